//! The other pooling routes of vLLM 0.33.0 (`entrypoints/pooling/`): `/v2/embed` (Cohere v2),
//! `/pooling`, `/classify`, `/score` (`/v1/score`) and `/rerank` (`/v1/rerank`, `/v2/rerank`).
//! See `docs/spec/endpoints.md` §1.4 to §1.8.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::embeddings::{EncodingParams, PoolingInput, PoolingParamsFields, PoolingUsage};

/// Cohere v2 `truncate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum CohereTruncate {
    None,
    Start,
    #[default]
    End,
}

/// Cohere v2 `embedding_types` item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CohereEmbeddingType {
    Float,
    Binary,
    Ubinary,
    Base64,
}

/// One content part of a Cohere v2 `inputs` item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CohereContent {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub image_url: Option<serde_json::Value>,
}

/// One Cohere v2 `inputs` item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CohereInput {
    pub content: Vec<CohereContent>,
}

/// `POST /v2/embed` (`embed/protocol.py::CohereEmbedRequest`). Unknown keys are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CohereEmbedRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub input_type: Option<String>,
    #[serde(default)]
    pub texts: Option<Vec<String>>,
    #[serde(default)]
    pub images: Option<Vec<String>>,
    #[serde(default)]
    pub inputs: Option<Vec<CohereInput>>,
    #[serde(default)]
    pub output_dimension: Option<i64>,
    #[serde(default)]
    pub embedding_types: Option<Vec<CohereEmbeddingType>>,
    #[serde(default)]
    pub truncate: CohereTruncate,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub priority: i64,
}

/// The vectors of a Cohere response, by type (only the requested ones are present).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CohereEmbeddings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub float: Option<Vec<Vec<f32>>>,
    /// Little-endian float32 bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<Vec<String>>,
    /// Sign bits, MSB first, 8 per byte, as signed bytes (`byte - 128`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<Vec<Vec<i32>>>,
    /// Sign bits, MSB first, 8 per byte, as 0..255.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ubinary: Option<Vec<Vec<i32>>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CohereApiVersion {
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CohereBilledUnits {
    pub input_tokens: u64,
    pub image_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CohereMeta {
    pub api_version: CohereApiVersion,
    pub billed_units: CohereBilledUnits,
}

/// The `/v2/embed` response (`model_dump(exclude_none=True)`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CohereEmbedResponse {
    pub id: String,
    pub embeddings: CohereEmbeddings,
    /// Echoed when the request gave `texts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub texts: Option<Vec<String>>,
    pub meta: CohereMeta,
    /// Always `"embeddings_by_type"`.
    pub response_type: String,
}

/// `POST /pooling` (`pooling/pooling/protocol.py`): `/v1/embeddings`' fields plus `task`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolingRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(flatten)]
    pub input: PoolingInput,
    #[serde(default)]
    pub task: Option<String>,
    #[serde(flatten)]
    pub encoding: EncodingParams,
    /// Refused: vLLM's `/pooling` does not truncate dimensions.
    #[serde(default)]
    pub dimensions: Option<i64>,
    #[serde(flatten)]
    pub params: PoolingParamsFields,
}

fn default_true() -> bool {
    true
}

/// One `/pooling` output: the pooled vector as floats or base64.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolingData {
    pub index: usize,
    /// Always `"pooling"`.
    pub object: String,
    pub data: super::embeddings::EmbeddingVector,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolingResponse {
    /// `pooling-<X-Request-Id or random id>`.
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub data: Vec<PoolingData>,
    pub usage: PoolingUsage,
}

/// `POST /classify` (`pooling/classify/protocol.py`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClassifyRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(flatten)]
    pub input: PoolingInput,
    #[serde(flatten)]
    pub params: PoolingParamsFields,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClassificationData {
    pub index: usize,
    /// `id2label` of the most probable class (null without a mapping).
    pub label: Option<String>,
    pub probs: Vec<f32>,
    pub num_classes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClassificationResponse {
    /// `classify-<X-Request-Id or random id>`.
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub data: Vec<ClassificationData>,
    pub usage: PoolingUsage,
}

/// One side of a score request: a text or a list of texts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ScoreTexts {
    One(String),
    Many(Vec<String>),
}

impl ScoreTexts {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            ScoreTexts::One(s) => vec![s],
            ScoreTexts::Many(v) => v,
        }
    }
}

/// `POST /score` (`pooling/scoring/protocol.py`): one of the field pairs `queries` /
/// `documents`, `queries` / `items`, `data_1` / `data_2`, `text_1` / `text_2`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScoreRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub queries: Option<ScoreTexts>,
    #[serde(default)]
    pub documents: Option<ScoreTexts>,
    #[serde(default)]
    pub items: Option<ScoreTexts>,
    #[serde(default)]
    pub data_1: Option<ScoreTexts>,
    #[serde(default)]
    pub data_2: Option<ScoreTexts>,
    #[serde(default)]
    pub text_1: Option<ScoreTexts>,
    #[serde(default)]
    pub text_2: Option<ScoreTexts>,
    #[serde(flatten)]
    pub params: PoolingParamsFields,
}

impl ScoreRequest {
    /// The (queries, documents) of whichever field pair the request used.
    pub fn sides(&self) -> Option<(Vec<String>, Vec<String>)> {
        let pick = |a: &Option<ScoreTexts>, b: &Option<ScoreTexts>| match (a, b) {
            (Some(a), Some(b)) => Some((a.clone().into_vec(), b.clone().into_vec())),
            _ => None,
        };
        pick(&self.queries, &self.documents)
            .or_else(|| pick(&self.queries, &self.items))
            .or_else(|| pick(&self.data_1, &self.data_2))
            .or_else(|| pick(&self.text_1, &self.text_2))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScoreData {
    pub index: usize,
    /// Always `"score"`.
    pub object: String,
    pub score: f32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScoreResponse {
    /// `score-<X-Request-Id or random id>`.
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub data: Vec<ScoreData>,
    pub usage: PoolingUsage,
}

/// `POST /rerank` (and `/v1/rerank`, `/v2/rerank`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub query: String,
    pub documents: ScoreTexts,
    /// `0` (the default) = every document.
    #[serde(default)]
    pub top_n: i64,
    #[serde(flatten)]
    pub params: PoolingParamsFields,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankDocument {
    pub text: Option<String>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub multi_modal: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankResultData {
    /// The document's position in the request.
    pub index: usize,
    pub document: RerankDocument,
    pub relevance_score: f32,
}

/// `usage` of a rerank response: prompt and total tokens only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankUsage {
    pub prompt_tokens: u64,
    pub total_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankResponse {
    /// `score-<X-Request-Id or random id>`.
    pub id: String,
    pub model: String,
    pub usage: RerankUsage,
    pub results: Vec<RerankResultData>,
}

/// `query` of `/generative_scoring`: text, or token ids used as given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum GenerativeScoringQuery {
    Text(String),
    Tokens(Vec<u32>),
}

/// `items` of `/generative_scoring`: all texts or all token-id lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum GenerativeScoringItems {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

/// `POST /generative_scoring` on a generative model (`openai/generative_scoring/`,
/// `docs/spec/endpoints.md` §1.10): the probability of the first label token after each
/// `query + item` prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerativeScoringRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub query: GenerativeScoringQuery,
    pub items: GenerativeScoringItems,
    pub label_token_ids: Vec<i64>,
    /// Softmax over the label tokens only; `false`: the label's probability over the whole
    /// vocabulary.
    #[serde(default = "default_true")]
    pub apply_softmax: bool,
    /// The prompt is `item + query` instead of `query + item`.
    #[serde(default)]
    pub item_first: bool,
    /// Applies to the query only; items are encoded without special tokens.
    #[serde(default = "default_true")]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub priority: i64,
    #[serde(default)]
    pub request_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerativeScoringResponse {
    /// `generative-scoring-<X-Request-Id, request_id or a random id>`.
    pub id: String,
    /// Always `"list"`.
    pub object: String,
    pub created: u64,
    pub model: String,
    /// One `"score"` per item, in item order.
    pub data: Vec<ScoreData>,
    pub usage: PoolingUsage,
}
