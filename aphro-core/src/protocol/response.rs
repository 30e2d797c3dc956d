//! Response shapes: generate (`output_mode: "tokens"`, `api.md` §4.2–4.3), chat completions (§8.1) and
//! completions (§8.2), with the logprob shapes of §2.4 and `UsageInfo` (§2.1).
//!
//! Serialization follows the spec's null rules: non-streaming responses and the derender stream
//! chunks are full dumps (every key, nulls included) except where a comment says a key is
//! omitted (`tool_calls` when empty, §2.5).
//!
//! Schemas: a key every dump writes, even as `null`, is `required` (and nullable); the
//! generate shapes here are what derender *reads* (every key optional but `request_id` and
//! `choices`), named `DerenderGenerate…` beside the engine's own output types. The chat
//! stream chunk is also what the coupled `/v1/chat/completions` stream sends with vLLM's
//! `exclude_unset`, so its keys that stream leaves out are optional.
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

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

/// `stop_reason`: the matched stop string or the stop token id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopReason {
    Token(i64),
    Text(String),
}

/// One candidate of a generate logprob entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DerenderGenerateTopLogProb)]
pub struct GenerateTopLogProb {
    pub token_id: u32,
    pub logprob: f64,
    #[serde(default)]
    pub rank: Option<i64>,
}

/// One generated position of `GenerateLogProbs.content`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DerenderGenerateLogProb)]
pub struct GenerateLogProb {
    pub token_id: u32,
    #[serde(default = "neg_9999")]
    pub logprob: f64,
    #[serde(default)]
    pub rank: Option<i64>,
    #[serde(default)]
    pub top_logprobs: Vec<GenerateTopLogProb>,
}

fn neg_9999() -> f64 {
    -9999.0
}

/// `GenerateLogProbs` (§2.4, tokens mode).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DerenderGenerateLogProbs)]
pub struct GenerateLogProbs {
    #[serde(default)]
    pub content: Option<Vec<GenerateLogProb>>,
}

/// A choice of a tokens-mode generate response or stream event. In a stream event `token_ids`
/// and `logprobs` are the delta of this step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DerenderGenerateChoice)]
pub struct GenerateChoice {
    #[serde(default)]
    pub index: usize,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub logprobs: Option<GenerateLogProbs>,
    #[serde(default)]
    pub routed_experts: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Vec<u32>>>)]
    pub sampling_mask: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub weight_versions: Option<Value>,
}

/// `GenerateResponse` with `output_mode: "tokens"` (§4.2). `output_mode` is kept so that a
/// `text`/`derender` response handed to derender can be rejected (§6.1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DerenderGenerateResponse)]
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

/// One `data:` event of a tokens-mode generate stream (§4.3): at most one choice, or none for
/// the usage-only event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DerenderGenerateChunk)]
pub struct GenerateStreamResponse {
    pub request_id: String,
    #[serde(default)]
    pub output_mode: Option<String>,
    #[serde(default)]
    pub choices: Vec<GenerateChoice>,
    #[serde(default)]
    pub usage: Option<UsageInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// An aphro extension to vLLM's stream chunk: the first chunk of each choice carries the
    /// prompt logprobs when the request asked for them (as `echo` with `logprobs` does), so
    /// a streamed echo can show them. Absent otherwise, so vLLM's bytes are unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub mm_placeholders: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Value>,
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
