//! Tool-call formats. Each format is a one-shot function over the content text
//! ([`ToolFormat::parse`], the single source of truth) plus a [`Live`] policy saying which content
//! may be streamed before the output ends. [`FormatStage`] is the incremental driver shared by
//! all formats.
use crate::config::{ParserConfig, ToolChoice};
use crate::scan::{find_earliest, partial_suffix_len, trailing_ws_len};
use crate::{DeltaMessage, DeltaToolCall};
use std::sync::Arc;

pub mod deepseek_v3;
pub mod deepseek_v31;
pub mod glm45;
pub mod granite;
pub mod granite_20b_fc;
pub mod harmony;
pub mod hermes;
pub mod hunyuan;
pub mod internlm;
pub mod jamba;
pub mod kimi_k2;
pub mod llama3_json;
pub mod minimax_m2;
pub mod mistral;
pub mod olmo3;
pub mod phi4_mini;
pub mod pythonic;
pub mod qwen3_coder;
pub mod step3;
pub mod xlam;

/// A call found by a format, before ids are assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawCall {
    pub name: String,
    pub arguments: String,
    /// A format-defined id (Kimi-K2); `None` → generated.
    pub id: Option<String>,
}

impl RawCall {
    pub fn new(name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            arguments: arguments.into(),
            id: None,
        }
    }
}

/// One-shot result of a tool format on the content text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolOutput {
    pub content: Option<String>,
    /// Only the Harmony format produces reasoning here.
    pub reasoning: Option<String>,
    pub calls: Vec<RawCall>,
}

impl ToolOutput {
    /// No calls; the text is the content unchanged.
    pub fn unchanged(text: &str) -> Self {
        Self {
            content: Some(text.to_string()),
            ..Self::default()
        }
    }
    pub fn calls(content: Option<String>, calls: Vec<RawCall>) -> Self {
        Self {
            content,
            reasoning: None,
            calls,
        }
    }
}

/// Which content may be streamed before the end of the output.
#[derive(Debug, Clone, Copy)]
pub enum Live {
    /// Nothing: the result depends on the whole text (e.g. Llama-3 JSON drops all prose when a
    /// call is found).
    Hold,
    /// Text before the first opener is final. `strip`: engine-style parsers strip that text when
    /// calls follow, so leading/trailing whitespace is held back.
    Prefix {
        openers: &'static [&'static str],
        strip: bool,
    },
}

/// How generated ids look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdStyle {
    /// `chatcmpl-tool-<16 hex>`
    Chatcmpl,
    /// 9 random alphanumerics (Mistral)
    Mistral,
    /// `call_<i>_<uuid4>` (xLAM)
    Xlam,
}

/// A tool-call format.
pub trait ToolFormat: Send + Sync {
    /// Parses the complete content text.
    fn parse(&self, text: &str, ctx: &ParserConfig) -> ToolOutput;
    fn live(&self) -> Live {
        Live::Hold
    }
    /// Engine-style parser (strips tool markup even with `tool_choice: "none"`).
    fn engine(&self) -> bool {
        false
    }
    fn id_style(&self) -> IdStyle {
        IdStyle::Chatcmpl
    }
}

/// The tool stage of the pipeline.
pub trait ToolStage: Send {
    fn push(&mut self, content: &str, out: &mut DeltaMessage);
    fn finish(&mut self, out: &mut DeltaMessage);
}

/// No tool parser configured: content passes straight through.
#[derive(Debug, Default)]
pub struct NoTools;

impl ToolStage for NoTools {
    fn push(&mut self, content: &str, out: &mut DeltaMessage) {
        out.push_content(content);
    }
    fn finish(&mut self, _out: &mut DeltaMessage) {}
}

/// Incremental driver for a [`ToolFormat`]: streams the provably final content prefix, buffers
/// the rest, parses once at `finish`, then emits the remaining content and the calls.
pub struct FormatStage {
    fmt: Arc<dyn ToolFormat>,
    ctx: Arc<ParserConfig>,
    buf: String,
    present: bool,
    emitted: usize,
    scan_from: usize,
    blocked: bool,
}

impl FormatStage {
    pub fn new(fmt: Arc<dyn ToolFormat>, ctx: Arc<ParserConfig>) -> Self {
        Self {
            fmt,
            ctx,
            buf: String::new(),
            present: false,
            emitted: 0,
            scan_from: 0,
            blocked: false,
        }
    }

    fn policy(&self) -> Live {
        match (&self.ctx.tool_choice, self.fmt.live()) {
            // Legacy parsers leave everything in content with tool_choice none.
            (ToolChoice::None, Live::Hold) if !self.fmt.engine() => Live::Prefix {
                openers: &[],
                strip: false,
            },
            (ToolChoice::None, Live::Prefix { openers, .. }) => {
                let openers: &'static [&'static str] =
                    if self.fmt.engine() { openers } else { &[] };
                Live::Prefix {
                    openers,
                    strip: false,
                }
            }
            (_, l) => l,
        }
    }

    fn advance_live(&mut self, out: &mut DeltaMessage) {
        let Live::Prefix { openers, strip } = self.policy() else {
            return;
        };
        if self.blocked {
            return;
        }
        let safe_end = match find_earliest(&self.buf[self.scan_from..], openers) {
            Some((p, _)) => {
                self.blocked = true;
                self.scan_from + p
            }
            None => {
                let e = self.buf.len() - partial_suffix_len(&self.buf, openers);
                self.scan_from = e;
                e
            }
        };
        let region = &self.buf[..safe_end];
        // Whitespace-only content may still become null.
        if region.trim().is_empty() {
            return;
        }
        let mut end = safe_end;
        if strip {
            if region.starts_with(char::is_whitespace) {
                return; // stripped if calls follow, kept if not: undecidable until the end
            }
            end -= trailing_ws_len(region);
        }
        if end > self.emitted {
            out.push_content(&self.buf[self.emitted..end]);
            self.emitted = end;
        }
    }

    /// Final (content, reasoning, calls) of the whole text under the request's gating.
    fn final_output(&self) -> ToolOutput {
        match &self.ctx.tool_choice {
            ToolChoice::None => {
                if !self.fmt.engine() {
                    return ToolOutput::unchanged(&self.buf);
                }
                let openers = match self.fmt.live() {
                    Live::Prefix { openers, .. } => openers,
                    Live::Hold => &[],
                };
                let cut = find_earliest(&self.buf, openers).map_or(self.buf.len(), |x| x.0);
                let c = &self.buf[..cut];
                ToolOutput {
                    content: (!c.is_empty() || self.buf.is_empty()).then(|| c.to_string()),
                    ..Default::default()
                }
            }
            // Named/required: none of the registered formats declares the structured fast path,
            // so vLLM 0.33.0 parses like auto (see corpus `hermes-tool-choice-*`).
            _ => {
                let mut o = self.fmt.parse(&self.buf, &self.ctx);
                if !self.ctx.parallel_tool_calls {
                    o.calls.truncate(1);
                }
                o
            }
        }
    }
}

impl ToolStage for FormatStage {
    fn push(&mut self, content: &str, out: &mut DeltaMessage) {
        self.present = true;
        self.buf.push_str(content);
        self.advance_live(out);
    }

    fn finish(&mut self, out: &mut DeltaMessage) {
        if !self.present {
            return;
        }
        let o = self.final_output();
        if let Some(r) = &o.reasoning {
            out.push_reasoning(r);
        }
        if let Some(c) = &o.content {
            let done = &self.buf[..self.emitted];
            if let Some(rest) = c.strip_prefix(done) {
                if !rest.is_empty() || self.emitted == 0 {
                    out.push_content(rest);
                }
            } else {
                // Cannot happen for a correct Live policy (the corpus property test checks it).
                // Emit what differs so no text is silently lost.
                let common = common_prefix_len(c, done);
                out.push_content(&c[common..]);
            }
        }
        let style = self.fmt.id_style();
        for (i, call) in o.calls.into_iter().enumerate() {
            let id = call.id.unwrap_or_else(|| gen_id(style, i));
            out.tool_calls.push(DeltaToolCall {
                index: i,
                id: Some(id),
                name: Some(call.name),
                arguments: call.arguments,
            });
        }
    }
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut n = 0;
    for ((i, x), y) in a.char_indices().zip(b.chars()) {
        if x != y {
            return i;
        }
        n = i + x.len_utf8();
    }
    n
}

/// A fresh random id in the given style.
pub fn gen_id(style: IdStyle, index: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    match style {
        IdStyle::Chatcmpl => format!("chatcmpl-tool-{:016x}", rng.random::<u64>()),
        IdStyle::Mistral => {
            const A: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
            (0..9)
                .map(|_| A[rng.random_range(0..A.len())] as char)
                .collect()
        }
        IdStyle::Xlam => {
            let u: u128 = rng.random();
            let h = format!("{u:032x}");
            format!(
                "call_{index}_{}-{}-4{}-a{}-{}",
                &h[0..8],
                &h[8..12],
                &h[13..16],
                &h[17..20],
                &h[20..32]
            )
        }
    }
}

/// The text between `open` and `close` occurrences: each `(start_of_open, inner, closed)`.
pub(crate) fn blocks<'a>(text: &'a str, open: &str, close: &str) -> Vec<(usize, &'a str, bool)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(p) = text[pos..].find(open) {
        let s = pos + p;
        let inner_start = s + open.len();
        match text[inner_start..].find(close) {
            Some(q) => {
                out.push((s, &text[inner_start..inner_start + q], true));
                pos = inner_start + q + close.len();
            }
            None => {
                out.push((s, &text[inner_start..], false));
                break;
            }
        }
    }
    out
}

/// `content if content else None`
pub(crate) fn nonempty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// Engine-style content: stripped, whitespace-only → None.
pub(crate) fn stripped(s: &str) -> Option<String> {
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_string())
}
