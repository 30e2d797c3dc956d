//! Tool-call formats. Each format is a one-shot function over the content text
//! ([`ToolFormat::parse`], the single source of truth) plus a [`Live`] policy saying which content
//! may be streamed before the output ends, and, where calls can become final before the end, an
//! [`EarlyScan`] that reports them as they do. [`FormatStage`] is the incremental driver shared
//! by all formats.
use crate::config::{ParserConfig, ToolChoice};
use crate::scan::{find_earliest, is_py_space, partial_suffix_len, py_strip, trailing_ws_len};
pub(crate) use crate::snapshot::ScanSnapshot;
use crate::snapshot::{FormatSnapshot, SentCall, ToolSnapshot};
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
    /// vLLM runs this parser behind `DelegatingParser` (`vllm/parser/abstract_parser.py`),
    /// whose `_extract_tool_calls` post-processes the content (whitespace-only content with
    /// calls → null). False for gpt-oss, whose `HarmonyParser` returns its own content.
    fn delegated(&self) -> bool {
        true
    }
    /// The incremental scanner that reports calls before the end of the output, for formats
    /// where a call can become final early (see [`EarlyScan`]). `None`: calls at `finish()`.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        None
    }
}

/// What became certain about the calls while the output is still running. Every event must
/// agree with what [`ToolFormat::parse`] returns on the *complete* text, whatever follows:
/// [`FormatStage`] reconciles at `finish()` by emitting only what is still missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Early {
    /// The next call (in the format's own order, before `parallel_tool_calls` gating) exists
    /// with this name (and format-defined id); `args` is a certain prefix of its arguments
    /// (often `""`, or the whole string when the call is reported at its closing marker).
    Call {
        name: String,
        id: Option<String>,
        args: String,
    },
    /// More certain argument text of the last reported call.
    Args(String),
}

/// A per-request incremental scanner over the growing content text. `scan` is called after each
/// push with the whole buffer so far (it only grows); implementations keep cursors and search
/// hints so each byte is examined a bounded number of times (linear streaming).
pub trait EarlyScan: Send {
    fn scan(&mut self, buf: &str, ctx: &ParserConfig, out: &mut Vec<Early>);
    /// The scanner's state (offsets absolute in the buffer).
    fn save(&self) -> ScanSnapshot;
    /// Takes over a saved state; `false` if it belongs to another kind of scanner.
    fn load(&mut self, s: ScanSnapshot) -> bool;
}

/// Earliest of `markers` in `buf[*from..]` (absolute position, marker index). When none is
/// found, `*from` moves to the first position where a marker could still start, so a later call
/// does not rescan text already known to hold none.
pub(crate) fn seek(buf: &str, from: &mut usize, markers: &[&str]) -> Option<(usize, usize)> {
    let start = (*from).min(buf.len());
    let max = markers.iter().map(|m| m.len()).max().unwrap_or(1);
    // Search a window that doubles until it holds a match no longer marker could precede:
    // the cost stays proportional to the distance to the match even when some marker does not
    // occur at all (a plain search per marker would run to the end of the text for each call
    // found in one big push, i.e. quadratic one-shot parsing).
    let mut w = 256usize;
    loop {
        let mut end = start.saturating_add(w).min(buf.len());
        while !buf.is_char_boundary(end) {
            end += 1;
        }
        if let Some((p, i)) = find_earliest(&buf[start..end], markers) {
            if end == buf.len() || start + p + max <= end {
                return Some((start + p, i));
            }
        }
        if end == buf.len() {
            break;
        }
        w = w.saturating_mul(2);
    }
    let mut f = buf.len().saturating_sub(max.saturating_sub(1)).max(start);
    while !buf.is_char_boundary(f) {
        f += 1;
    }
    *from = f;
    None
}

/// End of the text that cannot be the start of one of `markers` (a partial marker at the end
/// of `buf` is held back), never before `floor`.
pub(crate) fn safe_end(buf: &str, floor: usize, markers: &[&str]) -> usize {
    (buf.len() - partial_suffix_len(buf, markers)).max(floor)
}

/// Formats whose calls are closed blocks `CALL_BEGIN … CALL_END` after a section opener, each
/// call a function of its block alone (DeepSeek-V3/V3.1, Step-3): a call is reported in full
/// when its closing marker arrives. An unclosed block is never a call in these formats, so
/// nothing can be reported earlier.
pub(crate) struct ClosedBlocks {
    pub begin: &'static str,
    pub call_begin: &'static str,
    pub call_end: &'static str,
    /// Section end: blocks after it are not calls (and a block it cuts is unclosed).
    pub section_end: Option<&'static str>,
    pub block: fn(&str, &ParserConfig) -> Option<RawCall>,
    pub state: BlockState,
    pub from: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    Begin,
    Between,
    Inner(usize),
    Done,
}

impl ClosedBlocks {
    pub(crate) fn new(
        begin: &'static str,
        call_begin: &'static str,
        call_end: &'static str,
        section_end: Option<&'static str>,
        block: fn(&str, &ParserConfig) -> Option<RawCall>,
    ) -> Self {
        Self {
            begin,
            call_begin,
            call_end,
            section_end,
            block,
            state: BlockState::Begin,
            from: 0,
        }
    }
}

impl EarlyScan for ClosedBlocks {
    fn save(&self) -> ScanSnapshot {
        ScanSnapshot::Closed {
            state: self.state,
            from: self.from,
        }
    }

    fn load(&mut self, s: ScanSnapshot) -> bool {
        match s {
            ScanSnapshot::Closed { state, from } => {
                self.state = state;
                self.from = from;
                true
            }
            _ => false,
        }
    }

    fn scan(&mut self, buf: &str, ctx: &ParserConfig, out: &mut Vec<Early>) {
        loop {
            match self.state {
                BlockState::Done => return,
                BlockState::Begin => {
                    let Some((p, _)) = seek(buf, &mut self.from, &[self.begin]) else {
                        return;
                    };
                    self.from = p + self.begin.len();
                    self.state = BlockState::Between;
                }
                BlockState::Between => {
                    let end = self.section_end.unwrap_or(self.call_begin);
                    let Some((p, i)) = seek(buf, &mut self.from, &[self.call_begin, end]) else {
                        return;
                    };
                    if i == 1 && self.section_end.is_some() {
                        self.state = BlockState::Done;
                    } else {
                        self.from = p + self.call_begin.len();
                        self.state = BlockState::Inner(self.from);
                    }
                }
                BlockState::Inner(start) => {
                    let end = self.section_end.unwrap_or(self.call_end);
                    let Some((p, i)) = seek(buf, &mut self.from, &[self.call_end, end]) else {
                        return;
                    };
                    if i == 1 && self.section_end.is_some() {
                        self.state = BlockState::Done;
                        continue;
                    }
                    if let Some(c) = (self.block)(&buf[start..p], ctx) {
                        out.push(Early::Call {
                            name: c.name,
                            id: c.id,
                            args: c.arguments,
                        });
                    }
                    self.from = p + self.call_end.len();
                    self.state = BlockState::Between;
                }
            }
        }
    }
}

/// Formats whose calls depend only on the text up to a closing point (a marker, or the end of
/// a bracketed JSON value) while their result as a whole may still depend on more: once that
/// point arrives, the format's own one-shot parse of the text up to it gives the final calls
/// (jamba, hunyuan_a13b, internlm, olmo3, phi4_mini_json). Runs the parse once.
pub(crate) struct UpTo {
    pub open: &'static str,
    pub close: Close,
    pub parse: fn(&str, &ParserConfig) -> ToolOutput,
    from: usize,
    inner: Option<usize>,
    bal: crate::pyjson::Balance,
    done: bool,
}

/// Where the calls of an [`UpTo`] format become final.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Close {
    /// The first occurrence of this marker after the opener (inclusive).
    Marker(&'static str),
    /// The end of the balanced JSON value starting at the last byte of the opener.
    Bracket,
}

impl UpTo {
    pub(crate) fn new(
        open: &'static str,
        close: Close,
        parse: fn(&str, &ParserConfig) -> ToolOutput,
    ) -> Self {
        Self {
            open,
            close,
            parse,
            from: 0,
            inner: None,
            bal: Default::default(),
            done: false,
        }
    }
}

impl EarlyScan for UpTo {
    fn save(&self) -> ScanSnapshot {
        ScanSnapshot::UpTo {
            from: self.from,
            inner: self.inner,
            bal: self.bal.clone(),
            done: self.done,
        }
    }

    fn load(&mut self, s: ScanSnapshot) -> bool {
        match s {
            ScanSnapshot::UpTo {
                from,
                inner,
                bal,
                done,
            } => {
                self.from = from;
                self.inner = inner;
                self.bal = bal;
                self.done = done;
                true
            }
            _ => false,
        }
    }

    fn scan(&mut self, buf: &str, ctx: &ParserConfig, out: &mut Vec<Early>) {
        if self.done {
            return;
        }
        let inner = match self.inner {
            Some(i) => i,
            None => {
                let Some((p, _)) = seek(buf, &mut self.from, &[self.open]) else {
                    return;
                };
                let i = p + self.open.len();
                self.inner = Some(i);
                self.from = i;
                i
            }
        };
        let end = match self.close {
            Close::Marker(m) => match seek(buf, &mut self.from, &[m]) {
                Some((p, _)) => p + m.len(),
                None => return,
            },
            Close::Bracket => {
                // The opener ends with the bracket; balance from it.
                // Checked: `inner` and the balance come from a snapshot on resume.
                let Some(rest) = inner
                    .checked_sub(1)
                    .and_then(|o| o.checked_add(self.bal.fed()))
                    .and_then(|start| buf.as_bytes().get(start..))
                else {
                    return;
                };
                match self.bal.feed(rest) {
                    Some(n) => match (inner - 1).checked_add(n) {
                        Some(e) => e,
                        None => return,
                    },
                    None => return,
                }
            }
        };
        let Some(text) = buf.get(..end) else {
            return;
        };
        self.done = true;
        let o = (self.parse)(text, ctx);
        for c in o.calls {
            out.push(Early::Call {
                name: c.name,
                id: c.id,
                args: c.arguments,
            });
        }
    }
}

/// The tool stage of the pipeline.
pub trait ToolStage: Send {
    fn push(&mut self, content: &str, out: &mut DeltaMessage);
    fn finish(&mut self, out: &mut DeltaMessage);
    /// The resumable state (see [`crate::ParserSnapshot`]).
    fn snapshot(&self) -> ToolSnapshot;
    /// Takes over a snapshot taken from a stage of the same configuration.
    fn restore(&mut self, s: ToolSnapshot) -> Result<(), String>;
}

/// No tool parser configured: content passes straight through.
#[derive(Debug, Default)]
pub struct NoTools;

impl ToolStage for NoTools {
    fn push(&mut self, content: &str, out: &mut DeltaMessage) {
        out.push_content(content);
    }
    fn finish(&mut self, _out: &mut DeltaMessage) {}
    fn snapshot(&self) -> ToolSnapshot {
        ToolSnapshot::None
    }
    fn restore(&mut self, s: ToolSnapshot) -> Result<(), String> {
        match s {
            ToolSnapshot::None => Ok(()),
            ToolSnapshot::Format(_) => Err("a tool parser state, but no tool parser".into()),
        }
    }
}

/// Incremental driver for a [`ToolFormat`]: streams the provably final content prefix and the
/// calls its [`EarlyScan`] reports as certain, buffers the rest, parses once at `finish`, then
/// emits the remaining content, the argument tails of calls already sent, and the other calls.
pub struct FormatStage {
    fmt: Arc<dyn ToolFormat>,
    ctx: Arc<ParserConfig>,
    buf: String,
    present: bool,
    emitted: usize,
    scan_from: usize,
    blocked: bool,
    /// Early call scanner (`None` with `tool_choice: "none"` or for finish-only formats).
    early: Option<Box<dyn EarlyScan>>,
    events: Vec<Early>,
    /// Calls reported by the scanner so far (before gating).
    found: usize,
    /// Calls already sent, by index: (name, bytes of arguments sent so far).
    sent: Vec<(String, usize)>,
}

impl FormatStage {
    pub fn new(fmt: Arc<dyn ToolFormat>, ctx: Arc<ParserConfig>) -> Self {
        let early = match ctx.tool_choice {
            ToolChoice::None => None,
            _ => fmt.early(),
        };
        Self {
            fmt,
            ctx,
            buf: String::new(),
            present: false,
            emitted: 0,
            scan_from: 0,
            blocked: false,
            early,
            events: Vec::new(),
            found: 0,
            sent: Vec::new(),
        }
    }

    /// Runs the early scanner and sends what became certain: a call's id and name (with the
    /// certain start of its arguments) as soon as the format makes the call final, then
    /// argument fragments.
    fn advance_calls(&mut self, out: &mut DeltaMessage) {
        let Some(sc) = self.early.as_mut() else {
            return;
        };
        sc.scan(&self.buf, &self.ctx, &mut self.events);
        let limit = if self.ctx.parallel_tool_calls {
            usize::MAX
        } else {
            1
        };
        let style = self.fmt.id_style();
        for ev in self.events.drain(..) {
            match ev {
                Early::Call { name, id, args } => {
                    let index = self.found;
                    self.found = self.found.saturating_add(1);
                    if index >= limit {
                        continue;
                    }
                    let id = id.unwrap_or_else(|| gen_id(style, index));
                    out.tool_calls.push(DeltaToolCall {
                        index,
                        id: Some(id),
                        name: Some(name.clone()),
                        arguments: args.clone(),
                    });
                    self.sent.push((name, args.len()));
                }
                Early::Args(a) => {
                    let index = self.found.wrapping_sub(1);
                    if a.is_empty() || index >= limit || index >= self.sent.len() {
                        continue;
                    }
                    // Saturating: a restored snapshot may carry any count.
                    self.sent[index].1 = self.sent[index].1.saturating_add(a.len());
                    match out.tool_calls.last_mut() {
                        Some(last) if last.index == index => last.arguments.push_str(&a),
                        _ => out.tool_calls.push(DeltaToolCall {
                            index,
                            id: None,
                            name: None,
                            arguments: a,
                        }),
                    }
                }
            }
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
        // Once some content went out, the region passed the checks below for good (it only
        // grows); a restored stage no longer holds the start of that content.
        if self.emitted == 0 {
            // Whitespace-only content may still become null.
            if py_strip(region).is_empty() {
                return;
            }
            if strip && region.starts_with(is_py_space) {
                return; // stripped if calls follow, kept if not: undecidable until the end
            }
        }
        let mut end = safe_end;
        if strip {
            end -= trailing_ws_len(region);
        }
        if end > self.emitted {
            out.push_content(&self.buf[self.emitted..end]);
            self.emitted = end;
        }
    }

    /// `tool_choice` `required` or a named function: the message always has a content string.
    fn forced(&self) -> bool {
        matches!(
            self.ctx.tool_choice,
            ToolChoice::Required | ToolChoice::Named(_)
        )
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
                // `_strip_content_whitespace` ends in `content or None`.
                ToolOutput {
                    content: nonempty(c),
                    ..Default::default()
                }
            }
            // Named/required: none of the registered formats declares the structured fast path,
            // so vLLM 0.33.0 parses like auto (see corpus `hermes-tool-choice-*`).
            _ => {
                let mut o = self.fmt.parse(&self.buf, &self.ctx);
                let blank = o.content.as_deref().is_some_and(|c| py_strip(c).is_empty());
                if self.fmt.delegated() {
                    // `DelegatingParser._extract_tool_calls`: with calls,
                    // `if content and content.strip() == "": content = None` ("" stays "").
                    if !o.calls.is_empty() && blank && o.content.as_deref() != Some("") {
                        o.content = None;
                    }
                    // No calls from an engine parser: `tool_call_info.content or None`.
                    if o.calls.is_empty() && self.fmt.engine() && o.content.as_deref() == Some("") {
                        o.content = None;
                    }
                }
                if self.forced() {
                    // Required/named parsed like auto with no call: None or whitespace-only
                    // content → None (`_extract_tool_calls`); message assembly
                    // (`chat_completion/message_assembly.py`) then sends `content or ""`.
                    if o.content.is_none() || (self.fmt.delegated() && blank) {
                        o.content = Some(String::new());
                    }
                }
                if !self.ctx.parallel_tool_calls {
                    o.calls.truncate(1);
                }
                o
            }
        }
    }
}

impl ToolStage for FormatStage {
    /// Drops the content already sent (but its last character, the context the final parse
    /// needs: every `Live::Prefix` format's result on `P + T`, with `P` sent content holding no
    /// opener, is `P` minus its last char `c` followed by its result on `c + T`; for stripping
    /// formats `c` is not whitespace) and everything the scanner will not read again.
    fn snapshot(&self) -> ToolSnapshot {
        let mut k = match self.buf[..self.emitted].char_indices().next_back() {
            Some((i, _)) => i,
            None => 0,
        };
        if !self.blocked {
            k = k.min(self.scan_from);
        }
        let scan = self.early.as_ref().map(|s| {
            let s = s.save();
            k = k.min(s.min_offset());
            s
        });
        let scan = scan.map(|mut s| {
            s.rebase(k);
            s
        });
        ToolSnapshot::Format(FormatSnapshot {
            buf: self.buf[k..].to_string(),
            present: self.present,
            emitted: self.emitted - k,
            scan_from: if self.blocked { 0 } else { self.scan_from - k },
            blocked: self.blocked,
            found: self.found,
            sent: self
                .sent
                .iter()
                .map(|(name, args)| SentCall {
                    name: name.clone(),
                    args: *args,
                })
                .collect(),
            scan,
        })
    }

    fn restore(&mut self, s: ToolSnapshot) -> Result<(), String> {
        let ToolSnapshot::Format(f) = s else {
            return Err("no tool parser state for the configured tool parser".into());
        };
        let at = |o: usize| o <= f.buf.len() && f.buf.is_char_boundary(o);
        if !at(f.emitted) || !at(f.scan_from) {
            return Err("tool parser offsets outside the held text".into());
        }
        // Every call found starts with a marker still in the held text.
        if f.sent.len() > f.found || f.found > f.buf.len() {
            return Err("tool call counts do not fit the held text".into());
        }
        match (self.early.as_mut(), f.scan) {
            (None, None) => {}
            (Some(sc), Some(snap)) => {
                if !snap.fits(&f.buf) {
                    return Err("tool call scanner offsets outside the held text".into());
                }
                if !sc.load(snap) {
                    return Err("tool call scanner state of another format".into());
                }
            }
            _ => return Err("tool call scanner state does not match the tool parser".into()),
        }
        self.buf = f.buf;
        self.present = f.present;
        self.emitted = f.emitted;
        self.scan_from = f.scan_from;
        self.blocked = f.blocked;
        self.found = f.found;
        self.sent = f.sent.into_iter().map(|c| (c.name, c.args)).collect();
        Ok(())
    }

    fn push(&mut self, content: &str, out: &mut DeltaMessage) {
        self.present = true;
        self.buf.push_str(content);
        self.advance_live(out);
        self.advance_calls(out);
    }

    fn finish(&mut self, out: &mut DeltaMessage) {
        if !self.present {
            // No content at all (the reasoning took everything): forced choices still get "".
            if self.forced() {
                out.push_content("");
            }
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
            if let Some((name, sent)) = self.sent.get(i) {
                // Sent early: only the rest of the arguments is missing. The scanners report
                // only what the one-shot parse confirms (the property test checks every cut);
                // should they ever disagree, the whole arguments are sent so nothing is lost.
                let rest = match call.arguments.get(*sent..) {
                    Some(r) if *name == call.name => r,
                    _ => call.arguments.as_str(),
                };
                if !rest.is_empty() {
                    out.tool_calls.push(DeltaToolCall {
                        index: i,
                        id: None,
                        name: None,
                        arguments: rest.to_string(),
                    });
                }
                continue;
            }
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
    let t = py_strip(s);
    (!t.is_empty()).then(|| t.to_string())
}
