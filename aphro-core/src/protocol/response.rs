//! Response shapes: generate (`output_mode` `tokens`, `text` and `derender`, `api.md`
//! §4.2–4.3), chat completions (§8.1) and completions (§8.2), with the logprob shapes of §2.4
//! and `UsageInfo` (§2.1).
//!
//! The generate shapes are the one set both sides use: the engine builds them and the
//! derenderer (in process, or reading a remote engine's JSON) consumes them, so the
//! integrated server hands the engine's values to the derenderer as they are.
//!
//! Serialization follows the spec's null rules: non-streaming responses and the derender stream
//! chunks are full dumps (every key, nulls included) except where a comment says a key is
//! omitted (`tool_calls` when empty, §2.5; a generate choice's `text` and `message` outside
//! their output mode; the generate stream's first-event-only keys). Deserialization is
//! lenient the way vLLM's pydantic models are: a missing key takes its default.
//!
//! Schemas: in the chat and completion shapes a key every dump writes, even as `null`, is
//! `required` (and nullable); a key left out unless set is optional. The chat stream chunk is
//! also what the coupled `/v1/chat/completions` stream sends with vLLM's `exclude_unset`, so
//! its keys that stream leaves out are optional. The generate shapes and `UsageInfo` are
//! also what derender reads, where every key but `request_id` and `choices` may be missing,
//! so their schemas require only those; that the engine writes every key is asserted by the
//! engine's and the server's tests, not by the schema.
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

/// `UsageInfo` (§2.1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageInfo {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub prompt_tokens_details: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub completion_tokens_details: Option<Value>,
}

impl UsageInfo {
    /// The counts of a finished request, with no details.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens: Some(completion_tokens),
            prompt_tokens_details: None,
            completion_tokens_details: None,
        }
    }
}

/// `UsageInfo` with nulls excluded: the final usage-only event of a generate stream is dumped
/// with `exclude_none`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageInfoSparse {
    pub prompt_tokens: u64,
    pub total_tokens: u64,
    pub completion_tokens: u64,
}

/// `stop_reason`: the matched stop string or the stop token id (§2.6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopReason {
    Token(u32),
    Text(String),
}

/// One candidate of a tokens-mode logprob entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateTopLogProb {
    pub token_id: u32,
    pub logprob: f64,
    #[serde(default)]
    pub rank: Option<i64>,
}

/// One generated position of `GenerateLogProbs.content`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateLogProb {
    pub token_id: u32,
    #[serde(default = "neg_9999")]
    pub logprob: f64,
    #[serde(default)]
    pub rank: Option<i64>,
    /// Engine order: the chosen token first, then the candidates by rank (not cut).
    #[serde(default)]
    pub top_logprobs: Vec<GenerateTopLogProb>,
}

fn neg_9999() -> f64 {
    -9999.0
}

/// vLLM's floor for a logprob: `-inf` and NaN become `-9999.0`.
pub fn clamp_logprob(v: f32) -> f64 {
    if v.is_nan() {
        -9999.0
    } else {
        (v as f64).max(-9999.0)
    }
}

/// `GenerateLogProbs` (§2.4, `output_mode: "tokens"`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateLogProbs {
    #[serde(default)]
    pub content: Option<Vec<GenerateLogProb>>,
}

/// Logprobs of a generate choice: the tokens shape, or the chat shape with
/// `output_mode: "text"|"derender"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChoiceLogProbs {
    Tokens(GenerateLogProbs),
    Chat(ChatCompletionLogProbs),
}

/// An `anyOf` of component schemas: for untagged enums whose variants overlap, where
/// utoipa's `oneOf` would reject a value that fits more than one.
fn any_of(description: &str, names: &[std::borrow::Cow<'static, str>]) -> RefOr<Schema> {
    let mut any =
        utoipa::openapi::schema::AnyOfBuilder::new().description(Some(description.to_owned()));
    for name in names {
        any = any.item(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
            name.clone(),
        )));
    }
    RefOr::T(any.into())
}

/// `{"content": null}` has both shapes.
impl PartialSchema for ChoiceLogProbs {
    fn schema() -> RefOr<Schema> {
        any_of(
            "`GenerateLogProbs` with `output_mode: \"tokens\"`, the chat shape otherwise.",
            &[GenerateLogProbs::name(), ChatCompletionLogProbs::name()],
        )
    }
}

impl ToSchema for ChoiceLogProbs {
    fn schemas(out: &mut Vec<(String, RefOr<Schema>)>) {
        out.push((
            GenerateLogProbs::name().into_owned(),
            GenerateLogProbs::schema(),
        ));
        out.push((
            ChatCompletionLogProbs::name().into_owned(),
            ChatCompletionLogProbs::schema(),
        ));
        GenerateLogProbs::schemas(out);
        ChatCompletionLogProbs::schemas(out);
    }
}

impl ChoiceLogProbs {
    /// The tokens shape, which is all derender reads; `None` for the chat shape.
    pub fn tokens(&self) -> Option<&GenerateLogProbs> {
        match self {
            ChoiceLogProbs::Tokens(t) => Some(t),
            ChoiceLogProbs::Chat(_) => None,
        }
    }

    /// Append `other`'s entries (same shape) to `self`.
    pub fn extend(&mut self, other: ChoiceLogProbs) {
        match (self, other) {
            (ChoiceLogProbs::Tokens(a), ChoiceLogProbs::Tokens(b)) => a
                .content
                .get_or_insert_with(Vec::new)
                .extend(b.content.unwrap_or_default()),
            (ChoiceLogProbs::Chat(a), ChoiceLogProbs::Chat(b)) => a
                .content
                .get_or_insert_with(Vec::new)
                .extend(b.content.unwrap_or_default()),
            _ => {}
        }
    }
}

/// A choice of a generate response (§4.2) or stream event (§4.3; there `token_ids`,
/// `logprobs` and `text` are the delta of this step, and `message` is never set).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateChoice {
    #[serde(default)]
    pub index: usize,
    /// `output_mode: "text"` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `output_mode: "derender"` only (non-streaming).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<ResponseMessage>,
    #[serde(default)]
    pub logprobs: Option<ChoiceLogProbs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// Every generated id, including a stop token / the ids of a stop string.
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub routed_experts: Option<String>,
    #[serde(default)]
    pub sampling_mask: Option<Vec<Vec<u32>>>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub weight_versions: Option<Value>,
}

/// `GenerateResponse` (§4.2), a full dump. `output_mode` is kept so that a `text`/`derender`
/// response handed to derender can be rejected (§6.1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateResponse {
    pub request_id: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub created: Option<i64>,
    #[serde(default)]
    pub output_mode: Option<String>,
    pub choices: Vec<GenerateChoice>,
    #[serde(default)]
    pub usage: Option<UsageInfo>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Option<Object>>>)]
    pub prompt_logprobs: Option<Vec<Value>>,
    #[serde(default)]
    pub prompt_token_id_logprobs: Option<String>,
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub mm_placeholders: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub kv_transfer_params: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub ec_transfer_params: Option<Value>,
}

/// One choice event of a generate stream (§4.3): one choice, or none for the usage-only
/// event when it is read back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateStreamResponse {
    pub request_id: String,
    #[serde(default)]
    pub output_mode: Option<String>,
    #[serde(default)]
    pub choices: Vec<GenerateChoice>,
    /// Set on every event with `continuous_usage_stats`.
    #[serde(default)]
    pub usage: Option<UsageInfo>,
    /// First event only, with `return_token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// An aphro extension to vLLM's stream chunk: the first chunk of each choice carries the
    /// prompt logprobs when the request asked for them (as `echo` with `logprobs` does), so
    /// a streamed echo can show them. Absent otherwise, so vLLM's bytes are unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Option<Object>>>)]
    pub prompt_logprobs: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub mm_placeholders: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Value>,
}

/// The final usage-only event of a generate stream with `include_usage` (`choices: []`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateUsageEvent {
    pub request_id: String,
    pub output_mode: String,
    #[schema(value_type = Vec<Object>, max_items = 0)]
    pub choices: [(); 0],
    pub usage: UsageInfoSparse,
}

/// One `data:` payload of a generate stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum GenerateStreamEvent {
    Chunk(Box<GenerateStreamResponse>),
    Usage(GenerateUsageEvent),
}

/// The usage event also reads as a chunk with no choices.
impl PartialSchema for GenerateStreamEvent {
    fn schema() -> RefOr<Schema> {
        any_of(
            "A choice event (`GenerateStreamResponse`), or the final usage-only event.",
            &[GenerateStreamResponse::name(), GenerateUsageEvent::name()],
        )
    }
}

impl ToSchema for GenerateStreamEvent {
    fn schemas(out: &mut Vec<(String, RefOr<Schema>)>) {
        out.push((
            GenerateStreamResponse::name().into_owned(),
            GenerateStreamResponse::schema(),
        ));
        out.push((
            GenerateUsageEvent::name().into_owned(),
            GenerateUsageEvent::schema(),
        ));
        GenerateStreamResponse::schemas(out);
        GenerateUsageEvent::schemas(out);
    }
}

impl GenerateStreamEvent {
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The event as the chunk shape derender reads (the usage event has no choices).
    pub fn into_chunk(self) -> GenerateStreamResponse {
        match self {
            GenerateStreamEvent::Chunk(c) => *c,
            GenerateStreamEvent::Usage(u) => GenerateStreamResponse {
                request_id: u.request_id,
                output_mode: Some(u.output_mode),
                choices: Vec::new(),
                usage: Some(UsageInfo::new(
                    u.usage.prompt_tokens,
                    u.usage.completion_tokens,
                )),
                ..Default::default()
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Chat shapes.

/// A candidate of a chat logprob entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ChatCompletionLogProb)]
pub struct ChatTopLogProb {
    pub token: String,
    pub logprob: f64,
    #[schema(required)]
    pub bytes: Option<Vec<u8>>,
}

/// One position of `ChatCompletionLogProbs.content`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ChatCompletionLogProbsContent)]
pub struct ChatLogProb {
    pub token: String,
    pub logprob: f64,
    #[schema(required)]
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<ChatTopLogProb>,
}

/// `ChatCompletionLogProbs` (§2.4).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionLogProbs {
    #[schema(required)]
    pub content: Option<Vec<ChatLogProb>>,
}

/// `ToolCall` of a response message (§2.5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ChatCompletionToolCall)]
pub struct ResponseToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: ResponseFunction,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ChatCompletionFunctionCall)]
pub struct ResponseFunction {
    pub name: String,
    pub arguments: String,
}

/// The non-streaming assistant message (§2.5): every key present, `tool_calls` omitted when
/// empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ChatCompletionMessage)]
pub struct ResponseMessage {
    pub role: String,
    #[schema(required)]
    pub content: Option<String>,
    #[schema(required)]
    pub refusal: Option<String>,
    #[schema(required, value_type = Option<Vec<Object>>)]
    pub annotations: Option<Value>,
    #[schema(required, value_type = Option<Object>)]
    pub audio: Option<Value>,
    #[schema(required, value_type = Option<Object>)]
    pub function_call: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ResponseToolCall>,
    #[schema(required)]
    pub reasoning: Option<String>,
}

impl ResponseMessage {
    pub fn assistant(content: Option<String>) -> Self {
        Self {
            role: "assistant".into(),
            content,
            refusal: None,
            annotations: None,
            audio: None,
            function_call: None,
            tool_calls: Vec::new(),
            reasoning: None,
        }
    }
}

/// A non-streaming chat choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ChatCompletionResponseChoice)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ResponseMessage,
    #[schema(required)]
    pub logprobs: Option<ChatCompletionLogProbs>,
    #[schema(required)]
    pub finish_reason: Option<String>,
    #[schema(required)]
    pub stop_reason: Option<StopReason>,
    #[schema(required)]
    pub token_ids: Option<Vec<u32>>,
    #[schema(required)]
    pub routed_experts: Option<String>,
    #[schema(required, value_type = Option<Vec<Object>>)]
    pub weight_versions: Option<Value>,
}

/// `ChatCompletionResponse` (§8.1), as derender returns it (§13).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: String,
    pub created: i64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    #[schema(required)]
    pub service_tier: Option<String>,
    #[schema(required)]
    pub system_fingerprint: Option<String>,
    pub usage: UsageInfo,
    #[schema(required, value_type = Option<Vec<Option<Object>>>)]
    pub prompt_logprobs: Option<Vec<Value>>,
    #[schema(required)]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[schema(required)]
    pub prompt_text: Option<String>,
    #[schema(required, value_type = Option<Object>)]
    pub kv_transfer_params: Option<Value>,
    #[schema(required, value_type = Option<Object>)]
    pub ec_transfer_params: Option<Value>,
    #[schema(required, value_type = Option<Object>)]
    pub metrics: Option<Value>,
}

/// `DeltaToolCall` (§2.5), full dump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DeltaToolCall)]
pub struct DeltaToolCallWire {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub index: usize,
    pub function: Option<DeltaFunction>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DeltaFunctionCall)]
pub struct DeltaFunction {
    pub name: Option<String>,
    pub arguments: Option<String>,
}

/// `DeltaMessage` (§2.5), full dump with `tool_calls` omitted when empty.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DeltaMessage)]
pub struct DeltaMessageWire {
    pub role: Option<String>,
    pub content: Option<String>,
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<DeltaToolCallWire>,
}

impl DeltaMessageWire {
    /// True when the delta carries nothing.
    pub fn is_empty(&self) -> bool {
        self.role.is_none()
            && self.content.is_none()
            && self.reasoning.is_none()
            && self.tool_calls.is_empty()
    }
}

/// A choice of a chat stream chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ChatCompletionResponseStreamChoice)]
pub struct ChatStreamChoice {
    pub index: usize,
    pub delta: DeltaMessageWire,
    #[schema(required)]
    pub logprobs: Option<ChatCompletionLogProbs>,
    #[schema(required)]
    pub finish_reason: Option<String>,
    pub stop_reason: Option<StopReason>,
    pub token_ids: Option<Vec<u32>>,
}

/// `ChatCompletionStreamResponse` (§8.1): a full dump, as the derender endpoint returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ChatCompletionStreamResponse)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: i64,
    pub model: String,
    pub choices: Vec<ChatStreamChoice>,
    pub usage: Option<UsageInfo>,
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// Alias with vLLM's class name.
pub type ChatCompletionStreamResponse = ChatCompletionChunk;

// ---------------------------------------------------------------------------------------------
// Completion shapes.

/// `CompletionLogProbs` (§2.4): parallel lists.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionLogProbs {
    pub text_offset: Vec<u64>,
    pub token_logprobs: Vec<Option<f64>>,
    pub tokens: Vec<String>,
    #[schema(value_type = Vec<Option<HashMap<String, f64>>>)]
    pub top_logprobs: Vec<Option<serde_json::Map<String, Value>>>,
}

/// A completion choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = CompletionResponseChoice)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    #[schema(required)]
    pub logprobs: Option<CompletionLogProbs>,
    #[schema(required)]
    pub finish_reason: Option<String>,
    #[schema(required)]
    pub stop_reason: Option<StopReason>,
    #[schema(required)]
    pub token_ids: Option<Vec<u32>>,
    #[schema(required, value_type = Option<Vec<Option<Object>>>)]
    pub prompt_logprobs: Option<Vec<Value>>,
    #[schema(required)]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[schema(required)]
    pub routed_experts: Option<String>,
    #[schema(required, value_type = Option<Vec<Object>>)]
    pub weight_versions: Option<Value>,
}

/// `CompletionResponse` (§8.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionResponse {
    pub id: String,
    pub object: String,
    pub created: i64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[schema(required)]
    pub service_tier: Option<String>,
    #[schema(required)]
    pub system_fingerprint: Option<String>,
    pub usage: UsageInfo,
    #[schema(required, value_type = Option<Object>)]
    pub kv_transfer_params: Option<Value>,
    #[schema(required, value_type = Option<Object>)]
    pub metrics: Option<Value>,
}

/// A choice of a completion stream chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = CompletionResponseStreamChoice)]
pub struct CompletionStreamChoice {
    pub index: usize,
    pub text: String,
    #[schema(required)]
    pub logprobs: Option<CompletionLogProbs>,
    #[schema(required)]
    pub finish_reason: Option<String>,
    #[schema(required)]
    pub stop_reason: Option<StopReason>,
    #[schema(required)]
    pub token_ids: Option<Vec<u32>>,
}

/// `CompletionStreamResponse` (§8.2), full dump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = CompletionStreamResponse)]
pub struct CompletionChunk {
    pub id: String,
    pub object: String,
    pub created: i64,
    pub model: String,
    pub choices: Vec<CompletionStreamChoice>,
    #[schema(required)]
    pub usage: Option<UsageInfo>,
}
