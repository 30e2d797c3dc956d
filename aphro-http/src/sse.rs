//! Server-sent events exactly as vLLM frames them (`api.md` §1.7): every event is
//! `data: <one-line JSON>\n\n`, no `event:`/`id:` lines, and the stream always ends with
//! `data: [DONE]\n\n` — also after an in-stream error, which is sent as one more event
//! carrying the error envelope while the HTTP status stays 200. The Anthropic and Kobold
//! streams name their events instead ([`named_event_response`]).
use crate::error::ApiError;
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::convert::Infallible;

pub fn event_bytes(value: &Value) -> Bytes {
    data_event(Vec::new(), value)
}

/// `head` then `data: <one-line JSON>\n\n`; serde_json never emits raw newlines inside a
/// compact document, so the JSON is one line.
fn data_event(mut head: Vec<u8>, value: &Value) -> Bytes {
    head.extend_from_slice(b"data: ");
    head.extend(serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec()));
    head.extend_from_slice(b"\n\n");
    Bytes::from(head)
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
    event_stream_response(sse_body(events))
}

/// A 200 with an event-stream body and the headers every stream here sends.
fn event_stream_response(body: Body) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// One named event: `event: <name>\ndata: <one-line JSON>\n\n`.
pub fn named_event_bytes(name: &str, value: &Value) -> Bytes {
    data_event(format!("event: {name}\n").into_bytes(), value)
}

/// Named events as Anthropic's Messages stream and the Kobold stream frame them: no
/// `[DONE]` (the stream just ends); the first error ends it after an `event: error` whose
/// data is `on_error`'s body for it.
pub fn named_event_response<S, F>(events: S, on_error: F) -> Response
where
    S: Stream<Item = Result<(&'static str, Value), ApiError>> + Send + 'static,
    F: Fn(&ApiError) -> Value + Send + 'static,
{
    let framed = events
        .scan(false, move |errored, item| {
            if *errored {
                return futures::future::ready(None);
            }
            let bytes = match item {
                Ok((name, v)) => named_event_bytes(name, &v),
                Err(e) => {
                    *errored = true;
                    named_event_bytes("error", &on_error(&e))
                }
            };
            futures::future::ready(Some(bytes))
        })
        .map(Ok::<_, Infallible>);
    event_stream_response(Body::from_stream(framed))
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

    #[tokio::test]
    async fn names_events_and_ends_after_an_error_without_done() {
        let events = futures::stream::iter(vec![
            Ok(("ping", json!({"type": "ping"}))),
            Err(ApiError::internal("boom")),
            Ok(("never", json!({}))),
        ]);
        let resp = named_event_response(events, |e| json!({"message": e.message}));
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body");
        assert_eq!(
            String::from_utf8(body.to_vec()).expect("utf-8"),
            "event: ping\ndata: {\"type\":\"ping\"}\n\nevent: error\ndata: {\"message\":\"boom\"}\n\n"
        );
    }
}
