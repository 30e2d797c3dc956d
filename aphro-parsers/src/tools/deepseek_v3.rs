//! `deepseek_v3`: `<｜tool▁calls▁begin｜>` then per call
//! `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`, then
//! `<｜tool▁calls▁end｜>`. ARGS verbatim. Content is the text before the section plus the text
//! after its end marker; an incomplete call is not returned.
use super::{nonempty, Live, RawCall, ToolFormat, ToolOutput};
use crate::ParserConfig;

pub struct DeepSeekV3;

pub(crate) const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub(crate) const CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub(crate) const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub(crate) const CALL_END: &str = "<｜tool▁call▁end｜>";
pub(crate) const SEP: &str = "<｜tool▁sep｜>";

impl ToolFormat for DeepSeekV3 {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some(s) = text.find(CALLS_BEGIN) else {
            return ToolOutput::unchanged(text);
        };
        let section = &text[s + CALLS_BEGIN.len()..];
        let (section, after) = match section.find(CALLS_END) {
            Some(e) => (&section[..e], &section[e + CALLS_END.len()..]),
            None => (section, ""),
        };
        let mut calls = Vec::new();
        for (_, inner, closed) in super::blocks(section, CALL_BEGIN, CALL_END) {
            if !closed {
                continue;
            }
            let Some((_ty, rest)) = inner.split_once(SEP) else {
                continue;
            };
            let Some((name, rest)) = rest.split_once("\n```json\n") else {
                continue;
            };
            let Some(args) = rest.strip_suffix("\n```") else {
                continue;
            };
            calls.push(RawCall::new(name, args));
        }
        let content = format!("{}{}", &text[..s], after);
        ToolOutput::calls(nonempty(&content), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[CALLS_BEGIN],
            strip: false,
        }
    }
}
