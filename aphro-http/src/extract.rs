//! Request-body extraction with vLLM's error behaviour.
//!
//! axum's own `Json` answers 415/422 with plain-text bodies; vLLM answers every malformed
//! body with 400 and its error envelope (`api.md` §1.1, §1.3). [`JsonBody`] checks the
//! media type, enforces the body-size limit *before* parsing, and turns serde errors into a
//! `"Bad Request"` validation error whose `param` is the dotted path of the offending field.
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Default request-body limit (bytes); configurable per server.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Default time a client has to send a whole request body once its headers arrived.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Per-router body limits, stored in request extensions by the router builder so every
/// route that reads a body enforces the same ones.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit {
    /// Largest body accepted, in bytes (413 beyond it, before anything is parsed).
    pub max_bytes: usize,
    /// The whole body must arrive within this long (408 after it), so a client that stops
    /// mid-body cannot hold a connection and a buffer forever.
    pub read_timeout: Duration,
}

impl Default for BodyLimit {
    fn default() -> Self {
        BodyLimit {
            max_bytes: DEFAULT_MAX_BODY_BYTES,
            read_timeout: DEFAULT_BODY_READ_TIMEOUT,
        }
    }
}

/// The raw request body, read under the router's [`BodyLimit`] (JSON 413 / 408 otherwise).
/// Routes that parse the body themselves take this instead of `Bytes`, which has no limit.
#[derive(Debug)]
pub struct LimitedBytes(pub Bytes);

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "Payload Too Large",
        format!("Request body exceeds the limit of {limit} bytes"),
    )
}

/// Read and discard what is left of an over-limit body (up to `cap` bytes, within
/// `timeout`), so the client is reading when the 413 arrives: a server that closes on a
/// client still sending makes the kernel reset the connection, and the client sees a broken
/// pipe instead of the error.
async fn drain(mut body: Body, cap: u64, timeout: Duration) {
    use http_body_util::BodyExt;
    let _ = tokio::time::timeout(timeout, async {
        let mut seen = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                seen += data.len() as u64;
                if seen > cap {
                    break;
                }
            }
        }
    })
    .await;
}

/// How much of an over-limit body is read (and dropped) before the 413 is sent.
const DRAIN_CAP: u64 = 256 << 20;

impl<S: Send + Sync> FromRequest<S> for LimitedBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let limit = req
            .extensions()
            .get::<BodyLimit>()
            .copied()
            .unwrap_or_default();
        // A declared length over the limit is refused before a byte of the body is kept.
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let mut body = req.into_body();
        if declared.is_some_and(|n| n > limit.max_bytes as u64) {
            drain(body, DRAIN_CAP, limit.read_timeout).await;
            return Err(too_large(limit.max_bytes));
        }
        let deadline = tokio::time::Instant::now() + limit.read_timeout;
        let mut buf = bytes::BytesMut::new();
        loop {
            use http_body_util::BodyExt;
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => {
                    return Err(ApiError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        "Request Timeout",
                        format!(
                            "The request body did not arrive within {} s",
                            limit.read_timeout.as_secs_f64()
                        ),
                    ))
                }
                Ok(None) => return Ok(LimitedBytes(buf.freeze())),
                Ok(Some(Err(e))) => {
                    return Err(ApiError::validation(format!(
                        "1 validation error:\n  Could not read the request body: {e}"
                    )))
                }
                Ok(Some(Ok(frame))) => frame,
            };
            if let Some(data) = frame.data_ref() {
                if buf.len() + data.len() > limit.max_bytes {
                    drain(body, DRAIN_CAP, deadline - tokio::time::Instant::now()).await;
                    return Err(too_large(limit.max_bytes));
                }
                buf.extend_from_slice(data);
            }
        }
    }
}

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
/// Strict: bytes after the JSON value (other than whitespace) are refused, as Python's
/// `json.loads` refuses them.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let decode_error = |e: serde_json::Error| {
        ApiError::validation(format!(
            "1 validation error:\n  {{'loc': 'body', 'msg': 'JSON decode error: {e}'}}"
        ))
        .with_param("body")
    };
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    // The typed parse is the fast path (token ids straight into their vectors); only a body
    // that fails it is read again as a JSON value, to name the failing field the one way
    // every entry point does (`aphro_core::validation`, pydantic's wording).
    match T::deserialize(&mut *de) {
        Ok(value) => {
            de.end().map_err(decode_error)?;
            Ok(value)
        }
        Err(e) if e.is_syntax() || e.is_eof() => Err(decode_error(e)),
        Err(e) => {
            let body: serde_json::Value = serde_json::from_slice(bytes).map_err(decode_error)?;
            match aphro_core::validation::from_body::<T>(&body) {
                Err(diag) => Err(diag.into()),
                // Typed and untyped parses disagree only on oddities (duplicate keys): keep
                // serde's own message.
                Ok(_) => Err(ApiError::validation(format!(
                    "1 validation error:\n  {{'loc': 'body', 'msg': '{e}'}}"
                ))
                .with_param("body")),
            }
        }
    }
}

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        if !is_json_content_type(ct) {
            return Err(ApiError::validation(
                "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            ));
        }
        let LimitedBytes(bytes) = LimitedBytes::from_request(req, state).await?;
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
        // pydantic's location: list indices as path segments.
        assert_eq!(err.param.as_deref(), Some("body.messages.0.role"));
        assert!(
            err.message.contains("'loc': 'body.messages.0.role'"),
            "{}",
            err.message
        );
        let err = parse_json::<Req>(b"{not json").expect_err("must be refused");
        assert!(err.message.contains("JSON decode error"), "{}", err.message);
    }
}
