//! Routes every role mounts: health, version, models, metrics.
use super::AppState;
use crate::error::json_response;
use crate::metrics::TEXT_CONTENT_TYPE;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;

/// The vLLM release whose wire protocol aphro speaks; `/version` reports it so routers that
/// gate features on the version keep working.
pub const VLLM_COMPAT_VERSION: &str = "0.33.0";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
}

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

async fn version() -> Response {
    json_response(StatusCode::OK, &json!({"version": VLLM_COMPAT_VERSION}))
}

async fn models(State(state): State<AppState>) -> Response {
    let s = &state.settings;
    let data: Vec<_> = s
        .served_model_names
        .iter()
        .map(|name| {
            json!({
                "id": name,
                "object": "model",
                "created": state.created,
                "owned_by": "vllm",
                "root": s.model_root,
                "parent": null,
                "max_model_len": s.max_model_len,
                "permission": [{
                    "id": format!("modelperm-{}", name),
                    "object": "model_permission",
                    "created": state.created,
                    "allow_create_engine": false,
                    "allow_sampling": true,
                    "allow_logprobs": true,
                    "allow_search_indices": false,
                    "allow_view": true,
                    "allow_fine_tuning": false,
                    "organization": "*",
                    "group": null,
                    "is_blocking": false
                }]
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

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
