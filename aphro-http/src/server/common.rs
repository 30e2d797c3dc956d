//! Routes every role mounts: health, version, models, metrics.
use super::AppState;
use crate::error::json_response;
use crate::metrics::TEXT_CONTENT_TYPE;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The vLLM release whose wire protocol aphro speaks; `/version` reports it so routers that
/// gate features on the version keep working.
pub const VLLM_COMPAT_VERSION: &str = "0.33.0";

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(ping_get, ping_post))
        .routes(routes!(version))
        .routes(routes!(models))
        .routes(routes!(model))
        .routes(routes!(metrics))
}

/// Liveness: 200 with an empty body; 503 with the reason once the engine has died.
#[utoipa::path(get, path = "/health", tag = "utility", responses(
    (status = 200, description = "Serving."),
    (status = 503, description = "The engine failed and stopped serving.", body = String, content_type = "text/plain"),
))]
async fn health(State(state): State<AppState>) -> Response {
    if let Some(engine) = &state.engine {
        if let Some(reason) = engine.failure() {
            state
                .health
                .mark_dead(format!("the engine failed and stopped serving: {reason}"));
        }
    }
    match state.health.fatal_reason() {
        None => StatusCode::OK.into_response(),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

/// SageMaker's liveness route: the same answer as `/health` (vLLM mounts it on GET and POST).
#[utoipa::path(get, path = "/ping", tag = "utility", responses(
    (status = 200, description = "Serving."),
    (status = 503, description = "The engine failed and stopped serving.", body = String, content_type = "text/plain"),
))]
async fn ping_get(state: State<AppState>) -> Response {
    health(state).await
}

/// `POST /ping`: as `GET /ping`.
#[utoipa::path(post, path = "/ping", tag = "utility", responses(
    (status = 200, description = "Serving."),
    (status = 503, description = "The engine failed and stopped serving.", body = String, content_type = "text/plain"),
))]
async fn ping_post(state: State<AppState>) -> Response {
    health(state).await
}

/// The vLLM release whose wire protocol this server speaks.
#[utoipa::path(get, path = "/version", tag = "utility", responses(
    (status = 200, description = "The compatible vLLM version.", body = super::openapi::VersionResponse),
))]
async fn version() -> Response {
    json_response(StatusCode::OK, &json!({"version": VLLM_COMPAT_VERSION}))
}

/// The served model names (OpenAI model list with vLLM's extra fields).
#[utoipa::path(get, path = "/v1/models", tag = "utility", responses(
    (status = 200, description = "The served model names.", body = ModelList),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
))]
async fn models(State(state): State<AppState>) -> Response {
    let data = state
        .settings
        .served_model_names
        .iter()
        .map(|name| model_card(&state, name))
        .collect();
    let list = ModelList {
        object: "list",
        data,
    };
    match serde_json::to_value(&list) {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => crate::error::ApiError::internal(e.to_string()).into_response(),
    }
}

/// `GET /v1/models` (vLLM's `ModelList`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// One served model name (vLLM's `ModelCard`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    #[schema(required)]
    pub root: Option<String>,
    #[schema(required)]
    pub parent: Option<String>,
    #[schema(required)]
    pub max_model_len: Option<usize>,
    pub permission: Vec<ModelPermission>,
}

/// vLLM's `ModelPermission`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelPermission {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub allow_create_engine: bool,
    pub allow_sampling: bool,
    pub allow_logprobs: bool,
    pub allow_search_indices: bool,
    pub allow_view: bool,
    pub allow_fine_tuning: bool,
    pub organization: &'static str,
    #[schema(required)]
    pub group: Option<String>,
    pub is_blocking: bool,
}

/// One served model's card (the OpenAI `GET /v1/models/{model}`); 404 for a name not served.
#[utoipa::path(get, path = "/v1/models/{model}", tag = "utility",
    params(("model" = String, Path, description = "A served model name.")),
    responses(
    (status = 200, description = "The model card, as one entry of `/v1/models`.", body = ModelCard),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown model.", body = super::openapi::ErrorResponse),
))]
async fn model(
    State(state): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Response, crate::error::ApiError> {
    let name = state.resolve_model(Some(&name))?;
    let card = serde_json::to_value(model_card(&state, &name))
        .map_err(|e| crate::error::ApiError::internal(e.to_string()))?;
    Ok(json_response(StatusCode::OK, &card))
}

/// A model card with vLLM's extra fields (`root`, `max_model_len`, `permission`).
fn model_card(state: &AppState, name: &str) -> ModelCard {
    let s = &state.settings;
    ModelCard {
        id: name.to_owned(),
        object: "model",
        created: state.created,
        owned_by: "vllm",
        root: Some(s.model_root.clone()),
        parent: None,
        max_model_len: Some(s.max_model_len),
        permission: vec![ModelPermission {
            id: format!("modelperm-{name}"),
            object: "model_permission",
            created: state.created,
            allow_create_engine: false,
            allow_sampling: true,
            allow_logprobs: true,
            allow_search_indices: false,
            allow_view: true,
            allow_fine_tuning: false,
            organization: "*",
            group: None,
            is_blocking: false,
        }],
    }
}

/// Prometheus text exposition under vLLM's metric names.
#[utoipa::path(get, path = "/metrics", tag = "utility", responses(
    (status = 200, description = "Prometheus text format 0.0.4.", body = String, content_type = "text/plain"),
))]
async fn metrics(State(state): State<AppState>) -> Response {
    let mut text = state.metrics.render();
    if let Some(engine) = &state.engine {
        let name = state
            .settings
            .served_model_names
            .first()
            .map(String::as_str)
            .unwrap_or("");
        text.push_str(&crate::metrics::engine_exposition(
            &engine.metrics_per_engine(),
            name,
        ));
    }
    ([(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)], text).into_response()
}
