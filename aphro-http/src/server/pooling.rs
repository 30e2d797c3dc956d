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
    encode_bytes, random_request_id, vector_bytes, BytesMetadata, BytesUsage,
    ChatCompletionRequest, ClassificationData, ClassificationResponse, ClassifyRequest,
    CohereApiVersion, CohereBilledUnits, CohereEmbedRequest, CohereEmbedResponse,
    CohereEmbeddingType, CohereEmbeddings, CohereMeta, CohereTruncate, EmbedDType, EmbeddingData,
    EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingVector, EncodingFormat,
    EncodingParams, Endianness, PoolingData, PoolingInput, PoolingParamsFields, PoolingRequest,
    PoolingResponse, PoolingUsage, RerankDocument, RerankRequest, RerankResponse, RerankResultData,
    RerankUsage, ScoreData, ScoreRequest, ScoreResponse, TruncationSideParam,
};
use aphro_core::Renderer;
use aphro_engine::pooling::{
    EmbedInput, EmbedOptions, Embedder, PoolingError, PoolingTask, ScoreOptions, TruncationSide,
};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
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
    use ::base64::Engine as _;
    ::base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// vLLM's `/v1/embeddings`: one vector per input (or one per chat), as floats, as base64 of
/// its bytes, or as a raw `bytes` / `bytes_only` body.
#[utoipa::path(post, path = "/v1/embeddings", tag = "pooling",
    request_body = EmbeddingRequest,
    responses(
    (status = 200, description = "One embedding per input, in input order (`encoding_format` `bytes` / `bytes_only`: every vector's raw bytes back to back; `bytes` adds the `metadata` header).", content(
        (EmbeddingResponse = "application/json"),
        (Vec<u8> = "application/octet-stream"),
    )),
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
    let renderer = state.renderer.clone();
    let id = response_id(&headers, "embd");
    let out = tokio::task::spawn_blocking(move || {
        embed_body(&embedder, renderer.as_deref(), model, id, &body)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(match out {
        EmbedOutput::Json(resp) => json_response(StatusCode::OK, &resp),
        EmbedOutput::Bytes { body, metadata } => bytes_response(body, metadata.as_ref()),
    })
}

/// A `/v1/embeddings` or `/pooling` answer: JSON, or vLLM's binary body.
pub enum EmbedOutput<T = EmbeddingResponse> {
    Json(T),
    /// `bytes` / `bytes_only`: the vectors' bytes and, for `bytes`, the `metadata` header.
    Bytes {
        body: Vec<u8>,
        metadata: Option<BytesMetadata>,
    },
}

/// One `/v1/embeddings` body (already checked for its `model`) → the response `model` and
/// `id` name: the route's work, shared with `aphro embed`. Blocking (a forward pass).
/// `renderer` renders chat `messages` (without one they are refused as vLLM refuses a
/// model without a chat template).
pub fn embed_body(
    embedder: &Embedder,
    renderer: Option<&Renderer>,
    model: String,
    id: String,
    body: &Value,
) -> Result<EmbedOutput, ApiError> {
    let req: EmbeddingRequest = aphro_core::validation::from_body(body)?;
    let inputs = pooling_inputs(req.input, renderer)?;
    let opts = EmbedOptions {
        truncate_prompt_tokens: req.params.truncate_prompt_tokens,
        truncation_side: side(req.params.truncation_side),
        dimensions: req.dimensions,
        use_activation: req.params.use_activation,
    };
    let out = embedder.embed(&inputs, &opts)?;
    let prompt_tokens: usize = out.iter().map(|e| e.prompt_tokens).sum();
    let vectors: Vec<Vec<f32>> = out.into_iter().map(|e| e.embedding).collect();
    Ok(encode_vectors(
        vectors,
        prompt_tokens,
        req.encoding,
        id,
        model,
        |data, usage, id, model| EmbeddingResponse {
            id,
            object: "list".into(),
            created: unix_now(),
            model,
            data: data
                .into_iter()
                .enumerate()
                .map(|(index, embedding)| EmbeddingData {
                    index,
                    object: "embedding".into(),
                    embedding,
                })
                .collect(),
            usage,
        },
    ))
}

/// The vectors of a `/v1/embeddings` or `/pooling` request in its `encoding_format`
/// (vLLM's `encode_pooling_output_*` and `encode_pooling_bytes`); `json` builds the JSON
/// response from the encoded vectors.
fn encode_vectors<T>(
    vectors: Vec<Vec<f32>>,
    prompt_tokens: usize,
    enc: EncodingParams,
    id: String,
    model: String,
    json: impl FnOnce(Vec<EmbeddingVector>, PoolingUsage, String, String) -> T,
) -> EmbedOutput<T> {
    let usage = PoolingUsage::prompt(prompt_tokens as u64);
    match enc.encoding_format {
        EncodingFormat::Float => EmbedOutput::Json(json(
            vectors.into_iter().map(EmbeddingVector::Float).collect(),
            usage,
            id,
            model,
        )),
        EncodingFormat::Base64 => EmbedOutput::Json(json(
            vectors
                .iter()
                .map(|v| {
                    EmbeddingVector::Base64(base64(&vector_bytes(
                        v,
                        enc.embed_dtype,
                        enc.endianness,
                    )))
                })
                .collect(),
            usage,
            id,
            model,
        )),
        EncodingFormat::Bytes | EncodingFormat::BytesOnly => {
            let (body, items) = encode_bytes(&vectors, enc.embed_dtype, enc.endianness);
            let metadata = (enc.encoding_format == EncodingFormat::Bytes).then(|| BytesMetadata {
                id,
                created: unix_now(),
                model,
                data: items,
                usage: BytesUsage {
                    prompt_tokens: prompt_tokens as u64,
                    total_tokens: prompt_tokens as u64,
                },
            });
            EmbedOutput::Bytes { body, metadata }
        }
    }
}

/// vLLM's binary answer: `application/octet-stream`, and the `metadata` header (JSON, with
/// non-ASCII escaped as Python's `json.dumps` does, so it is a valid header value).
fn bytes_response(body: Vec<u8>, metadata: Option<&BytesMetadata>) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(m) = metadata {
        let json = serde_json::to_string(m).unwrap_or_default();
        let mut ascii = String::with_capacity(json.len());
        for c in json.chars() {
            if c.is_ascii() {
                ascii.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    ascii.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
        if let Ok(v) = HeaderValue::from_str(&ascii) {
            headers.insert("metadata", v);
        }
    }
    resp
}

/// The inputs of a completion-style or chat request. A chat is rendered through the chat
/// template into one prompt, tokenized without special tokens unless the request adds them
/// (vLLM's `ChatRequestMixin`).
fn pooling_inputs(
    input: PoolingInput,
    renderer: Option<&Renderer>,
) -> Result<Vec<EmbedInput>, ApiError> {
    let text = |s: String, specials: bool| {
        if specials {
            EmbedInput::Text(s)
        } else {
            EmbedInput::RawText(s)
        }
    };
    match input {
        PoolingInput::Completion(c) => Ok(match c.input {
            EmbeddingInput::Text(s) => vec![text(s, c.add_special_tokens)],
            EmbeddingInput::Texts(v) => v
                .into_iter()
                .map(|s| text(s, c.add_special_tokens))
                .collect(),
            EmbeddingInput::Tokens(ids) => vec![EmbedInput::Tokens(ids)],
            EmbeddingInput::TokenBatch(v) => v.into_iter().map(EmbedInput::Tokens).collect(),
        }),
        PoolingInput::Chat(chat) => {
            let req = ChatCompletionRequest {
                messages: chat.messages,
                add_generation_prompt: Some(chat.add_generation_prompt),
                continue_final_message: chat.continue_final_message,
                chat_template: chat.chat_template,
                chat_template_kwargs: chat.chat_template_kwargs,
                ..ChatCompletionRequest::default()
            };
            let renderer = renderer.ok_or_else(|| ApiError::bad_request(NO_CHAT_TEMPLATE))?;
            let rendered = renderer.render_chat_prompt(&req)?;
            Ok(vec![text(rendered.prompt, chat.add_special_tokens)])
        }
    }
}

/// vLLM's refusal of chat input on a model without a chat template.
const NO_CHAT_TEMPLATE: &str = "As of transformers v4.44, default chat template is no longer \
     allowed, so you must provide a chat template if the tokenizer does not define one.";

/// Runs a pooling call on the blocking pool. Not behind the server's per-core gate: concurrent
/// calls must reach the Embedder together, whose batcher runs them in shared forward passes
/// (one at a time), so throughput grows with concurrency.
async fn blocking<T: Send + 'static, E: Into<ApiError> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(Into::into)
}

fn side(s: Option<TruncationSideParam>) -> Option<TruncationSide> {
    s.map(|s| match s {
        TruncationSideParam::Left => TruncationSide::Left,
        TruncationSideParam::Right => TruncationSide::Right,
    })
}

fn response_id(headers: &HeaderMap, prefix: &str) -> String {
    match header_request_id(headers) {
        Some(h) => format!("{prefix}-{h}"),
        None => format!("{prefix}-{}", random_request_id()),
    }
}

fn le_f32_base64(v: &[f32]) -> String {
    base64(&vector_bytes(v, EmbedDType::Float32, Endianness::Little))
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
    // `input_type` picks a prompt prefix of the model (vLLM prepends it to each text; a
    // model with a chat template would get it as a system message instead).
    let prefix = match &req.input_type {
        None => None,
        Some(t) => {
            let instructions = &embedder.config().task_instructions;
            if instructions.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "Unsupported input_type '{t}'. This model does not define any input_type \
                     task instructions."
                )));
            }
            match instructions.get(t) {
                Some(p) => Some(p.clone()).filter(|p| !p.is_empty()),
                None => {
                    let supported: Vec<&str> = instructions.keys().map(String::as_str).collect();
                    return Err(ApiError::bad_request(format!(
                        "Unsupported input_type '{t}'. Supported values: {}",
                        supported.join(", ")
                    )));
                }
            }
        }
    };
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
    let inputs: Vec<EmbedInput> = texts
        .iter()
        .map(|t| match &prefix {
            Some(p) => EmbedInput::Text(format!("{p}{t}")),
            None => EmbedInput::Text(t.clone()),
        })
        .collect();
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
/// model, the class probabilities of a classifier), in any `encoding_format`.
#[utoipa::path(post, path = "/pooling", tag = "pooling",
    request_body = PoolingRequest,
    responses(
    (status = 200, description = "One pooled output per input, in input order (`encoding_format` `bytes` / `bytes_only`: the raw bytes, as `/v1/embeddings`).", content(
        (PoolingResponse = "application/json"),
        (Vec<u8> = "application/octet-stream"),
    )),
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
    let renderer = state.renderer.clone();
    let id = response_id(&headers, "pooling");
    let params = req.params;
    let encoding = req.encoding;
    let input = req.input;
    let out = blocking(move || {
        let inputs = pooling_inputs(input, renderer.as_deref())?;
        let pooled: Vec<(Vec<f32>, usize)> = if embedder.config().task == PoolingTask::Embed {
            let opts = EmbedOptions {
                truncate_prompt_tokens: params.truncate_prompt_tokens,
                truncation_side: side(params.truncation_side),
                dimensions: None,
                use_activation: params.use_activation,
            };
            embedder.embed(&inputs, &opts).map(|v| {
                v.into_iter()
                    .map(|e| (e.embedding, e.prompt_tokens))
                    .collect()
            })?
        } else {
            embedder
                .classify(&inputs, &score_options(&params))
                .map(|v| v.into_iter().map(|c| (c.probs, c.prompt_tokens)).collect())?
        };
        let prompt_tokens = pooled.iter().map(|(_, n)| n).sum();
        let vectors = pooled.into_iter().map(|(v, _)| v).collect();
        Ok::<_, ApiError>(encode_vectors(
            vectors,
            prompt_tokens,
            encoding,
            id,
            model,
            |data, usage, id, model| PoolingResponse {
                id,
                object: "list".into(),
                created: unix_now(),
                model,
                data: data
                    .into_iter()
                    .enumerate()
                    .map(|(index, data)| PoolingData {
                        index,
                        object: "pooling".into(),
                        data,
                    })
                    .collect(),
                usage,
            },
        ))
    })
    .await?;
    Ok(match out {
        EmbedOutput::Json(resp) => json_response(StatusCode::OK, &resp),
        EmbedOutput::Bytes { body, metadata } => bytes_response(body, metadata.as_ref()),
    })
}

/// The truncation and activation fields as the engine takes them.
fn score_options(p: &PoolingParamsFields) -> ScoreOptions {
    ScoreOptions {
        truncate_prompt_tokens: p.truncate_prompt_tokens,
        truncation_side: side(p.truncation_side),
        use_activation: p.use_activation,
    }
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
    let renderer = state.renderer.clone();
    let opts = score_options(&req.params);
    let input = req.input;
    let out = blocking(move || {
        let inputs = pooling_inputs(input, renderer.as_deref())?;
        embedder.classify(&inputs, &opts).map_err(ApiError::from)
    })
    .await?;
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
    let opts = score_options(&req.params);
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
    let opts = score_options(&req.params);
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
    use super::*;

    #[test]
    fn bytes_metadata_header_is_ascii_json() {
        let meta = BytesMetadata {
            id: "embd-1".into(),
            created: 7,
            model: "modèle".into(),
            data: Vec::new(),
            usage: BytesUsage {
                prompt_tokens: 1,
                total_tokens: 1,
            },
        };
        let resp = bytes_response(vec![1, 2], Some(&meta));
        let h = resp.headers()["metadata"].to_str().expect("ascii header");
        assert!(h.contains("mod\\u00e8le"), "{h}");
        let back: BytesMetadata = serde_json::from_str(h).expect("json");
        assert_eq!(back, meta);
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "application/octet-stream"
        );
    }
}
