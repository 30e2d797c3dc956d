//! `jamba`: `<tool_calls>[{"name", "arguments"}, …]</tool_calls>`. Content is the text before the
//! marker (a lone space counts as none). JSON error → no calls, whole output as content.
use super::{hermes::call_from_obj, Close, EarlyScan, ToolFormat, ToolOutput, UpTo};
use crate::pyjson::loads;
use crate::ParserConfig;

pub struct Jamba;

impl ToolFormat for Jamba {
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
        let mut calls = Vec::new();
        for it in items {
            match call_from_obj(it, &["arguments"]) {
                Some(c) => calls.push(c),
                None => return ToolOutput::unchanged(text),
            }
        }
        let content = &text[..s];
        let content = (!content.is_empty() && content != " ").then(|| content.to_string());
        ToolOutput::calls(content, calls)
    }

    /// The calls depend only on the text up to the first `</tool_calls>` (text after it is
    /// ignored), but one bad element voids them all: sent when `</tool_calls>` arrives.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(UpTo::new(
            "<tool_calls>",
            Close::Marker("</tool_calls>"),
            |t, c| Jamba.parse(t, c),
        )))
    }
}
