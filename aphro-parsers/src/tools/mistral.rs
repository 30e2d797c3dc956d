//! `mistral` (engine-based, v11+ format): `[TOOL_CALLS]NAME{json-args}` repeated for parallel
//! calls. The JSON object after the name is passed through verbatim (even truncated/invalid);
//! text after a closed object is dropped. Content is the text before the first `[TOOL_CALLS]`,
//! stripped. The pre-v11 array form `[TOOL_CALLS][{…}]` is mis-parsed with name `[` exactly as
//! vLLM 0.33.0 does without the Mistral tokenizer. Ids are 9 random alphanumerics.
use super::{stripped, IdStyle, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::balanced_len;
use crate::ParserConfig;

pub struct Mistral;

const MARK: &str = "[TOOL_CALLS]";

impl ToolFormat for Mistral {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some(first) = text.find(MARK) else {
            return ToolOutput::unchanged(text);
        };
        let mut calls = Vec::new();
        for seg in text[first + MARK.len()..].split(MARK) {
            let (name, args) = match seg.find('{') {
                Some(b) => {
                    let obj = &seg[b..];
                    let args = balanced_len(obj).map_or(obj, |n| &obj[..n]);
                    (seg[..b].trim(), args)
                }
                None => (seg.trim(), "{}"),
            };
            if !name.is_empty() {
                calls.push(RawCall::new(name, args));
            }
        }
        ToolOutput::calls(stripped(&text[..first]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[MARK],
            strip: true,
        }
    }

    fn engine(&self) -> bool {
        true
    }

    fn id_style(&self) -> IdStyle {
        IdStyle::Mistral
    }
}
