//! `aphro.Renderer`: OpenAI chat / completion requests -> token-in `GenerateRequest`s.
use crate::base64_str::base64_str;
use crate::convert::{ser_to_py, to_py, to_value};
use crate::errors::{self, CoreResultExt};
use crate::model::{load_any, PyModel};
use aphro_core::protocol::{DetokenizeRequest, TokenizeRequest};
use aphro_core::renderer::{parse_chat_request, parse_completion_request};
use aphro_core::{ContentFormat, RenderOptions, Renderer};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;
use std::sync::Arc;

/// Renders OpenAI requests to the token-in requests of the generate endpoint, exactly as the
/// render server's `/v1/chat/completions/render` and `/v1/completions/render` routes do.
///
/// Args:
///     model: `None` (the embedded default model), a path (HF directory or `.gguf`), a hub id,
///         or an `aphro.Model`.
///     chat_template: a Jinja template, inline or as a file path (overrides the model's).
///     chat_template_content_format: `"auto"`, `"string"` or `"openai"`.
///     max_model_len: context length (overrides the model's config).
///     default_chat_template_kwargs: server-default template kwargs (merged under the request's).
///     served_model_name: name(s) accepted in the request's `model` field (`None`: any).
///     tool_call_parser, reasoning_parser: the server's parser names (vLLM's flags); they
///         decide `reasoning_ended` and the sampling adjustments of the rendered request.
///     enable_auto_tool_choice: vLLM's `--enable-auto-tool-choice`. As in vLLM, a request
///         with `tools` (whose `tool_choice` defaults to `"auto"`) or a `"required"` / named
///         `tool_choice` is refused unless both this and `tool_call_parser` are set.
///     trust_request_mm_kwargs, mm_device_do_normalize: vLLM's multimodal flags. With a
///         Qwen-VL model directory, image parts render to placeholder runs and the result's
///         `features` (`mm_hashes`, `mm_placeholders`, `kwargs_data`, `mm_metadata`).
///     allowed_media_domains, allowed_local_media_path: where `http(s)` / `file` image URLs
///         may be loaded from (vLLM's flags; limits from its `VLLM_*` environment
///         variables). By default only `data:` URLs.
#[pyclass(module = "aphro", name = "Renderer", frozen)]
pub struct PyRenderer {
    pub(crate) inner: Arc<Renderer>,
    model: Py<PyModel>,
}

#[pymethods]
impl PyRenderer {
    #[new]
    #[pyo3(signature = (model=None, *, chat_template=None, chat_template_content_format="auto", max_model_len=None, default_chat_template_kwargs=None, served_model_name=None, tool_call_parser=None, reasoning_parser=None, enable_auto_tool_choice=false, trust_request_mm_kwargs=false, mm_device_do_normalize=true, allowed_media_domains=None, allowed_local_media_path=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: Option<&Bound<'_, PyAny>>,
        chat_template: Option<String>,
        chat_template_content_format: &str,
        max_model_len: Option<usize>,
        default_chat_template_kwargs: Option<&Bound<'_, PyDict>>,
        served_model_name: Option<&Bound<'_, PyAny>>,
        tool_call_parser: Option<String>,
        reasoning_parser: Option<String>,
        enable_auto_tool_choice: bool,
        trust_request_mm_kwargs: bool,
        mm_device_do_normalize: bool,
        allowed_media_domains: Option<Vec<String>>,
        allowed_local_media_path: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let (spec, m) = load_any(py, model)?;
        let content_format = chat_template_content_format
            .parse::<ContentFormat>()
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let chat_template = match chat_template {
            Some(t) if std::path::Path::new(&t).is_file() => Some(
                std::fs::read_to_string(&t)
                    .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("{t}: {e}")))?,
            ),
            other => other,
        };
        // Server defaults first (vLLM's own, e.g. `cohere_format`), the caller's on top, as
        // `--default-chat-template-kwargs` does.
        let mut options = RenderOptions::default();
        if let Some(d) = default_chat_template_kwargs {
            if let Value::Object(o) = to_value(d.as_any())? {
                options.default_chat_template_kwargs.extend(o);
            }
        }
        if tool_call_parser.is_some() || reasoning_parser.is_some() {
            let registry = aphro_parsers::ParserRegistry::new();
            if let Some(t) = tool_call_parser
                .as_deref()
                .filter(|t| !registry.has_tool_parser(t))
            {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown tool call parser {t:?}"
                )));
            }
            if let Some(r) = reasoning_parser
                .as_deref()
                .filter(|r| !registry.has_reasoning_parser(r))
            {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown reasoning parser {r:?}"
                )));
            }
            options.hooks = Some(Arc::new(aphro_core::parser_hooks::ParserHooks::new(
                m.clone(),
                tool_call_parser.as_deref(),
                reasoning_parser.as_deref(),
            )));
        }
        let served_model_names = match served_model_name {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => Some(match v.extract::<String>() {
                Ok(s) => vec![s],
                Err(_) => v.extract::<Vec<String>>()?,
            }),
        };
        let vision = aphro_core::multimodal::VisionModel::for_model(&m).py_err(py)?;
        let media_fetch = match (&vision, allowed_media_domains, allowed_local_media_path) {
            (Some(_), domains, local) if domains.is_some() || local.is_some() => {
                let options = aphro_core::multimodal::MediaFetchOptions {
                    allowed_media_domains: domains.unwrap_or_default(),
                    allowed_local_media_path: local,
                    ..aphro_core::multimodal::MediaFetchOptions::from_env()
                        .map_err(pyo3::exceptions::PyValueError::new_err)?
                };
                Some(Arc::new(
                    aphro_core::multimodal::MediaFetcher::new(options).py_err(py)?,
                ))
            }
            _ => None,
        };
        let options = RenderOptions {
            chat_template,
            content_format,
            max_model_len,
            served_model_names,
            tool_call_parser,
            enable_auto_tool_choice,
            vision: vision.map(Arc::new),
            multimodal: aphro_core::multimodal::MultimodalOptions {
                device_normalize: mm_device_do_normalize,
                trust_request_mm_kwargs,
            },
            media_fetch,
            ..options
        };
        let inner = py.detach(|| Renderer::new(m.clone(), options)).py_err(py)?;
        let model = Py::new(py, PyModel { inner: m, spec })?;
        Ok(Self {
            inner: Arc::new(inner),
            model,
        })
    }

    /// The loaded `aphro.Model`.
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<PyModel> {
        self.model.clone_ref(py)
    }

    /// The effective context length.
    #[getter]
    fn max_model_len(&self) -> usize {
        self.inner.max_model_len()
    }

    /// Renders a chat completion request (the JSON body of `POST /v1/chat/completions`) to
    /// the `GenerateRequest` dict that `/v1/chat/completions/render` returns: `token_ids`,
    /// `sampling_params`, `parse_context`, ... `request_id` plays the `X-Request-Id` header.
    ///
    /// Raises `aphro.BadRequestError` with the route's 400 message on an invalid request.
    #[pyo3(signature = (request, *, request_id=None))]
    fn render_chat<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        request_id: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let body = to_value(request)?;
        let r = &self.inner;
        let out = py.detach(|| {
            parse_chat_request(&body)
                .and_then(|req| r.render_chat_with_pending_kwargs(&req, request_id.as_deref()))
        });
        let (mut out, payload) = out.py_err(py)?;
        let features = out.features.take();
        let dict = ser_to_py(py, &out)?;
        if let Some(f) = features {
            let f = to_py(py, &f)?;
            // The `kwargs_data` blobs (megabytes each) are encoded straight into their `str`s,
            // in place of the nulls the render left.
            if let Some(payload) = payload {
                let list = f.get_item("kwargs_data")?.get_item("image")?;
                for i in 0..payload.len() {
                    if let Some(blob) = payload.blob(i) {
                        list.set_item(i, base64_str(py, &blob)?)?;
                    }
                }
            }
            dict.set_item("features", f)?;
        }
        Ok(dict)
    }

    /// Renders a completion request (the body of `POST /v1/completions`) to the list of
    /// `GenerateRequest` dicts, one per prompt, as `/v1/completions/render` returns.
    #[pyo3(signature = (request, *, request_id=None))]
    fn render_completion<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        request_id: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let body = to_value(request)?;
        let r = &self.inner;
        let out = py.detach(|| {
            parse_completion_request(&body)
                .and_then(|req| r.render_completion_with_id(&req, request_id.as_deref()))
        });
        ser_to_py(py, &out.py_err(py)?)
    }

    /// `POST /tokenize`: `{"prompt": ...}` or `{"messages": [...]}` -> `{"count",
    /// "max_model_len", "tokens", "token_strs"}`. A plain `str` is taken as `{"prompt": s}`.
    fn tokenize<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut body = to_value(request)?;
        if let Value::String(s) = body {
            body = serde_json::json!({ "prompt": s });
        }
        let req: TokenizeRequest = errors::from_value(py, body)?;
        let r = &self.inner;
        let out = py.detach(|| r.tokenize(&req)).py_err(py)?;
        ser_to_py(py, &out)
    }

    /// `POST /detokenize`: `{"tokens": [...]}` -> `{"prompt": str}`. A list of ids is taken as
    /// `{"tokens": ids}`.
    fn detokenize<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut body = to_value(request)?;
        if body.is_array() {
            body = serde_json::json!({ "tokens": body });
        }
        let req: DetokenizeRequest = errors::from_value(py, body)?;
        let out = self.inner.detokenize(&req).py_err(py)?;
        ser_to_py(py, &out)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("aphro.Renderer({:?})", self.model.bind(py).get().spec)
    }
}

/// Benchmark helper: renders `request` `iterations` times in a Rust loop (GIL released) and
/// returns the seconds per call, so `bench_render.py` compares the binding with the plain Rust
/// call in the same process and build. `parse_each` also re-parses the JSON body every time.
#[pyfunction]
#[pyo3(signature = (renderer, request, iterations, *, parse_each=false))]
pub fn _bench_render_chat(
    py: Python<'_>,
    renderer: &PyRenderer,
    request: &Bound<'_, PyAny>,
    iterations: u32,
    parse_each: bool,
) -> PyResult<f64> {
    let body = to_value(request)?;
    let r = &renderer.inner;
    let req = parse_chat_request(&body).py_err(py)?;
    let n = iterations.max(1);
    let out = py.detach(|| -> aphro_core::Result<f64> {
        let t = std::time::Instant::now();
        for _ in 0..n {
            if parse_each {
                let req = parse_chat_request(&body)?;
                std::hint::black_box(r.render_chat(&req)?);
            } else {
                std::hint::black_box(r.render_chat(&req)?);
            }
        }
        Ok(t.elapsed().as_secs_f64() / f64::from(n))
    });
    out.py_err(py)
}
