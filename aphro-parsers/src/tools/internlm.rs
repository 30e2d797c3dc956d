//! `internlm` (`internlm2`): `<|action_start|><|plugin|>`, a JSON object
//! `{"name", "parameters"|"arguments"}`, then `<|action_end|>`; only the first call is read. Content is the text before the marker.
//! Invalid JSON raises inside vLLM 0.33.0 (request fails); here it yields no call and the whole
//! output as content.
use super::{
    hermes::call_from_obj, nonempty, Close, EarlyScan, Live, ToolFormat, ToolOutput, UpTo,
};
use crate::pyjson::loads;
use crate::ParserConfig;

pub struct InternLm;

const START: &str = "<|action_start|><|plugin|>";

impl ToolFormat for InternLm {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some(s) = text.find(START) else {
            return ToolOutput::unchanged(text);
        };
        let rest = &text[s + START.len()..];
        let body = rest.split("<|action_end|>").next().unwrap_or(rest);
        match loads(body)
            .as_ref()
            .and_then(|v| call_from_obj(v, &["parameters", "arguments"]))
        {
            Some(c) => ToolOutput::calls(nonempty(&text[..s]), vec![c]),
            None => ToolOutput::unchanged(text),
        }
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &["<|action_start|>"],
            strip: false,
        }
    }

    /// Only the first call is read and the JSON must parse as a whole: sent when the first
    /// `<|action_end|>` arrives (text after it is ignored).
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(UpTo::new(
            START,
            Close::Marker("<|action_end|>"),
            |t, c| InternLm.parse(t, c),
        )))
    }
}
