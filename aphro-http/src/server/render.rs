//! The GPU-less frontend routes: render, tokenize, detokenize (wire spec §3, §5, §9).
//!
//! Handlers are thin: parse the body, call the library, serialize. All semantics live in
//! `aphro_core::Renderer`, so the CLI, the Python bindings and these routes agree by
//! construction.
use super::AppState;
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use aphro_core::derenderer::Derenderer;
use aphro_core::protocol::derender::{
    parse_derender_chat_body, parse_derender_completion_body, DerenderChatBody,
    DerenderCompletionBody,
};
use aphro_core::protocol::{DetokenizeRequest, TokenizeRequest};
use aphro_core::renderer::{parse_chat_request, parse_completion_request};
use aphro_core::Renderer;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::Value;
use std::sync::Arc;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions/render", post(render_chat))
        .route("/v1/completions/render", post(render_completion))
        .route("/v1/chat/completions/derender", post(derender_chat))
        .route("/v1/completions/derender", post(derender_completion))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
}

/// `X-Request-Id` replaces the body's `request_id` as the base id (§1.5).
pub fn header_request_id(headers: &HeaderMap) -> Option<&str> {
    headers.get("x-request-id").and_then(|v| v.to_str().ok())
}

pub(crate) fn renderer(state: &AppState) -> Result<&Arc<Renderer>, ApiError> {
    state.renderer.as_ref().ok_or_else(|| {
        ApiError::not_implemented(
            "This server has no renderer (it was started with --tokens-only).",
        )
    })
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<Value, ApiError> {
    serde_json::to_value(v).map_err(|e| ApiError::internal(format!("serialization failed: {e}")))
}

async fn render_chat(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?.clone();
    let req = parse_chat_request(&body)?;
    let id = header_request_id(&headers).map(str::to_owned);
    // Templates and tokenizers are CPU work: keep them off the async reactor.
    let out =
        tokio::task::spawn_blocking(move || renderer.render_chat_with_id(&req, id.as_deref()))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(json_response(StatusCode::OK, &to_json(&out)?))
}

async fn render_completion(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?.clone();
    let req = parse_completion_request(&body)?;
    let id = header_request_id(&headers).map(str::to_owned);
    let out = tokio::task::spawn_blocking(move || {
        renderer.render_completion_with_id(&req, id.as_deref())
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(json_response(StatusCode::OK, &to_json(&out)?))
}

async fn tokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?.clone();
    let out = tokio::task::spawn_blocking(move || renderer.tokenize(&req))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(json_response(StatusCode::OK, &to_json(&out)?))
}

async fn detokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?;
    let out = renderer.detokenize(&req)?;
    Ok(json_response(StatusCode::OK, &to_json(&out)?))
}

pub(crate) fn derenderer(state: &AppState) -> Result<&Arc<Derenderer>, ApiError> {
    state.derenderer.as_ref().ok_or_else(|| {
        ApiError::not_implemented(
            "This server has no derenderer (it was started with --tokens-only).",
        )
    })
}

/// Run CPU-bound library work off the async reactor and flatten its errors.
async fn blocking<T, F>(f: F) -> Result<T, ApiError>
where
    F: FnOnce() -> aphro_core::Result<T> + Send + 'static,
    T: Send + 'static,
{
    Ok(tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??)
}

async fn derender_chat(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let d = derenderer(&state)?.clone();
    let out = blocking(move || {
        Ok(match parse_derender_chat_body(&body)? {
            DerenderChatBody::Full(r) => serde_json::to_value(d.derender_chat(*r)?),
            DerenderChatBody::Stream(r) => serde_json::to_value(d.derender_chat_stream(*r)?),
        })
    })
    .await?
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(json_response(StatusCode::OK, &out))
}

async fn derender_completion(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let d = derenderer(&state)?.clone();
    let out = blocking(move || {
        Ok(match parse_derender_completion_body(&body)? {
            DerenderCompletionBody::Full(r) => serde_json::to_value(d.derender_completion(*r)?),
            DerenderCompletionBody::Stream(r) => {
                serde_json::to_value(d.derender_completion_stream(*r)?)
            }
        })
    })
    .await?
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(json_response(StatusCode::OK, &out))
}
