//! `POST /v1/embeddings`: request and response shapes of vLLM 0.33.0
//! (`entrypoints/pooling/embed/protocol.py`, `pooling/base/protocol.py`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// `input`: a string, a list of strings, a list of token ids, or a list of lists of ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Tokens(Vec<u32>),
    TokenBatch(Vec<Vec<u32>>),
    Texts(Vec<String>),
}

/// `truncation_side`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TruncationSideParam {
    Left,
    Right,
}

/// `encoding_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
    Bytes,
    BytesOnly,
}

/// `embed_dtype`: the element type of `base64` and `bytes` vectors (`endpoints.md` §1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EmbedDType {
    #[default]
    Float32,
    Float16,
    Bfloat16,
    Fp8E4m3,
    Fp8E5m2,
}

/// `endianness` of `base64` and `bytes` vectors; `native` is the server's byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Endianness {
    #[default]
    Native,
    Big,
    Little,
}

/// The completion-style `/v1/embeddings` body. Unknown keys are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub input: EmbeddingInput,
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    #[serde(default)]
    pub embed_dtype: EmbedDType,
    #[serde(default)]
    pub endianness: Endianness,
    #[serde(default)]
    pub dimensions: Option<i64>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    #[serde(default)]
    pub truncation_side: Option<TruncationSideParam>,
    #[serde(default)]
    pub use_activation: Option<bool>,
    #[serde(default = "default_true")]
    pub add_special_tokens: bool,
}

fn default_true() -> bool {
    true
}

/// One vector: a float list, or base64 of its little-endian float32 bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingData {
    pub index: usize,
    /// Always `"embedding"`.
    pub object: String,
    pub embedding: EmbeddingVector,
}

/// Usage of a pooling response: no completion, `prompt_tokens_details` null.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolingUsage {
    pub prompt_tokens: u64,
    pub total_tokens: u64,
    pub completion_tokens: u64,
    #[schema(value_type = Option<Object>)]
    pub prompt_tokens_details: Option<Value>,
}

impl PoolingUsage {
    pub fn prompt(tokens: u64) -> Self {
        Self {
            prompt_tokens: tokens,
            total_tokens: tokens,
            completion_tokens: 0,
            prompt_tokens_details: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingResponse {
    /// `embd-<X-Request-Id or random id>`.
    pub id: String,
    /// Always `"list"`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub data: Vec<EmbeddingData>,
    pub usage: PoolingUsage,
}
