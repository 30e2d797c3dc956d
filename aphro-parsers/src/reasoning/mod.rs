//! Reasoning stages. The `<think>`-style families share one marker state machine
//! ([`think::ThinkStage`], configured per vLLM name in [`crate::registry`]); formats whose split
//! depends on a whole frame (Hunyuan, Granite) buffer and split once at the end.
pub mod append_think;
pub mod granite;
pub mod hunyuan;
pub mod think;

use crate::snapshot::ReasoningSnapshot;

/// What a reasoning stage produced in one step: reasoning text, and content text to hand to the
/// tool stage. `Some("")` marks presence (e.g. empty DeepSeek-R1 reasoning).
#[derive(Debug, Default)]
pub struct StageOut {
    pub reasoning: Option<String>,
    pub content: Option<String>,
}

impl StageOut {
    pub(crate) fn reasoning(&mut self, s: &str) {
        self.reasoning.get_or_insert_with(String::new).push_str(s);
    }
    pub(crate) fn content(&mut self, s: &str) {
        self.content.get_or_insert_with(String::new).push_str(s);
    }
}

/// An incremental reasoning splitter.
pub trait ReasoningStage: Send {
    fn push(&mut self, text: &str, out: &mut StageOut);
    fn finish(&mut self, out: &mut StageOut);
    /// The resumable state (see [`crate::ParserSnapshot`]).
    fn snapshot(&self) -> ReasoningSnapshot;
    /// Takes over a snapshot taken from a stage of the same configuration.
    fn restore(&mut self, s: ReasoningSnapshot) -> Result<(), String>;
}

pub(crate) fn mismatch() -> String {
    "reasoning parser state of another kind of reasoning parser".into()
}

/// No reasoning parser (or reasoning disabled): everything is content. Content is present even
/// when the output is empty.
#[derive(Debug, Default)]
pub struct Passthrough {
    sent: bool,
}

impl ReasoningStage for Passthrough {
    fn push(&mut self, text: &str, out: &mut StageOut) {
        if !text.is_empty() {
            self.sent = true;
            out.content(text);
        }
    }
    fn finish(&mut self, out: &mut StageOut) {
        if !self.sent {
            self.sent = true;
            out.content("");
        }
    }
    fn snapshot(&self) -> ReasoningSnapshot {
        ReasoningSnapshot::Passthrough { sent: self.sent }
    }
    fn restore(&mut self, s: ReasoningSnapshot) -> Result<(), String> {
        match s {
            ReasoningSnapshot::Passthrough { sent } => {
                self.sent = sent;
                Ok(())
            }
            _ => Err(mismatch()),
        }
    }
}

/// A split that needs the whole text: buffer, then split once at the end.
pub struct Buffered {
    buf: String,
    split: fn(&str) -> (Option<String>, Option<String>),
}

impl Buffered {
    pub fn new(split: fn(&str) -> (Option<String>, Option<String>)) -> Self {
        Self {
            buf: String::new(),
            split,
        }
    }
}

impl ReasoningStage for Buffered {
    fn push(&mut self, text: &str, _out: &mut StageOut) {
        self.buf.push_str(text);
    }
    fn finish(&mut self, out: &mut StageOut) {
        let (r, c) = (self.split)(&self.buf);
        if let Some(r) = r {
            out.reasoning(&r);
        }
        if let Some(c) = c {
            out.content(&c);
        }
    }
    fn snapshot(&self) -> ReasoningSnapshot {
        ReasoningSnapshot::Buffered {
            buf: self.buf.clone(),
        }
    }
    fn restore(&mut self, s: ReasoningSnapshot) -> Result<(), String> {
        match s {
            ReasoningSnapshot::Buffered { buf } => {
                self.buf = buf;
                Ok(())
            }
            _ => Err(mismatch()),
        }
    }
}
