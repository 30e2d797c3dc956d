//! `deepseek_v3`: `<｜tool▁calls▁begin｜>` then per call
//! `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`, then
//! `<｜tool▁calls▁end｜>`. ARGS verbatim. Content is the text before the section plus the text
//! after its end marker; an incomplete call is not returned.
use super::{nonempty, ClosedBlocks, EarlyScan, Live, RawCall, ToolFormat, ToolOutput};
use crate::ParserConfig;

pub struct DeepSeekV3;

pub(crate) const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub(crate) const CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub(crate) const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub(crate) const CALL_END: &str = "<｜tool▁call▁end｜>";
pub(crate) const SEP: &str = "<｜tool▁sep｜>";

/// One closed call block → call (type, fenced JSON arguments taken verbatim).
fn block(inner: &str, _ctx: &ParserConfig) -> Option<RawCall> {
    let (_ty, rest) = inner.split_once(SEP)?;
    let (name, rest) = rest.split_once("\n```json\n")?;
    let args = rest.strip_suffix("\n```")?;
    Some(RawCall::new(name, args))
}

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
        let calls = super::blocks(section, CALL_BEGIN, CALL_END)
            .into_iter()
            .filter(|b| b.2)
            .filter_map(|(_, inner, _)| block(inner, _ctx))
            .collect();
        let content = format!("{}{}", &text[..s], after);
        ToolOutput::calls(nonempty(&content), calls)
    }

    /// A call is final at its `<｜tool▁call▁end｜>` (an unclosed call is never returned, and no
    /// later text changes a closed one), so it is sent whole then.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(ClosedBlocks::new(
            CALLS_BEGIN,
            CALL_BEGIN,
            CALL_END,
            Some(CALLS_END),
            block,
        )))
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[CALLS_BEGIN],
            strip: false,
        }
    }
}
