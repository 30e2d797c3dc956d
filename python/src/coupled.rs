//! `aphro.LLM`'s native half: the coupled OpenAI routes (`/v1/chat/completions`,
//! `/v1/completions`) on `aphro_engine::openai::OpenAiServing`, the same library type the
//! integrated HTTP server runs, so a request gives the same chunks here as over HTTP.
use crate::convert::{ser_to_py, to_py, to_value};
use crate::derenderer::PyDerenderer;
use crate::engine::{serving_err, PyEngine};
use crate::errors;
use crate::renderer::PyRenderer;
use aphro_engine::openai::{parse_chat, parse_completion, ChunkStream, OpenAiError, OpenAiServing};
use futures::executor::block_on;
use futures::StreamExt;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex, PoisonError};

fn coupled_err(py: Python<'_>, e: &OpenAiError) -> PyErr {
    match e {
        OpenAiError::Core(e) => errors::core(py, e),
        OpenAiError::Serving(e) => serving_err(py, e),
        OpenAiError::Internal(m) => errors::internal(py, m),
    }
}

/// Render → engine → derender in one process, over the given stages.
#[pyclass(module = "aphro", name = "CoupledServing", frozen)]
pub struct PyCoupled {
    serving: OpenAiServing,
    served_model_name: String,
}

impl PyCoupled {
    /// The name chunks carry: the request's `model` when it is the served one (absent = the
    /// served one); any other name is the HTTP route's 404.
    fn model(&self, requested: Option<&str>) -> Result<String, OpenAiError> {
        match requested {
            None => Ok(self.served_model_name.clone()),
            Some(m) if m == self.served_model_name => Ok(m.to_owned()),
            Some(m) => Err(aphro_core::Error::ModelNotFound(m.to_owned()).into()),
        }
    }
}

#[pymethods]
impl PyCoupled {
    #[new]
    fn new(engine: &PyEngine, renderer: &PyRenderer, derenderer: &PyDerenderer) -> Self {
        PyCoupled {
            served_model_name: engine.inner.served_model_name().to_owned(),
            serving: OpenAiServing::new(
                renderer.inner.clone(),
                Arc::new(derenderer.inner.clone()),
                engine.inner.clone(),
            ),
        }
    }

    /// The `ChatCompletionResponse` of a non-streaming chat request.
    #[pyo3(signature = (request, *, request_id=None))]
    fn chat<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        request_id: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let body = to_value(request)?;
        let s = &self.serving;
        let resp = py
            .detach(|| {
                let chat = parse_chat(&body)?;
                self.model(chat.model.as_deref())?;
                block_on(s.chat(chat, request_id))
            })
            .map_err(|e| coupled_err(py, &e))?;
        ser_to_py(py, &resp)
    }

    /// An iterator over the `chat.completion.chunk` objects of a chat request, as the SSE
    /// stream's `data:` events (without `[DONE]`).
    #[pyo3(signature = (request, *, request_id=None))]
    fn chat_stream(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        request_id: Option<&str>,
    ) -> PyResult<PyChunkStream> {
        let body = to_value(request)?;
        let s = &self.serving;
        let stream = py
            .detach(|| {
                let chat = parse_chat(&body)?;
                let model = self.model(chat.model.as_deref()).ok();
                let rendered = s.render_chat(chat, request_id)?;
                s.stream_chat(rendered, model)
            })
            .map_err(|e| coupled_err(py, &e))?;
        Ok(PyChunkStream::new(stream))
    }

    /// The `CompletionResponse` of a non-streaming completion request.
    #[pyo3(signature = (request, *, request_id=None))]
    fn completion<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        request_id: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let body = to_value(request)?;
        let s = &self.serving;
        let resp = py
            .detach(|| {
                let req = parse_completion(&body)?;
                self.model(req.model.as_deref())?;
                block_on(s.completion(req, request_id))
            })
            .map_err(|e| coupled_err(py, &e))?;
        ser_to_py(py, &resp)
    }

    /// An iterator over the `text_completion` chunks of a completion request.
    #[pyo3(signature = (request, *, request_id=None))]
    fn completion_stream(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        request_id: Option<&str>,
    ) -> PyResult<PyChunkStream> {
        let body = to_value(request)?;
        let s = &self.serving;
        let stream = py
            .detach(|| {
                let req = parse_completion(&body)?;
                let model = self.model(req.model.as_deref())?;
                let rendered = s.render_completion(req, request_id)?;
                s.stream_completion(rendered, model)
            })
            .map_err(|e| coupled_err(py, &e))?;
        Ok(PyChunkStream::new(stream))
    }
}

/// The chunks of one coupled stream. Dropping or closing it before the end aborts the
/// request in the engine.
#[pyclass(module = "aphro", name = "ChunkStream", frozen)]
pub struct PyChunkStream {
    inner: Mutex<Option<ChunkStream>>,
}

impl PyChunkStream {
    fn new(stream: ChunkStream) -> Self {
        PyChunkStream {
            inner: Mutex::new(Some(stream)),
        }
    }
}

#[pymethods]
impl PyChunkStream {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let cell = &self.inner;
        let next = py.detach(|| {
            let mut guard = cell.lock().unwrap_or_else(PoisonError::into_inner);
            let stream = guard.as_mut()?;
            let item = block_on(stream.next());
            if !matches!(item, Some(Ok(_))) {
                *guard = None;
            }
            item
        });
        match next {
            None => Ok(None),
            Some(Ok(v)) => to_py(py, &v).map(Some),
            Some(Err(e)) => Err(coupled_err(py, &e)),
        }
    }

    /// Like `next(stream)` but `None` at the end instead of StopIteration (for `AsyncLLM`,
    /// which calls it from a worker thread).
    fn next_chunk<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.__next__(py)
    }

    /// Ends the stream now; the engine aborts the request.
    fn close(&self) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}
