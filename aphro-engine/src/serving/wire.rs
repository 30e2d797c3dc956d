//! Response shapes of `POST /inference/v1/generate` (`docs/spec/api.md` §4.2/§4.3) with the
//! logprob shapes of §2.4 and `UsageInfo` (§2.1).
//!
//! Key presence follows the spec: non-streaming responses are full dumps (every key, nulls
//! included); stream chunks omit `prompt_token_ids` / `mm_placeholders` / `metrics` unless
//! set; the final usage-only event omits every null. Text-only keys (`text`) and the
//! derender `message` appear only in their output mode.
//!
//! The OpenAPI schemas (`ToSchema`) follow the same rules: a key every dump writes, even as
//! `null`, is `required`; a key left out unless set is optional. Types whose vLLM name
//! aphro-core's protocol already uses for another shape are named `Generate…`.

use serde::Serialize;
use serde_json::Value;
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

/// `UsageInfo` (§2.1) as a full dump.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
#[schema(as = GenerateUsageInfo)]
pub struct UsageInfo {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
    pub completion_tokens: usize,
    #[schema(required, value_type = Option<Object>)]
    pub prompt_tokens_details: Option<Value>,
}

impl UsageInfo {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens,
            prompt_tokens_details: None,
        }
    }
}

/// `stop_reason`: the matched stop string or the stop token id (§2.6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = GenerateStopReason)]
pub enum StopReason {
    Token(u32),
    Text(String),
}

/// A candidate of a tokens-mode logprob entry.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GenerateLogProb {
    pub token_id: u32,
    pub logprob: f64,
    #[schema(required)]
    pub rank: Option<usize>,
}

/// One generated position of `GenerateLogProbs.content`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GenerateLogProbsContent {
    pub token_id: u32,
    pub logprob: f64,
    #[schema(required)]
    pub rank: Option<usize>,
    /// Engine order: the chosen token first, then the candidates by rank (not cut).
    pub top_logprobs: Vec<GenerateLogProb>,
}

/// `GenerateLogProbs` (§2.4, `output_mode="tokens"`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct GenerateLogProbs {
    #[schema(required)]
    pub content: Option<Vec<GenerateLogProbsContent>>,
}

/// A candidate of a chat-shape logprob entry.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[schema(as = GenerateChatLogProb)]
pub struct ChatLogProb {
    pub token: String,
    pub logprob: f64,
    #[schema(required)]
    pub bytes: Option<Vec<u8>>,
}

/// One position of `ChatCompletionLogProbs.content`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[schema(as = GenerateChatLogProbsContent)]
pub struct ChatLogProbsContent {
    pub token: String,
    pub logprob: f64,
    #[schema(required)]
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<ChatLogProb>,
}

/// `ChatCompletionLogProbs` (§2.4), used by `output_mode="text"|"derender"`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
#[schema(as = GenerateChatLogProbs)]
pub struct ChatCompletionLogProbs {
    #[schema(required)]
    pub content: Option<Vec<ChatLogProbsContent>>,
}

/// Logprobs of a choice: the tokens shape or the chat shape, by output mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ChoiceLogProbs {
    Tokens(GenerateLogProbs),
    Chat(ChatCompletionLogProbs),
}

/// An `anyOf`: `{"content": null}` has both shapes.
impl PartialSchema for ChoiceLogProbs {
    fn schema() -> RefOr<Schema> {
        let mut any = utoipa::openapi::schema::AnyOfBuilder::new().description(Some(
            "`GenerateLogProbs` with `output_mode: \"tokens\"`, the chat shape otherwise.",
        ));
        for item in [GenerateLogProbs::name(), ChatCompletionLogProbs::name()] {
            any = any.item(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(item)));
        }
        RefOr::T(any.into())
    }
}

impl ToSchema for ChoiceLogProbs {
    fn schemas(out: &mut Vec<(String, RefOr<Schema>)>) {
        for (name, schema) in [
            (GenerateLogProbs::name(), GenerateLogProbs::schema()),
            (
                ChatCompletionLogProbs::name(),
                ChatCompletionLogProbs::schema(),
            ),
        ] {
            out.push((name.into_owned(), schema));
        }
        GenerateLogProbs::schemas(out);
        ChatCompletionLogProbs::schemas(out);
    }
}

impl ChoiceLogProbs {
    /// Append `other`'s entries (same shape) to `self`.
    pub(crate) fn extend(&mut self, other: ChoiceLogProbs) {
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

/// The plain assistant message of a derender choice without a parser (§4.2, §2.5).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct DerenderMessage {
    pub role: &'static str,
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
    #[schema(required)]
    pub reasoning: Option<String>,
}

impl DerenderMessage {
    pub fn assistant(content: String) -> Self {
        Self {
            role: "assistant",
            content: Some(content),
            refusal: None,
            annotations: None,
            audio: None,
            function_call: None,
            reasoning: None,
        }
    }
}

/// A non-streaming choice (§4.2).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GenerateChoice {
    pub index: usize,
    /// `output_mode="text"` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `output_mode="derender"` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<DerenderMessage>,
    #[schema(required)]
    pub logprobs: Option<ChoiceLogProbs>,
    pub finish_reason: String,
    #[schema(required)]
    pub stop_reason: Option<StopReason>,
    /// Every generated id, including a stop token / the ids of a stop string.
    pub token_ids: Vec<u32>,
    #[schema(required)]
    pub routed_experts: Option<String>,
    #[schema(required)]
    pub sampling_mask: Option<Vec<Vec<u32>>>,
    #[schema(required, value_type = Option<Vec<Object>>)]
    pub weight_versions: Option<Value>,
}

/// `GenerateResponse` (§4.2), a full dump.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GenerateResponse {
    pub request_id: String,
    pub model: String,
    pub created: u64,
    pub output_mode: String,
    pub choices: Vec<GenerateChoice>,
    pub usage: UsageInfo,
    #[schema(required, value_type = Option<Vec<Option<Object>>>)]
    pub prompt_logprobs: Option<Vec<Option<Value>>>,
    #[schema(required)]
    pub prompt_token_id_logprobs: Option<String>,
    #[schema(required)]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[schema(required, value_type = Option<Object>)]
    pub mm_placeholders: Option<Value>,
    #[schema(required, value_type = Option<Object>)]
    pub metrics: Option<Value>,
    #[schema(required, value_type = Option<Object>)]
    pub kv_transfer_params: Option<Value>,
    #[schema(required, value_type = Option<Object>)]
    pub ec_transfer_params: Option<Value>,
}

/// The single choice of a stream event (§4.3); `token_ids`, `logprobs` and `text` are deltas.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GenerateStreamChoice {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[schema(required)]
    pub logprobs: Option<ChoiceLogProbs>,
    #[schema(required)]
    pub finish_reason: Option<String>,
    #[schema(required)]
    pub stop_reason: Option<StopReason>,
    pub token_ids: Vec<u32>,
    #[schema(required)]
    pub routed_experts: Option<String>,
    #[schema(required)]
    pub sampling_mask: Option<Vec<Vec<u32>>>,
    #[schema(required, value_type = Option<Vec<Object>>)]
    pub weight_versions: Option<Value>,
}

/// One choice event of a generate stream (§4.3).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GenerateStreamResponse {
    pub request_id: String,
    pub output_mode: String,
    pub choices: Vec<GenerateStreamChoice>,
    /// Set on every event with `continuous_usage_stats`.
    #[schema(required)]
    pub usage: Option<UsageInfo>,
    /// First event only, with `return_token_ids`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The first event of each choice, when the request asked for prompt logprobs (an
    /// extension: vLLM's stream drops them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<Value>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub mm_placeholders: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Value>,
}

/// `UsageInfo` with nulls excluded (the final usage event is dumped with `exclude_none`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[schema(as = GenerateUsageInfoSparse)]
pub struct UsageInfoSparse {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
    pub completion_tokens: usize,
}

/// The final usage-only event of a stream with `include_usage` (`choices: []`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GenerateUsageEvent {
    pub request_id: String,
    pub output_mode: String,
    #[schema(value_type = Vec<Object>, max_items = 0)]
    pub choices: [(); 0],
    pub usage: UsageInfoSparse,
}

/// One `data:` payload of a generate stream.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum GenerateStreamEvent {
    Chunk(Box<GenerateStreamResponse>),
    Usage(GenerateUsageEvent),
}

impl GenerateStreamEvent {
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// vLLM's floor for a logprob: `-inf` and NaN become `-9999.0`.
pub fn clamp_logprob(v: f32) -> f64 {
    if v.is_nan() {
        -9999.0
    } else {
        (v as f64).max(-9999.0)
    }
}
