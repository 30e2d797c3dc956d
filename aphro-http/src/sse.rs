//! Server-sent events exactly as vLLM frames them (`api.md` §1.7): every event is
//! `data: <one-line JSON>\n\n`, no `event:`/`id:` lines, and the stream always ends with
//! `data: [DONE]\n\n` — also after an in-stream error, which is sent as one more event
//! carrying the error envelope while the HTTP status stays 200.
use crate::error::ApiError;
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::convert::Infallible;

pub fn event_bytes(value: &Value) -> Bytes {
    let mut out = b"data: ".to_vec();
    // serde_json never emits raw newlines inside a compact document.
    out.extend(serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec()));
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Frame a stream of events; the first error ends the stream after its error event.
pub fn sse_body<S>(events: S) -> Body
where
    S: Stream<Item = Result<Value, ApiError>> + Send + 'static,
{
    let framed = events
        .scan(false, |errored, item| {
            if *errored {
                return futures::future::ready(None);
            }
            let bytes = match item {
                Ok(v) => event_bytes(&v),
                Err(e) => {
                    *errored = true;
                    event_bytes(&e.body())
                }
            };
            futures::future::ready(Some(bytes))
        })
        .chain(futures::stream::once(async { Bytes::from_static(DONE) }))
        .map(Ok::<_, Infallible>);
    Body::from_stream(framed)
}

pub fn sse_response<S>(events: S) -> Response
where
    S: Stream<Item = Result<Value, ApiError>> + Send + 'static,
{
    let mut resp = (StatusCode::OK, sse_body(events)).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn frames_events_then_error_then_done() {
        let events = futures::stream::iter(vec![
            Ok(json!({"a": 1})),
            Err(ApiError::internal("boom")),
            Ok(json!({"never": true})),
        ]);
        let body = axum::body::to_bytes(sse_body(events), usize::MAX)
            .await
            .expect("body");
        let text = String::from_utf8(body.to_vec()).expect("utf-8");
        assert_eq!(
            text,
            "data: {\"a\":1}\n\ndata: {\"error\":{\"message\":\"boom\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n"
        );
    }
}
