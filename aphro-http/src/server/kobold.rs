//! The KoboldAI API behind `--launch-kobold-api` (`endpoints.md` §5): thin handlers over
//! `aphro_engine::kobold::KoboldServing`. Errors keep the OpenAI envelope, as Aphrodite's do.
//! The `/api/v1/...` routes that only report settings are mounted under `/api/latest/...` too.
use super::{content_length, AppState};
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use crate::sse::named_event_response;
use aphro_core::kobold::{GenKey, TokenCountRequest, KOBOLDCPP_VERSION, KOBOLD_API_VERSION};
use aphro_engine::kobold::KoboldServing;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(generate))
        .routes(routes!(generate_latest))
        .routes(routes!(generate_stream))
        .routes(routes!(check_get))
        .routes(routes!(check_post))
        .routes(routes!(abort))
        .routes(routes!(token_count))
        .routes(routes!(version_v1))
        .routes(routes!(version_latest))
        .routes(routes!(model_v1))
        .routes(routes!(model_latest))
        .routes(routes!(max_length_v1))
        .routes(routes!(max_length_latest))
        .routes(routes!(max_context_length_v1))
        .routes(routes!(max_context_length_latest))
        .routes(routes!(true_max_context_length))
        .routes(routes!(soft_prompts_list_v1))
        .routes(routes!(soft_prompts_list_latest))
        .routes(routes!(soft_prompt_v1))
        .routes(routes!(soft_prompt_latest))
        .routes(routes!(extra_version))
}

fn kobold(state: &AppState) -> Result<&Arc<KoboldServing>, ApiError> {
    state
        .kobold
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("The model does not support KoboldAI API"))
}

/// `KAIGenerationInputSchema` (`endpoints.md` §5); other fields are accepted and ignored.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub struct KoboldGenerateDoc {
    pub prompt: String,
    pub max_context_length: i64,
    pub max_length: i64,
    pub genkey: Option<String>,
    pub n: Option<i64>,
    pub rep_pen: Option<f64>,
    pub rep_pen_range: Option<i64>,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub temperature: Option<f64>,
    pub sampler_seed: Option<i64>,
    pub stop_sequence: Option<Vec<String>>,
    pub include_stop_str_in_output: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KoboldText {
    pub text: String,
}

/// `{"results": [{"text"}, ...]}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct KoboldResults {
    pub results: Vec<KoboldText>,
}

/// One stream event's data: the new text.
#[derive(Debug, Serialize, ToSchema)]
pub struct KoboldToken {
    pub token: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KoboldValue {
    pub value: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KoboldStringValue {
    pub value: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KoboldValues {
    pub values: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KoboldResult {
    pub result: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KoboldCppVersion {
    pub result: String,
    pub version: String,
}

/// `/api/extra/abort`'s answer (KoboldCpp's shape): whether a generation was stopped.
#[derive(Debug, Serialize, ToSchema)]
pub struct KoboldAbort {
    pub success: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub struct GenKeyDoc {
    pub genkey: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub struct TokenCountDoc {
    pub prompt: String,
}

async fn run_generate(
    state: AppState,
    headers: axum::http::HeaderMap,
    body: Value,
) -> Result<Response, ApiError> {
    let k = kobold(&state)?.clone();
    let model = state.resolve_model(None)?;
    let (req, texts) = state
        .cpu
        .run(content_length(&headers), move || {
            k.start(&body, false, model)
        })
        .await?;
    let v = KoboldServing::collect(&req, texts).await?;
    Ok(json_response(StatusCode::OK, &v))
}

/// Generate to the end (or an abort): one result per `n`.
#[utoipa::path(post, path = "/api/v1/generate", tag = "kobold", request_body = KoboldGenerateDoc,
    responses((status = 200, description = "The generated text.", body = KoboldResults),
              (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse)))]
async fn generate(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    run_generate(state, headers, body).await
}

/// `/api/v1/generate` under its `latest` name.
#[utoipa::path(post, path = "/api/latest/generate", tag = "kobold", request_body = KoboldGenerateDoc,
    responses((status = 200, description = "The generated text.", body = KoboldResults),
              (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse)))]
async fn generate_latest(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    run_generate(state, headers, body).await
}

/// Generate as SSE: `event: message` with `{"token": <new text>}` per engine step; the
/// stream ends without a terminal event.
#[utoipa::path(post, path = "/api/extra/generate/stream", tag = "kobold",
    request_body = KoboldGenerateDoc,
    responses((status = 200, description = "Named SSE events.",
                content((KoboldToken = "text/event-stream"))),
              (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse)))]
async fn generate_stream(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let k = kobold(&state)?.clone();
    let model = state.resolve_model(None)?;
    let (_, texts) = state
        .cpu
        .run(content_length(&headers), move || {
            k.start(&body, true, model)
        })
        .await?;
    let events = texts.map(|item| {
        item.map(|(_, t)| ("message", json!({"token": t})))
            .map_err(ApiError::from)
    });
    Ok(named_event_response(events, ApiError::body))
}

/// The text so far of a running generation, by `?genkey=`.
#[utoipa::path(get, path = "/api/extra/generate/check", tag = "kobold",
    params(("genkey" = Option<String>, Query, description = "The generation's key.")),
    responses((status = 200, description = "`\"\"` when unknown or finished.", body = KoboldResults)))]
async fn check_get(
    State(state): State<AppState>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let k = kobold(&state)?;
    let key = q.get("genkey").map(String::as_str).unwrap_or_default();
    Ok(json_response(StatusCode::OK, &k.check(key)))
}

/// The text so far of a running generation, by `{"genkey"}`.
#[utoipa::path(post, path = "/api/extra/generate/check", tag = "kobold", request_body = GenKeyDoc,
    responses((status = 200, description = "`\"\"` when unknown or finished.", body = KoboldResults),
              (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse)))]
async fn check_post(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<GenKey>,
) -> Result<Response, ApiError> {
    let k = kobold(&state)?;
    Ok(json_response(
        StatusCode::OK,
        &k.check(body.genkey.as_deref().unwrap_or_default()),
    ))
}

/// Stops a running generation; its request ends with the text so far.
#[utoipa::path(post, path = "/api/extra/abort", tag = "kobold", request_body = GenKeyDoc,
    responses((status = 200, description = "Whether a generation was running.", body = KoboldAbort),
              (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse)))]
async fn abort(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<GenKey>,
) -> Result<Response, ApiError> {
    let k = kobold(&state)?;
    let success = body.genkey.as_deref().is_some_and(|g| k.abort(g));
    Ok(json_response(StatusCode::OK, &KoboldAbort { success }))
}

/// `len(encode(prompt, add_special_tokens=False))`.
#[utoipa::path(post, path = "/api/extra/tokencount", tag = "kobold", request_body = TokenCountDoc,
    responses((status = 200, description = "The prompt's token count.", body = KoboldValue),
              (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse)))]
async fn token_count(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody<TokenCountRequest>,
) -> Result<Response, ApiError> {
    let k = kobold(&state)?.clone();
    let n = state
        .cpu
        .run(content_length(&headers), move || {
            k.token_count(&body.prompt)
        })
        .await?;
    Ok(json_response(StatusCode::OK, &json!({"value": n})))
}

/// A GET route answering a fixed shape from the state.
macro_rules! kobold_get {
    ($name:ident, $path:tt, $body:ident, $desc:tt, |$state:ident| $value:expr) => {
        #[doc = $desc]
        #[utoipa::path(get, path = $path, tag = "kobold", responses((status = 200, description = $desc, body = $body)))]
        async fn $name(State($state): State<AppState>) -> Response {
            json_response(StatusCode::OK, &$value)
        }
    };
}

fn model_name(state: &AppState) -> Value {
    let name = state
        .settings
        .served_model_names
        .first()
        .cloned()
        .unwrap_or_default();
    json!({"result": format!("aphro/{name}")})
}

kobold_get!(
    version_v1,
    "/api/v1/info/version",
    KoboldResult,
    "The Kobold API version.",
    |_s| json!({"result": KOBOLD_API_VERSION})
);
kobold_get!(
    version_latest,
    "/api/latest/info/version",
    KoboldResult,
    "The Kobold API version.",
    |_s| json!({"result": KOBOLD_API_VERSION})
);
kobold_get!(
    model_v1,
    "/api/v1/model",
    KoboldResult,
    "`aphro/<served model name>`.",
    |s| model_name(&s)
);
kobold_get!(
    model_latest,
    "/api/latest/model",
    KoboldResult,
    "`aphro/<served model name>`.",
    |s| model_name(&s)
);
kobold_get!(
    max_length_v1,
    "/api/v1/config/max_length",
    KoboldValue,
    "The served context length.",
    |s| json!({"value": s.settings.max_model_len})
);
kobold_get!(
    max_length_latest,
    "/api/latest/config/max_length",
    KoboldValue,
    "The served context length.",
    |s| json!({"value": s.settings.max_model_len})
);
kobold_get!(
    max_context_length_v1,
    "/api/v1/config/max_context_length",
    KoboldValue,
    "The served context length.",
    |s| json!({"value": s.settings.max_model_len})
);
kobold_get!(
    max_context_length_latest,
    "/api/latest/config/max_context_length",
    KoboldValue,
    "The served context length.",
    |s| json!({"value": s.settings.max_model_len})
);
kobold_get!(
    true_max_context_length,
    "/api/extra/true_max_context_length",
    KoboldValue,
    "The served context length.",
    |s| json!({"value": s.settings.max_model_len})
);
kobold_get!(
    soft_prompts_list_v1,
    "/api/v1/config/soft_prompts_list",
    KoboldValues,
    "Soft prompts: none.",
    |_s| json!({"values": []})
);
kobold_get!(
    soft_prompts_list_latest,
    "/api/latest/config/soft_prompts_list",
    KoboldValues,
    "Soft prompts: none.",
    |_s| json!({"values": []})
);
kobold_get!(
    soft_prompt_v1,
    "/api/v1/config/soft_prompt",
    KoboldStringValue,
    "The active soft prompt: none.",
    |_s| json!({"value": ""})
);
kobold_get!(
    soft_prompt_latest,
    "/api/latest/config/soft_prompt",
    KoboldStringValue,
    "The active soft prompt: none.",
    |_s| json!({"value": ""})
);
kobold_get!(
    extra_version,
    "/api/extra/version",
    KoboldCppVersion,
    "The KoboldCpp feature level clients probe for.",
    |_s| json!({"result": "KoboldCpp", "version": KOBOLDCPP_VERSION})
);
