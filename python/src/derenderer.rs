//! `aphro.Derenderer`: generated token ids -> OpenAI chat / completion responses.
use crate::convert::{ser_to_py, to_value};
use crate::errors::{self, CoreResultExt};
use crate::model::{load_any, PyModel};
use aphro_core::derenderer::{ChatDerenderStream, CompletionDerenderStream};
use aphro_core::protocol::{
    parse_derender_chat_body, parse_derender_completion_body, ChatCompletionRequest,
    CompletionRequest, DerenderChatBody, DerenderCompletionBody, GenerateStreamResponse,
};
use aphro_core::renderer::{parse_chat_request, parse_completion_request};
use aphro_core::{DerenderOptions, Derenderer};
use pyo3::prelude::*;
use serde_json::{Map, Value};
use std::sync::{Mutex, PoisonError};

/// Turns tokens-mode generate responses into OpenAI responses, as the derender routes
/// `/v1/chat/completions/derender` and `/v1/completions/derender` do: detokenization, stop
/// strings, reasoning and tool-call parsing, logprobs, usage.
///
/// Args:
///     model: `None` (the embedded default), a path, a hub id, or an `aphro.Model`.
///     tool_call_parser: vLLM's `--tool-call-parser` name (e.g. `"hermes"`).
///     reasoning_parser: vLLM's `--reasoning-parser` name (e.g. `"qwen3"`).
///     enable_auto_tool_choice: vLLM's `--enable-auto-tool-choice`.
///     served_model_name: the `model` reported in responses (default: the model's name).
///     max_model_len: context length (default: the model's).
///     max_logprobs: `--max-logprobs` (default 20; -1 = unlimited).
///     return_tokens_as_token_ids: `--return-tokens-as-token-ids` (logprob tokens as `token_id:N`).
#[pyclass(module = "aphro", name = "Derenderer", frozen)]
pub struct PyDerenderer {
    pub(crate) inner: Derenderer,
    model: Py<PyModel>,
}

fn opt_value(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Value>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => to_value(o).map(Some),
    }
}

fn insert_opt(body: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    if let Some(v) = v {
        body.insert(key.to_owned(), v);
    }
}

fn chat_req(py: Python<'_>, v: Option<Value>) -> PyResult<Option<ChatCompletionRequest>> {
    v.map(|v| parse_chat_request(&v)).transpose().py_err(py)
}

fn completion_req(py: Python<'_>, v: Option<Value>) -> PyResult<Option<CompletionRequest>> {
    v.map(|v| parse_completion_request(&v))
        .transpose()
        .py_err(py)
}

#[pymethods]
impl PyDerenderer {
    #[new]
    #[pyo3(signature = (model=None, *, tool_call_parser=None, reasoning_parser=None, enable_auto_tool_choice=false, served_model_name=None, max_model_len=None, max_logprobs=20, return_tokens_as_token_ids=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: Option<&Bound<'_, PyAny>>,
        tool_call_parser: Option<String>,
        reasoning_parser: Option<String>,
        enable_auto_tool_choice: bool,
        served_model_name: Option<String>,
        max_model_len: Option<usize>,
        max_logprobs: i64,
        return_tokens_as_token_ids: bool,
    ) -> PyResult<Self> {
        let (spec, m) = load_any(py, model)?;
        let opts = DerenderOptions {
            served_model_name,
            tool_call_parser,
            reasoning_parser,
            enable_auto_tool_choice,
            max_model_len,
            max_logprobs,
            return_tokens_as_token_ids,
        };
        // Unknown parser names are a startup error: ValueError, not a request error.
        let inner = Derenderer::new(m.clone(), opts)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let model = Py::new(py, PyModel { inner: m, spec })?;
        Ok(Self { inner, model })
    }

    /// The loaded `aphro.Model`.
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<PyModel> {
        self.model.clone_ref(py)
    }

    /// The `model` name reported in responses.
    #[getter]
    fn served_model_name(&self) -> &str {
        self.inner.served_model_name()
    }

    /// Derenders a chat completion.
    ///
    /// `response` is either a whole derender body (`{"generate_response": ..., "chat_request":
    /// ...}`, or a streaming one with `"stream": true, "generate_chunk"`, `"stream_state"`, for
    /// which the result is `{"chunk", "stream_state"}`), or a tokens-mode generate response,
    /// in which case `chat_request`, `prompt_token_ids` and `prompt_tokens` complete the body
    /// (`prompt_tokens` defaulting to the generate response's `usage.prompt_tokens`, else to
    /// the length of `prompt_token_ids`).
    ///
    /// Returns the `chat.completion` dict of `/v1/chat/completions/derender`.
    #[pyo3(signature = (response, chat_request=None, *, prompt_token_ids=None, prompt_tokens=None, model=None))]
    fn derender_chat<'py>(
        &self,
        py: Python<'py>,
        response: &Bound<'py, PyAny>,
        chat_request: Option<&Bound<'py, PyAny>>,
        prompt_token_ids: Option<Vec<u32>>,
        prompt_tokens: Option<u64>,
        model: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = to_value(response)?;
        let body = if r.get("generate_response").is_some() || r.get("generate_chunk").is_some() {
            r
        } else {
            // Usage reports the prompt length: the caller's, else the generate response's
            // usage, else the prompt ids' length.
            let prompt_tokens = prompt_tokens
                .or_else(|| r.pointer("/usage/prompt_tokens").and_then(Value::as_u64))
                .or(prompt_token_ids.as_ref().map(|p| p.len() as u64));
            let mut b = Map::new();
            b.insert("generate_response".into(), r);
            insert_opt(&mut b, "chat_request", opt_value(chat_request)?);
            insert_opt(
                &mut b,
                "prompt_token_ids",
                prompt_token_ids.map(Value::from),
            );
            insert_opt(&mut b, "prompt_tokens", prompt_tokens.map(Value::from));
            insert_opt(&mut b, "model", model.map(Value::from));
            Value::Object(b)
        };
        let d = &self.inner;
        let out = py.detach(|| {
            parse_derender_chat_body(&body).and_then(|b| match b {
                DerenderChatBody::Full(r) => d.derender_chat(*r).map(serde_json::to_value),
                DerenderChatBody::Stream(r) => d.derender_chat_stream(*r).map(serde_json::to_value),
            })
        });
        let value = out
            .py_err(py)?
            .map_err(|e| errors::internal(py, &format!("serialization failed: {e}")))?;
        crate::convert::to_py(py, &value)
    }

    /// Derenders a completion. `responses` is a whole derender body (`{"generate_responses":
    /// [...], "completion_request": ...}` or a streaming one), one tokens-mode generate
    /// response, or a list of them (one per prompt). `prompt_token_ids` is one id list (one
    /// prompt) or a list of them.
    ///
    /// Returns the `text_completion` dict of `/v1/completions/derender`.
    #[pyo3(signature = (responses, completion_request=None, *, prompt_token_ids=None, prompt_tokens=None, model=None))]
    fn derender_completion<'py>(
        &self,
        py: Python<'py>,
        responses: &Bound<'py, PyAny>,
        completion_request: Option<&Bound<'py, PyAny>>,
        prompt_token_ids: Option<&Bound<'py, PyAny>>,
        prompt_tokens: Option<&Bound<'py, PyAny>>,
        model: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = to_value(responses)?;
        let body = if r.get("generate_responses").is_some() || r.get("generate_chunk").is_some() {
            r
        } else {
            let list = match r {
                Value::Array(a) => a,
                other => vec![other],
            };
            let usage_counts: Option<Vec<u64>> = list
                .iter()
                .map(|g| g.pointer("/usage/prompt_tokens").and_then(Value::as_u64))
                .collect();
            let mut b = Map::new();
            b.insert("generate_responses".into(), Value::Array(list));
            insert_opt(&mut b, "completion_request", opt_value(completion_request)?);
            let ids = opt_value(prompt_token_ids)?.map(|v| match v {
                // One prompt's ids -> a list of one.
                Value::Array(a) if a.iter().all(Value::is_number) && !a.is_empty() => {
                    Value::Array(vec![Value::Array(a)])
                }
                other => other,
            });
            insert_opt(&mut b, "prompt_token_ids", ids);
            let counts = opt_value(prompt_tokens)?
                .map(|v| match v {
                    Value::Number(n) => Value::Array(vec![Value::Number(n)]),
                    other => other,
                })
                .or_else(|| usage_counts.map(Value::from));
            insert_opt(&mut b, "prompt_tokens", counts);
            insert_opt(&mut b, "model", model.map(Value::from));
            Value::Object(b)
        };
        let d = &self.inner;
        let out = py.detach(|| {
            parse_derender_completion_body(&body).and_then(|b| match b {
                DerenderCompletionBody::Full(r) => {
                    d.derender_completion(*r).map(serde_json::to_value)
                }
                DerenderCompletionBody::Stream(r) => {
                    d.derender_completion_stream(*r).map(serde_json::to_value)
                }
            })
        });
        let value = out
            .py_err(py)?
            .map_err(|e| errors::internal(py, &format!("serialization failed: {e}")))?;
        crate::convert::to_py(py, &value)
    }

    /// A streaming chat derender for one choice: `stream.push(generate_chunk)` turns each
    /// event of a tokens-mode generate stream into a `chat.completion.chunk` dict. State stays
    /// in the object (the in-process counterpart of the wire `stream_state`).
    ///
    /// Args:
    ///     chat_request: the original chat request (tools, stop strings, logprobs, ...).
    ///     prompt_token_ids: the rendered prompt (seeds detokenization and the parsers).
    ///     prompt_tokens: prompt length reported in usage chunks.
    ///     request_id: informational; chunk ids come from the generate chunks.
    ///     index: the choice index.
    #[pyo3(signature = (chat_request=None, *, prompt_token_ids=None, prompt_tokens=None, request_id=String::new(), index=0))]
    fn chat_stream(
        &self,
        py: Python<'_>,
        chat_request: Option<&Bound<'_, PyAny>>,
        prompt_token_ids: Option<Vec<u32>>,
        prompt_tokens: Option<u64>,
        request_id: String,
        index: usize,
    ) -> PyResult<PyChatStream> {
        let req = chat_req(py, opt_value(chat_request)?)?;
        let mut s = self
            .inner
            .chat_stream(req.as_ref(), request_id, prompt_token_ids.as_deref(), index)
            .py_err(py)?;
        s.set_prompt_tokens(prompt_tokens.or(prompt_token_ids.map(|p| p.len() as u64)));
        Ok(PyChatStream {
            inner: Mutex::new(s),
        })
    }

    /// A streaming completion derender for one choice (`stream.push(chunk)` ->
    /// `text_completion` chunk dict).
    #[pyo3(signature = (completion_request=None, *, prompt_token_ids=None, prompt_tokens=None, request_id=String::new(), index=0))]
    fn completion_stream(
        &self,
        py: Python<'_>,
        completion_request: Option<&Bound<'_, PyAny>>,
        prompt_token_ids: Option<Vec<u32>>,
        prompt_tokens: Option<u64>,
        request_id: String,
        index: usize,
    ) -> PyResult<PyCompletionStream> {
        let req = completion_req(py, opt_value(completion_request)?)?;
        let mut s = self
            .inner
            .completion_stream(req.as_ref(), request_id, prompt_token_ids.as_deref(), index)
            .py_err(py)?;
        s.set_prompt_tokens(prompt_tokens.or(prompt_token_ids.map(|p| p.len() as u64)));
        Ok(PyCompletionStream {
            inner: Mutex::new(s),
        })
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("aphro.Derenderer({:?})", self.model.bind(py).get().spec)
    }
}

fn chunk_from(py: Python<'_>, chunk: &Bound<'_, PyAny>) -> PyResult<GenerateStreamResponse> {
    errors::from_value(py, to_value(chunk)?)
}

/// Streaming chat derender state of one choice (from `Derenderer.chat_stream`).
#[pyclass(module = "aphro", name = "ChatStream", frozen)]
pub struct PyChatStream {
    inner: Mutex<ChatDerenderStream>,
}

#[pymethods]
impl PyChatStream {
    /// One generate stream event (`{"request_id", "choices": [{"token_ids": [...], ...}]}`)
    /// -> one `chat.completion.chunk` dict. A usage-only event gives `choices: []`.
    fn push<'py>(&self, py: Python<'py>, chunk: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let c = chunk_from(py, chunk)?;
        let cell = &self.inner;
        let out = py.detach(|| cell.lock().unwrap_or_else(PoisonError::into_inner).push(&c));
        ser_to_py(py, &out.py_err(py)?)
    }

    /// Generated tokens seen so far.
    #[getter]
    fn tokens(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tokens()
    }
}

/// Streaming completion derender state of one choice (from `Derenderer.completion_stream`).
#[pyclass(module = "aphro", name = "CompletionStream", frozen)]
pub struct PyCompletionStream {
    inner: Mutex<CompletionDerenderStream>,
}

#[pymethods]
impl PyCompletionStream {
    /// One generate stream event -> one `text_completion` chunk dict.
    fn push<'py>(&self, py: Python<'py>, chunk: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let c = chunk_from(py, chunk)?;
        let cell = &self.inner;
        let out = py.detach(|| cell.lock().unwrap_or_else(PoisonError::into_inner).push(&c));
        ser_to_py(py, &out.py_err(py)?)
    }
}
