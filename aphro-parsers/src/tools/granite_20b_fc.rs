//! `granite-20b-fc`: one or more `<function_call>` markers each followed by a JSON object
//! `{"name", "arguments"}`. Content is the text before the first marker; a decode error → whole
//! output as content.
use super::{hermes::call_from_obj, nonempty, Live, ToolFormat, ToolOutput};
use crate::pyjson::decode_prefix;
use crate::ParserConfig;

pub struct Granite20bFc;

const MARK: &str = "<function_call>";

// No `early()`: calls are sent at `finish()`. A later `<function_call>` whose JSON does not
// decode voids every call (whole output as content), so no call is final before the end.
impl ToolFormat for Granite20bFc {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some(first) = text.find(MARK) else {
            return ToolOutput::unchanged(text);
        };
        let mut calls = Vec::new();
        for part in text[first + MARK.len()..].split(MARK) {
            let Some((v, _)) = decode_prefix(part) else {
                return ToolOutput::unchanged(text);
            };
            let Some(c) = call_from_obj(&v, &["arguments"]) else {
                return ToolOutput::unchanged(text);
            };
            calls.push(c);
        }
        ToolOutput::calls(nonempty(&text[..first]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[MARK],
            strip: false,
        }
    }
}
