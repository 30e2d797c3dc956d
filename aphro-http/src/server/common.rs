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
        .routes(routes!(version))
        .routes(routes!(models))
        .routes(routes!(metrics))
}

/// Liveness: 200 with an empty body; 503 with the reason once the engine has died.
#[utoipa::path(get, path = "/health", tag = "utility", responses(
    (status = 200, description = "Serving."),
    (status = 503, description = "The engine failed and stopped serving.", body = String, content_type = "text/plain"),
))]
async fn health(State(state): State<AppState>) -> Response {
    if let Some(engine) = &state.engine {
        if !engine.is_healthy() {
            state
                .health
                .mark_dead("the engine failed and stopped serving");
        }
    }
    match state.health.fatal_reason() {
        None => StatusCode::OK.into_response(),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
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
    let s = &state.settings;
    let data = s
        .served_model_names
        .iter()
        .map(|name| ModelCard {
            id: name.clone(),
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
        })
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
        text.push_str(&crate::metrics::engine_exposition(&engine.metrics(), name));
    }
    ([(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)], text).into_response()
}
