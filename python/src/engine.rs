//! `aphro.Engine`: the token-in/token-out engine (`/inference/v1/generate`, `api.md` §4) on
//! `aphro_engine::serving::ServingEngine`. Every wait on the engine releases the GIL.
use crate::convert::{ser_to_py, to_py, to_value};
use crate::errors;
use crate::model::PyModel;
use aphro_engine::model::ModelDType;
use aphro_engine::serving::{ServingConfig, ServingEngine, ServingError, ServingStream};
use futures::executor::block_on;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::sync::{Arc, Mutex, PoisonError};

pub(crate) fn serving_err(py: Python<'_>, e: &ServingError) -> PyErr {
    errors::from_response(py, &e.to_error_response())
}

fn model_spec(py: Python<'_>, model: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    match model {
        Some(m) if !m.is_none() => {
            if let Ok(pm) = m.cast::<PyModel>() {
                return Ok(pm.get().spec.clone());
            }
            if let Ok(s) = m.cast::<PyString>() {
                return Ok(s.to_cow()?.into_owned());
            }
            let os = py.import("os")?;
            os.call_method1("fspath", (m,))
                .map_err(|_| {
                    PyTypeError::new_err(
                        "model must be None, a str, an os.PathLike or an aphro.Model",
                    )
                })?
                .extract::<String>()
        }
        _ => py
            .detach(aphro_core::default_model::ensure_default_model)
            .map(|p| p.to_string_lossy().into_owned())
            .map_err(|e| errors::internal(py, &e.to_string())),
    }
}

fn config(spec: String, args: Option<&Bound<'_, PyDict>>) -> PyResult<ServingConfig> {
    let mut cfg = ServingConfig {
        model: spec,
        ..ServingConfig::default()
    };
    let Some(args) = args else {
        return Ok(cfg);
    };
    for (k, v) in args.iter() {
        let key: String = k.extract()?;
        let key = key.replace('-', "_");
        match key.as_str() {
            "dtype" => {
                let s: String = v.extract()?;
                cfg.dtype = match s.as_str() {
                    "auto" => ModelDType::Auto,
                    "float32" | "float" | "f32" => ModelDType::Float32,
                    "bfloat16" | "bf16" => ModelDType::BFloat16,
                    "float16" | "half" | "f16" => ModelDType::Float16,
                    other => {
                        return Err(PyValueError::new_err(format!(
                        "dtype must be 'auto', 'float32', 'bfloat16' or 'float16', not {other:?}"
                    )))
                    }
                };
            }
            "device" => {
                let s: String = v.extract()?;
                cfg.device = s.parse().map_err(|e: aphro_engine::backend::DeviceError| {
                    PyValueError::new_err(e.to_string())
                })?;
            }
            "kv_cache_memory" => cfg.kv_cache_memory = v.extract()?,
            "kv_cache_dtype" => {
                let s: String = v.extract()?;
                cfg.kv_cache_dtype = s.parse().map_err(PyValueError::new_err)?;
            }
            "block_size" => cfg.block_size = v.extract()?,
            "num_gpu_blocks_override" => cfg.num_gpu_blocks_override = v.extract()?,
            "max_num_batched_tokens" => cfg.max_num_batched_tokens = v.extract()?,
            "max_num_seqs" => cfg.max_num_seqs = v.extract()?,
            "long_prefill_token_threshold" => cfg.long_prefill_token_threshold = v.extract()?,
            "prefill_pacing_ratio" => cfg.prefill_pacing_ratio = v.extract()?,
            "enable_prefix_caching" => cfg.enable_prefix_caching = v.extract()?,
            "max_model_len" => {
                // An int, or vLLM's strings ("auto", "32k").
                let text: String = match v.extract::<i64>() {
                    Ok(n) => n.to_string(),
                    Err(_) => v.extract()?,
                };
                cfg.max_model_len = text
                    .parse()
                    .map_err(pyo3::exceptions::PyValueError::new_err)?;
            }
            "max_logprobs" => cfg.max_logprobs = v.extract()?,
            "seed" => cfg.seed = v.extract()?,
            "served_model_name" => cfg.served_model_name = v.extract()?,
            "tokens_only" => cfg.tokens_only = v.extract()?,
            "scheduling_policy" => {
                let s: String = v.extract()?;
                cfg.scheduling_policy = s.parse().map_err(PyValueError::new_err)?;
            }
            "data_parallel_size" => cfg.data_parallel_size = v.extract()?,
            "prefix_caching_hash_algo" => {
                let s: String = v.extract()?;
                cfg.prefix_caching_hash_algo = s.parse().map_err(PyValueError::new_err)?;
            }
            "kv_events_config" => {
                // vLLM's JSON, as a string or a dict.
                let text: String = match v.extract::<String>() {
                    Ok(s) => s,
                    Err(_) => v
                        .py()
                        .import("json")?
                        .call_method1("dumps", (v,))?
                        .extract()?,
                };
                cfg.kv_events_config = Some(text.parse().map_err(PyValueError::new_err)?);
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "Engine() got an unexpected engine argument {other:?} (known: dtype, \
                     device, kv_cache_memory, kv_cache_dtype, block_size, num_gpu_blocks_override, \
                     max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold, \
                     prefill_pacing_ratio, scheduling_policy, enable_prefix_caching, max_model_len, max_logprobs, seed, \
                     served_model_name, tokens_only, data_parallel_size, prefix_caching_hash_algo, \
                     kv_events_config)"
                )))
            }
        }
    }
    Ok(cfg)
}

/// The generate engine: token ids in, token ids (or text) out, with continuous batching over
/// concurrent requests (call it from several threads, or use `AsyncEngine`).
///
/// Args:
///     model: `None` (the embedded default GGUF), a path (`.gguf` / HF directory), a hub id,
///         or an `aphro.Model`.
///     **engine_args: vLLM's engine flags: `dtype` ("auto", "float32", "bfloat16",
///         "float16"), `device` ("auto", "cpu", "cuda", "cuda:N", or "cuda:0,cuda:1" for one data-parallel engine per device), `kv_cache_memory` (bytes), `block_size`,
///         `num_gpu_blocks_override`, `max_num_batched_tokens`, `max_num_seqs`,
///         `long_prefill_token_threshold`, `prefill_pacing_ratio`, `enable_prefix_caching`, `max_model_len`, `max_logprobs`, `seed`,
///         `served_model_name`, `tokens_only`.
#[pyclass(module = "aphro", name = "Engine", frozen)]
pub struct PyEngine {
    pub(crate) inner: Arc<ServingEngine>,
}

impl PyEngine {
    fn submit(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        request_id: Option<&str>,
        session_id: Option<&str>,
    ) -> PyResult<ServingStream> {
        let body = to_value(request)?;
        let e = &self.inner;
        py.detach(|| {
            let req = e.parse_request(&body)?;
            e.generate_routed(req, request_id, session_id)
        })
        .map_err(|err| serving_err(py, &err))
    }
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (model=None, **engine_args))]
    fn new(
        py: Python<'_>,
        model: Option<&Bound<'_, PyAny>>,
        engine_args: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut cfg = config(model_spec(py, model)?, engine_args)?;
        let embedded_default = model.is_none_or(|m| m.is_none());
        let dtype_given = engine_args.is_some_and(|a| a.contains("dtype").unwrap_or(false));
        if embedded_default && !dtype_given {
            cfg.dtype = aphro_engine::model::EMBEDDED_DEFAULT_DTYPE;
        }
        let inner = py
            .detach(|| ServingEngine::new(cfg))
            .map_err(|e| serving_err(py, &e))?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Runs a generate request (the body of `POST /inference/v1/generate`: `token_ids`,
    /// `sampling_params`, `output_mode`, ...; a `Renderer.render_*` result as is) to
    /// completion and returns the `GenerateResponse` dict. `request_id` plays `X-Request-Id`;
    /// `session_id` keeps a conversation on one engine (`data_parallel_size` > 1).
    #[pyo3(signature = (request, *, request_id=None, session_id=None))]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        request_id: Option<&str>,
        session_id: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let stream = self.submit(py, request, request_id, session_id)?;
        let resp = py
            .detach(|| block_on(stream.collect_response()))
            .map_err(|e| serving_err(py, &e))?;
        ser_to_py(py, &resp)
    }

    /// Submits a generate request and returns an iterator over its stream events (the
    /// `data:` objects of the SSE stream: one per engine step with new tokens, and a usage
    /// event when `stream_options.include_usage` is set). Dropping the iterator before the end
    /// aborts the request.
    #[pyo3(signature = (request, *, request_id=None, session_id=None))]
    fn generate_stream(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        request_id: Option<&str>,
        session_id: Option<&str>,
    ) -> PyResult<PyEngineStream> {
        let stream = self.submit(py, request, request_id, session_id)?;
        Ok(PyEngineStream {
            request_id: stream.request_id().to_owned(),
            inner: Mutex::new(Some(stream)),
            engine: self.inner.clone(),
        })
    }

    /// Aborts requests by id: the engine id (`generate-tokens-...`, the `request_id` of the
    /// responses) or the base id passed as `request_id`. Unknown ids are ignored; an aborted
    /// stream ends with `finish_reason: "abort"`.
    fn abort(&self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids: Vec<String> = match request_id.extract::<String>() {
            Ok(s) => vec![s],
            Err(_) => request_id.extract()?,
        };
        let mut all = Vec::with_capacity(ids.len() * 2);
        for id in ids {
            if !id.starts_with("generate-tokens-") {
                all.push(format!("generate-tokens-{id}"));
            }
            all.push(id);
        }
        self.inner.abort(&all);
        Ok(())
    }

    /// The `model` reported in responses.
    #[getter]
    fn served_model_name(&self) -> &str {
        self.inner.served_model_name()
    }

    /// The context length the engine serves (clamped to what the KV cache holds).
    #[getter]
    fn max_model_len(&self) -> usize {
        self.inner.max_model_len()
    }

    /// The resolved model path.
    #[getter]
    fn model_path(&self) -> String {
        self.inner.model_path().to_string_lossy().into_owned()
    }

    /// The tokenizer side (tokenizer, chat template, generation defaults) as the engine
    /// loaded it, or `None` when it could not be loaded (a tokens-only engine of a model
    /// without tokenizer files): pass it to `Renderer` / `Derenderer` to share it.
    #[getter]
    fn model(&self) -> Option<PyModel> {
        self.inner.model().map(|m| PyModel {
            inner: m.clone(),
            spec: self.inner.model_path().to_string_lossy().into_owned(),
        })
    }

    /// False once the engine thread failed.
    fn is_healthy(&self) -> bool {
        self.inner.is_healthy()
    }

    /// Stops the engine thread; later requests fail. Called automatically at exit.
    fn shutdown(&self, py: Python<'_>) {
        let e = &self.inner;
        py.detach(|| e.shutdown());
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.shutdown(py);
    }

    fn __repr__(&self) -> String {
        format!("aphro.Engine({:?})", self.inner.model_path().display())
    }
}

/// Iterator over the events of one streaming generate request (from `Engine.generate_stream`).
#[pyclass(module = "aphro", name = "EngineStream", frozen)]
pub struct PyEngineStream {
    inner: Mutex<Option<ServingStream>>,
    request_id: String,
    engine: Arc<ServingEngine>,
}

impl PyEngineStream {
    /// Next event, or `None` at the end.
    fn next_value(&self, py: Python<'_>) -> PyResult<Option<serde_json::Value>> {
        let cell = &self.inner;
        let out = py.detach(|| {
            let mut guard = cell.lock().unwrap_or_else(PoisonError::into_inner);
            let stream = guard.as_mut()?;
            match block_on(stream.next_event()) {
                None => {
                    *guard = None;
                    None
                }
                Some(Err(e)) => {
                    *guard = None;
                    Some(Err(e))
                }
                Some(Ok(ev)) => Some(Ok(ev.to_json())),
            }
        });
        out.transpose().map_err(|e| serving_err(py, &e))
    }
}

#[pymethods]
impl PyEngineStream {
    /// The engine id of the request (`generate-tokens-...`), for `Engine.abort`.
    #[getter]
    fn request_id(&self) -> &str {
        &self.request_id
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.next_value(py)? {
            Some(v) => to_py(py, &v).map(Some),
            None => Ok(None),
        }
    }

    /// Like `next(stream)` but returns `None` at the end instead of raising StopIteration
    /// (for `AsyncEngine`, which calls it from a worker thread).
    fn next_event<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.__next__(py)
    }

    /// Aborts the request; the stream then ends with `finish_reason: "abort"`.
    fn abort(&self) {
        self.engine.abort(&[self.request_id.as_str()]);
    }

    /// Aborts the request and drops the stream.
    fn close(&self) {
        self.abort();
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}
