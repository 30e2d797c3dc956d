//! The pooling routes of a server whose model runs as a pooling model (`--runner pooling`),
//! thin over [`aphro_engine::pooling::Embedder`] (vLLM 0.33.0's `entrypoints/pooling/`,
//! `endpoints.md` §1): `/v1/embeddings`, `/v2/embed`, `/pooling`, `/classify`,
//! `/score` (`/v1/score`) and `/rerank` (`/v1/rerank`, `/v2/rerank`). Which of them a server
//! mounts follows the model's task, as vLLM's `pooling/factories.py` registers them.
use super::render::header_request_id;
use super::{unix_now, AppState};
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use aphro_core::protocol::{
    random_request_id, ClassificationData, ClassificationResponse, ClassifyRequest,
    CohereApiVersion, CohereBilledUnits, CohereEmbedRequest, CohereEmbedResponse,
    CohereEmbeddingType, CohereEmbeddings, CohereMeta, CohereTruncate, EmbedDType, EmbeddingData,
    EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingVector, EncodingFormat,
    Endianness, PoolingData, PoolingRequest, PoolingResponse, PoolingUsage, RerankDocument,
    RerankRequest, RerankResponse, RerankResultData, RerankUsage, ScoreData, ScoreRequest,
    ScoreResponse, TruncationSideParam,
};
use aphro_engine::pooling::{
    EmbedInput, EmbedOptions, Embedder, PoolingError, PoolingTask, ScoreOptions, TruncationSide,
};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Which pooling routes a server mounts (vLLM §1.1): `/pooling` always; the embedding routes
/// for an embedding model; `/classify` for a classifier; the score and rerank routes for an
/// embedding model or a one-label classifier (a cross-encoder).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolingRoutes {
    pub embed: bool,
    pub classify: bool,
    pub score: bool,
}

impl Default for PoolingRoutes {
    /// An embedding model's routes.
    fn default() -> Self {
        PoolingRoutes {
            embed: true,
            classify: false,
            score: true,
        }
    }
}

impl PoolingRoutes {
    pub fn for_model(embedder: &Embedder) -> Self {
        let c = embedder.config();
        match c.task {
            PoolingTask::Embed => Self::default(),
            PoolingTask::Classify => PoolingRoutes {
                embed: false,
                classify: true,
                score: c.labels.len() == 1,
            },
        }
    }
}

pub fn routes(which: PoolingRoutes) -> OpenApiRouter<AppState> {
    let mut app = OpenApiRouter::new().routes(routes!(pooling));
    if which.embed {
        app = app
            .routes(routes!(embeddings))
            .routes(routes!(cohere_embed));
    }
    if which.classify {
        app = app.routes(routes!(classify));
    }
    if which.score {
        app = app
            .routes(routes!(score))
            .routes(routes!(score_v1))
            .routes(routes!(rerank))
            .routes(routes!(rerank_v1))
            .routes(routes!(rerank_v2));
    }
    app
}

impl From<PoolingError> for ApiError {
    fn from(e: PoolingError) -> Self {
        let err = match e.status() {
            400 => ApiError::bad_request(e.to_string()),
            501 => ApiError::not_implemented(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        };
        match e.param() {
            Some(p) => err.with_param(p),
            None => err,
        }
    }
}

fn embedder(state: &AppState) -> Result<&Arc<Embedder>, ApiError> {
    state
        .embedder
        .as_ref()
        .ok_or_else(|| ApiError::not_implemented("The model does not support Embeddings API"))
}

/// The served name for a pooling request's `model`: absent or empty is the first name, an
/// unknown one vLLM's 404 (`VLLMNotFoundError`, no `param`).
fn pooling_model(state: &AppState, requested: Option<&str>) -> Result<String, ApiError> {
    let names = &state.settings.served_model_names;
    match requested {
        None | Some("") => Ok(names.first().cloned().unwrap_or_default()),
        Some(m) if names.iter().any(|n| n == m) => Ok(names[0].clone()),
        Some(m) => Err(ApiError::not_found(format!(
            "The model `{m}` does not exist."
        ))),
    }
}

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// vLLM's `/v1/embeddings` (completion-style input): one vector per input, as floats or as
/// base64 of little-endian float32 bytes.
#[utoipa::path(post, path = "/v1/embeddings", tag = "pooling",
    request_body = EmbeddingRequest,
    responses(
    (status = 200, description = "One embedding per input, in input order.", body = EmbeddingResponse),
    (status = 400, description = "Invalid request (over-long input without truncation, `dimensions` on a non-Matryoshka model, ...).", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 501, description = "The model is not an embedding model.", body = super::openapi::ErrorResponse),
))]
async fn embeddings(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let model = {
        let req: EmbeddingRequest = aphro_core::validation::from_body(&body)?;
        pooling_model(&state, req.model.as_deref())?
    };
    let embedder = embedder(&state)?.clone();
    let id = response_id(&headers, "embd");
    let resp = tokio::task::spawn_blocking(move || embed_body(&embedder, model, id, &body))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(json_response(StatusCode::OK, &resp))
}

/// One `/v1/embeddings` body (already checked for its `model`) → the response `model` and
/// `id` name: the route's work, shared with `aphro embed`. Blocking (a forward pass).
pub fn embed_body(
    embedder: &Embedder,
    model: String,
    id: String,
    body: &Value,
) -> Result<EmbeddingResponse, ApiError> {
    let req: EmbeddingRequest = aphro_core::validation::from_body(body)?;
    refuse_unsupported(req.encoding_format, req.add_special_tokens)?;
    if matches!(req.embed_dtype, EmbedDType::Fp8E4m3 | EmbedDType::Fp8E5m2) {
        return Err(ApiError::bad_request(format!(
            "embed_dtype {:?} is not supported by this server (float32, float16, bfloat16)",
            req.embed_dtype
        ))
        .with_param("embed_dtype"));
    }
    let inputs = embed_inputs(req.input);
    let opts = EmbedOptions {
        truncate_prompt_tokens: req.truncate_prompt_tokens,
        truncation_side: side(req.truncation_side),
        dimensions: req.dimensions,
        use_activation: req.use_activation,
    };
    let out = embedder.embed(&inputs, &opts)?;
    let encode = |v: Vec<f32>| match req.encoding_format {
        EncodingFormat::Base64 => {
            EmbeddingVector::Base64(base64(&vector_bytes(&v, req.embed_dtype, req.endianness)))
        }
        _ => EmbeddingVector::Float(v),
    };
    let prompt_tokens: usize = out.iter().map(|e| e.prompt_tokens).sum();
    let data = out
        .into_iter()
        .enumerate()
        .map(|(index, e)| EmbeddingData {
            index,
            object: "embedding".into(),
            embedding: encode(e.embedding),
        })
        .collect();
    Ok(EmbeddingResponse {
        id,
        object: "list".into(),
        created: unix_now(),
        model,
        data,
        usage: PoolingUsage::prompt(prompt_tokens as u64),
    })
}

/// Runs a pooling call on the blocking pool. Not behind the server's per-core gate: concurrent
/// calls must reach the Embedder together, whose batcher runs them in shared forward passes
/// (one at a time), so throughput grows with concurrency.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, PoolingError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(ApiError::from)
}

fn side(s: Option<TruncationSideParam>) -> Option<TruncationSide> {
    s.map(|s| match s {
        TruncationSideParam::Left => TruncationSide::Left,
        TruncationSideParam::Right => TruncationSide::Right,
    })
}

fn embed_inputs(input: EmbeddingInput) -> Vec<EmbedInput> {
    match input {
        EmbeddingInput::Text(s) => vec![EmbedInput::Text(s)],
        EmbeddingInput::Texts(v) => v.into_iter().map(EmbedInput::Text).collect(),
        EmbeddingInput::Tokens(ids) => vec![EmbedInput::Tokens(ids)],
        EmbeddingInput::TokenBatch(v) => v.into_iter().map(EmbedInput::Tokens).collect(),
    }
}

fn response_id(headers: &HeaderMap, prefix: &str) -> String {
    match header_request_id(headers) {
        Some(h) => format!("{prefix}-{h}"),
        None => format!("{prefix}-{}", random_request_id()),
    }
}

fn refuse_unsupported(format: EncodingFormat, add_special_tokens: bool) -> Result<(), ApiError> {
    match format {
        EncodingFormat::Float | EncodingFormat::Base64 => {}
        other => {
            return Err(ApiError::bad_request(format!(
                "encoding_format {other:?} is not supported by this server (float, base64)"
            ))
            .with_param("encoding_format"))
        }
    }
    if !add_special_tokens {
        return Err(ApiError::bad_request(
            "add_special_tokens=false is not supported by this server",
        )
        .with_param("add_special_tokens"));
    }
    Ok(())
}

/// vLLM's `tensor2binary`: the vector cast to `dtype` (round to nearest even, as torch
/// casts), its raw bytes in `endianness` order (`native`: this machine's).
fn vector_bytes(v: &[f32], dtype: EmbedDType, endianness: Endianness) -> Vec<u8> {
    let big = match endianness {
        Endianness::Big => true,
        Endianness::Little => false,
        Endianness::Native => cfg!(target_endian = "big"),
    };
    let mut out = Vec::with_capacity(v.len() * 4);
    for &x in v {
        match dtype {
            EmbedDType::Float16 => {
                let h = half::f16::from_f32(x);
                out.extend(if big {
                    h.to_be_bytes()
                } else {
                    h.to_le_bytes()
                });
            }
            EmbedDType::Bfloat16 => {
                let h = half::bf16::from_f32(x);
                out.extend(if big {
                    h.to_be_bytes()
                } else {
                    h.to_le_bytes()
                });
            }
            // fp8 is refused before the forward pass.
            _ => out.extend(if big {
                x.to_be_bytes()
            } else {
                x.to_le_bytes()
            }),
        }
    }
    out
}

fn le_f32_base64(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64(&bytes)
}

fn vector(v: Vec<f32>, format: EncodingFormat) -> EmbeddingVector {
    match format {
        EncodingFormat::Base64 => EmbeddingVector::Base64(le_f32_base64(&v)),
        _ => EmbeddingVector::Float(v),
    }
}

/// Cohere's packed sign bits (`v >= 0` → 1), MSB first, 8 per byte; `signed`: `byte - 128`.
fn pack_bits(v: &[f32], signed: bool) -> Vec<i32> {
    v.chunks(8)
        .map(|c| {
            let byte = c
                .iter()
                .enumerate()
                .fold(0i32, |acc, (i, &x)| acc | (i32::from(x >= 0.0) << (7 - i)));
            if signed {
                byte - 128
            } else {
                byte
            }
        })
        .collect()
}

/// Cohere v2 embed (vLLM's `embed/io_processor.py`): `texts` (or the text parts of
/// `inputs`), `truncate` NONE / START / END with `max_tokens`, `output_dimension`, and
/// `float` / `base64` / `binary` / `ubinary` vectors.
#[utoipa::path(post, path = "/v2/embed", tag = "pooling",
    request_body = CohereEmbedRequest,
    responses(
    (status = 200, description = "The vectors of every text, by requested type.", body = CohereEmbedResponse),
    (status = 400, description = "Invalid request (no texts, over-long input with `truncate: NONE`, images on a text model, ...).", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
))]
async fn cohere_embed(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let req: CohereEmbedRequest = aphro_core::validation::from_body(&body)?;
    pooling_model(&state, req.model.as_deref())?;
    let embedder = embedder(&state)?.clone();
    if req.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::bad_request(
            "images are not supported: this is a text-only embedding model",
        ));
    }
    let texts: Vec<String> = if let Some(inputs) = &req.inputs {
        inputs
            .iter()
            .map(|i| {
                let mut text = String::new();
                for part in &i.content {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(t)) => text.push_str(t),
                        ("text", None) => {
                            return Err(ApiError::bad_request(
                                "CohereEmbedContent with type='text' requires text",
                            ))
                        }
                        _ => {
                            return Err(ApiError::bad_request(
                                "images are not supported: this is a text-only embedding model",
                            ))
                        }
                    }
                }
                Ok(text)
            })
            .collect::<Result<_, _>>()?
    } else if let Some(t) = &req.texts {
        t.clone()
    } else {
        return Err(ApiError::bad_request(
            "One of texts, images, or inputs must be provided",
        ));
    };
    if let Some(t) = &req.input_type {
        return Err(ApiError::bad_request(format!(
            "Unsupported input_type '{t}'. This model does not define any input_type task \
             instructions."
        )));
    }
    let (truncate_prompt_tokens, truncation_side) = match req.truncate {
        CohereTruncate::End => (Some(req.max_tokens.unwrap_or(-1)), TruncationSide::Right),
        CohereTruncate::Start => (Some(req.max_tokens.unwrap_or(-1)), TruncationSide::Left),
        CohereTruncate::None => (None, TruncationSide::Right),
    };
    let types = req
        .embedding_types
        .clone()
        .unwrap_or_else(|| vec![CohereEmbeddingType::Float]);
    let opts = EmbedOptions {
        truncate_prompt_tokens,
        truncation_side: Some(truncation_side),
        dimensions: req.output_dimension,
        use_activation: None,
    };
    let inputs: Vec<EmbedInput> = texts.iter().cloned().map(EmbedInput::Text).collect();
    let max_tokens = match req.truncate {
        CohereTruncate::None => req.max_tokens,
        _ => None,
    };
    let out = blocking(move || embedder.embed(&inputs, &opts)).await?;
    if let Some(m) = max_tokens {
        if let Some(n) = out.iter().map(|e| e.prompt_tokens).find(|&n| n as i64 > m) {
            return Err(ApiError::bad_request(format!(
                "Input of {n} tokens exceeds max_tokens={m} with truncate=NONE. Set truncate \
                 to END or START to allow truncation."
            )));
        }
    }
    let input_tokens: usize = out.iter().map(|e| e.prompt_tokens).sum();
    let vectors: Vec<Vec<f32>> = out.into_iter().map(|e| e.embedding).collect();
    if types.iter().any(|t| {
        matches!(
            t,
            CohereEmbeddingType::Binary | CohereEmbeddingType::Ubinary
        )
    }) {
        if let Some(dim) = vectors.first().map(Vec::len).filter(|d| d % 8 != 0) {
            return Err(ApiError::bad_request(format!(
                "Embedding dimension must be a multiple of 8 for binary embedding types, but \
                 got {dim}."
            )));
        }
    }
    let mut embeddings = CohereEmbeddings::default();
    for t in &types {
        match t {
            CohereEmbeddingType::Float => embeddings.float = Some(vectors.clone()),
            CohereEmbeddingType::Base64 => {
                embeddings.base64 = Some(vectors.iter().map(|v| le_f32_base64(v)).collect())
            }
            CohereEmbeddingType::Binary => {
                embeddings.binary = Some(vectors.iter().map(|v| pack_bits(v, true)).collect())
            }
            CohereEmbeddingType::Ubinary => {
                embeddings.ubinary = Some(vectors.iter().map(|v| pack_bits(v, false)).collect())
            }
        }
    }
    let resp = CohereEmbedResponse {
        id: response_id(&headers, "embd"),
        embeddings,
        texts: req.texts.clone(),
        meta: CohereMeta {
            api_version: CohereApiVersion {
                version: "2".into(),
            },
            billed_units: CohereBilledUnits {
                input_tokens: input_tokens as u64,
                image_tokens: 0,
            },
        },
        response_type: "embeddings_by_type".into(),
    };
    Ok(json_response(StatusCode::OK, &resp))
}

/// vLLM's `/pooling`: the model's pooled output per input (the embedding of an embedding
/// model, the class probabilities of a classifier).
#[utoipa::path(post, path = "/pooling", tag = "pooling",
    request_body = PoolingRequest,
    responses(
    (status = 200, description = "One pooled output per input, in input order.", body = PoolingResponse),
    (status = 400, description = "Invalid request (`dimensions`, another task, over-long input, ...).", body = super::openapi::ErrorResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
))]
async fn pooling(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let req: PoolingRequest = aphro_core::validation::from_body(&body)?;
    if req.dimensions.is_some() {
        return Err(ApiError::bad_request(
            "dimensions is currently not supported",
        ));
    }
    let model = pooling_model(&state, req.model.as_deref())?;
    let embedder = embedder(&state)?.clone();
    let task = match embedder.config().task {
        PoolingTask::Embed => "embed",
        PoolingTask::Classify => "classify",
    };
    if let Some(t) = req.task.as_deref().filter(|t| *t != task) {
        return Err(ApiError::bad_request(format!(
            "Unsupported task: '{t}' Supported tasks: ('{task}',)"
        )));
    }
    refuse_unsupported(req.encoding_format, req.add_special_tokens)?;
    let inputs = embed_inputs(req.input);
    let truncation_side = side(req.truncation_side);
    let (truncate_prompt_tokens, use_activation) = (req.truncate_prompt_tokens, req.use_activation);
    let out: Vec<(Vec<f32>, usize)> = blocking(move || {
        if embedder.config().task == PoolingTask::Embed {
            let opts = EmbedOptions {
                truncate_prompt_tokens,
                truncation_side,
                dimensions: None,
                use_activation,
            };
            embedder.embed(&inputs, &opts).map(|v| {
                v.into_iter()
                    .map(|e| (e.embedding, e.prompt_tokens))
                    .collect()
            })
        } else {
            let opts = ScoreOptions {
                truncate_prompt_tokens,
                truncation_side,
                use_activation,
            };
            embedder
                .classify(&inputs, &opts)
                .map(|v| v.into_iter().map(|c| (c.probs, c.prompt_tokens)).collect())
        }
    })
    .await?;
    let prompt_tokens: usize = out.iter().map(|(_, n)| n).sum();
    let resp = PoolingResponse {
        id: response_id(&headers, "pooling"),
        object: "list".into(),
        created: unix_now(),
        model,
        data: out
            .into_iter()
            .enumerate()
            .map(|(index, (v, _))| PoolingData {
                index,
                object: "pooling".into(),
                data: vector(v, req.encoding_format),
            })
            .collect(),
        usage: PoolingUsage::prompt(prompt_tokens as u64),
    };
    Ok(json_response(StatusCode::OK, &resp))
}

/// vLLM's `/classify` on a sequence-classification model.
#[utoipa::path(post, path = "/classify", tag = "pooling",
    request_body = ClassifyRequest,
    responses(
    (status = 200, description = "One classification per input.", body = ClassificationResponse),
    (status = 400, description = "Invalid request (empty or over-long input, ...).", body = super::openapi::ErrorResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
))]
async fn classify(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let req: ClassifyRequest = aphro_core::validation::from_body(&body)?;
    let model = pooling_model(&state, req.model.as_deref())?;
    let embedder = embedder(&state)?.clone();
    refuse_unsupported(EncodingFormat::Float, req.add_special_tokens)?;
    let inputs = embed_inputs(req.input);
    let opts = ScoreOptions {
        truncate_prompt_tokens: req.truncate_prompt_tokens,
        truncation_side: side(req.truncation_side),
        use_activation: req.use_activation,
    };
    let out = blocking(move || embedder.classify(&inputs, &opts)).await?;
    let prompt_tokens: usize = out.iter().map(|c| c.prompt_tokens).sum();
    let resp = ClassificationResponse {
        id: response_id(&headers, "classify"),
        object: "list".into(),
        created: unix_now(),
        model,
        data: out
            .into_iter()
            .enumerate()
            .map(|(index, c)| ClassificationData {
                index,
                label: c.label,
                probs: c.probs,
                num_classes: c.num_classes,
            })
            .collect(),
        usage: PoolingUsage::prompt(prompt_tokens as u64),
    };
    Ok(json_response(StatusCode::OK, &resp))
}

async fn score_impl(
    state: AppState,
    headers: HeaderMap,
    body: Value,
) -> Result<Response, ApiError> {
    let req: ScoreRequest = aphro_core::validation::from_body(&body)?;
    let model = pooling_model(&state, req.model.as_deref())?;
    let embedder = embedder(&state)?.clone();
    let (queries, documents) = req.sides().ok_or_else(|| {
        ApiError::validation(
            "one of the field pairs queries/documents, queries/items, data_1/data_2 or \
             text_1/text_2 is required",
        )
    })?;
    let opts = ScoreOptions {
        truncate_prompt_tokens: req.truncate_prompt_tokens,
        truncation_side: side(req.truncation_side),
        use_activation: req.use_activation,
    };
    let out = blocking(move || embedder.score(&queries, &documents, &opts)).await?;
    let resp = ScoreResponse {
        id: response_id(&headers, "score"),
        object: "list".into(),
        created: unix_now(),
        model,
        data: out
            .scores
            .iter()
            .enumerate()
            .map(|(index, &score)| ScoreData {
                index,
                object: "score".into(),
                score,
            })
            .collect(),
        usage: PoolingUsage::prompt(out.prompt_tokens as u64),
    };
    Ok(json_response(StatusCode::OK, &resp))
}

/// vLLM's `/score`: 1:1, 1:N or N:N pairs; cosine of the embeddings on an embedding model,
/// the classifier's score on a cross-encoder.
#[utoipa::path(post, path = "/score", tag = "pooling",
    request_body = ScoreRequest,
    responses(
    (status = 200, description = "One score per pair, in pair order.", body = ScoreResponse),
    (status = 400, description = "Invalid request (empty side, lengths not 1:1, 1:N or N:N, over-long input, ...).", body = super::openapi::ErrorResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
))]
async fn score(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    score_impl(state, headers, body).await
}

/// `/v1/score`: an alias of `/score`.
#[utoipa::path(post, path = "/v1/score", tag = "pooling",
    request_body = ScoreRequest,
    responses(
    (status = 200, description = "One score per pair, in pair order.", body = ScoreResponse),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
))]
async fn score_v1(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    score_impl(state, headers, body).await
}

async fn rerank_impl(
    state: AppState,
    headers: HeaderMap,
    body: Value,
) -> Result<Response, ApiError> {
    let req: RerankRequest = aphro_core::validation::from_body(&body)?;
    let model = pooling_model(&state, req.model.as_deref())?;
    let embedder = embedder(&state)?.clone();
    if req.top_n < 0 {
        return Err(
            ApiError::validation("top_n: Input should be greater than or equal to 0")
                .with_param("top_n"),
        );
    }
    let documents = req.documents.into_vec();
    let opts = ScoreOptions {
        truncate_prompt_tokens: req.truncate_prompt_tokens,
        truncation_side: side(req.truncation_side),
        use_activation: req.use_activation,
    };
    let top_n = req.top_n as usize;
    let query = req.query;
    let docs = documents.clone();
    let out = blocking(move || embedder.rerank(&query, &docs, top_n, &opts)).await?;
    let resp = RerankResponse {
        id: response_id(&headers, "score"),
        model,
        usage: RerankUsage {
            prompt_tokens: out.prompt_tokens as u64,
            total_tokens: out.prompt_tokens as u64,
        },
        results: out
            .results
            .into_iter()
            .map(|r| RerankResultData {
                index: r.index,
                document: RerankDocument {
                    text: Some(documents[r.index].clone()),
                    multi_modal: None,
                },
                relevance_score: r.relevance_score,
            })
            .collect(),
    };
    Ok(json_response(StatusCode::OK, &resp))
}

/// vLLM's `/rerank` (Jina / Cohere shape): every document scored against the query, sorted
/// by score (ties in input order), cut to `top_n`, each with its text.
#[utoipa::path(post, path = "/rerank", tag = "pooling",
    request_body = RerankRequest,
    responses(
    (status = 200, description = "The documents by relevance, highest first.", body = RerankResponse),
    (status = 400, description = "Invalid request (no documents, negative `top_n`, over-long input, ...).", body = super::openapi::ErrorResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
))]
async fn rerank(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    rerank_impl(state, headers, body).await
}

/// `/v1/rerank`: an alias of `/rerank`.
#[utoipa::path(post, path = "/v1/rerank", tag = "pooling",
    request_body = RerankRequest,
    responses(
    (status = 200, description = "The documents by relevance, highest first.", body = RerankResponse),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
))]
async fn rerank_v1(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    rerank_impl(state, headers, body).await
}

/// `/v2/rerank`: an alias of `/rerank` (same shape, no Cohere `meta`).
#[utoipa::path(post, path = "/v2/rerank", tag = "pooling",
    request_body = RerankRequest,
    responses(
    (status = 200, description = "The documents by relevance, highest first.", body = RerankResponse),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
))]
async fn rerank_v2(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    rerank_impl(state, headers, body).await
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc4648() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (raw, enc) in cases {
            assert_eq!(base64(raw.as_bytes()), enc);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }
}
