//! The combined parser: a reasoning stage feeding a tool stage.
use crate::reasoning::{ReasoningStage, StageOut};
use crate::tools::ToolStage;
use crate::{DeltaMessage, StreamParser};

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
