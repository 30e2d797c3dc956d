//! `phi4_mini_json`: `functools[…]`, a JSON array of `{"name", "arguments"|"parameters"}`.
//! Anything before `functools` is dropped when calls parse; a decode error → whole output as
//! content.
use super::{hermes::call_from_obj, Close, EarlyScan, ToolFormat, ToolOutput, UpTo};
use crate::pyjson::raw_decode;
use crate::ParserConfig;

pub struct Phi4Mini;

impl ToolFormat for Phi4Mini {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some(p) = text.find("functools[") else {
            return ToolOutput::unchanged(text);
        };
        let arr = &text[p + "functools".len()..];
        let Some((v, _)) = raw_decode(arr) else {
            return ToolOutput::unchanged(text);
        };
        let Some(items) = v.as_array() else {
            return ToolOutput::unchanged(text);
        };
        let mut calls = Vec::new();
        for it in items {
            match call_from_obj(it, &["arguments", "parameters"]) {
                Some(c) => calls.push(c),
                None => return ToolOutput::unchanged(text),
            }
        }
        ToolOutput::calls(None, calls)
    }

    /// The array must decode as a whole (one bad element voids all calls), and text after it
    /// is ignored: the calls are sent when the array's closing bracket arrives.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(UpTo::new("functools[", Close::Bracket, |t, c| {
            Phi4Mini.parse(t, c)
        })))
    }
}
