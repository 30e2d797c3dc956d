//! Anthropic's Messages routes (`endpoints.md` §2): thin handlers over
//! `aphro_engine::messages` (the coupled path) and `aphro_core::anthropic::count_tokens`
//! (render only, so `aphro launch render` serves it too). Every error on these routes,
//! body-parse errors included, is Anthropic's `{"type": "error", "error": {type, message}}`.
use super::openai::coupled;
use super::render::{header_request_id, renderer};
use super::{content_length, AppState};
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use crate::sse::named_event_response;
use aphro_core::anthropic::{self, Route};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// `/v1/messages` (the integrated server).
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(messages))
}

/// `/v1/messages/count_tokens` (every role with a renderer).
pub fn count_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(count_tokens))
}

/// An error in Anthropic's shape, with the status of the error it replaces.
struct AnthropicError(ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl From<aphro_core::Error> for AnthropicError {
    fn from(e: aphro_core::Error) -> Self {
        AnthropicError(e.into())
    }
}

impl From<aphro_engine::openai::OpenAiError> for AnthropicError {
    fn from(e: aphro_engine::openai::OpenAiError) -> Self {
        AnthropicError(e.into())
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let e = self.0;
        json_response(
            e.status,
            &anthropic::error_body(e.status.as_u16(), &e.message),
        )
    }
}

/// `POST /v1/messages` body (`endpoints.md` §2.1); unknown fields are ignored.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub struct MessagesRequestDoc {
    pub model: String,
    /// `{role: "user" | "assistant", content: string | content block[]}`.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    pub max_tokens: i64,
    pub system: Option<SystemDoc>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<Value>,
}

/// `POST /v1/messages/count_tokens` body: a Messages body without `max_tokens`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub struct CountTokensRequestDoc {
    pub model: String,
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    pub system: Option<SystemDoc>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
}

/// `system`: a string or text blocks.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum SystemDoc {
    Text(String),
    Blocks(Vec<TextBlockDoc>),
}

/// `{"type": "text", "text"}` (other keys, such as `cache_control`, are ignored).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub struct TextBlockDoc {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// A Messages response: content blocks `thinking`, `text`, `tool_use`.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessagesResponseDoc {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub role: String,
    #[schema(value_type = Vec<Object>)]
    pub content: Vec<Value>,
    pub model: String,
    #[schema(required)]
    pub stop_reason: Option<String>,
    #[schema(required)]
    pub stop_sequence: Option<String>,
    pub usage: AnthropicUsage,
}

/// One streamed event's data (`message_start`, `ping`, `content_block_start`,
/// `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`, `error`);
/// the SSE `event:` line repeats `type`.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageStreamEventDoc {
    #[serde(rename = "type")]
    pub kind: String,
    #[schema(value_type = Option<Object>)]
    pub message: Option<Value>,
    pub index: Option<u64>,
    #[schema(value_type = Option<Object>)]
    pub content_block: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub delta: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub usage: Option<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorObject {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// Anthropic's error body.
#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorResponse {
    #[serde(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorObject,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ContextManagement {
    pub original_input_tokens: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CountTokensResponse {
    pub input_tokens: u64,
    pub context_management: ContextManagement,
}

/// Anthropic Messages: render, generate and derender as a chat request.
#[utoipa::path(post, path = "/v1/messages", tag = "anthropic",
    request_body = MessagesRequestDoc,
    responses(
    (status = 200, description = "A Messages response; with `stream: true` an SSE stream of \
        named events (`event: <type>` then `data:`), no `[DONE]`; an in-stream error is an \
        `error` event.",
        content(
            (MessagesResponseDoc = "application/json"),
            (MessageStreamEventDoc = "text/event-stream"),
        )),
    (status = 400, description = "Invalid request.", body = AnthropicErrorResponse),
    (status = 401, description = "Missing or wrong API key (`x-api-key` or Bearer).", body = AnthropicErrorResponse),
    (status = 404, description = "Unknown `model`.", body = AnthropicErrorResponse),
    (status = 503, description = "The engine failed and stopped serving.", body = AnthropicErrorResponse),
))]
async fn messages(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<JsonBody<Value>, ApiError>,
) -> Result<Response, AnthropicError> {
    let JsonBody(body) = body?;
    let serving = coupled(&state)?;
    let req = anthropic::parse_request(&body, Route::Messages)?;
    let model = state.resolve_model(Some(&req.model))?;
    let id = header_request_id(&headers).map(str::to_owned);
    let stream = req.stream == Some(true);
    let s = serving.clone();
    let rendered = state
        .cpu
        .run(content_length(&headers), move || {
            s.render_messages(&req, id.as_deref())
        })
        .await?;
    if stream {
        let events = serving.stream_messages(rendered, model)?;
        return Ok(named_event_response(
            events.map(|e| e.map_err(ApiError::from)),
            |e| anthropic::error_body(e.status.as_u16(), &e.message),
        ));
    }
    let generated = serving.generate_chat(rendered).await?;
    let v = state
        .cpu
        .run(None, move || serving.derender_messages(generated, &model))
        .await?;
    Ok(json_response(StatusCode::OK, &v))
}

/// Anthropic `count_tokens`: the prompt length of the equivalent chat render.
#[utoipa::path(post, path = "/v1/messages/count_tokens", tag = "anthropic",
    request_body = CountTokensRequestDoc,
    responses(
    (status = 200, description = "The token count.", body = CountTokensResponse),
    (status = 400, description = "Invalid request.", body = AnthropicErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = AnthropicErrorResponse),
    (status = 404, description = "Unknown `model`.", body = AnthropicErrorResponse),
))]
async fn count_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<JsonBody<Value>, ApiError>,
) -> Result<Response, AnthropicError> {
    let JsonBody(body) = body?;
    let renderer = renderer(&state)?.clone();
    if let Some(m) = body.get("model").and_then(Value::as_str) {
        state.resolve_model(Some(m))?;
    }
    let v = state
        .cpu
        .run(content_length(&headers), move || {
            anthropic::count_tokens(&renderer, &body)
        })
        .await?;
    Ok(json_response(StatusCode::OK, &v))
}
