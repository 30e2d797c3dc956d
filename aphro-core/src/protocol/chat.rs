//! `ChatCompletionRequest` (`api.md` §8.1) and its message / tool types (§2.5).
use super::{StopSpec, StreamOptions};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

fn default_true() -> bool {
    true
}
fn default_one() -> i64 {
    1
}
fn default_length_penalty() -> f64 {
    1.0
}

/// The OpenAI chat-completions request with vLLM's extras. Unknown keys are ignored (§1.1).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// Token id (as a string) → bias, clamped to [-100, 100].
    #[serde(default)]
    #[schema(value_type = Option<HashMap<String, f64>>)]
    pub logit_bias: Option<Map<String, Value>>,
    #[serde(default)]
    pub logprobs: bool,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default = "default_one")]
    pub n: i64,
    /// `{"type": "text"}`; other types (`json_object`, `json_schema`, …) are refused.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<StopSpec>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub tools: Option<Vec<ChatTool>>,
    #[serde(default)]
    #[schema(schema_with = super::schema::tool_choice)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    #[serde(default)]
    pub thinking_token_budget: Option<i64>,
    #[serde(default = "default_true")]
    pub include_reasoning: bool,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub use_beam_search: bool,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f64>,
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    #[serde(default = "default_length_penalty")]
    pub length_penalty: f64,
    #[serde(default)]
    pub stop_token_ids: Option<Vec<i64>>,
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub min_tokens: i64,
    #[serde(default)]
    pub skip_special_tokens: Option<bool>,
    #[serde(default = "default_true")]
    pub spaces_between_special_tokens: bool,
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    #[serde(default)]
    pub truncation_side: Option<String>,
    #[serde(default)]
    pub prompt_logprobs: Option<i64>,
    #[serde(default)]
    pub logprob_token_ids: Option<Vec<i64>>,
    #[serde(default)]
    pub allowed_token_ids: Option<Vec<i64>>,
    #[serde(default)]
    pub bad_words: Option<Vec<String>>,
    #[serde(default)]
    pub echo: bool,
    /// `None` when the request leaves it out (then it is true). vLLM's check for both
    /// `continue_final_message` and `add_generation_prompt` reads the raw request, so only an
    /// explicit `true` is refused there; read the effective value with
    /// [`ChatCompletionRequest::add_generation_prompt`].
    #[serde(default, deserialize_with = "crate::protocol::explicit")]
    #[schema(value_type = bool, default = true)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: bool,
    #[serde(default)]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub documents: Option<Vec<Map<String, Value>>>,
    #[serde(default)]
    pub chat_template: Option<String>,
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub mm_processor_kwargs: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub media_io_kwargs: Option<Value>,
    /// `"none"`: the render response's `features` keep hashes and placeholders but leave
    /// `kwargs_data` / `mm_metadata` null.
    #[serde(default)]
    pub mm_payload: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub structured_outputs: Option<Value>,
    #[serde(default)]
    pub priority: i64,
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub return_tokens_as_token_ids: Option<bool>,
    #[serde(default)]
    pub return_token_ids: Option<bool>,
    #[serde(default)]
    pub cache_salt: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub kv_transfer_params: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub ec_transfer_params: Option<Value>,
    #[serde(default)]
    pub vllm_xargs: Option<Map<String, Value>>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub repetition_detection: Option<Value>,
    #[serde(default)]
    pub stream_interval: Option<i64>,
    /// Render-only: return `token_offsets` in the result.
    #[serde(default)]
    pub return_token_offsets: bool,
}

impl ChatCompletionRequest {
    /// The effective `add_generation_prompt`: true unless the request sets it.
    pub fn add_generation_prompt(&self) -> bool {
        self.add_generation_prompt.unwrap_or(true)
    }
}

/// One message of `messages`. Roles are free strings (system/developer/user/assistant/tool/…).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallParam>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// vLLM 0.33 name; `reasoning_content` is accepted on input and renamed (§2.5).
    #[serde(
        default,
        alias = "reasoning_content",
        skip_serializing_if = "Option::is_none"
    )]
    pub reasoning: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `content`: a string or a list of typed parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part: `{"type":"text","text":…}`, `{"type":"image_url",…}`, …
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An assistant tool call in the history. `arguments` is normally a JSON string, but an object
/// is accepted too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCallParam {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: FunctionCallParam,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCallParam {
    pub name: String,
    #[serde(default)]
    #[schema(schema_with = super::schema::arguments)]
    pub arguments: Value,
}

/// An entry of `tools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatTool {
    #[serde(rename = "type", default = "function_str")]
    pub kind: String,
    pub function: FunctionDefinition,
}

fn function_str() -> String {
    "function".to_owned()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionDefinition {
    pub name: String,
    /// Serialized as `null` when absent: templates and `parse_context` see `"description": null`.
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON Schema object.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `ToolCall` in responses (§2.5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}
