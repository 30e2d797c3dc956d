//! `CompletionRequest` (`api.md` §8.2).
use super::{StopSpec, StreamOptions};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

fn default_true() -> bool {
    true
}
fn default_one() -> i64 {
    1
}
fn default_max_tokens() -> Option<i64> {
    Some(16)
}

/// `prompt`: string, list of strings, token ids, or list of token-id lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenBatches(Vec<Vec<i64>>),
}

/// An `anyOf`, not the `oneOf` a derive gives: `[]` is a valid value of every list form.
impl PartialSchema for PromptInput {
    fn schema() -> RefOr<Schema> {
        super::schema::any_of(
            [
                String::schema(),
                Vec::<String>::schema(),
                Vec::<i64>::schema(),
                Vec::<Vec<i64>>::schema(),
            ],
            "A prompt, a list of prompts, one prompt's token ids, or a list of token-id lists.",
        )
        .into()
    }
}

impl ToSchema for PromptInput {}

/// One prompt after splitting a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum SinglePrompt {
    Text(String),
    Tokens(Vec<i64>),
}

impl PromptInput {
    pub fn into_prompts(self) -> Vec<SinglePrompt> {
        match self {
            PromptInput::Text(s) => vec![SinglePrompt::Text(s)],
            PromptInput::Texts(v) => v.into_iter().map(SinglePrompt::Text).collect(),
            PromptInput::Tokens(t) => vec![SinglePrompt::Tokens(t)],
            PromptInput::TokenBatches(v) => v.into_iter().map(SinglePrompt::Tokens).collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<PromptInput>,
    #[serde(default)]
    #[schema(schema_with = super::schema::prompt_embeds)]
    pub prompt_embeds: Option<Value>,
    #[serde(default)]
    pub echo: bool,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// Token id (as a string) → bias, clamped to [-100, 100].
    #[serde(default)]
    #[schema(value_type = Option<HashMap<String, f64>>)]
    pub logit_bias: Option<Map<String, Value>>,
    #[serde(default)]
    pub logprobs: Option<i64>,
    /// Request default 16 (§10); an explicit `null` means "fill the context".
    #[serde(default = "default_max_tokens")]
    pub max_tokens: Option<i64>,
    #[serde(default = "default_one")]
    pub n: i64,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<StopSpec>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
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
    /// `left` (default) or `right`: which end `truncate_prompt_tokens` cuts.
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
    #[serde(default = "default_true")]
    pub add_special_tokens: bool,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub structured_outputs: Option<Value>,
    #[serde(default)]
    pub priority: i64,
    #[serde(default)]
    pub request_id: Option<String>,
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
    pub thinking_token_budget: Option<i64>,
    #[serde(default)]
    pub stream_interval: Option<i64>,
    #[serde(default)]
    pub return_token_offsets: bool,
}

impl Default for CompletionRequest {
    fn default() -> Self {
        // Deserializing `{}` applies every serde default in one place.
        serde_json::from_value(Value::Object(Map::new())).unwrap_or_else(|_| unreachable!())
    }
}
