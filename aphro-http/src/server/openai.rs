//! The integrated OpenAI routes (`/v1/chat/completions`, `/v1/completions`) and generate's
//! `output_mode: "derender"`: render → engine → derender chained in one process, with the
//! same library calls the three disaggregated roles make, so both deployments give the same
//! bytes (`api.md` §8, §12).
use super::engine::engine;
use super::render::{derenderer, header_request_id, renderer};
use super::{content_length, AppState};
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use crate::sse::sse_response;
use aphro_core::protocol::{
    ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, CompletionChunk,
    CompletionRequest, CompletionResponse, DerenderChatRequest, GenerateRequest,
};
use aphro_core::renderer::parse_chat_request;
use aphro_engine::openai::{parse_chat, parse_completion, OpenAiError, OpenAiServing};
use aphro_engine::serving::ServingEngine;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(chat_completions))
        .routes(routes!(completions))
}

/// The `X-Session-ID` header the vLLM router's session affinity sends: with data
/// parallelism, a conversation's requests stay on one engine.
pub(crate) fn header_session_id(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

impl From<OpenAiError> for ApiError {
    fn from(e: OpenAiError) -> Self {
        match e {
            OpenAiError::Core(e) => e.into(),
            OpenAiError::Serving(e) => e.into(),
            OpenAiError::Internal(m) => ApiError::internal(m),
        }
    }
}

/// The coupled layer over this server's renderer, derenderer and engine (a 400/503 when the
/// role lacks one of them).
pub(crate) fn coupled(state: &AppState) -> Result<OpenAiServing, ApiError> {
    Ok(OpenAiServing::new(
        renderer(state)?.clone(),
        derenderer(state)?.clone(),
        engine(state)?.clone(),
    ))
}

/// The OpenAI chat endpoint: render, generate and derender in one process.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    request_body = ChatCompletionRequest,
    responses(
    (status = 200, description = "A `ChatCompletionResponse`; with `stream: true` an SSE stream whose \
        `data:` events are `ChatCompletionStreamResponse`s (only the keys vLLM sets), ending in \
        `data: [DONE]` (an in-stream error is one more event with the `ErrorResponse` envelope).",
        content(
            (ChatCompletionResponse = "application/json"),
            (ChatCompletionChunk = "text/event-stream"),
        )),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 503, description = "The engine failed and stopped serving.", body = super::openapi::ErrorResponse),
))]
async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let serving = coupled(&state)?;
    let chat = parse_chat(&body)?;
    let id = header_request_id(&headers).map(str::to_owned);
    let stream = chat.stream;
    let s = serving.clone();
    // An image URL to fetch renders on the blocking pool, whatever the body's size.
    let inline_len = (!aphro_core::renderer::chat_fetches_media(&chat))
        .then(|| content_length(&headers))
        .flatten();
    let rendered = state
        .cpu
        .run(inline_len, move || s.render_chat(chat, id.as_deref()))
        .await?;
    let mut rendered = rendered;
    if rendered.session.is_none() {
        rendered.session = header_session_id(&headers);
    }
    tracing::info!(request_id = %rendered.id, prompt_tokens = rendered.generate.token_ids.len(), stream, "chat completion");
    if stream {
        let model = state.resolve_model(rendered.chat.model.as_deref()).ok();
        let chunks = serving.stream_chat(rendered, model)?;
        return Ok(sse_response(chunks.map(|c| c.map_err(ApiError::from))));
    }
    let generated = serving.generate_chat(rendered).await?;
    let resp = state
        .cpu
        .run(None, move || serving.derender_chat(generated))
        .await?;
    let v = serde_json::to_value(resp).map_err(internal)?;
    Ok(json_response(StatusCode::OK, &v))
}

/// The OpenAI completion endpoint: render, generate and derender in one process.
#[utoipa::path(post, path = "/v1/completions", tag = "openai",
    request_body = CompletionRequest,
    responses(
    (status = 200, description = "A `CompletionResponse`; with `stream: true` an SSE stream whose \
        `data:` events are `CompletionStreamResponse`s, ending in `data: [DONE]` (an in-stream \
        error is one more event with the `ErrorResponse` envelope).",
        content(
            (CompletionResponse = "application/json"),
            (CompletionChunk = "text/event-stream"),
        )),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 503, description = "The engine failed and stopped serving.", body = super::openapi::ErrorResponse),
))]
async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let serving = coupled(&state)?;
    let req = parse_completion(&body)?;
    let id = header_request_id(&headers).map(str::to_owned);
    let stream = req.stream;
    let s = serving.clone();
    let rendered = state
        .cpu
        .run(content_length(&headers), move || {
            s.render_completion(req, id.as_deref())
        })
        .await?;
    let mut rendered = rendered;
    rendered.session = header_session_id(&headers);
    if stream {
        let model = state.resolve_model(rendered.request.model.as_deref())?;
        let chunks = serving.stream_completion(rendered, model)?;
        return Ok(sse_response(chunks.map(|c| c.map_err(ApiError::from))));
    }
    let generated = serving.generate_completion(rendered).await?;
    let resp = state
        .cpu
        .run(None, move || serving.derender_completion(generated))
        .await?;
    let v = serde_json::to_value(resp).map_err(internal)?;
    Ok(json_response(StatusCode::OK, &v))
}

/// `POST /inference/v1/generate` with `output_mode: "derender"` (non-streaming only): the
/// engine's tokens are parsed with the request's `parse_context` into a chat message.
pub async fn generate_derender(
    state: &AppState,
    engine: &Arc<ServingEngine>,
    req: GenerateRequest,
    header_id: Option<&str>,
) -> Result<Response, ApiError> {
    // A request the server cannot serve as asked is the client's to fix (400, wire spec
    // §4.1), not a missing server feature (501).
    let derenderer = state.derenderer.clone().ok_or_else(|| {
        ApiError::bad_request(
            "output_mode='derender' requires a tokenizer, but this server does not load one \
             (--tokens-only or --skip-tokenizer-init). Send the request to a server that \
             loads a tokenizer, or use output_mode='tokens'.",
        )
    })?;
    if req.stream.unwrap_or(false) {
        return Err(ApiError::bad_request(
            "output_mode='derender' does not support stream=true.",
        ));
    }
    // The message is assembled from the render-time context the request carries (§4.1).
    let chat_request = match &req.parse_context {
        Some(ctx) => {
            let mut v = serde_json::to_value(ctx).map_err(internal)?;
            if let Some(obj) = v.as_object_mut() {
                obj.remove("history_tool_call_cnt");
                obj.insert("messages".into(), Value::Array(Vec::new()));
            }
            Some(parse_chat_request(&v)?)
        }
        None if derenderer.has_parser() => {
            return Err(ApiError::bad_request(
                "output_mode='derender' requires parse_context when the server has a tool or reasoning parser.",
            ))
        }
        None => None,
    };
    let prompt_ids = req.token_ids.clone();
    // The derenderer turns the engine's token output into the message, so the engine runs
    // the request in tokens mode: tokens-shaped logprobs, no text of its own.
    let mut req = req;
    req.output_mode = "tokens".into();
    let generated = engine.generate(req, header_id)?.collect_response().await?;
    let out = state
        .cpu
        .run(None, move || {
            derenderer.derender_chat(DerenderChatRequest {
                stream: false,
                model: None,
                generate_response: generated,
                prompt_tokens: Some(prompt_ids.len() as u64),
                prompt_token_ids: Some(prompt_ids),
                chat_request,
            })
        })
        .await?;
    let v = serde_json::to_value(GenerateDerenderResponse {
        response: out,
        output_mode: DerenderMode::Derender,
    })
    .map_err(internal)?;
    Ok(json_response(StatusCode::OK, &v))
}

/// `POST /inference/v1/generate` with `output_mode: "derender"`: the chat response the
/// derender route would give, tagged with the output mode.
#[derive(Debug, Serialize, ToSchema)]
pub struct GenerateDerenderResponse {
    #[serde(flatten)]
    pub response: ChatCompletionResponse,
    pub output_mode: DerenderMode,
}

/// The `output_mode` literal of [`GenerateDerenderResponse`].
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DerenderMode {
    Derender,
}
