//! The vLLM variant of the OpenAI error envelope, and its HTTP response.
//!
//! `{"error": {"message", "type", "param", "code"}}` where `code` is the integer HTTP status
//! and the status line equals it. Two spellings of the 400 `type` exist on the wire:
//! `"Bad Request"` for structural request-validation failures (the HTTP reason phrase) and
//! `"BadRequestError"` for semantic failures raised by handlers. Auth failures and unknown
//! routes use different bodies altogether (see [`unauthorized`] and [`route_not_found`]).
use aphro_core::protocol::ErrorResponse;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: kind.into(),
            param: None,
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// A structural validation failure (malformed body, wrong type, missing field).
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Bad Request", message)
    }

    /// A semantic failure detected by a handler.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequestError", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotFoundError", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            message,
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            message,
        )
    }

    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, "NotImplementedError", message)
    }

    /// `The model `X` does not exist.` with `param: "model"`, as vLLM words it.
    pub fn unknown_model(requested: &str, served: &[String]) -> Self {
        Self::not_found(format!(
            "The model `{requested}` does not exist. Valid aliases: {}",
            served.join(", ")
        ))
        .with_param("model")
    }

    pub fn error_response(&self) -> ErrorResponse {
        ErrorResponse::new(
            self.status.as_u16(),
            self.kind.clone(),
            self.message.clone(),
            self.param.as_deref(),
        )
    }

    pub fn body(&self) -> Value {
        self.error_response().to_value()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body())
    }
}

/// A JSON response with an exact body (no pretty-printing, UTF-8 kept).
pub fn json_response<T: serde::Serialize + ?Sized>(status: StatusCode, body: &T) -> Response {
    // Straight to bytes: a `GenerateRequest` carries thousands of token ids, which a detour
    // through `serde_json::Value` would box one by one.
    let bytes = match serde_json::to_vec(body) {
        Ok(bytes) => bytes,
        Err(e) => {
            return ApiError::internal(format!("response serialization failed: {e}"))
                .into_response()
        }
    };
    let mut resp = (status, bytes).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// 401 with the exact body vLLM sends: `{"error":"Unauthorized"}`.
pub fn unauthorized() -> Response {
    json_response(StatusCode::UNAUTHORIZED, &json!({"error": "Unauthorized"}))
}

/// Unknown routes answer FastAPI's default `404 {"detail":"Not Found"}`, not the envelope.
pub async fn route_not_found() -> Response {
    json_response(StatusCode::NOT_FOUND, &json!({"detail": "Not Found"}))
}

/// Every error type of the workspace reaches HTTP through its [`ErrorResponse`].
impl From<ErrorResponse> for ApiError {
    fn from(r: ErrorResponse) -> Self {
        let e = r.error;
        ApiError {
            status: StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message: e.message,
            kind: e.kind,
            param: e.param,
        }
    }
}

impl From<aphro_core::Error> for ApiError {
    fn from(e: aphro_core::Error) -> Self {
        e.to_error_response().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_carries_integer_status() {
        let e =
            ApiError::bad_request("top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)")
                .with_param("top_p");
        assert_eq!(
            e.body(),
            json!({"error": {"message": "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)",
                    "type": "BadRequestError", "param": "top_p", "code": 400}})
        );
        assert_eq!(e.into_response().status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn unknown_model_names_the_param() {
        let e = ApiError::unknown_model("nope", &["smollm2".into()]);
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.param.as_deref(), Some("model"));
        assert_eq!(
            e.message,
            "The model `nope` does not exist. Valid aliases: smollm2"
        );
    }
}
