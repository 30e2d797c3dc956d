//! `/tokenize` and `/detokenize` bodies (`api.md` §9).
use super::{ChatMessage, ChatTool};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

fn default_true() -> bool {
    true
}

/// `/tokenize` request: either a completion-style `prompt` or chat `messages`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenizeRequest {
    Chat(Box<TokenizeChatRequest>),
    Completion(TokenizeCompletionRequest),
}

/// An `anyOf`: a body with both `messages` and `prompt` is read as a chat.
impl PartialSchema for TokenizeRequest {
    fn schema() -> RefOr<Schema> {
        super::schema::any_of(
            [
                super::schema::reference::<TokenizeChatRequest>(),
                super::schema::reference::<TokenizeCompletionRequest>(),
            ],
            "`{messages, …}` (the chat template is applied) or `{prompt, …}`.",
        )
        .into()
    }
}

impl ToSchema for TokenizeRequest {
    fn schemas(out: &mut Vec<(String, RefOr<Schema>)>) {
        super::schema::collect::<TokenizeChatRequest>(out);
        super::schema::collect::<TokenizeCompletionRequest>(out);
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenizeCompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: String,
    #[serde(default = "default_true")]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub return_token_strs: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenizeChatRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// `None` when left out (then true); see [`super::ChatCompletionRequest::add_generation_prompt`].
    #[serde(default, deserialize_with = "crate::protocol::explicit")]
    #[schema(value_type = bool, default = true)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: bool,
    #[serde(default)]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub return_token_strs: bool,
    #[serde(default)]
    pub chat_template: Option<String>,
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    pub tools: Option<Vec<ChatTool>>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub mm_processor_kwargs: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub media_io_kwargs: Option<Value>,
}

impl TokenizeChatRequest {
    /// The effective `add_generation_prompt`: true unless the request sets it.
    pub fn add_generation_prompt(&self) -> bool {
        self.add_generation_prompt.unwrap_or(true)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    #[serde(default)]
    pub token_strs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
