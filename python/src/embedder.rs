//! `aphro.Embedder`: a pooling model (an HF encoder folder such as all-MiniLM-L6-v2) and
//! [`aphro_engine::pooling::Embedder`]'s calls — `embed`, `score`, `rerank`, `classify` — with
//! the semantics of the pooling routes (`/v1/embeddings`, `/score`, `/rerank`, `/classify`),
//! the GIL released during the forward passes. Errors raise the routes' exceptions.
use crate::errors;
use aphro_engine::pooling::{
    EmbedInput, EmbedOptions, Embedder, PoolingError, PoolingTask, ScoreOptions, TruncationSide,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use std::path::PathBuf;

/// A pooling model with its tokenizer, on the CPU.
#[pyclass(module = "aphro", name = "Embedder", frozen)]
pub struct PyEmbedder {
    inner: Embedder,
}

fn pooling_err(py: Python<'_>, e: PoolingError) -> PyErr {
    let status = e.status();
    let kind = match status {
        400 => "BadRequestError",
        501 => "NotImplementedError",
        _ => "InternalServerError",
    };
    errors::make(py, &e.to_string(), status, kind, e.param())
}

fn truncation_side(py: Python<'_>, side: Option<&str>) -> PyResult<Option<TruncationSide>> {
    match side {
        None => Ok(None),
        Some("right") => Ok(Some(TruncationSide::Right)),
        Some("left") => Ok(Some(TruncationSide::Left)),
        Some(other) => Err(errors::make(
            py,
            &format!("truncation_side must be 'left' or 'right', got {other:?}"),
            400,
            "BadRequestError",
            Some("truncation_side"),
        )),
    }
}

/// One input: a string (with the model's special tokens) or a list of token ids.
fn input_of(item: &Bound<'_, PyAny>) -> PyResult<EmbedInput> {
    if let Ok(s) = item.cast::<PyString>() {
        return Ok(EmbedInput::Text(s.extract::<String>()?));
    }
    Ok(EmbedInput::Tokens(item.extract::<Vec<u32>>()?))
}

/// `texts`: one input (a string) or a sequence of them; `true` when it was a single string.
fn inputs_of(texts: &Bound<'_, PyAny>) -> PyResult<(Vec<EmbedInput>, bool)> {
    if texts.is_instance_of::<PyString>() {
        return Ok((vec![input_of(texts)?], true));
    }
    let mut out = Vec::new();
    for item in texts.try_iter()? {
        out.push(input_of(&item?)?);
    }
    Ok((out, false))
}

/// A string or a sequence of strings, as a list.
fn strings_of(v: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(vec![s.extract::<String>()?]);
    }
    v.extract::<Vec<String>>()
}

#[pymethods]
impl PyEmbedder {
    /// Loads a pooling model folder (`config.json`, safetensors, `tokenizer.json`, and
    /// sentence-transformers' `modules.json` / `1_Pooling` / `sentence_bert_config.json`).
    #[new]
    fn new(py: Python<'_>, model_dir: PathBuf) -> PyResult<Self> {
        let inner = py
            .detach(|| Embedder::load(&model_dir))
            .map_err(|e| pooling_err(py, e))?;
        let name = model_dir.display().to_string();
        Ok(Self {
            inner: inner.with_served_name(name),
        })
    }

    /// The longest input in tokens (sentence-transformers' `max_seq_length` when given).
    #[getter]
    fn max_model_len(&self) -> usize {
        self.inner.max_model_len()
    }

    /// `"embed"` or `"classify"`.
    #[getter]
    fn task(&self) -> &'static str {
        match self.inner.config().task {
            PoolingTask::Embed => "embed",
            PoolingTask::Classify => "classify",
        }
    }

    /// One vector per input, as `/v1/embeddings` computes it: pooled, cut to `dimensions`
    /// (Matryoshka models only), then L2-normalized unless `normalize=False` (`None`: the
    /// model's default). A single string gives a single vector; token-id lists are used as
    /// given.
    #[pyo3(signature = (texts, *, dimensions=None, normalize=None, truncate_prompt_tokens=None, truncation_side=None))]
    fn embed(
        &self,
        py: Python<'_>,
        texts: &Bound<'_, PyAny>,
        dimensions: Option<i64>,
        normalize: Option<bool>,
        truncate_prompt_tokens: Option<i64>,
        truncation_side: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let (inputs, single) = inputs_of(texts)?;
        let opts = EmbedOptions {
            truncate_prompt_tokens,
            truncation_side: self::truncation_side(py, truncation_side)?,
            dimensions,
            use_activation: normalize,
        };
        let out = py
            .detach(|| self.inner.embed(&inputs, &opts))
            .map_err(|e| pooling_err(py, e))?;
        let mut vectors: Vec<Vec<f32>> = out.into_iter().map(|e| e.embedding).collect();
        if single {
            return Ok(vectors.remove(0).into_pyobject(py)?.into_any().unbind());
        }
        Ok(vectors.into_pyobject(py)?.into_any().unbind())
    }

    /// `/score`: one score per pair — 1:1, 1:N (the query broadcast) or N:N. Cosine of the
    /// embeddings on an embedding model; the classifier's score on a cross-encoder.
    #[pyo3(signature = (queries, documents, *, use_activation=None, truncate_prompt_tokens=None, truncation_side=None))]
    fn score(
        &self,
        py: Python<'_>,
        queries: &Bound<'_, PyAny>,
        documents: &Bound<'_, PyAny>,
        use_activation: Option<bool>,
        truncate_prompt_tokens: Option<i64>,
        truncation_side: Option<&str>,
    ) -> PyResult<Vec<f32>> {
        let (q, d) = (strings_of(queries)?, strings_of(documents)?);
        let opts = ScoreOptions {
            truncate_prompt_tokens,
            truncation_side: self::truncation_side(py, truncation_side)?,
            use_activation,
        };
        py.detach(|| self.inner.score(&q, &d, &opts))
            .map(|o| o.scores)
            .map_err(|e| pooling_err(py, e))
    }

    /// `/rerank`: the documents by score against `query`, highest first (ties in input
    /// order), cut to `top_n` (`0`: all); each `{"index", "relevance_score", "document"}`.
    #[pyo3(signature = (query, documents, *, top_n=0, use_activation=None, truncate_prompt_tokens=None, truncation_side=None))]
    #[allow(clippy::too_many_arguments)]
    fn rerank<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        documents: Vec<String>,
        top_n: usize,
        use_activation: Option<bool>,
        truncate_prompt_tokens: Option<i64>,
        truncation_side: Option<&str>,
    ) -> PyResult<Bound<'py, PyList>> {
        let opts = ScoreOptions {
            truncate_prompt_tokens,
            truncation_side: self::truncation_side(py, truncation_side)?,
            use_activation,
        };
        let out = py
            .detach(|| self.inner.rerank(query, &documents, top_n, &opts))
            .map_err(|e| pooling_err(py, e))?;
        let list = PyList::empty(py);
        for r in out.results {
            let d = PyDict::new(py);
            d.set_item("index", r.index)?;
            d.set_item("relevance_score", r.relevance_score)?;
            d.set_item("document", &documents[r.index])?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// `/classify` on a sequence-classification model: per input
    /// `{"label", "probs", "num_classes"}` (`use_activation=False`: raw logits).
    #[pyo3(signature = (texts, *, use_activation=None, truncate_prompt_tokens=None, truncation_side=None))]
    fn classify<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'_, PyAny>,
        use_activation: Option<bool>,
        truncate_prompt_tokens: Option<i64>,
        truncation_side: Option<&str>,
    ) -> PyResult<Bound<'py, PyList>> {
        let (inputs, _) = inputs_of(texts)?;
        let opts = ScoreOptions {
            truncate_prompt_tokens,
            truncation_side: self::truncation_side(py, truncation_side)?,
            use_activation,
        };
        let out = py
            .detach(|| self.inner.classify(&inputs, &opts))
            .map_err(|e| pooling_err(py, e))?;
        let list = PyList::empty(py);
        for c in out {
            let d = PyDict::new(py);
            d.set_item("label", c.label)?;
            d.set_item("probs", c.probs)?;
            d.set_item("num_classes", c.num_classes)?;
            list.append(d)?;
        }
        Ok(list)
    }
}
