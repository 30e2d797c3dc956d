//! `llama3_json` (alias `llama4_json`): bare JSON objects `{"name": …, "parameters"|"arguments": …}`,
//! optionally after `<|python_tag|>`, separated by `;`. Every `{` at top level is raw-decoded;
//! text around the objects is ignored and content is null when calls are found. A decode error or
//! a missing key → no calls, whole output as content.
use super::{hermes::call_from_obj, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::raw_decode;
use crate::ParserConfig;

pub struct Llama3Json;

// No `early()`: calls are sent at `finish()`. Every later `{` must also decode to a call, or
// all calls are void (whole output as content), so no call is final before the end.
impl ToolFormat for Llama3Json {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let mut calls: Vec<RawCall> = Vec::new();
        let mut pos = 0;
        while let Some(p) = text[pos..].find('{') {
            let s = pos + p;
            let Some((v, len)) = raw_decode(&text[s..]) else {
                return ToolOutput::unchanged(text);
            };
            let Some(c) = call_from_obj(&v, &["parameters", "arguments"]) else {
                return ToolOutput::unchanged(text);
            };
            calls.push(c);
            pos = s + len;
        }
        if calls.is_empty() {
            return ToolOutput::unchanged(text);
        }
        ToolOutput::calls(None, calls)
    }
}
