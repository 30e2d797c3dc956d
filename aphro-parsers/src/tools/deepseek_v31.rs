//! `deepseek_v31`: like DeepSeek-V3 but a call is
//! `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` (no type, no fence). ARGS
//! verbatim. Content is the text before the section only.
use super::deepseek_v3::{CALLS_BEGIN, CALL_BEGIN, CALL_END, SEP};
use super::{nonempty, Live, RawCall, ToolFormat, ToolOutput};
use crate::ParserConfig;

pub struct DeepSeekV31;

impl ToolFormat for DeepSeekV31 {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some(s) = text.find(CALLS_BEGIN) else {
            return ToolOutput::unchanged(text);
        };
        let section = &text[s + CALLS_BEGIN.len()..];
        let mut calls = Vec::new();
        for (_, inner, closed) in super::blocks(section, CALL_BEGIN, CALL_END) {
            if !closed {
                continue;
            }
            if let Some((name, args)) = inner.split_once(SEP) {
                calls.push(RawCall::new(name, args));
            }
        }
        ToolOutput::calls(nonempty(&text[..s]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[CALLS_BEGIN],
            strip: false,
        }
    }
}
