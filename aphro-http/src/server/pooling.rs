//! The pooling routes of a server whose model runs as a pooling model (`--runner pooling`):
//! `/v1/embeddings`, thin over [`aphro_engine::pooling::Embedder`] (vLLM 0.33.0's
//! `entrypoints/pooling/embed/`).
use super::render::header_request_id;
use super::{unix_now, AppState};
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use aphro_core::protocol::{
    random_request_id, EmbeddingData, EmbeddingInput, EmbeddingRequest, EmbeddingResponse,
    EmbeddingVector, EncodingFormat, PoolingUsage, TruncationSideParam,
};
use aphro_engine::pooling::{EmbedInput, EmbedOptions, Embedder, PoolingError, TruncationSide};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embeddings))
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
    let req: EmbeddingRequest = aphro_core::validation::from_body(&body)?;
    let model = pooling_model(&state, req.model.as_deref())?;
    let embedder = embedder(&state)?.clone();
    match req.encoding_format {
        EncodingFormat::Float | EncodingFormat::Base64 => {}
        other => {
            return Err(ApiError::bad_request(format!(
                "encoding_format {other:?} is not supported by this server (float, base64)"
            ))
            .with_param("encoding_format"))
        }
    }
    if !req.add_special_tokens {
        return Err(ApiError::bad_request(
            "add_special_tokens=false is not supported by this server",
        )
        .with_param("add_special_tokens"));
    }
    let inputs: Vec<EmbedInput> = match req.input {
        EmbeddingInput::Text(s) => vec![EmbedInput::Text(s)],
        EmbeddingInput::Texts(v) => v.into_iter().map(EmbedInput::Text).collect(),
        EmbeddingInput::Tokens(ids) => vec![EmbedInput::Tokens(ids)],
        EmbeddingInput::TokenBatch(v) => v.into_iter().map(EmbedInput::Tokens).collect(),
    };
    let opts = EmbedOptions {
        truncate_prompt_tokens: req.truncate_prompt_tokens,
        truncation_side: req.truncation_side.map(|s| match s {
            TruncationSideParam::Left => TruncationSide::Left,
            TruncationSideParam::Right => TruncationSide::Right,
        }),
        dimensions: req.dimensions,
        use_activation: req.use_activation,
    };
    // A forward pass is CPU-heavy: always on the blocking pool, never on an async worker.
    let out = state
        .cpu
        .run(None, move || embedder.embed(&inputs, &opts))
        .await?;
    let prompt_tokens: usize = out.iter().map(|e| e.prompt_tokens).sum();
    let data = out
        .into_iter()
        .enumerate()
        .map(|(index, e)| EmbeddingData {
            index,
            object: "embedding".into(),
            embedding: match req.encoding_format {
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = e.embedding.iter().flat_map(|v| v.to_le_bytes()).collect();
                    EmbeddingVector::Base64(base64(&bytes))
                }
                _ => EmbeddingVector::Float(e.embedding),
            },
        })
        .collect();
    let id = match header_request_id(&headers) {
        Some(h) => format!("embd-{h}"),
        None => format!("embd-{}", random_request_id()),
    };
    let resp = EmbeddingResponse {
        id,
        object: "list".into(),
        created: unix_now(),
        model,
        data,
        usage: PoolingUsage::prompt(prompt_tokens as u64),
    };
    Ok(json_response(StatusCode::OK, &resp))
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
