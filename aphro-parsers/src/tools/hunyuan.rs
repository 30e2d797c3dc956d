//! `hunyuan_a13b`: `<tool_calls>[…JSON array of {"name","arguments"}…]</tool_calls>`; content
//! before the block kept verbatim. Malformed → whole output as content.
use super::{hermes::call_from_obj, nonempty, Live, ToolFormat, ToolOutput};
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
}
