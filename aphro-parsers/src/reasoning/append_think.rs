//! `minimax_m2_append_think`: no split at all; `<think>` is prepended to the output and the whole
//! text is returned as content (for clients that parse the tags themselves).
use super::{ReasoningStage, StageOut};
use crate::snapshot::ReasoningSnapshot;

#[derive(Debug, Default)]
pub struct AppendThink {
    started: bool,
}

impl ReasoningStage for AppendThink {
    fn push(&mut self, text: &str, out: &mut StageOut) {
        if !self.started {
            self.started = true;
            out.content("<think>");
        }
        if !text.is_empty() {
            out.content(text);
        }
    }
    fn finish(&mut self, out: &mut StageOut) {
        if !self.started {
            self.started = true;
            out.content("<think>");
        }
    }
    fn snapshot(&self) -> ReasoningSnapshot {
        ReasoningSnapshot::AppendThink {
            started: self.started,
        }
    }
    fn restore(&mut self, s: ReasoningSnapshot) -> Result<(), String> {
        match s {
            ReasoningSnapshot::AppendThink { started } => {
                self.started = started;
                Ok(())
            }
            _ => Err(super::mismatch()),
        }
    }
}
