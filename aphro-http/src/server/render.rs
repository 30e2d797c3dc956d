//! The GPU-less frontend routes: render, tokenize, detokenize (`api.md` §3, §5, §9).
//!
//! Handlers are thin: parse the body, call the library, serialize. All semantics live in
//! `aphro_core::Renderer`, so the CLI, the Python bindings and these routes agree by
//! construction.
use super::{content_length, AppState};
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use aphro_core::derenderer::Derenderer;
use aphro_core::protocol::derender::{
    parse_derender_chat_body, parse_derender_completion_body, DerenderChatBody, DerenderChatOutput,
    DerenderCompletionBody, DerenderCompletionOutput,
};
use aphro_core::protocol::{
    ChatCompletionRequest, CompletionRequest, DetokenizeRequest, DetokenizeResponse,
    GenerateRequest, TokenizeRequest, TokenizeResponse,
};
use aphro_core::Renderer;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Every route of the render role.
pub fn routes() -> OpenApiRouter<AppState> {
    scale_out_routes().merge(utility_routes())
}

/// The render and derender routes: scale-out endpoints, which the integrated server mounts
/// only with `--enable-scale-out` (vLLM's `register_scale_out_api_routers`).
pub fn scale_out_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(render_chat))
        .routes(routes!(render_completion))
        .routes(routes!(derender_chat))
        .routes(routes!(derender_completion))
}

/// `/tokenize` and `/detokenize`, mounted by every role with a tokenizer.
pub fn utility_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(tokenize))
        .routes(routes!(detokenize))
}

/// `X-Request-Id` replaces the body's `request_id` as the base id (§1.5).
pub fn header_request_id(headers: &HeaderMap) -> Option<&str> {
    headers.get("x-request-id").and_then(|v| v.to_str().ok())
}

pub(crate) fn renderer(state: &AppState) -> Result<&Arc<Renderer>, ApiError> {
    state
        .renderer
        .as_ref()
        .ok_or_else(|| no_tokenizer(state, "renderer"))
}

/// Why a server without a tokenizer cannot serve a text route: `--skip-tokenizer-init` is a
/// request the server cannot take (vLLM's renderer message, 400); `--tokens-only` has no such
/// routes at all (501).
fn no_tokenizer(state: &AppState, what: &str) -> ApiError {
    if state.settings.skip_tokenizer_init {
        ApiError::bad_request("Tokenizer not available when `skip_tokenizer_init=True`")
    } else {
        ApiError::not_implemented(format!(
            "This server has no {what} (it was started with --tokens-only)."
        ))
    }
}

/// Chat request -> one `GenerateRequest` (template applied, tokenized, sampling resolved).
#[utoipa::path(post, path = "/v1/chat/completions/render", tag = "render",
    request_body = ChatCompletionRequest,
    responses(
    (status = 200, description = "A `GenerateRequest` for `/inference/v1/generate`.", body = GenerateRequest),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 501, description = "The server has no renderer (`--tokens-only`).", body = super::openapi::ErrorResponse),
))]
async fn render_chat(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?.clone();
    let id = header_request_id(&headers).map(str::to_owned);
    // Templates and tokenizers are CPU work: keep them off the async reactor; an image URL
    // to fetch always goes to the blocking pool.
    let inline_len = (!aphro_core::renderer::chat_fetches_media(&req))
        .then(|| content_length(&headers))
        .flatten();
    let out = state
        .cpu
        .run(inline_len, move || {
            renderer.render_chat_with_id(&req, id.as_deref())
        })
        .await?;
    Ok(json_response(StatusCode::OK, &out))
}

/// Completion request -> one `GenerateRequest` per prompt.
#[utoipa::path(post, path = "/v1/completions/render", tag = "render",
    request_body = CompletionRequest,
    responses(
    (status = 200, description = "One `GenerateRequest` per prompt.", body = Vec<GenerateRequest>),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 501, description = "The server has no renderer (`--tokens-only`).", body = super::openapi::ErrorResponse),
))]
async fn render_completion(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?.clone();
    let id = header_request_id(&headers).map(str::to_owned);
    let out = state
        .cpu
        .run(content_length(&headers), move || {
            renderer.render_completion_with_id(&req, id.as_deref())
        })
        .await?;
    Ok(json_response(StatusCode::OK, &out))
}

/// Tokenize a prompt or a chat.
#[utoipa::path(post, path = "/tokenize", tag = "utility",
    request_body = TokenizeRequest,
    responses(
    (status = 200, description = "The token ids (and their strings with `return_token_strs`).", body = TokenizeResponse),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 501, description = "The server has no renderer (`--tokens-only`).", body = super::openapi::ErrorResponse),
))]
async fn tokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?.clone();
    let out = state
        .cpu
        .run(content_length(&headers), move || renderer.tokenize(&req))
        .await?;
    Ok(json_response(StatusCode::OK, &out))
}

/// Decode token ids to text.
#[utoipa::path(post, path = "/detokenize", tag = "utility",
    request_body = DetokenizeRequest,
    responses(
    (status = 200, description = "The decoded text.", body = DetokenizeResponse),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 501, description = "The server has no renderer (`--tokens-only`).", body = super::openapi::ErrorResponse),
))]
async fn detokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?;
    let out = renderer.detokenize(&req)?;
    Ok(json_response(StatusCode::OK, &out))
}

pub(crate) fn derenderer(state: &AppState) -> Result<&Arc<Derenderer>, ApiError> {
    state
        .derenderer
        .as_ref()
        .ok_or_else(|| no_tokenizer(state, "derenderer"))
}

/// Generate output -> OpenAI chat response (or one stream chunk plus its state).
#[utoipa::path(post, path = "/v1/chat/completions/derender", tag = "derender",
    request_body = DerenderChatBody,
    responses(
    (status = 200, description = "A `ChatCompletionResponse`, or with `stream: true` one `{chunk, stream_state}`.", body = DerenderChatOutput),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 501, description = "The server has no renderer (`--tokens-only`).", body = super::openapi::ErrorResponse),
))]
async fn derender_chat(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let d = derenderer(&state)?.clone();
    let out = state
        .cpu
        .run(
            content_length(&headers),
            move || -> aphro_core::Result<_> {
                Ok(match parse_derender_chat_body(&body)? {
                    DerenderChatBody::Full(r) => {
                        DerenderChatOutput::Full(Box::new(d.derender_chat(*r)?))
                    }
                    DerenderChatBody::Stream(r) => {
                        DerenderChatOutput::Stream(Box::new(d.derender_chat_stream(*r)?))
                    }
                })
            },
        )
        .await?;
    Ok(json_response(StatusCode::OK, &out))
}

/// Generate output -> OpenAI completion response (or one stream chunk plus its state).
#[utoipa::path(post, path = "/v1/completions/derender", tag = "derender",
    request_body = DerenderCompletionBody,
    responses(
    (status = 200, description = "A `CompletionResponse`, or with `stream: true` one `{chunk, stream_state}`.", body = DerenderCompletionOutput),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 501, description = "The server has no renderer (`--tokens-only`).", body = super::openapi::ErrorResponse),
))]
async fn derender_completion(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let d = derenderer(&state)?.clone();
    let out = state
        .cpu
        .run(
            content_length(&headers),
            move || -> aphro_core::Result<_> {
                Ok(match parse_derender_completion_body(&body)? {
                    DerenderCompletionBody::Full(r) => {
                        DerenderCompletionOutput::Full(Box::new(d.derender_completion(*r)?))
                    }
                    DerenderCompletionBody::Stream(r) => DerenderCompletionOutput::Stream(
                        Box::new(d.derender_completion_stream(*r)?),
                    ),
                })
            },
        )
        .await?;
    Ok(json_response(StatusCode::OK, &out))
}
