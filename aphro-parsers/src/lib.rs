//! Reasoning and tool-call parsers for vLLM model-output formats. Plain text in, parsed assistant
//! message out; no tokenizer, model or HTTP dependency.
//!
//! # Shape
//!
//! A parser is built per request (per choice) from the two vLLM names
//! (`--tool-call-parser`, `--reasoning-parser`) with [`ParserRegistry::new_parser`]. It is a pipeline
//! of two incremental stages (`api.md` §11 order):
//!
//! 1. a **reasoning stage** (a marker state machine for the `<think>` families, a buffered split for
//!    the frame-based formats) that splits the text into reasoning and content;
//! 2. a **tool stage** fed with the content part. Every tool format is a one-shot function over the
//!    content (the single source of truth) plus a *live-prefix policy*: content that is provably
//!    final (text before the first possible tool opener, with partial markers and ambiguous
//!    whitespace held back) is streamed as it arrives; the rest of the content is settled at
//!    [`StreamParser::finish`]. Formats whose calls can become final before the end also have an
//!    incremental *early scanner* ([`tools::EarlyScan`]) that sends a call's id and name, and its
//!    arguments or argument fragments, as soon as the format makes them certain whatever follows.
//!
//! Streaming therefore equals one-shot by construction: [`parse`] is literally `push(all)` +
//! `finish()`, and `finish()` sends only what the one-shot parse of the whole text adds to what
//! was already sent (the rest of the content, argument tails, calls not yet sent), so any other
//! cut gives the same deltas concatenated. The work is linear in the output length: the stages
//! and the early scanners keep cursors and only rescan a marker-length overlap of old text
//! (bracket matching is incremental), and the final tool parse runs once.
//!
//! # When tool calls are sent (streaming)
//!
//! | parser | call sent (id + name) | arguments |
//! |---|---|---|
//! | `kimi_k2` | at `<\|tool_call_argument_begin\|>` | verbatim fragments as they arrive; bare counter ids (`0`) whole at `<\|tool_call_end\|>` |
//! | `openai` (Harmony) | at the `<\|message\|>` of a `to=functions.NAME` message | verbatim fragments as they arrive |
//! | `mistral` | at the `{` after the name (no object: at the next `[TOOL_CALLS]`) | verbatim fragments until the object closes |
//! | `glm45`, `glm47` | when the name ends (newline / `<arg_key>`) | whole at `</tool_call>` (typed values, re-serialized) |
//! | `qwen3_coder`, `qwen3_xml`, `seed_oss` | when the name ends (`>` / newline) | whole at `</function>` or the next `<function=` |
//! | `minimax_m2` | when `name="…">` is complete | whole at `</invoke>` (or the section end) |
//! | `deepseek_v3`, `deepseek_v31`, `step3` | whole at `<｜tool▁call▁end｜>` / `<｜tool_call_end｜>` (an unclosed call is never returned) | with the call |
//! | `granite` | whole at each array object's closing `}` | with the call (the last, unterminated object at `finish()`) |
//! | `jamba`, `hunyuan_a13b` | all calls at `</tool_calls>` (the array must parse as a whole) | with the calls |
//! | `internlm` | at the first `<\|action_end\|>` | with the call |
//! | `olmo3` | all calls at `</function_calls>` (one bad line voids all) | with the calls |
//! | `phi4_mini_json` | all calls at the array's closing `]` | with the calls |
//! | `hermes`, `qwen3_json`, `longcat`, `granite4`, `ernie45` | at `finish()`: one malformed later block turns *every* call back into content | — |
//! | `llama3_json` | at `finish()`: every later `{` must decode to a call or all are void | — |
//! | `pythonic`, `llama4_pythonic` | at `finish()`: the whole output must be one call list | — |
//! | `granite-20b-fc` | at `finish()`: a later undecodable `<function_call>` voids all | — |
//! | `xlam` | at `finish()`: wrappers are tried in priority order over the whole text | — |
//!
//! Calls come out of a reasoning stage that buffers the whole frame (`hunyuan_a13b`, `granite`
//! reasoning parsers) only at `finish()`. `tool_choice: "none"` sends no calls;
//! `parallel_tool_calls: false` sends only the first.

//! # Suspending and resuming
//!
//! [`StreamParser::snapshot`] gives a serde-serializable [`ParserSnapshot`] of a stream's state;
//! [`ParserRegistry::restore`] rebuilds the parser from it (same names and [`ParserConfig`]), so
//! a stream can continue in another process. The snapshot holds only text the parser has not
//! settled (see the [`ParserSnapshot`] docs), so it stays small for ordinary answers.
//!
//! # Registry (vLLM names)
//!
//! Tool parsers (`--tool-call-parser`): `hermes`, `qwen3_json`, `longcat`, `granite4`, `ernie45`,
//! `llama3_json` (`llama4_json`), `pythonic`, `llama4_pythonic`, `olmo3`, `mistral`,
//! `deepseek_v3`, `deepseek_v31`, `glm45`, `glm47`, `kimi_k2`, `minimax_m2`, `qwen3_coder`,
//! `qwen3_xml`, `seed_oss`, `jamba`, `hunyuan_a13b`, `internlm` (`internlm2`), `xlam`,
//! `phi4_mini_json`, `granite-20b-fc`, `granite`, `step3`, `openai` (gpt-oss Harmony).
//!
//! Reasoning parsers (`--reasoning-parser`): `deepseek_r1`, `step5`, `holo2`, `deepseek_v3`,
//! `ernie45`, `step3`, `qwen3`, `glm45`, `glm47`, `kimi_k2`, `minimax_m2`,
//! `minimax_m2_append_think`, `seed_oss`, `mistral`, `hunyuan_a13b`, `granite`, `openai_gptoss`.
//!
//! # Use
//!
//! ```
//! use aphro_parsers::{ParserConfig, ParserRegistry};
//! let reg = ParserRegistry::new();
//! let ctx = ParserConfig::default();
//! let mut p = reg.new_parser(Some("hermes"), None, &ctx).unwrap();
//! let msg = aphro_parsers::parse(p.as_mut(),
//!     "Sure. <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>");
//! assert_eq!(msg.content.as_deref(), Some("Sure. "));
//! assert_eq!(msg.tool_calls[0].arguments, "{\"a\": 1}");
//! ```

mod aggregate;
mod config;
mod pipeline;
pub mod pyjson;
mod pyliteral;
pub mod reasoning;
mod registry;
mod scan;
mod snapshot;
pub mod tools;

pub use aggregate::Aggregator;
pub use config::{ParserConfig, ToolChoice};
pub use registry::{ParserRegistry, REASONING_PARSERS, TOOL_PARSERS};
pub use snapshot::{ParserSnapshot, SNAPSHOT_VERSION};

use serde::Serialize;

/// Errors building a parser.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParserError {
    #[error("unknown tool call parser {0:?}")]
    UnknownToolParser(String),
    #[error("unknown reasoning parser {0:?}")]
    UnknownReasoningParser(String),
    #[error("invalid request field: {0}")]
    InvalidConfig(String),
    /// A snapshot that does not fit the parser it is restored into (or is malformed).
    #[error("invalid parser snapshot: {0}")]
    InvalidSnapshot(String),
}

/// One streamed tool-call fragment. The first fragment of an index carries `id` and `name`;
/// later ones only argument text. Concatenating `arguments` per index gives the full string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeltaToolCall {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// What one `push`/`finish` step produced. `Some("")` is meaningful: it marks that the field
/// exists (e.g. DeepSeek-R1 returns `reasoning: ""` for `<think></think>`), so an aggregator
/// yields `Some("")` rather than `None`. A mapper to OpenAI wire deltas may drop empty strings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeltaMessage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<DeltaToolCall>,
}

impl DeltaMessage {
    /// True when the step produced nothing at all (not even an empty-string marker).
    pub fn is_empty(&self) -> bool {
        self.content.is_none() && self.reasoning.is_none() && self.tool_calls.is_empty()
    }

    pub(crate) fn push_content(&mut self, s: &str) {
        match &mut self.content {
            Some(c) => c.push_str(s),
            None => self.content = Some(s.to_string()),
        }
    }

    pub(crate) fn push_reasoning(&mut self, s: &str) {
        match &mut self.reasoning {
            Some(c) => c.push_str(s),
            None => self.reasoning = Some(s.to_string()),
        }
    }
}

/// A complete tool call. `arguments` is the JSON text exactly as vLLM returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// The parsed assistant message (non-streaming result).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ParsedMessage {
    pub content: Option<String>,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

impl ParsedMessage {
    /// Chat-level finish reason for an engine stop (`api.md` §2.6): `tool_calls` when calls were
    /// returned and `tool_choice` is not a named function, else `stop`.
    pub fn finish_reason(&self, ctx: &ParserConfig) -> &'static str {
        if !self.tool_calls.is_empty() && !matches!(ctx.tool_choice, ToolChoice::Named(_)) {
            "tool_calls"
        } else {
            "stop"
        }
    }
}

/// An incremental parser for one choice. Feed decoded text deltas with [`push`](Self::push), then
/// call [`finish`](Self::finish) once. The concatenation of all returned deltas does not depend
/// on how the text was cut.
pub trait StreamParser: Send {
    /// Feed the next piece of generated text.
    fn push(&mut self, delta: &str) -> DeltaMessage;
    /// The output ended; flush everything held back.
    fn finish(&mut self) -> DeltaMessage;
    /// The resumable state, to continue this stream elsewhere with
    /// [`ParserRegistry::restore`]; `None` if this parser cannot be suspended.
    fn snapshot(&self) -> Option<ParserSnapshot> {
        None
    }
}

/// One-shot parse: `push(text)` then `finish()`, aggregated.
pub fn parse(parser: &mut dyn StreamParser, text: &str) -> ParsedMessage {
    let mut agg = Aggregator::new();
    agg.add(&parser.push(text));
    agg.add(&parser.finish());
    agg.into_message()
}

pub use pipeline::CombinedParser;
