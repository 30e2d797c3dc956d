//! Derender request bodies (`api.md` §6, §7) and the client-carried streaming state (§6.2).
//!
//! # `DerenderStreamState` format
//!
//! vLLM's field names are all accepted on input and written on output, so a vLLM client that
//! echoes the state unchanged works as is. aphro adds one object, `aphro`, and leaves vLLM's
//! replay list `output_token_ids` empty:
//!
//! ```json
//! {"prev_tokens": [], "prefix_offset": 0, "read_offset": 3, "role_sent": true,
//!  "logprob_context_token_ids": [..≤4], "logprob_text_offset": 17,
//!  "output_token_ids": [], "output_chunk_lens": [], "tools_streamed": false,
//!  "last_tool_call_ids": [],
//!  "aphro": {"v": 2, "tokens": 42, "finished": false,
//!            "detokenizer": {"ids": [..], "read_offset": 3, "skip_special_tokens": false,
//!                            "spaces_between_special_tokens": true, "last_special": false},
//!            "parser": {"v": 1, "finished": false,
//!                       "reasoning": {"kind": "think", "phase": "content", "pending": "",
//!                                     "held_ws": "", "marked": false},
//!                       "tool": {"kind": "format", "buf": ".", "present": true, "emitted": 1,
//!                                "scan_from": 1, "blocked": false, "found": 0, "sent": [],
//!                                "scan": null}},
//!            "session": "…", "seq": 7}}
//! ```
//!
//! * `detokenizer` is the incremental detokenizer's window (a few dozen ids at most, checked on
//!   input), so decoding a chunk costs the chunk, not the history.
//! * `parser` is the tool/reasoning parser's [`aphro_parsers::ParserSnapshot`] (absent without
//!   a parser): each stage's phase, a few counters, and only the text the parser has not
//!   settled — a partial marker, one character of sent content as context, and, once a tool-call
//!   marker appeared, the text from it on (most formats settle calls with one parse of that tail
//!   at the end, because later text can still change or void them). Content and reasoning
//!   already sent are not carried, so for an ordinary answer the state stays a few hundred
//!   bytes at any output length, and a call costs O(chunk): the server rebuilds the parser from
//!   the names it is configured with plus the request's parser settings, and sets it to the
//!   snapshot. What still grows is inherent to the formats: the call section while calls are
//!   generated, the whole output for frame-based reasoning (`hunyuan_a13b`, `granite`) and for
//!   formats that settle everything at the end (`pythonic`, `llama3_json`, `xlam`, `openai`
//!   …), and content that opens with whitespace under a stripping format (`qwen3_coder`,
//!   `mistral`, `glm45`, …: stripped if a call follows, kept if not). A snapshot that does not
//!   fit the configured parsers (another parser, offsets outside its text, another version) is
//!   a 400. vLLM replays every earlier chunk through the tokenizer and `parse_delta` instead.
//! * `session` and `seq` let the server that issued the state resume its live copy (an LRU of
//!   open streams) without decoding `parser`; another server, or an evicted or replayed state,
//!   restores from `parser`, so the state stays portable.
//! * `tokens` counts generated tokens (for the `max_model_len` limit and usage).
//! * Version 1 states (which carried the parser's input text) are refused with a 400.
//! * A state without `aphro` but with vLLM's `output_token_ids` (e.g. produced by a vLLM
//!   server) is accepted: the ids are decoded once to rebuild the same state.
use super::response::{
    ChatCompletionChunk, ChatCompletionResponse, CompletionChunk, CompletionResponse,
    GenerateResponse, GenerateStreamResponse,
};
use super::{ChatCompletionRequest, CompletionRequest};
use crate::detokenizer::DetokenizerState;
use crate::error::{Error, Result};
use aphro_parsers::ParserSnapshot;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

/// `POST /v1/chat/completions/derender`, non-streaming (§6.1).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DerenderChatRequest {
    #[serde(default)]
    #[schema(schema_with = super::schema::stream_false)]
    pub stream: bool,
    #[serde(default)]
    pub model: Option<String>,
    pub generate_response: GenerateResponse,
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub chat_request: Option<ChatCompletionRequest>,
}

/// `POST /v1/chat/completions/derender`, streaming: one call per generate event (§6.2).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DerenderChatStreamRequest {
    #[schema(schema_with = super::schema::stream_true)]
    pub stream: bool,
    #[serde(default)]
    pub model: Option<String>,
    pub generate_chunk: GenerateStreamResponse,
    #[serde(default)]
    pub stream_state: Option<DerenderStreamState>,
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub chat_request: Option<ChatCompletionRequest>,
}

/// Streaming chat derender response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DerenderChatStreamResponse {
    pub chunk: ChatCompletionChunk,
    pub stream_state: DerenderStreamState,
}

/// `POST /v1/completions/derender`, non-streaming (§7).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DerenderCompletionRequest {
    #[serde(default)]
    #[schema(schema_with = super::schema::stream_false)]
    pub stream: bool,
    #[serde(default)]
    pub model: Option<String>,
    pub generate_responses: Vec<GenerateResponse>,
    #[serde(default)]
    pub prompt_tokens: Option<Vec<u64>>,
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<Option<Vec<u32>>>>,
    #[serde(default)]
    pub completion_request: Option<CompletionRequest>,
}

/// `POST /v1/completions/derender`, streaming (§7).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DerenderCompletionStreamRequest {
    #[schema(schema_with = super::schema::stream_true)]
    pub stream: bool,
    #[serde(default)]
    pub model: Option<String>,
    pub generate_chunk: GenerateStreamResponse,
    #[serde(default)]
    pub stream_state: Option<DerenderStreamState>,
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub completion_request: Option<CompletionRequest>,
}

/// Streaming completion derender response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DerenderCompletionStreamResponse {
    pub chunk: CompletionChunk,
    pub stream_state: DerenderStreamState,
}

/// The client-carried state of the stateless streaming form; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DerenderStreamState {
    #[serde(default)]
    pub prev_tokens: Vec<String>,
    #[serde(default)]
    pub prefix_offset: usize,
    #[serde(default)]
    pub read_offset: usize,
    #[serde(default)]
    pub role_sent: bool,
    #[serde(default)]
    pub logprob_context_token_ids: Vec<u32>,
    #[serde(default)]
    pub logprob_text_offset: u64,
    #[serde(default)]
    pub output_token_ids: Vec<u32>,
    #[serde(default)]
    pub output_chunk_lens: Vec<usize>,
    #[serde(default)]
    pub tools_streamed: bool,
    #[serde(default)]
    pub last_tool_call_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aphro: Option<AphroStreamState>,
}

/// aphro's compact resumable state (module docs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AphroStreamState {
    #[serde(default = "current_version")]
    pub v: u32,
    /// Generated tokens seen so far.
    #[serde(default)]
    pub tokens: u64,
    /// A finish reason was seen; further chunks produce nothing but usage.
    #[serde(default)]
    pub finished: bool,
    pub detokenizer: DetokenizerState,
    /// The parser's resumable state (absent without a parser); opaque, echo it unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub parser: Option<ParserSnapshot>,
    /// Names this stream's live state on the server that issued it; with `seq` it lets that
    /// server resume without even decoding `parser`.
    /// Any other server (or a miss) falls back to the rebuild, so the state stays portable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Calls answered so far in this session.
    #[serde(default)]
    pub seq: u64,
}

/// Version of [`AphroStreamState`] written and accepted (1 carried the parser's input text).
pub const STREAM_STATE_VERSION: u32 = 2;

fn current_version() -> u32 {
    STREAM_STATE_VERSION
}

/// A chat derender body: the `stream` literal discriminates (missing ⇒ non-streaming).
#[derive(Debug, Clone)]
pub enum DerenderChatBody {
    Full(Box<DerenderChatRequest>),
    Stream(Box<DerenderChatStreamRequest>),
}

/// A completion derender body.
#[derive(Debug, Clone)]
pub enum DerenderCompletionBody {
    Full(Box<DerenderCompletionRequest>),
    Stream(Box<DerenderCompletionStreamRequest>),
}

/// The body `parse_derender_*_body` reads: one of two forms, told apart by `stream`.
macro_rules! body_schema {
    ($body:ty, $full:ty, $stream:ty, $what:literal) => {
        impl PartialSchema for $body {
            fn schema() -> RefOr<Schema> {
                super::schema::one_of(
                    [
                        super::schema::reference::<$full>(),
                        super::schema::reference::<$stream>(),
                    ],
                    $what,
                )
                .into()
            }
        }

        impl ToSchema for $body {
            fn schemas(out: &mut Vec<(String, RefOr<Schema>)>) {
                super::schema::collect::<$full>(out);
                super::schema::collect::<$stream>(out);
            }
        }
    };
}

body_schema!(
    DerenderChatBody,
    DerenderChatRequest,
    DerenderChatStreamRequest,
    "The whole generate response (`stream` false or absent), or one generate stream event \
     with the state the previous call returned (`stream: true`)."
);
body_schema!(
    DerenderCompletionBody,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    "The generate responses of every prompt (`stream` false or absent), or one generate \
     stream event with the state the previous call returned (`stream: true`)."
);

/// What the chat derender route answers: the chat response, or one chunk and the state
/// for the next call.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum DerenderChatOutput {
    Full(Box<ChatCompletionResponse>),
    Stream(Box<DerenderChatStreamResponse>),
}

/// What the completion derender route answers (see [`DerenderChatOutput`]).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum DerenderCompletionOutput {
    Full(Box<CompletionResponse>),
    Stream(Box<DerenderCompletionStreamResponse>),
}

fn is_stream(body: &Value) -> Result<bool> {
    match body.get("stream") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(false),
        Some(Value::Bool(true)) => Ok(true),
        Some(_) => Err(Error::validation(
            "1 validation error:\n  stream: Input should be a valid boolean",
            Some("body.stream"),
        )),
    }
}

fn structural(branch: &str, e: &serde_json::Error) -> Error {
    let msg = e.to_string();
    let field = if msg.contains("missing field") {
        msg.split('`').nth(1).unwrap_or("").to_owned()
    } else {
        String::new()
    };
    let param = if field.is_empty() {
        format!("body.{branch}")
    } else {
        format!("body.{branch}.{field}")
    };
    Error::validation(
        format!("1 validation error:\n  {param}: {msg}"),
        Some(&param),
    )
}

/// Rejects a generate response whose `output_mode` is not `tokens` (§6.1: 400/val).
fn check_tokens_mode(mode: Option<&str>, branch: &str, what: &str) -> Result<()> {
    match mode {
        None | Some("tokens") => Ok(()),
        Some(m) => {
            let param = format!("body.{branch}.{what}.output_mode");
            Err(Error::validation(
                format!(
                    "1 validation error:\n  {param}: Input should be 'tokens' (got '{m}'); \
                     derender takes a tokens-mode generate response"
                ),
                Some(&param),
            ))
        }
    }
}

/// Parses a chat derender body (structural errors are 400 `Bad Request`).
pub fn parse_derender_chat_body(body: &Value) -> Result<DerenderChatBody> {
    if !body.is_object() {
        return Err(Error::validation(
            "1 validation error:\n  body: Input should be a valid dictionary",
            Some("body"),
        ));
    }
    if is_stream(body)? {
        check_tokens_mode(
            body.pointer("/generate_chunk/output_mode")
                .and_then(Value::as_str),
            "DerenderChatStreamRequest",
            "generate_chunk",
        )?;
        let r: DerenderChatStreamRequest = serde_json::from_value(body.clone())
            .map_err(|e| structural("DerenderChatStreamRequest", &e))?;
        Ok(DerenderChatBody::Stream(Box::new(r)))
    } else {
        check_tokens_mode(
            body.pointer("/generate_response/output_mode")
                .and_then(Value::as_str),
            "DerenderChatRequest",
            "generate_response",
        )?;
        let r: DerenderChatRequest = serde_json::from_value(body.clone())
            .map_err(|e| structural("DerenderChatRequest", &e))?;
        Ok(DerenderChatBody::Full(Box::new(r)))
    }
}

/// Parses a completion derender body.
pub fn parse_derender_completion_body(body: &Value) -> Result<DerenderCompletionBody> {
    if !body.is_object() {
        return Err(Error::validation(
            "1 validation error:\n  body: Input should be a valid dictionary",
            Some("body"),
        ));
    }
    if is_stream(body)? {
        check_tokens_mode(
            body.pointer("/generate_chunk/output_mode")
                .and_then(Value::as_str),
            "DerenderCompletionStreamRequest",
            "generate_chunk",
        )?;
        let r: DerenderCompletionStreamRequest = serde_json::from_value(body.clone())
            .map_err(|e| structural("DerenderCompletionStreamRequest", &e))?;
        Ok(DerenderCompletionBody::Stream(Box::new(r)))
    } else {
        if let Some(arr) = body.get("generate_responses").and_then(Value::as_array) {
            for (i, g) in arr.iter().enumerate() {
                check_tokens_mode(
                    g.get("output_mode").and_then(Value::as_str),
                    "DerenderCompletionRequest",
                    &format!("generate_responses.{i}"),
                )?;
            }
        }
        let r: DerenderCompletionRequest = serde_json::from_value(body.clone())
            .map_err(|e| structural("DerenderCompletionRequest", &e))?;
        Ok(DerenderCompletionBody::Full(Box::new(r)))
    }
}
