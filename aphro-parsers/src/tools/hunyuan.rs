//! `hunyuan_a13b`: `<tool_calls>[…JSON array of {"name","arguments"}…]</tool_calls>`; content
//! before the block kept verbatim. Malformed → whole output as content.
use super::{
    hermes::call_from_obj, nonempty, Close, EarlyScan, Live, ToolFormat, ToolOutput, UpTo,
};
use crate::pyjson::loads;
use crate::ParserConfig;

pub struct Hunyuan;

impl ToolFormat for Hunyuan {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some(s) = text.find("<tool_calls>") else {
            return ToolOutput::unchanged(text);
        };
        let inner_start = s + "<tool_calls>".len();
        let Some(e) = text[inner_start..].find("</tool_calls>") else {
            return ToolOutput::unchanged(text);
        };
        let Some(v) = loads(&text[inner_start..inner_start + e]) else {
            return ToolOutput::unchanged(text);
        };
        let Some(items) = v.as_array() else {
            return ToolOutput::unchanged(text);
        };
        let calls: Vec<_> = items
            .iter()
            .filter_map(|it| call_from_obj(it, &["arguments"]))
            .collect();
        if calls.is_empty() {
            return ToolOutput::unchanged(text);
        }
        ToolOutput::calls(nonempty(&text[..s]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &["<tool_calls>"],
            strip: false,
        }
    }

    /// The calls depend only on the text up to the first `</tool_calls>` (the JSON array must
    /// parse as a whole): sent when `</tool_calls>` arrives. With the `hunyuan_a13b` reasoning
    /// parser the content itself is only known at the end of the frame, hence at `finish()`.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(UpTo::new(
            "<tool_calls>",
            Close::Marker("</tool_calls>"),
            |t, c| Hunyuan.parse(t, c),
        )))
    }
}
