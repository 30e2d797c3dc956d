//! Request-body extraction with vLLM's error behaviour.
//!
//! axum's own `Json` answers 415/422 with plain-text bodies; vLLM answers every malformed
//! body with 400 and its error envelope (§1.1, §1.3 of the wire spec). [`JsonBody`] checks the
//! media type, enforces the body-size limit *before* parsing, and turns serde errors into a
//! `"Bad Request"` validation error whose `param` is the dotted path of the offending field.
use crate::error::ApiError;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

/// Default request-body limit (bytes); configurable per server.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Per-router limit, stored in request extensions by the router builder.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// A JSON request body parsed into `T`, or a vLLM-shaped 400.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// True for `application/json`, compared case-insensitively with parameters ignored.
pub fn is_json_content_type(value: Option<&str>) -> bool {
    value
        .and_then(|v| v.split(';').next())
        .map(|m| m.trim().eq_ignore_ascii_case("application/json"))
        .unwrap_or(false)
}

/// Parse bytes into `T` with a path-aware error (used by extractors and the CLI alike).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let msg = inner.to_string();
        // serde reports a missing field at its parent's path; name the field itself.
        let field = msg
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
            .map(str::to_owned);
        let mut loc = String::from("body");
        if path != "." && !path.is_empty() {
            loc.push('.');
            loc.push_str(&path);
        }
        if let Some(f) = field {
            loc.push('.');
            loc.push_str(&f);
        }
        let what = if inner.is_syntax() || inner.is_eof() {
            format!("JSON decode error: {msg}")
        } else {
            msg
        };
        ApiError::validation(format!(
            "1 validation error:\n  {{'loc': '{loc}', 'msg': '{what}'}}"
        ))
        .with_param(loc)
    })
}

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        if !is_json_content_type(ct) {
            return Err(ApiError::validation(
                "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            ));
        }
        let limit = req
            .extensions()
            .get::<BodyLimit>()
            .map(|l| l.0)
            .unwrap_or(DEFAULT_MAX_BODY_BYTES);
        let bytes = axum::body::to_bytes(req.into_body(), limit)
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Payload Too Large",
                    format!("Request body exceeds the limit of {limit} bytes"),
                )
            })?;
        parse_json(&bytes).map(JsonBody)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Req {
        messages: Vec<Msg>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Msg {
        role: String,
    }

    #[test]
    fn media_type_check_ignores_case_and_params() {
        assert!(is_json_content_type(Some(
            "Application/JSON; charset=utf-8"
        )));
        assert!(!is_json_content_type(Some("text/plain")));
        assert!(!is_json_content_type(None));
    }

    #[test]
    fn missing_field_names_its_location() {
        let err = parse_json::<Req>(b"{}").expect_err("must be refused");
        assert_eq!(err.param.as_deref(), Some("body.messages"));
        assert_eq!(err.kind, "Bad Request");
        let err = parse_json::<Req>(br#"{"messages":[{"role":1}]}"#).expect_err("must be refused");
        assert_eq!(err.param.as_deref(), Some("body.messages[0].role"));
        let err = parse_json::<Req>(b"{not json").expect_err("must be refused");
        assert!(err.message.contains("JSON decode error"), "{}", err.message);
    }
}
