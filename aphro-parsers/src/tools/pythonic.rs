//! `pythonic` and `llama4_pythonic`: the whole output is a Python list of calls
//! `[f(a=1, b="x"), g()]` (Llama 4 may wrap it in `<|python_start|>…<|python_end|>`). Keyword
//! arguments with literal values only. Leading prose, a syntax error or a non-call element → no
//! calls, output as content.
use super::{RawCall, ToolFormat, ToolOutput};
use crate::pyjson::dumps;
use crate::pyliteral::Py;
use crate::ParserConfig;
use serde_json::Value;

pub struct Pythonic;

// No `early()`: calls are sent at `finish()`. The *whole* output must be one Python list of
// calls; any text after the closing `]` turns it back into content, so nothing is final
// before the end.
impl ToolFormat for Pythonic {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let mut t = text.trim();
        if let Some(x) = t.strip_prefix("<|python_start|>") {
            t = x.strip_suffix("<|python_end|>").unwrap_or(x).trim();
        }
        if !t.starts_with('[') {
            return ToolOutput::unchanged(text);
        }
        match Py::new(t).call_list() {
            Some(calls) if !calls.is_empty() => ToolOutput::calls(
                None,
                calls
                    .into_iter()
                    .map(|(n, a)| RawCall::new(n, dumps(&Value::Object(a))))
                    .collect(),
            ),
            _ => ToolOutput::unchanged(text),
        }
    }
}
