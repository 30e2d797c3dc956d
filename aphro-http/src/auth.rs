//! `--api-key` / `VLLM_API_KEY` enforcement (`api.md` §1.4).
//!
//! Only the API prefixes are guarded; `/health`, `/metrics`, `/tokenize`, `/detokenize`,
//! `/version` and the legacy `/abort_requests` stay open, exactly as vLLM does, so existing
//! routers and probes keep working when a key is set. Two departures from vLLM, both so real
//! clients work: the key is accepted as `x-api-key` too (what Anthropic's SDKs send), and
//! the Kobold routes (`/api/...`) are guarded as well (vLLM has none; Aphrodite leaves them
//! open, KoboldCpp guards them with its password). `/v1/messages` answers a 401 in
//! Anthropic's error shape.
use crate::error::unauthorized;
use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

const GUARDED_PREFIXES: [&str; 5] = ["/v1", "/v2", "/inference", "/cohere", "/api"];

#[derive(Debug, Clone, Default)]
pub struct ApiKeys(pub Arc<Vec<String>>);

impl ApiKeys {
    pub fn new(keys: Vec<String>) -> Self {
        ApiKeys(Arc::new(
            keys.into_iter().filter(|k| !k.is_empty()).collect(),
        ))
    }

    pub fn is_enabled(&self) -> bool {
        !self.0.is_empty()
    }

    /// Compare against every key without an early exit, so timing leaks nothing about which
    /// prefix matched.
    fn accepts(&self, presented: &str) -> bool {
        let mut ok = false;
        for key in self.0.iter() {
            ok |= constant_time_eq(key.as_bytes(), presented.as_bytes());
        }
        ok
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn is_guarded(path: &str) -> bool {
    GUARDED_PREFIXES.iter().any(|p| {
        path == *p
            || path
                .strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// `Authorization: Bearer <key>` with the scheme compared case-insensitively.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

pub async fn require_api_key(State(keys): State<ApiKeys>, req: Request, next: Next) -> Response {
    if !keys.is_enabled() || req.method() == Method::OPTIONS || !is_guarded(req.uri().path()) {
        return next.run(req).await;
    }
    let headers = req.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let x_api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    if bearer.into_iter().chain(x_api_key).any(|k| keys.accepts(k)) {
        return next.run(req).await;
    }
    if req.uri().path().starts_with("/v1/messages") {
        return crate::error::json_response(
            axum::http::StatusCode::UNAUTHORIZED,
            &aphro_core::anthropic::error_body(401, "invalid x-api-key"),
        );
    }
    unauthorized()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guarded_paths_match_whole_segments() {
        assert!(is_guarded("/v1/chat/completions"));
        assert!(is_guarded("/inference/v1/generate"));
        assert!(!is_guarded("/v1x"));
        assert!(!is_guarded("/health"));
        assert!(!is_guarded("/abort_requests"));
        assert!(!is_guarded("/tokenize"));
        assert!(is_guarded("/api/v1/generate"));
        assert!(!is_guarded("/apis"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("bearer sekret"), Some("sekret"));
        assert_eq!(bearer_token("Bearer sekret"), Some("sekret"));
        assert_eq!(bearer_token("Basic sekret"), None);
        let keys = ApiKeys::new(vec!["sekret".into(), "other".into()]);
        assert!(keys.accepts("other"));
        assert!(!keys.accepts("sekre"));
    }
}
