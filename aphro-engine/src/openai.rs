//! The coupled OpenAI layer: `/v1/chat/completions` and `/v1/completions` as a library.
//!
//! [`OpenAiServing`] chains the three steps the disaggregated roles run separately — render
//! (aphro-core's [`Renderer`]), generate ([`ServingEngine`]) and derender ([`Derenderer`]) —
//! with the same library calls, so a deployment split over three processes and this one give
//! the same bytes (`api.md` §8, §12). The HTTP handlers, the Python bindings (`aphro.LLM`) and
//! any Rust embedder use it; none of them assembles chunks itself.
//!
//! Each route is split where the work changes kind, so a caller can place the CPU-bound parts
//! (render, the final derender) on a blocking pool and await only the engine:
//! [`OpenAiServing::render_chat`] (sync) → [`OpenAiServing::stream_chat`] (a stream of chunk
//! objects) or [`OpenAiServing::generate_chat`] (async) → [`OpenAiServing::derender_chat`]
//! (sync). [`OpenAiServing::chat`] runs the whole non-streaming request in one call. The
//! completion route has the same four steps.
//!
//! The chunks are `serde_json::Value`s because vLLM's coupled chat stream is written with
//! pydantic's `exclude_unset`: which keys appear depends on what changed, not on the type.
use std::sync::Arc;

use aphro_core::derenderer::{ChatDerenderStream, CompletionDerenderStream, Derenderer};
use aphro_core::protocol::{
    ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, CompletionRequest,
    CompletionResponse, DerenderChatRequest, DerenderCompletionRequest, GenerateRequest,
    GenerateResponse, GenerateStreamEvent, GenerateStreamResponse,
};
use aphro_core::renderer::Renderer;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Map, Value};

use crate::serving::{ServingEngine, ServingError};

fn is_set(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

fn refuse(param: &str, what: &str) -> aphro_core::Error {
    aphro_core::Error::for_param(
        format!("{what} is not supported by this server yet."),
        param,
    )
}

/// Request parameters aphro does not implement yet are refused with a 400 that names them,
/// never silently ignored: a client asking for JSON-constrained output must not receive
/// unconstrained text that merely looks like success. The render routes are exempt: like
/// vLLM's, they only carry these fields into `sampling_params` for whichever engine runs
/// next.
pub fn check_supported(body: &Value) -> Result<(), aphro_core::Error> {
    // vLLM dropped the `guided_*` fields (0.33 ignores them); ignoring a constraint would
    // hand back unconstrained text, so they are refused with the field to use instead.
    for key in [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    ] {
        if is_set(body.get(key)) {
            return Err(aphro_core::Error::for_param(
                format!(
                    "{key} is no longer accepted; use structured_outputs.{} instead.",
                    &key["guided_".len()..]
                ),
                key,
            ));
        }
    }
    for key in [
        "logprob_token_ids",
        "prompt_logprob_token_ids",
        "prompt_embeds",
        "thinking_token_budget",
        "repetition_detection",
    ] {
        if is_set(body.get(key)) {
            return Err(refuse(key, key));
        }
    }
    Ok(())
}

/// A `/v1/chat/completions` body as the coupled route reads it: parameters this server
/// cannot honour refused by name, then vLLM's structural and semantic checks.
pub fn parse_chat(body: &Value) -> Result<ChatCompletionRequest, OpenAiError> {
    check_supported(body)?;
    Ok(aphro_core::renderer::parse_chat_request(body)?)
}

/// A `/v1/completions` body, checked as [`parse_chat`] checks a chat body.
pub fn parse_completion(body: &Value) -> Result<CompletionRequest, OpenAiError> {
    check_supported(body)?;
    Ok(aphro_core::renderer::parse_completion_request(body)?)
}

/// Why a coupled request failed: the render/derender step's error (4xx mostly), the engine's,
/// or a broken invariant of this layer.
#[derive(Debug, thiserror::Error)]
pub enum OpenAiError {
    #[error(transparent)]
    Core(#[from] aphro_core::Error),
    #[error(transparent)]
    Serving(#[from] ServingError),
    #[error("{0}")]
    Internal(String),
}

/// A stream of coupled chunk objects (the `data:` payloads, without `[DONE]`); an `Err` is
/// the last item.
pub type ChunkStream = BoxStream<'static, Result<Value, OpenAiError>>;

/// A chat request after render: what [`OpenAiServing::stream_chat`] and
/// [`OpenAiServing::generate_chat`] take.
#[derive(Debug, Clone)]
pub struct RenderedChat {
    pub chat: ChatCompletionRequest,
    pub generate: GenerateRequest,
    /// The `chatcmpl-…` id the response carries (§1.6), not generate's.
    pub id: String,
    /// Routes every request of a conversation to one data-parallel engine: the body's
    /// `session_id` (a server may fill in the `X-Session-ID` header's).
    pub session: Option<String>,
}

/// A chat request after the engine ran it, for [`OpenAiServing::derender_chat`].
#[derive(Debug, Clone)]
pub struct GeneratedChat {
    pub chat: ChatCompletionRequest,
    pub prompt_token_ids: Vec<u32>,
    pub generated: GenerateResponse,
    pub id: String,
}

/// A completion request after render: one generate request per prompt.
#[derive(Debug, Clone)]
pub struct RenderedCompletion {
    pub request: CompletionRequest,
    pub generate: Vec<GenerateRequest>,
    /// The `cmpl-…` id shared by every prompt's choices.
    pub id: String,
    /// See [`RenderedChat::session`] (completions carry it only as the header).
    pub session: Option<String>,
}

/// A completion request after the engine ran every prompt.
#[derive(Debug, Clone)]
pub struct GeneratedCompletion {
    pub request: CompletionRequest,
    pub prompt_token_ids: Vec<Vec<u32>>,
    pub generated: Vec<GenerateResponse>,
    pub id: String,
}

/// Render → engine → derender in one process.
#[derive(Clone)]
pub struct OpenAiServing {
    pub renderer: Arc<Renderer>,
    pub derenderer: Arc<Derenderer>,
    pub engine: Arc<ServingEngine>,
}

impl OpenAiServing {
    pub fn new(
        renderer: Arc<Renderer>,
        derenderer: Arc<Derenderer>,
        engine: Arc<ServingEngine>,
    ) -> Self {
        OpenAiServing {
            renderer,
            derenderer,
            engine,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Chat.

    /// Renders a chat request (CPU-bound). `request_id` plays `X-Request-Id`.
    pub fn render_chat(
        &self,
        chat: ChatCompletionRequest,
        request_id: Option<&str>,
    ) -> Result<RenderedChat, OpenAiError> {
        let generate = self.renderer.render_chat_with_id(&chat, request_id)?;
        Ok(RenderedChat {
            id: generate.request_id.clone(),
            session: chat.session_id.clone(),
            chat,
            generate,
        })
    }

    /// Starts the engine on a rendered chat and returns vLLM's coupled chunk stream (§8.1).
    /// `model` is the name the chunks carry (the served name the request resolved to).
    pub fn stream_chat(
        &self,
        r: RenderedChat,
        model: Option<String>,
    ) -> Result<ChunkStream, OpenAiError> {
        let RenderedChat {
            chat,
            generate,
            id,
            session,
        } = r;
        let prompt_ids = generate.token_ids.clone();
        let n = generate.sampling_params.n.max(1) as usize;
        let stream = self
            .engine
            .generate_routed(generate, None, session.as_deref())?;
        let mut states: Vec<ChatDerenderStream> = (0..n)
            .map(|i| {
                self.derenderer
                    .chat_stream(Some(&chat), id.clone(), Some(&prompt_ids), i)
            })
            .collect::<Result<_, _>>()?;
        for s in &mut states {
            s.set_prompt_tokens(Some(prompt_ids.len() as u64));
        }
        let mut shape = CoupledChatChunks::new(
            &chat,
            model,
            id,
            &prompt_ids,
            n,
            self.derenderer.has_parser(),
        );
        let events = stream
            .into_events()
            .map(move |item| -> Result<Vec<Value>, OpenAiError> {
                let chunk: GenerateStreamResponse = item?.into_chunk();
                let mut out = shape.opening();
                let idx = chunk.choices.first().map(|c| c.index).unwrap_or(0);
                let st = states
                    .get_mut(idx)
                    .ok_or_else(|| OpenAiError::Internal("choice index out of range".into()))?;
                out.extend(shape.chunk(st.push(&chunk)?));
                Ok(out)
            })
            .flat_map(|r| {
                futures::stream::iter(match r {
                    Ok(v) => v.into_iter().map(Ok).collect::<Vec<_>>(),
                    Err(e) => vec![Err(e)],
                })
            });
        Ok(events.boxed())
    }

    /// Runs a rendered chat to the end in the engine.
    pub async fn generate_chat(&self, r: RenderedChat) -> Result<GeneratedChat, OpenAiError> {
        let prompt_token_ids = r.generate.token_ids.clone();
        let generated = self
            .engine
            .generate_routed(r.generate, None, r.session.as_deref())?
            .collect_response()
            .await?;
        Ok(GeneratedChat {
            chat: r.chat,
            prompt_token_ids,
            generated,
            id: r.id,
        })
    }

    /// Derenders a finished chat into its response (CPU-bound: the parsers run here).
    pub fn derender_chat(&self, g: GeneratedChat) -> Result<ChatCompletionResponse, OpenAiError> {
        let mut resp = self.derenderer.derender_chat(DerenderChatRequest {
            stream: false,
            model: g.chat.model.clone(),
            generate_response: g.generated,
            prompt_tokens: Some(g.prompt_token_ids.len() as u64),
            prompt_token_ids: Some(g.prompt_token_ids),
            chat_request: Some(g.chat),
        })?;
        resp.id = g.id;
        Ok(resp)
    }

    /// A whole non-streaming chat request: render, generate, derender.
    pub async fn chat(
        &self,
        chat: ChatCompletionRequest,
        request_id: Option<&str>,
    ) -> Result<ChatCompletionResponse, OpenAiError> {
        let rendered = self.render_chat(chat, request_id)?;
        let generated = self.generate_chat(rendered).await?;
        self.derender_chat(generated)
    }

    // -----------------------------------------------------------------------------------------
    // Completions.

    /// Renders a completion request (one generate request per prompt; CPU-bound).
    pub fn render_completion(
        &self,
        request: CompletionRequest,
        request_id: Option<&str>,
    ) -> Result<RenderedCompletion, OpenAiError> {
        let generate = self
            .renderer
            .render_completion_with_id(&request, request_id)?;
        let id = generate
            .first()
            .map(|r| r.request_id.trim_end_matches("-0").to_owned())
            .unwrap_or_default();
        Ok(RenderedCompletion {
            request,
            generate,
            id,
            session: None,
        })
    }

    /// Starts every prompt and returns their chunks interleaved as they come, with
    /// `index = prompt_i * n + choice` (vLLM's `merge_async_iterators`). Chunks are full
    /// dumps, as vLLM's are; the per-prompt usage chunks are summed into one final usage
    /// chunk without nulls.
    pub fn stream_completion(
        &self,
        r: RenderedCompletion,
        model: String,
    ) -> Result<ChunkStream, OpenAiError> {
        let RenderedCompletion {
            request,
            generate,
            id,
            session,
        } = r;
        let created = unix_now();
        let mut streams: Vec<EventStream> = Vec::with_capacity(generate.len());
        let mut states = Vec::with_capacity(generate.len());
        let mut prompt_lens = Vec::with_capacity(generate.len());
        let mut n = 1;
        for (pi, g) in generate.into_iter().enumerate() {
            let prompt_ids = g.token_ids.clone();
            prompt_lens.push(prompt_ids.len() as u64);
            n = g.sampling_params.n.max(1) as usize;
            let mut per_prompt = (0..n)
                .map(|j| {
                    self.derenderer.completion_stream_for_prompt(
                        Some(&request),
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
                self.engine
                    .generate_routed(g, None, session.as_deref())?
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
                        let v = json!({"id": f.id, "object": "text_completion",
                            "created": f.created, "model": f.model, "choices": [],
                            "usage": {"prompt_tokens": p, "total_tokens": p + c,
                                      "completion_tokens": c}});
                        return Some((Ok(v), f));
                    }
                }
            }
        });
        Ok(chunks.boxed())
    }

    /// Runs every prompt of a rendered completion to the end, concurrently (the engine
    /// batches them).
    pub async fn generate_completion(
        &self,
        r: RenderedCompletion,
    ) -> Result<GeneratedCompletion, OpenAiError> {
        let prompt_token_ids: Vec<Vec<u32>> =
            r.generate.iter().map(|g| g.token_ids.clone()).collect();
        let mut runs = Vec::with_capacity(r.generate.len());
        for g in r.generate {
            runs.push(
                self.engine
                    .generate_routed(g, None, r.session.as_deref())?
                    .collect_response(),
            );
        }
        let generated = futures::future::try_join_all(runs).await?;
        Ok(GeneratedCompletion {
            request: r.request,
            prompt_token_ids,
            generated,
            id: r.id,
        })
    }

    /// Derenders finished prompts into the completion response (CPU-bound).
    pub fn derender_completion(
        &self,
        g: GeneratedCompletion,
    ) -> Result<CompletionResponse, OpenAiError> {
        let mut resp = self
            .derenderer
            .derender_completion(DerenderCompletionRequest {
                stream: false,
                model: g.request.model.clone(),
                generate_responses: g.generated,
                prompt_tokens: Some(g.prompt_token_ids.iter().map(|p| p.len() as u64).collect()),
                prompt_token_ids: Some(g.prompt_token_ids.into_iter().map(Some).collect()),
                completion_request: Some(g.request),
            })?;
        resp.id = g.id;
        Ok(resp)
    }

    /// A whole non-streaming completion request: render, generate, derender.
    pub async fn completion(
        &self,
        request: CompletionRequest,
        request_id: Option<&str>,
    ) -> Result<CompletionResponse, OpenAiError> {
        let rendered = self.render_completion(request, request_id)?;
        let generated = self.generate_completion(rendered).await?;
        self.derender_completion(generated)
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
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
        model: Option<String>,
        id: String,
        prompt_ids: &[u32],
        n: usize,
        has_parser: bool,
    ) -> Self {
        // vLLM's `get_chat_request_role`: the last message's role when not adding a prompt.
        let role = if chat.add_generation_prompt() {
            "assistant".to_owned()
        } else {
            chat.messages
                .last()
                .map_or_else(|| "assistant".to_owned(), |m| m.role.clone())
        };
        let opts = chat.stream_options.as_ref();
        CoupledChatChunks {
            id,
            created: unix_now(),
            model,
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

    fn head(&self, model: &str) -> Map<String, Value> {
        let mut m = Map::new();
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
            json!({"prompt_tokens": self.prompt_tokens,
                   "total_tokens": self.prompt_tokens,
                   "completion_tokens": 0})
        });
        let mut out: Vec<Value> = (0..self.n)
            .map(|i| {
                let mut m = self.head(&model);
                m.insert(
                    "choices".into(),
                    json!([{"index": i, "delta": {"role": self.role, "content": ""},
                            "logprobs": null, "finish_reason": null}]),
                );
                if let Some(ids) = &prompt_ids {
                    m.insert("prompt_token_ids".into(), json!(ids));
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
                    json!([{"index": i, "delta": {"content": echo},
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
    fn chunk(&mut self, c: ChatCompletionChunk) -> Option<Value> {
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
        let mut delta = Map::new();
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
        let mut ch = Map::new();
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
            choice.token_ids.map_or(Value::Null, |t| json!(t)),
        );
        m.insert("choices".into(), Value::Array(vec![Value::Object(ch)]));
        if let Some(u) = usage {
            m.insert("usage".into(), u);
        }
        Some(Value::Object(m))
    }
}

type EventStream = BoxStream<'static, (usize, Result<GenerateStreamEvent, ServingError>)>;

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
        item: Result<GenerateStreamEvent, ServingError>,
    ) -> Result<Option<Value>, OpenAiError> {
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
            .ok_or_else(|| OpenAiError::Internal("choice index out of range".into()))?;
        let mut c = st.push(&chunk)?;
        c.id.clone_from(&self.id);
        c.created = self.created;
        for ch in &mut c.choices {
            ch.index = pi * self.n + j;
        }
        serde_json::to_value(c)
            .map(Some)
            .map_err(|e| OpenAiError::Internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_by_name_and_accepts_defaults() {
        assert!(check_supported(
            &json!({"messages": [], "response_format": {"type": "text"}, "logprob_token_ids": null})
        )
        .is_ok());
        for body in [
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            json!({"structured_outputs": {"json": {}}}),
        ] {
            assert!(check_supported(&body).is_ok(), "{body}");
        }
        let e = check_supported(&json!({"guided_regex": "a+"})).expect_err("must be refused");
        assert_eq!(e.param(), Some("guided_regex"));
        assert_eq!(
            e.to_string(),
            "guided_regex is no longer accepted; use structured_outputs.regex instead. \
             (parameter=guided_regex)"
        );
        assert_eq!(e.error_type(), "BadRequestError");
    }
}
