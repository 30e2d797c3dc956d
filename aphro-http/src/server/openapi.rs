//! `/openapi.json` and `/docs`.
//!
//! The document is not written by hand: every route is registered through
//! `utoipa_axum::routes!`, which takes the method and path from the handler's
//! `#[utoipa::path]` attribute and mounts the handler under exactly that method and path. The
//! axum router and the OpenAPI document therefore come out of the same registration and
//! cannot drift apart; each role's document lists only the routes that role mounts.
//!
//! The body schemas are derived too: every wire type of `aphro_core::protocol` derives
//! `utoipa::ToSchema` beside its serde impls, and each
//! route's `#[utoipa::path]` names the type it parses as `request_body` and the type it
//! serializes as the response (a route that streams lists the SSE event type as a second,
//! `text/event-stream`, content). The schemas follow serde: renames, untagged enums as
//! `oneOf` (or `anyOf` where variants overlap), keys with a serde default optional, and in
//! responses a key the server always writes, even as `null`, `required`. utoipa registers
//! every referenced schema under `components/schemas`. `tests/openapi.rs` validates real
//! requests and responses of each role against the document. The error envelope below is
//! the one shape every route shares.
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::openapi::OpenApi;
use utoipa::ToSchema;

/// The error body (`api.md` §1.2): the one type in `aphro_core::protocol`.
pub use aphro_core::protocol::{ErrorObject, ErrorResponse};

/// `GET /version`.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionResponse {
    pub version: String,
}

/// The body of a 401: exactly `{"error": "Unauthorized"}` (§1.2).
#[derive(Debug, Serialize, ToSchema)]
pub struct UnauthorizedResponse {
    pub error: String,
}

/// Title, version and shared schemas on top of the collected paths.
pub fn finish(mut doc: OpenApi) -> OpenApi {
    doc.info = utoipa::openapi::InfoBuilder::new()
        .title("aphro")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(
            "vLLM-compatible render / generate / derender and OpenAI endpoints.",
        ))
        .build();
    doc
}

/// Swagger UI, loaded by the reader's browser from a CDN as FastAPI's `/docs` is, so the
/// server ships no UI assets and builds offline.
pub const DOCS_HTML: &str = r##"<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<title>aphro - Swagger UI</title>
<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui",
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  layout: "BaseLayout", deepLinking: true});
</script>
</body>
</html>
"##;

pub async fn docs() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        DOCS_HTML,
    )
        .into_response()
}
