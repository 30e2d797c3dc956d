//! The token-in/token-out engine routes (`api.md` §4): generate (tokens / text, streaming
//! SSE or one JSON body; `derender` on the integrated server), abort, and the legacy
//! unauthenticated `/abort_requests` of `--tokens-only` servers.
//!
//! A client that disconnects aborts its request: the response body (streaming) or the handler
//! future (non-streaming) owns the engine stream, and dropping it aborts the request and
//! frees its KV blocks in the engine's next step.
use super::render::header_request_id;
use super::AppState;
use crate::error::{json_response, ApiError};
use crate::extract::{is_json_content_type, LimitedBytes};
use crate::sse::sse_response;
use aphro_core::protocol::{GenerateResponse, GenerateStreamEvent};
use aphro_engine::serving::{GenerateBody, ServingEngine, ServingError};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::Value;
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes(tokens_only: bool) -> OpenApiRouter<AppState> {
    let mut r = OpenApiRouter::new()
        .routes(routes!(generate))
        .routes(routes!(abort));
    if tokens_only {
        r = r.routes(routes!(abort_legacy));
    }
    r
}

/// vLLM's development routes that touch the engine, mounted only when `VLLM_SERVER_DEV_MODE=1`
/// as in vLLM (`vllm/entrypoints/serve/dev/cache/api_router.py`): `POST /reset_prefix_cache`.
pub fn dev_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(reset_prefix_cache))
}

/// Whether vLLM's development routes are on (`VLLM_SERVER_DEV_MODE`, read as vLLM reads it:
/// an integer, non-zero = on).
pub fn dev_mode() -> bool {
    std::env::var("VLLM_SERVER_DEV_MODE")
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .is_some_and(|v| v != 0)
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
struct ResetPrefixCacheQuery {
    /// Preempt running requests to free their blocks first (not supported: a reset waits
    /// until no request holds blocks).
    #[serde(default)]
    reset_running_requests: bool,
    /// Also reset a connector-managed cache (aphro has none, so nothing more to reset).
    #[serde(default)]
    reset_external: bool,
}

/// Drop every cached prefix; `{"success": false}` while requests hold blocks (retry later).
/// With KV events on, subscribers get an `AllBlocksCleared`.
#[utoipa::path(post, path = "/reset_prefix_cache", tag = "dev", params(ResetPrefixCacheQuery),
    responses((status = 200, description = "`{\"success\": bool}`")))]
async fn reset_prefix_cache(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<ResetPrefixCacheQuery>,
) -> Result<Response, ApiError> {
    let engine = Arc::clone(engine(&state)?);
    if q.reset_running_requests {
        return Err(ApiError::bad_request(
            "reset_running_requests=true is not supported: the prefix cache is reset once no \
             request holds blocks (retry while success is false)",
        ));
    }
    let _ = q.reset_external;
    let success = tokio::task::spawn_blocking(move || engine.engine().reset_prefix_cache())
        .await
        .unwrap_or(false);
    Ok(axum::Json(serde_json::json!({ "success": success })).into_response())
}

impl From<ServingError> for ApiError {
    fn from(e: ServingError) -> Self {
        e.to_error_response().into()
    }
}

pub(crate) fn engine(state: &AppState) -> Result<&Arc<ServingEngine>, ApiError> {
    let engine = state
        .engine
        .as_ref()
        .ok_or_else(|| ApiError::not_implemented("This server has no engine."))?;
    if let Some(reason) = state.health.fatal_reason() {
        return Err(ApiError::unavailable(reason));
    }
    if let Some(reason) = engine.failure() {
        let reason = format!("the engine failed and stopped serving: {reason}");
        state.health.mark_dead(&reason);
        return Err(ApiError::unavailable(reason));
    }
    Ok(engine)
}

/// Parse a raw JSON body the way the generate route needs it: `token_ids` straight into
/// integers, the rest as a JSON value so absent `sampling_params` keys stay distinguishable
/// from defaults (§10).
fn json_body(headers: &HeaderMap, body: &[u8]) -> Result<GenerateBody, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    if !is_json_content_type(ct) {
        return Err(ApiError::validation(
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
        ));
    }
    crate::extract::parse_json::<GenerateBody>(body)
}

/// Token ids in, token ids (or text, or a derendered message) out; SSE when `stream`.
#[utoipa::path(post, path = "/inference/v1/generate", tag = "generate",
    request_body(content = aphro_core::protocol::GenerateRequest, description = "A `GenerateRequest` (as `/v1/chat/completions/render` returns it)."),
    responses(
    (status = 200, description = "A `GenerateResponse` (with `output_mode: \"derender\"`, integrated \
        server only, the derendered chat response); with `stream: true` an SSE stream whose `data:` \
        events are `GenerateStreamEvent`s (per-choice chunks, then the usage-only event with \
        `include_usage`), ending in `data: [DONE]` (an in-stream error is one more event with the \
        `ErrorResponse` envelope).",
        content(
            (GenerateOutput = "application/json"),
            (GenerateStreamEvent = "text/event-stream"),
        )),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 503, description = "The engine failed and stopped serving.", body = super::openapi::ErrorResponse),
))]
async fn generate(
    State(state): State<AppState>,
    headers: HeaderMap,
    LimitedBytes(body): LimitedBytes,
) -> Result<Response, ApiError> {
    let parsed = json_body(&headers, &body)?;
    drop(body);
    let value = &parsed.rest;
    let engine = engine(&state)?.clone();
    if let Some(model) = value.get("model").and_then(Value::as_str) {
        state.resolve_model(Some(model))?;
    }
    let streaming = stream_requested(value);
    let req = engine.parse_request_body(parsed)?;
    if req.output_mode == "derender" {
        return super::openai::generate_derender(&state, &engine, req, header_request_id(&headers))
            .await;
    }
    let session = super::openai::header_session_id(&headers);
    let stream = engine.generate_routed(req, header_request_id(&headers), session.as_deref())?;
    tracing::info!(request_id = %stream.request_id(), "generate");
    if streaming {
        let events = stream
            .into_events()
            .map(|item| item.map(|ev| ev.to_json()).map_err(ApiError::from));
        return Ok(sse_response(events));
    }
    let resp = stream.collect_response().await?;
    let v = serde_json::to_value(&resp).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(json_response(StatusCode::OK, &v))
}

/// The JSON body of a non-streaming generate: the engine's response, or (`output_mode:
/// "derender"` on the integrated server) the derendered chat response.
#[derive(Debug, serde::Serialize, ToSchema)]
#[serde(untagged)]
pub enum GenerateOutput {
    Generate(Box<GenerateResponse>),
    Derender(Box<super::openai::GenerateDerenderResponse>),
}

/// The body of both abort routes.
#[derive(Debug, ToSchema)]
pub struct AbortRequest {
    /// `generate-tokens-…` ids as the generate route returned them.
    pub request_ids: Vec<String>,
}

fn stream_requested(v: &Value) -> bool {
    v.get("stream").and_then(Value::as_bool).unwrap_or(false)
}

/// Abort in-flight requests by their `generate-tokens-…` ids.
#[utoipa::path(post, path = "/inference/v1/abort_requests", tag = "generate",
    request_body = AbortRequest,
    responses(
    (status = 200, description = "Accepted; the abort runs in the background."),
    (status = 400, description = "Malformed body.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
))]
async fn abort(state: State<AppState>, body: LimitedBytes) -> Result<Response, ApiError> {
    abort_ids(state, body).await
}

/// The legacy, unauthenticated abort route of `--tokens-only` servers.
#[utoipa::path(post, path = "/abort_requests", tag = "generate",
    request_body = AbortRequest,
    responses(
    (status = 200, description = "Accepted; the abort runs in the background."),
    (status = 400, description = "Malformed body.", body = super::openapi::ErrorResponse),
))]
async fn abort_legacy(state: State<AppState>, body: LimitedBytes) -> Result<Response, ApiError> {
    abort_ids(state, body).await
}

/// `{"request_ids": [...]}` → 200 with an empty body; the abort runs in the background.
async fn abort_ids(
    State(state): State<AppState>,
    LimitedBytes(body): LimitedBytes,
) -> Result<Response, ApiError> {
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::validation(format!("JSON decode error: {e}")))?;
    let ids = value
        .get("request_ids")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::validation("Missing 'request_ids' in request body"))?;
    // Every id must be a string: a silently skipped entry would leave a request running
    // that the client believes aborted.
    let ids: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str().map(str::to_owned).ok_or_else(|| {
                ApiError::validation(format!(
                    "1 validation error:\n  {{'loc': 'body.request_ids[{i}]', 'msg': 'Input should be a valid string'}}"
                ))
                .with_param(format!("body.request_ids[{i}]"))
            })
        })
        .collect::<Result<_, _>>()?;
    if let Some(engine) = state.engine.as_ref() {
        engine.abort(&ids);
    }
    Ok(StatusCode::OK.into_response())
}
