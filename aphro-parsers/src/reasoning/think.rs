//! The `<think>…</think>` marker state machine behind `deepseek_r1`, `step5`, `holo2`,
//! `deepseek_v3` (thinking on), `ernie45`, `step3`, and the engine-style `qwen3`, `glm45`/`glm47`,
//! `kimi_k2`, `minimax_m2`, `seed_oss` (`<seed:think>`) and `mistral` (`[THINK]`).
//!
//! States: `Start` (deciding whether the output opens with the start marker), `Reasoning`,
//! `Content`. Text that could still be the beginning of a marker is held back until the next
//! delta decides it, so any cut of the input yields the same concatenated output.
use super::{ReasoningStage, StageOut};
use crate::snapshot::ReasoningSnapshot;

use crate::scan::{find_earliest, partial_suffix_len, trailing_ws_len};
pub use State as ThinkPhase;

/// Per-format behaviour of [`ThinkStage`].
#[derive(Debug, Clone)]
pub struct ThinkConfig {
    pub start: &'static str,
    pub end: &'static str,
    /// The output starts inside reasoning (the prompt opened it). Mistral starts in content.
    pub start_in_reasoning: bool,
    /// Remove a start marker at the very beginning (false: Step3 keeps it in the reasoning text).
    pub strip_leading_start: bool,
    /// Engine style: start markers inside reasoning are dropped, further end markers in content
    /// are dropped, empty reasoning is null. Legacy (R1) style keeps them and returns `""`.
    pub engine: bool,
    /// A start marker in content opens reasoning again (Mistral `[THINK]`).
    pub start_in_content: bool,
    /// The reasoning text is `rstrip()`ed: vLLM's parser engine joins every reasoning chunk and
    /// rstrips the result when the grammar keeps `strip_trailing_reasoning_whitespace` (default
    /// `True` in `vllm/parser/engine/parser_engine_config.py`; `parser_engine.py`
    /// `extract_reasoning` / `_single_pass_parse`). On for `glm45`/`glm47`, `minimax_m2`,
    /// `mistral`, `kimi_k2`; off for `qwen3` and `seed_oss` (`vllm/parser/qwen3.py`).
    /// Whitespace is held back until more reasoning text follows, so whitespace that ends one
    /// reasoning block survives when a later block (Mistral `[THINK]` again) continues it.
    pub rstrip_reasoning: bool,
    /// Markers that end reasoning implicitly and stay in the content (tool-call openers of the
    /// same engine grammar, e.g. Qwen3's `<tool_call>`).
    pub implicit_end: &'static [&'static str],
}

impl ThinkConfig {
    /// DeepSeek-R1 semantics.
    pub const fn r1() -> Self {
        Self {
            start: "<think>",
            end: "</think>",
            start_in_reasoning: true,
            strip_leading_start: true,
            engine: false,
            start_in_content: false,
            rstrip_reasoning: false,
            implicit_end: &[],
        }
    }

    /// vLLM parser-engine semantics (Qwen3 and friends) with the given markers.
    pub const fn engine(
        start: &'static str,
        end: &'static str,
        implicit_end: &'static [&'static str],
    ) -> Self {
        Self {
            start,
            end,
            start_in_reasoning: true,
            strip_leading_start: true,
            engine: true,
            start_in_content: false,
            rstrip_reasoning: false,
            implicit_end,
        }
    }
}

/// Phase of a [`ThinkStage`] (part of its snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Start,
    Reasoning,
    Content,
}

/// Incremental `<think>` splitter.
#[derive(Debug)]
pub struct ThinkStage {
    cfg: ThinkConfig,
    state: State,
    pending: String,
    held_ws: String,
    reasoning_marked: bool,
}

impl ThinkStage {
    /// `in_reasoning`: whether the output starts inside reasoning (config default, or what the
    /// prompt tail says).
    pub fn new(cfg: ThinkConfig, in_reasoning: bool) -> Self {
        let state = if in_reasoning {
            State::Start
        } else {
            State::Content
        };
        Self {
            cfg,
            state,
            pending: String::new(),
            held_ws: String::new(),
            reasoning_marked: false,
        }
    }

    fn mark_reasoning(&mut self, out: &mut StageOut) {
        if !self.cfg.engine && !self.reasoning_marked {
            self.reasoning_marked = true;
            out.reasoning("");
        }
    }

    fn emit_reasoning(&mut self, s: &str, out: &mut StageOut) {
        self.mark_reasoning(out);
        if s.is_empty() {
            return;
        }
        if self.cfg.rstrip_reasoning {
            self.held_ws.push_str(s);
            let keep = trailing_ws_len(&self.held_ws);
            let cut = self.held_ws.len() - keep;
            if cut > 0 {
                out.reasoning(&self.held_ws[..cut]);
                self.held_ws.drain(..cut);
            }
        } else {
            out.reasoning(s);
        }
    }

    /// Held trailing whitespace stays held: it is emitted if reasoning resumes with more text
    /// (the rstrip applies to the joined reasoning), dropped at `finish`.
    fn end_reasoning(&mut self) {
        self.state = State::Content;
    }

    fn emit_content(s: &str, out: &mut StageOut) {
        if !s.is_empty() {
            out.content(s);
        }
    }

    /// Processes `pending`; with `final_` nothing is held back.
    fn run(&mut self, out: &mut StageOut, final_: bool) {
        loop {
            match self.state {
                State::Start => {
                    let start = self.cfg.start;
                    if self.pending.starts_with(start) {
                        if self.cfg.strip_leading_start {
                            self.pending.drain(..start.len());
                        }
                        self.mark_reasoning(out);
                        self.state = State::Reasoning;
                    } else if start.starts_with(self.pending.as_str()) && !final_ {
                        return; // undecided yet
                    } else {
                        self.mark_reasoning(out);
                        self.state = State::Reasoning;
                    }
                }
                State::Reasoning => {
                    let mut markers: Vec<&str> = vec![self.cfg.end];
                    if self.cfg.engine {
                        markers.push(self.cfg.start);
                    }
                    markers.extend_from_slice(self.cfg.implicit_end);
                    match find_earliest(&self.pending, &markers) {
                        Some((pos, idx)) => {
                            let before = self.pending[..pos].to_string();
                            self.emit_reasoning(&before, out);
                            let m = markers[idx];
                            let rest = self.pending[pos + m.len()..].to_string();
                            if idx == 0 {
                                self.end_reasoning();
                                self.pending = rest;
                            } else if self.cfg.engine && idx == 1 {
                                self.pending = rest; // stray start marker: dropped
                            } else {
                                self.end_reasoning();
                                self.pending = format!("{m}{rest}");
                                // The opener belongs to the content; pass it on directly.
                                Self::emit_content(m, out);
                                self.pending.drain(..m.len());
                            }
                        }
                        None => {
                            let hold = if final_ {
                                0
                            } else {
                                partial_suffix_len(&self.pending, &markers)
                            };
                            let cut = self.pending.len() - hold;
                            let s: String = self.pending.drain(..cut).collect();
                            self.emit_reasoning(&s, out);
                            return;
                        }
                    }
                }
                State::Content => {
                    let mut markers: Vec<&str> = Vec::new();
                    if self.cfg.engine {
                        markers.push(self.cfg.end);
                    }
                    if self.cfg.start_in_content {
                        markers.push(self.cfg.start);
                    }
                    match find_earliest(&self.pending, &markers) {
                        Some((pos, idx)) => {
                            Self::emit_content(&self.pending[..pos], out);
                            let m = markers[idx];
                            self.pending.drain(..pos + m.len());
                            if m == self.cfg.start && self.cfg.start_in_content {
                                self.state = State::Reasoning;
                            }
                        }
                        None => {
                            let hold = if final_ {
                                0
                            } else {
                                partial_suffix_len(&self.pending, &markers)
                            };
                            let cut = self.pending.len() - hold;
                            Self::emit_content(&self.pending[..cut], out);
                            self.pending.drain(..cut);
                            return;
                        }
                    }
                }
            }
        }
    }
}

impl ReasoningStage for ThinkStage {
    fn push(&mut self, text: &str, out: &mut StageOut) {
        self.pending.push_str(text);
        self.run(out, false);
    }

    fn finish(&mut self, out: &mut StageOut) {
        self.run(out, true);
        // What is still held is trailing whitespace of the whole reasoning: rstripped.
        self.held_ws.clear();
    }

    fn snapshot(&self) -> ReasoningSnapshot {
        ReasoningSnapshot::Think {
            phase: self.state,
            pending: self.pending.clone(),
            held_ws: self.held_ws.clone(),
            marked: self.reasoning_marked,
        }
    }

    fn restore(&mut self, s: ReasoningSnapshot) -> Result<(), String> {
        match s {
            ReasoningSnapshot::Think {
                phase,
                pending,
                held_ws,
                marked,
            } => {
                self.state = phase;
                self.pending = pending;
                self.held_ws = held_ws;
                self.reasoning_marked = marked;
                Ok(())
            }
            _ => Err(super::mismatch()),
        }
    }
}
