//! `deepseek_v31`: like DeepSeek-V3 but a call is
//! `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` (no type, no fence). ARGS
//! verbatim. Content is the text before the section only.
use super::deepseek_v3::{CALLS_BEGIN, CALL_BEGIN, CALL_END, SEP};
use super::{nonempty, ClosedBlocks, EarlyScan, Live, RawCall, ToolFormat, ToolOutput};
use crate::ParserConfig;

pub struct DeepSeekV31;

/// One closed call block → call (arguments verbatim).
fn block(inner: &str, _ctx: &ParserConfig) -> Option<RawCall> {
    let (name, args) = inner.split_once(SEP)?;
    Some(RawCall::new(name, args))
}

impl ToolFormat for DeepSeekV31 {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some(s) = text.find(CALLS_BEGIN) else {
            return ToolOutput::unchanged(text);
        };
        let section = &text[s + CALLS_BEGIN.len()..];
        let calls = super::blocks(section, CALL_BEGIN, CALL_END)
            .into_iter()
            .filter(|b| b.2)
            .filter_map(|(_, inner, _)| block(inner, _ctx))
            .collect();
        ToolOutput::calls(nonempty(&text[..s]), calls)
    }

    /// A call is final at its `<｜tool▁call▁end｜>` (unclosed calls are dropped, later text
    /// never changes a closed one): sent whole then.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(ClosedBlocks::new(
            CALLS_BEGIN,
            CALL_BEGIN,
            CALL_END,
            None,
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
