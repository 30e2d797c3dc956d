//! The integrated OpenAI routes (`/v1/chat/completions`, `/v1/completions`) and generate's
//! `output_mode: "derender"`: render → engine → derender chained in one process, with the
//! same library calls the three disaggregated roles make, so both deployments give the same
//! bytes (wire spec §8, §12).
use super::engine::engine;
use super::render::{derenderer, header_request_id, renderer};
use super::AppState;
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use crate::sse::sse_response;
use aphro_core::derenderer::ChatDerenderStream;
use aphro_core::protocol::{
    ChatCompletionRequest, DerenderChatRequest, DerenderCompletionRequest, GenerateRequest,
    GenerateResponse, GenerateStreamResponse,
};
use aphro_core::renderer::{parse_chat_request, parse_completion_request};
use aphro_engine::serving::ServingEngine;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use futures::StreamExt;
use serde_json::Value;
use std::sync::Arc;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

/// The engine's wire output re-read as aphro-core's protocol type (same JSON shape).
fn to_core<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(internal)
}

async fn run_full(
    engine: &ServingEngine,
    req: GenerateRequest,
) -> Result<GenerateResponse, ApiError> {
    let resp = engine.generate(req, None)?.collect_response().await?;
    to_core(serde_json::to_value(&resp).map_err(internal)?)
}

async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?.clone();
    let derenderer = derenderer(&state)?.clone();
    let engine = engine(&state)?.clone();
    super::unsupported::check_openai(&body)?;
    let chat: ChatCompletionRequest = parse_chat_request(&body)?;
    let id = header_request_id(&headers).map(str::to_owned);
    let chat_for_render = chat.clone();
    let rendered = tokio::task::spawn_blocking(move || {
        renderer.render_chat_with_id(&chat_for_render, id.as_deref())
    })
    .await
    .map_err(internal)??;
    let chat_id = rendered.request_id.clone();
    tracing::info!(request_id = %chat_id, prompt_tokens = rendered.token_ids.len(), stream = chat.stream, "chat completion");
    let prompt_ids = rendered.token_ids.clone();
    if chat.stream {
        let n = rendered.sampling_params.n.max(1) as usize;
        let stream = engine.generate(rendered, None)?;
        let mut states: Vec<ChatDerenderStream> = (0..n)
            .map(|i| derenderer.chat_stream(Some(&chat), chat_id.clone(), Some(&prompt_ids), i))
            .collect::<Result<_, _>>()?;
        for s in &mut states {
            s.set_prompt_tokens(Some(prompt_ids.len() as u64));
        }
        let events = stream.into_events().map(move |item| {
            let ev = item?.to_json();
            let chunk: GenerateStreamResponse = to_core(ev)?;
            let idx = chunk.choices.first().map(|c| c.index as usize).unwrap_or(0);
            let st = states
                .get_mut(idx)
                .ok_or_else(|| ApiError::internal("choice index out of range"))?;
            let out = st.push(&chunk)?;
            serde_json::to_value(out).map_err(internal)
        });
        return Ok(sse_response(events));
    }
    let n_prompt = prompt_ids.len() as u64;
    let generated = run_full(&engine, rendered).await?;
    let resp = tokio::task::spawn_blocking(move || {
        derenderer.derender_chat(DerenderChatRequest {
            stream: false,
            model: chat.model.clone(),
            generate_response: generated,
            prompt_tokens: Some(n_prompt),
            prompt_token_ids: Some(prompt_ids),
            chat_request: Some(chat),
        })
    })
    .await
    .map_err(internal)??;
    let mut v = serde_json::to_value(resp).map_err(internal)?;
    // The coupled server answers with its own `chatcmpl-` id (§1.6), not generate's.
    v["id"] = Value::String(chat_id);
    Ok(json_response(StatusCode::OK, &v))
}

async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let renderer = renderer(&state)?.clone();
    let derenderer = derenderer(&state)?.clone();
    let engine = engine(&state)?.clone();
    super::unsupported::check_openai(&body)?;
    let req = parse_completion_request(&body)?;
    let id = header_request_id(&headers).map(str::to_owned);
    let req_for_render = req.clone();
    let rendered = tokio::task::spawn_blocking(move || {
        renderer.render_completion_with_id(&req_for_render, id.as_deref())
    })
    .await
    .map_err(internal)??;
    let base_id = rendered
        .first()
        .map(|r| r.request_id.trim_end_matches("-0").to_owned())
        .unwrap_or_default();
    if req.stream {
        if rendered.len() != 1 {
            return Err(
                ApiError::bad_request("Streaming is supported for a single prompt only.")
                    .with_param("prompt"),
            );
        }
        let mut it = rendered.into_iter();
        let r = it
            .next()
            .ok_or_else(|| ApiError::internal("no prompt rendered"))?;
        let prompt_ids = r.token_ids.clone();
        let n = r.sampling_params.n.max(1) as usize;
        let stream = engine.generate(r, None)?;
        let mut states = (0..n)
            .map(|i| {
                derenderer.completion_stream(Some(&req), base_id.clone(), Some(&prompt_ids), i)
            })
            .collect::<Result<Vec<_>, _>>()?;
        for s in &mut states {
            s.set_prompt_tokens(Some(prompt_ids.len() as u64));
        }
        let events = stream.into_events().map(move |item| {
            let chunk: GenerateStreamResponse = to_core(item?.to_json())?;
            let idx = chunk.choices.first().map(|c| c.index as usize).unwrap_or(0);
            let st = states
                .get_mut(idx)
                .ok_or_else(|| ApiError::internal("choice index out of range"))?;
            serde_json::to_value(st.push(&chunk)?).map_err(internal)
        });
        return Ok(sse_response(events));
    }
    let prompt_tokens: Vec<u64> = rendered.iter().map(|r| r.token_ids.len() as u64).collect();
    let prompt_ids: Vec<Option<Vec<u32>>> =
        rendered.iter().map(|r| Some(r.token_ids.clone())).collect();
    // All prompts run concurrently: the engine batches them.
    let runs = rendered.into_iter().map(|r| run_full(&engine, r));
    let generated = futures::future::try_join_all(runs).await?;
    let resp = tokio::task::spawn_blocking(move || {
        derenderer.derender_completion(DerenderCompletionRequest {
            stream: false,
            model: req.model.clone(),
            generate_responses: generated,
            prompt_tokens: Some(prompt_tokens),
            prompt_token_ids: Some(prompt_ids),
            completion_request: Some(req),
        })
    })
    .await
    .map_err(internal)??;
    let mut v = serde_json::to_value(resp).map_err(internal)?;
    v["id"] = Value::String(base_id);
    Ok(json_response(StatusCode::OK, &v))
}

/// `POST /inference/v1/generate` with `output_mode: "derender"` (non-streaming only): the
/// engine's tokens are parsed with the request's `parse_context` into a chat message.
pub async fn generate_derender(
    state: &AppState,
    engine: &Arc<ServingEngine>,
    req: GenerateRequest,
    header_id: Option<&str>,
) -> Result<Response, ApiError> {
    let derenderer = derenderer(state)?.clone();
    if req.stream.unwrap_or(false) {
        return Err(ApiError::bad_request(
            "output_mode='derender' does not support stream=true.",
        ));
    }
    // The message is assembled from the render-time context the request carries (§4.1).
    let chat_request = match &req.parse_context {
        Some(ctx) => {
            let mut v = serde_json::to_value(ctx).map_err(internal)?;
            if let Some(obj) = v.as_object_mut() {
                obj.remove("history_tool_call_cnt");
                obj.insert("messages".into(), Value::Array(Vec::new()));
            }
            Some(parse_chat_request(&v)?)
        }
        None if derenderer.has_parser() => {
            return Err(ApiError::bad_request(
                "output_mode='derender' requires parse_context when the server has a tool or reasoning parser.",
            ))
        }
        None => None,
    };
    let prompt_ids = req.token_ids.clone();
    let resp = engine.generate(req, header_id)?.collect_response().await?;
    let generated: GenerateResponse = to_core(serde_json::to_value(&resp).map_err(internal)?)?;
    let out = tokio::task::spawn_blocking(move || {
        derenderer.derender_chat(DerenderChatRequest {
            stream: false,
            model: None,
            generate_response: generated,
            prompt_tokens: Some(prompt_ids.len() as u64),
            prompt_token_ids: Some(prompt_ids),
            chat_request,
        })
    })
    .await
    .map_err(internal)??;
    let mut v = serde_json::to_value(out).map_err(internal)?;
    v["output_mode"] = Value::String("derender".into());
    Ok(json_response(StatusCode::OK, &v))
}
