//! `POST /generative_scoring` on a generative model (`docs/spec/endpoints.md` §1.10), thin over
//! [`aphro_engine::serving::ServingEngine::generative_score`].
use super::engine::engine;
use super::render::header_request_id;
use super::AppState;
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use aphro_core::protocol::{GenerativeScoringRequest, GenerativeScoringResponse};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(generative_scoring))
}

/// The probability of the first label token after each `query + item` prompt (one generated
/// position per item; softmax over the label tokens, or over the vocabulary with
/// `apply_softmax: false`).
#[utoipa::path(post, path = "/generative_scoring", tag = "generate",
    request_body = GenerativeScoringRequest,
    responses(
    (status = 200, description = "One score per item, in item order.", body = GenerativeScoringResponse),
    (status = 400, description = "Invalid request (no items, no labels, a label outside the vocabulary, ...).", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
))]
async fn generative_scoring(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let req: GenerativeScoringRequest = aphro_core::validation::from_body(&body)?;
    state.resolve_model(req.model.as_deref())?;
    let engine = engine(&state)?.clone();
    let resp = engine
        .generative_score(&req, header_request_id(&headers))
        .await?;
    Ok(json_response(StatusCode::OK, &resp))
}
