//! `olmo3`: newline-separated pythonic calls inside `<function_calls>…</function_calls>`. Text
//! before the block is discarded when the calls parse; malformed → whole output as content.
use super::{Close, EarlyScan, RawCall, ToolFormat, ToolOutput, UpTo};
use crate::pyjson::dumps;
use crate::pyliteral::Py;
use crate::ParserConfig;
use serde_json::Value;

pub struct Olmo3;

impl ToolFormat for Olmo3 {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        const OPEN: &str = "<function_calls>";
        let Some(s) = text.find(OPEN) else {
            return ToolOutput::unchanged(text);
        };
        let rest = &text[s + OPEN.len()..];
        let body = rest.find("</function_calls>").map_or(rest, |e| &rest[..e]);
        let mut calls = Vec::new();
        for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let mut p = Py::new(line);
            match p.call() {
                Some((n, a)) if p.at_end() => calls.push(RawCall::new(n, dumps(&Value::Object(a)))),
                _ => return ToolOutput::unchanged(text),
            }
        }
        if calls.is_empty() {
            return ToolOutput::unchanged(text);
        }
        ToolOutput::calls(None, calls)
    }

    /// One malformed line turns every call back into content, so nothing is final before the
    /// block ends; text after `</function_calls>` is ignored, so the calls are sent when it
    /// arrives.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(UpTo::new(
            "<function_calls>",
            Close::Marker("</function_calls>"),
            |t, c| Olmo3.parse(t, c),
        )))
    }
}
