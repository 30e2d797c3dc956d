//! Serializable parser state, so a stream can be suspended on one server and resumed on another
//! (the stateless streaming derender carries it between calls).
//!
//! A snapshot holds only what the parser still needs: the text it has not settled yet, the
//! phase of each stage and a few counters. Text already sent as content or reasoning is not
//! kept (the tool stage keeps one character of it as context for the final parse), so for an
//! ordinary answer the snapshot stays a few dozen bytes whatever the output length. What a
//! format genuinely holds is kept: the tail from the first tool-call marker (most formats settle
//! their calls with one parse of that tail at the end, because later text can still change or
//! void them), and the whole output for the frame-based reasoning parsers (`hunyuan_a13b`,
//! `granite`) and for formats that stream nothing before the end (e.g. `pythonic`, `openai`).
//!
//! The configuration (markers, tools, `tool_choice`, …) is not part of the snapshot: it is
//! rebuilt from the parser names and the [`crate::ParserConfig`] by
//! [`crate::ParserRegistry::restore`], which checks that the snapshot fits that configuration
//! and that every offset is inside the held text, so a forged snapshot is an error, never a
//! panic.
use crate::pyjson::Balance;
use crate::reasoning::think::ThinkPhase;
use crate::tools::{
    glm45::GlmScan, granite::GraniteScan, harmony::HarmonyScan, kimi_k2::KimiScan,
    minimax_m2::MinimaxScan, mistral::MistralScan, qwen3_coder::QwenScan, BlockState,
};
use serde::{Deserialize, Serialize};

/// Version of the snapshot layout; [`crate::ParserRegistry::restore`] refuses any other.
pub const SNAPSHOT_VERSION: u32 = 1;

/// The resumable state of a [`crate::StreamParser`] (see the module docs). Serialize it with
/// serde; restore it with [`crate::ParserRegistry::restore`] under the same parser names and
/// request configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParserSnapshot {
    pub(crate) v: u32,
    #[serde(default)]
    pub(crate) finished: bool,
    pub(crate) reasoning: ReasoningSnapshot,
    pub(crate) tool: ToolSnapshot,
}

impl ParserSnapshot {
    /// Bytes of generated text the snapshot holds (not yet settled by the parser).
    pub fn held_bytes(&self) -> usize {
        let r = match &self.reasoning {
            ReasoningSnapshot::Think {
                pending, held_ws, ..
            } => pending.len() + held_ws.len(),
            ReasoningSnapshot::Buffered { buf } => buf.len(),
            ReasoningSnapshot::Passthrough { .. } | ReasoningSnapshot::AppendThink { .. } => 0,
        };
        let t = match &self.tool {
            ToolSnapshot::None => 0,
            ToolSnapshot::Format(f) => f.buf.len(),
        };
        r + t
    }
}

/// State of the reasoning stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[doc(hidden)]
pub enum ReasoningSnapshot {
    Passthrough {
        sent: bool,
    },
    Think {
        phase: ThinkPhase,
        /// Text that may still be the start of a marker.
        pending: String,
        /// Trailing reasoning whitespace held back (Kimi-K2 strips it at the end).
        held_ws: String,
        marked: bool,
    },
    AppendThink {
        started: bool,
    },
    /// Frame-based splits need the whole text.
    Buffered {
        buf: String,
    },
}

/// State of the tool stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[doc(hidden)]
pub enum ToolSnapshot {
    None,
    Format(FormatSnapshot),
}

/// State of [`crate::tools::FormatStage`]. `buf` is the content text from the first byte the
/// stage may still read (all offsets are relative to it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[doc(hidden)]
pub struct FormatSnapshot {
    pub buf: String,
    pub present: bool,
    pub emitted: usize,
    pub scan_from: usize,
    pub blocked: bool,
    pub found: usize,
    /// Calls sent so far: name and how many bytes of their arguments.
    pub sent: Vec<SentCall>,
    #[serde(default)]
    pub scan: Option<ScanSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[doc(hidden)]
pub struct SentCall {
    pub name: String,
    pub args: usize,
}

/// State of a format's early call scanner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[doc(hidden)]
pub enum ScanSnapshot {
    Closed {
        state: BlockState,
        from: usize,
    },
    UpTo {
        from: usize,
        inner: Option<usize>,
        bal: Balance,
        done: bool,
    },
    Mistral(MistralScan),
    Glm(GlmScan),
    Kimi(KimiScan),
    Minimax(MinimaxScan),
    Qwen(QwenScan),
    Granite(GraniteScan),
    Harmony(HarmonyScan),
}

impl ScanSnapshot {
    /// Every buffer offset held.
    pub(crate) fn offsets(&mut self) -> Vec<&mut usize> {
        match self {
            Self::Closed { state, from } => {
                let mut v = vec![from];
                if let BlockState::Inner(s) = state {
                    v.push(s);
                }
                v
            }
            Self::UpTo { from, inner, .. } => {
                let mut v = vec![from];
                if let Some(i) = inner {
                    v.push(i);
                }
                v
            }
            Self::Mistral(s) => s.offsets(),
            Self::Glm(s) => s.offsets(),
            Self::Kimi(s) => s.offsets(),
            Self::Minimax(s) => s.offsets(),
            Self::Qwen(s) => s.offsets(),
            Self::Granite(s) => s.offsets(),
            Self::Harmony(s) => s.offsets(),
        }
    }

    /// The smallest offset held (nothing before it is read again by the scanner).
    pub(crate) fn min_offset(&self) -> usize {
        let mut c = self.clone();
        c.offsets().into_iter().map(|o| *o).min().unwrap_or(0)
    }

    /// Moves every offset `k` bytes back (the first `k` bytes of the buffer are dropped).
    pub(crate) fn rebase(&mut self, k: usize) {
        for o in self.offsets() {
            *o = o.saturating_sub(k);
        }
    }

    /// Whether the offsets fit `buf`: inside it, on char boundaries, in the scanner's order.
    pub(crate) fn fits(&self, buf: &str) -> bool {
        let mut c = self.clone();
        let inside = c
            .offsets()
            .into_iter()
            .all(|o| *o <= buf.len() && buf.is_char_boundary(*o));
        inside
            && match self {
                Self::Closed { state, from } => match state {
                    BlockState::Inner(s) => s <= from,
                    _ => true,
                },
                Self::UpTo {
                    from, inner, bal, ..
                } => match inner {
                    // The bracket scan reads from the byte before `inner`.
                    Some(i) => {
                        *i >= 1
                            && i <= from
                            && (i - 1)
                                .checked_add(bal.fed())
                                .is_some_and(|f| f <= buf.len())
                    }
                    None => bal.fed() == 0,
                },
                Self::Mistral(s) => s.check(buf.len()),
                Self::Glm(s) => s.check(buf.len()),
                Self::Kimi(s) => s.check(buf.len()),
                Self::Minimax(s) => s.check(buf.len()),
                Self::Qwen(s) => s.check(buf.len()),
                Self::Granite(s) => s.check(buf.len()),
                Self::Harmony(s) => s.check(buf.len()),
            }
    }
}
