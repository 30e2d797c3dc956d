//! `GenerateRequest` (`api.md` §4.1) as the render endpoints produce it (§3, §5), and `ParseContext`.
use super::SamplingParams;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// `stream_options` (§2.2). Serialized with both keys (render echoes them that way).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamOptions {
    #[serde(default, deserialize_with = "de_null_false")]
    #[schema(value_type = Option<bool>)]
    pub include_usage: bool,
    #[serde(default, deserialize_with = "de_null_false")]
    #[schema(value_type = Option<bool>)]
    pub continuous_usage_stats: bool,
}

fn de_null_false<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

/// What derender needs to parse the model output of a chat request (§3). Unknown keys are
/// kept (a newer render server may add some; generate decides what to do with them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ParseContext {
    /// The request's tools, normalized (`{"type": "function", "function": {…}}`).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    #[schema(schema_with = super::schema::tool_choice)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default = "default_true")]
    pub include_reasoning: bool,
    #[serde(default)]
    pub chat_template_kwargs: Map<String, Value>,
    #[serde(default)]
    pub history_tool_call_cnt: u64,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn default_true() -> bool {
    true
}

fn default_output_mode() -> String {
    "tokens".to_owned()
}

/// The token-in request of the generate endpoint; also the render endpoints' output.
/// All fields serialize, nulls included (§3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateRequest {
    #[serde(default = "super::random_request_id")]
    pub request_id: String,
    pub token_ids: Vec<u32>,
    pub sampling_params: SamplingParams,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default = "default_output_mode")]
    #[schema(schema_with = super::schema::output_mode)]
    pub output_mode: String,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub return_token_ids: Option<bool>,
    #[serde(default)]
    pub cache_salt: Option<String>,
    #[serde(default)]
    pub priority: i64,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub kv_transfer_params: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub ec_transfer_params: Option<Value>,
    #[serde(default)]
    pub reasoning_ended: Option<bool>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub reasoning_parser_kwargs: Option<Value>,
    #[serde(default)]
    pub parse_context: Option<ParseContext>,
    #[serde(default)]
    #[schema(schema_with = super::schema::token_offsets)]
    pub token_offsets: Option<Vec<(usize, usize)>>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub features: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub content_parts: Option<Vec<Value>>,
}
