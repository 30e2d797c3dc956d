//! `minimax_m2_append_think`: no split at all; `<think>` is prepended to the output and the whole
//! text is returned as content (for clients that parse the tags themselves).
use super::{ReasoningStage, StageOut};

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
}
