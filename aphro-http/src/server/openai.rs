//! The integrated OpenAI routes (`/v1/chat/completions`, `/v1/completions`) and generate's
//! `output_mode: "derender"`: render → engine → derender chained in one process, with the
//! same library calls the three disaggregated roles make, so both deployments give the same
//! bytes (`api.md` §8, §12).
use super::engine::engine;
use super::render::{derenderer, header_request_id, renderer};
use super::AppState;
use crate::error::{json_response, ApiError};
use crate::extract::JsonBody;
use crate::sse::sse_response;
use aphro_core::derenderer::{ChatDerenderStream, CompletionDerenderStream};
use aphro_core::protocol::{
    ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, CompletionChunk,
    CompletionRequest, CompletionResponse, DerenderChatRequest, DerenderCompletionRequest,
    GenerateRequest, GenerateResponse, GenerateStreamResponse,
};
use aphro_core::renderer::{parse_chat_request, parse_completion_request};
use aphro_engine::serving::ServingEngine;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(chat_completions))
        .routes(routes!(completions))
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

async fn run_full(
    engine: &ServingEngine,
    req: GenerateRequest,
) -> Result<GenerateResponse, ApiError> {
    Ok(engine.generate(req, None)?.collect_response().await?)
}

/// The OpenAI chat endpoint: render, generate and derender in one process.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    request_body = ChatCompletionRequest,
    responses(
    (status = 200, description = "A `ChatCompletionResponse`; with `stream: true` an SSE stream whose \
        `data:` events are `ChatCompletionStreamResponse`s (only the keys vLLM sets), ending in \
        `data: [DONE]` (an in-stream error is one more event with the `ErrorResponse` envelope).",
        content(
            (ChatCompletionResponse = "application/json"),
            (ChatCompletionChunk = "text/event-stream"),
        )),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 503, description = "The engine failed and stopped serving.", body = super::openapi::ErrorResponse),
))]
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
        let mut shape = CoupledChatChunks::new(
            &chat,
            &state,
            chat_id,
            &prompt_ids,
            n,
            derenderer.has_parser(),
        );
        let events = stream
            .into_events()
            .map(move |item| -> Result<Vec<Value>, ApiError> {
                let chunk: GenerateStreamResponse = item?.into_chunk();
                let mut out = shape.opening();
                let idx = chunk.choices.first().map(|c| c.index).unwrap_or(0);
                let st = states
                    .get_mut(idx)
                    .ok_or_else(|| ApiError::internal("choice index out of range"))?;
                out.extend(shape.chunk(st.push(&chunk)?));
                Ok(out)
            })
            .flat_map(|r| {
                futures::stream::iter(match r {
                    Ok(v) => v.into_iter().map(Ok).collect::<Vec<_>>(),
                    Err(e) => vec![Err(e)],
                })
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

/// The OpenAI completion endpoint: render, generate and derender in one process.
#[utoipa::path(post, path = "/v1/completions", tag = "openai",
    request_body = CompletionRequest,
    responses(
    (status = 200, description = "A `CompletionResponse`; with `stream: true` an SSE stream whose \
        `data:` events are `CompletionStreamResponse`s, ending in `data: [DONE]` (an in-stream \
        error is one more event with the `ErrorResponse` envelope).",
        content(
            (CompletionResponse = "application/json"),
            (CompletionChunk = "text/event-stream"),
        )),
    (status = 400, description = "Invalid request.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 503, description = "The engine failed and stopped serving.", body = super::openapi::ErrorResponse),
))]
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
        let model = state.resolve_model(req.model.as_deref())?;
        return stream_completions(&engine, &derenderer, &req, rendered, base_id, model);
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

/// Drops null-valued keys, recursively (pydantic's `exclude_none`).
fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// The coupled chat stream as vLLM writes it (wire spec §8.1): unlike the derender
/// endpoint's full dumps, each chunk is serialized with `exclude_unset`, so only the keys
/// vLLM sets appear: one opening chunk per choice with `{"role", "content": ""}`, then
/// deltas holding just what changed, `stop_reason` only on the finishing chunk, and a
/// usage-only chunk without nulls.
struct CoupledChatChunks {
    id: String,
    created: i64,
    model: Option<String>,
    role: String,
    n: usize,
    has_parser: bool,
    /// `Some` until the opening chunks went out.
    opening_prompt_ids: Option<Option<Vec<u32>>>,
    continuous_usage: bool,
    prompt_tokens: u64,
    /// `echo`: sent as one content chunk per choice after the role chunks.
    echo: Option<String>,
}

impl CoupledChatChunks {
    fn new(
        chat: &ChatCompletionRequest,
        state: &AppState,
        id: String,
        prompt_ids: &[u32],
        n: usize,
        has_parser: bool,
    ) -> Self {
        // vLLM's `get_chat_request_role`: the last message's role when not adding a prompt.
        let role = if chat.add_generation_prompt {
            "assistant".to_owned()
        } else {
            chat.messages
                .last()
                .map_or_else(|| "assistant".to_owned(), |m| m.role.clone())
        };
        let opts = chat.stream_options.as_ref();
        CoupledChatChunks {
            id,
            created: super::unix_now() as i64,
            model: state.resolve_model(chat.model.as_deref()).ok(),
            role,
            n,
            has_parser,
            opening_prompt_ids: Some(
                chat.return_token_ids
                    .unwrap_or(false)
                    .then(|| prompt_ids.to_vec()),
            ),
            continuous_usage: opts.is_some_and(|o| o.include_usage && o.continuous_usage_stats),
            prompt_tokens: prompt_ids.len() as u64,
            echo: aphro_core::derenderer::chat_echo_text(chat).filter(|t| !t.is_empty()),
        }
    }

    fn head(&self, model: &str) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("id".into(), Value::String(self.id.clone()));
        m.insert(
            "object".into(),
            Value::String("chat.completion.chunk".into()),
        );
        m.insert("created".into(), Value::from(self.created));
        m.insert("model".into(), Value::String(model.to_owned()));
        m
    }

    /// The role chunks, once, before the first engine output.
    fn opening(&mut self) -> Vec<Value> {
        let Some(prompt_ids) = self.opening_prompt_ids.take() else {
            return Vec::new();
        };
        let model = self.model.clone().unwrap_or_default();
        let usage = self.continuous_usage.then(|| {
            serde_json::json!({"prompt_tokens": self.prompt_tokens,
                               "total_tokens": self.prompt_tokens,
                               "completion_tokens": 0})
        });
        let mut out: Vec<Value> = (0..self.n)
            .map(|i| {
                let mut m = self.head(&model);
                m.insert(
                    "choices".into(),
                    serde_json::json!([{"index": i, "delta": {"role": self.role, "content": ""},
                                        "logprobs": null, "finish_reason": null}]),
                );
                if let Some(ids) = &prompt_ids {
                    m.insert("prompt_token_ids".into(), serde_json::json!(ids));
                }
                if let Some(u) = &usage {
                    m.insert("usage".into(), u.clone());
                }
                Value::Object(m)
            })
            .collect();
        // vLLM echoes the last message's content right after the role chunks.
        if let Some(echo) = &self.echo {
            out.extend((0..self.n).map(|i| {
                let mut m = self.head(&model);
                m.insert(
                    "choices".into(),
                    serde_json::json!([{"index": i, "delta": {"content": echo},
                                        "logprobs": null, "finish_reason": null}]),
                );
                if let Some(u) = &usage {
                    m.insert("usage".into(), u.clone());
                }
                Value::Object(m)
            }));
        }
        out
    }

    /// One derendered chunk in vLLM's `exclude_unset` shape, or `None` when vLLM would skip
    /// it (a parser that emitted nothing on a step with nothing else to deliver).
    fn chunk(&mut self, c: aphro_core::protocol::ChatCompletionChunk) -> Option<Value> {
        let model = self.model.clone().unwrap_or_else(|| c.model.clone());
        let mut m = self.head(&model);
        let usage = c
            .usage
            .and_then(|u| serde_json::to_value(u).ok())
            .map(without_nulls);
        let Some(choice) = c.choices.into_iter().next() else {
            m.insert("choices".into(), Value::Array(Vec::new()));
            m.insert("usage".into(), usage.unwrap_or(Value::Null));
            return Some(Value::Object(m));
        };
        let d = choice.delta;
        let mut delta = serde_json::Map::new();
        if self.has_parser {
            if let Some(t) = d.content {
                delta.insert("content".into(), Value::String(t));
            }
            if let Some(t) = d.reasoning {
                delta.insert("reasoning".into(), Value::String(t));
            }
            if !d.tool_calls.is_empty() {
                let calls = serde_json::to_value(&d.tool_calls).unwrap_or(Value::Null);
                delta.insert("tool_calls".into(), without_nulls(calls));
            }
            if delta.is_empty()
                && choice.finish_reason.is_none()
                && choice.logprobs.is_none()
                && choice.token_ids.is_none()
            {
                return None;
            }
        } else {
            // Without a parser vLLM sends `{"content": delta_text}` on every step, even "".
            delta.insert(
                "content".into(),
                Value::String(d.content.unwrap_or_default()),
            );
        }
        let mut ch = serde_json::Map::new();
        ch.insert("index".into(), Value::from(choice.index));
        ch.insert("delta".into(), Value::Object(delta));
        ch.insert(
            "logprobs".into(),
            choice
                .logprobs
                .and_then(|l| serde_json::to_value(l).ok())
                .unwrap_or(Value::Null),
        );
        let finished = choice.finish_reason.is_some();
        ch.insert(
            "finish_reason".into(),
            choice.finish_reason.map_or(Value::Null, Value::String),
        );
        if finished {
            ch.insert(
                "stop_reason".into(),
                choice
                    .stop_reason
                    .and_then(|r| serde_json::to_value(r).ok())
                    .unwrap_or(Value::Null),
            );
        }
        ch.insert(
            "token_ids".into(),
            choice
                .token_ids
                .map_or(Value::Null, |t| serde_json::json!(t)),
        );
        m.insert("choices".into(), Value::Array(vec![Value::Object(ch)]));
        if let Some(u) = usage {
            m.insert("usage".into(), u);
        }
        Some(Value::Object(m))
    }
}

/// Streaming `/v1/completions`, one engine request per prompt, their chunks interleaved as
/// they come with `index = prompt_i * n + choice` (vLLM's `merge_async_iterators`). Chunks
/// are full dumps, as vLLM's are; the per-prompt usage chunks are summed into one final
/// usage chunk without nulls.
fn stream_completions(
    engine: &Arc<ServingEngine>,
    derenderer: &Arc<aphro_core::derenderer::Derenderer>,
    req: &aphro_core::protocol::CompletionRequest,
    rendered: Vec<GenerateRequest>,
    id: String,
    model: String,
) -> Result<Response, ApiError> {
    let created = super::unix_now() as i64;
    let mut streams: Vec<EventStream> = Vec::with_capacity(rendered.len());
    let mut states = Vec::with_capacity(rendered.len());
    let mut prompt_lens = Vec::with_capacity(rendered.len());
    let mut n = 1;
    for (pi, r) in rendered.into_iter().enumerate() {
        let prompt_ids = r.token_ids.clone();
        prompt_lens.push(prompt_ids.len() as u64);
        n = r.sampling_params.n.max(1) as usize;
        let mut per_prompt = (0..n)
            .map(|j| {
                derenderer.completion_stream_for_prompt(
                    Some(req),
                    id.clone(),
                    Some(&prompt_ids),
                    pi,
                    j,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        for s in &mut per_prompt {
            s.set_prompt_tokens(Some(prompt_ids.len() as u64));
        }
        states.push(per_prompt);
        streams.push(
            engine
                .generate(r, None)?
                .into_events()
                .map(move |item| (pi, item))
                .boxed(),
        );
    }
    let fan_in = CompletionFanIn {
        merged: futures::stream::select_all(streams),
        states,
        prompt_lens,
        n,
        id,
        created,
        model,
        usage: None,
        done: false,
    };
    let chunks = futures::stream::unfold(fan_in, |mut f| async move {
        loop {
            if f.done {
                return None;
            }
            match f.merged.next().await {
                Some((pi, item)) => match f.push(pi, item) {
                    Ok(None) => continue,
                    Ok(Some(v)) => return Some((Ok(v), f)),
                    Err(e) => {
                        f.done = true;
                        return Some((Err(e), f));
                    }
                },
                None => {
                    f.done = true;
                    let (p, c) = f.usage?;
                    let v = serde_json::json!({"id": f.id, "object": "text_completion",
                        "created": f.created, "model": f.model, "choices": [],
                        "usage": {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}});
                    return Some((Ok(v), f));
                }
            }
        }
    });
    Ok(sse_response(chunks))
}

type EventStream = futures::stream::BoxStream<
    'static,
    (
        usize,
        Result<
            aphro_core::protocol::GenerateStreamEvent,
            aphro_engine::serving::ServingError,
        >,
    ),
>;

/// State of an interleaved multi-prompt completion stream.
struct CompletionFanIn {
    merged: futures::stream::SelectAll<EventStream>,
    /// `states[prompt][choice]`.
    states: Vec<Vec<CompletionDerenderStream>>,
    prompt_lens: Vec<u64>,
    n: usize,
    id: String,
    created: i64,
    model: String,
    /// Summed (prompt, completion) tokens of the per-prompt usage chunks seen.
    usage: Option<(u64, u64)>,
    done: bool,
}

impl CompletionFanIn {
    fn push(
        &mut self,
        pi: usize,
        item: Result<
            aphro_core::protocol::GenerateStreamEvent,
            aphro_engine::serving::ServingError,
        >,
    ) -> Result<Option<Value>, ApiError> {
        let chunk: GenerateStreamResponse = item?.into_chunk();
        let Some(j) = chunk.choices.first().map(|c| c.index) else {
            // A prompt's usage-only chunk: summed into the final one.
            let sum = self.usage.get_or_insert((0, 0));
            sum.0 += self.prompt_lens.get(pi).copied().unwrap_or(0);
            sum.1 += chunk
                .usage
                .as_ref()
                .and_then(|u| u.completion_tokens)
                .unwrap_or(0);
            return Ok(None);
        };
        let st = self
            .states
            .get_mut(pi)
            .and_then(|s| s.get_mut(j))
            .ok_or_else(|| ApiError::internal("choice index out of range"))?;
        let mut c = st.push(&chunk)?;
        c.id.clone_from(&self.id);
        c.created = self.created;
        for ch in &mut c.choices {
            ch.index = pi * self.n + j;
        }
        serde_json::to_value(c).map(Some).map_err(internal)
    }
}

/// `POST /inference/v1/generate` with `output_mode: "derender"` (non-streaming only): the
/// engine's tokens are parsed with the request's `parse_context` into a chat message.
pub async fn generate_derender(
    state: &AppState,
    engine: &Arc<ServingEngine>,
    req: GenerateRequest,
    header_id: Option<&str>,
) -> Result<Response, ApiError> {
    // A request the server cannot serve as asked is the client's to fix (400, wire spec
    // §4.1), not a missing server feature (501).
    let derenderer = state.derenderer.clone().ok_or_else(|| {
        ApiError::bad_request(
            "output_mode='derender' requires a tokenizer, but this server does not load one \
             (--tokens-only or --skip-tokenizer-init). Send the request to a server that \
             loads a tokenizer, or use output_mode='tokens'.",
        )
    })?;
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
    // The derenderer turns the engine's token output into the message, so the engine runs
    // the request in tokens mode: tokens-shaped logprobs, no text of its own.
    let mut req = req;
    req.output_mode = "tokens".into();
    let generated = engine.generate(req, header_id)?.collect_response().await?;
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
    let v = serde_json::to_value(GenerateDerenderResponse {
        response: out,
        output_mode: DerenderMode::Derender,
    })
    .map_err(internal)?;
    Ok(json_response(StatusCode::OK, &v))
}

/// `POST /inference/v1/generate` with `output_mode: "derender"`: the chat response the
/// derender route would give, tagged with the output mode.
#[derive(Debug, Serialize, ToSchema)]
pub struct GenerateDerenderResponse {
    #[serde(flatten)]
    pub response: ChatCompletionResponse,
    pub output_mode: DerenderMode,
}

/// The `output_mode` literal of [`GenerateDerenderResponse`].
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DerenderMode {
    Derender,
}
