//! The combined parser: a reasoning stage feeding a tool stage.
use crate::reasoning::{ReasoningStage, StageOut};
use crate::snapshot::{ParserSnapshot, SNAPSHOT_VERSION};
use crate::tools::ToolStage;
use crate::{DeltaMessage, ParserError, StreamParser};

/// Reasoning split first, tool extraction on the content part (`api.md` §11). Built by
/// [`crate::ParserRegistry::new_parser`].
pub struct CombinedParser {
    reasoning: Box<dyn ReasoningStage>,
    tool: Box<dyn ToolStage>,
    finished: bool,
}

impl CombinedParser {
    pub(crate) fn new(reasoning: Box<dyn ReasoningStage>, tool: Box<dyn ToolStage>) -> Self {
        Self {
            reasoning,
            tool,
            finished: false,
        }
    }

    /// Takes over a snapshot of a parser built with the same names and configuration.
    pub(crate) fn restore(&mut self, s: ParserSnapshot) -> Result<(), ParserError> {
        if s.v != SNAPSHOT_VERSION {
            return Err(ParserError::InvalidSnapshot(format!(
                "unsupported version {}",
                s.v
            )));
        }
        self.reasoning
            .restore(s.reasoning)
            .map_err(ParserError::InvalidSnapshot)?;
        self.tool
            .restore(s.tool)
            .map_err(ParserError::InvalidSnapshot)?;
        self.finished = s.finished;
        Ok(())
    }

    fn route(&mut self, so: StageOut, d: &mut DeltaMessage) {
        if let Some(r) = so.reasoning {
            d.push_reasoning(&r);
        }
        if let Some(c) = so.content {
            self.tool.push(&c, d);
        }
    }
}

impl StreamParser for CombinedParser {
    fn push(&mut self, delta: &str) -> DeltaMessage {
        let mut d = DeltaMessage::default();
        if self.finished {
            return d;
        }
        let mut so = StageOut::default();
        self.reasoning.push(delta, &mut so);
        self.route(so, &mut d);
        d
    }

    fn snapshot(&self) -> Option<ParserSnapshot> {
        Some(ParserSnapshot {
            v: SNAPSHOT_VERSION,
            finished: self.finished,
            reasoning: self.reasoning.snapshot(),
            tool: self.tool.snapshot(),
        })
    }

    fn finish(&mut self) -> DeltaMessage {
        let mut d = DeltaMessage::default();
        if self.finished {
            return d;
        }
        self.finished = true;
        let mut so = StageOut::default();
        self.reasoning.finish(&mut so);
        self.route(so, &mut d);
        self.tool.finish(&mut d);
        d
    }
}
