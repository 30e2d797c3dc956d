//! `aphro.parse` and `aphro.Parser`: reasoning / tool-call parsing of model text.
use crate::convert::{ser_to_py, to_value};
use aphro_parsers::{ParserConfig, ParserRegistry, StreamParser};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{Map, Value};
use std::sync::{Mutex, PoisonError};

#[allow(clippy::too_many_arguments)]
fn config(
    tools: Option<&Bound<'_, PyAny>>,
    tool_choice: Option<&Bound<'_, PyAny>>,
    parallel_tool_calls: bool,
    chat_template_kwargs: Option<&Bound<'_, PyAny>>,
    prompt_text: Option<String>,
    history_tool_calls: usize,
) -> PyResult<ParserConfig> {
    let mut body = Map::new();
    if let Some(t) = tools.filter(|t| !t.is_none()) {
        body.insert("tools".into(), to_value(t)?);
    }
    if let Some(t) = tool_choice.filter(|t| !t.is_none()) {
        body.insert("tool_choice".into(), to_value(t)?);
    }
    if let Some(k) = chat_template_kwargs.filter(|k| !k.is_none()) {
        body.insert("chat_template_kwargs".into(), to_value(k)?);
    }
    body.insert("parallel_tool_calls".into(), parallel_tool_calls.into());
    if let Some(p) = prompt_text {
        body.insert("prompt_text".into(), p.into());
    }
    body.insert("history_tool_calls".into(), history_tool_calls.into());
    ParserConfig::from_request_json(&Value::Object(body))
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

fn build(
    tool_call_parser: Option<&str>,
    reasoning_parser: Option<&str>,
    cfg: &ParserConfig,
) -> PyResult<Box<dyn StreamParser>> {
    ParserRegistry::new()
        .new_parser(tool_call_parser, reasoning_parser, cfg)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Parses a finished model output into `{"content", "reasoning", "tool_calls": [{"id",
/// "name", "arguments"}], "finish_reason"}` with vLLM's parsers (`--tool-call-parser`,
/// `--reasoning-parser` names). `finish_reason` is what a chat response would report for an
/// engine stop: `"tool_calls"` when calls were found (and `tool_choice` names no function),
/// else `"stop"`.
///
/// Raises `ValueError` for an unknown parser name or an invalid `tool_choice`.
#[pyfunction]
#[pyo3(signature = (model_output, *, tool_call_parser=None, reasoning_parser=None, tools=None, tool_choice=None, parallel_tool_calls=true, chat_template_kwargs=None, prompt_text=None, history_tool_calls=0))]
#[allow(clippy::too_many_arguments)]
pub fn parse<'py>(
    py: Python<'py>,
    model_output: &str,
    tool_call_parser: Option<&str>,
    reasoning_parser: Option<&str>,
    tools: Option<&Bound<'py, PyAny>>,
    tool_choice: Option<&Bound<'py, PyAny>>,
    parallel_tool_calls: bool,
    chat_template_kwargs: Option<&Bound<'py, PyAny>>,
    prompt_text: Option<String>,
    history_tool_calls: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let cfg = config(
        tools,
        tool_choice,
        parallel_tool_calls,
        chat_template_kwargs,
        prompt_text,
        history_tool_calls,
    )?;
    let mut p = build(tool_call_parser, reasoning_parser, &cfg)?;
    let msg = py.detach(|| aphro_parsers::parse(p.as_mut(), model_output));
    let out = ser_to_py(py, &msg)?;
    out.cast::<PyDict>()?
        .set_item("finish_reason", msg.finish_reason(&cfg))?;
    Ok(out)
}

/// An incremental parser: `push(text_delta) -> {"content"?, "reasoning"?, "tool_calls"?}`
/// (tool-call deltas are `{"index", "id"?, "name"?, "arguments"}`), then `finish()` once.
/// The concatenated deltas equal `aphro.parse` of the whole text, however it was cut.
#[pyclass(module = "aphro", name = "Parser", frozen)]
pub struct PyParser {
    inner: Mutex<Box<dyn StreamParser>>,
}

#[pymethods]
impl PyParser {
    #[new]
    #[pyo3(signature = (*, tool_call_parser=None, reasoning_parser=None, tools=None, tool_choice=None, parallel_tool_calls=true, chat_template_kwargs=None, prompt_text=None, history_tool_calls=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        tool_call_parser: Option<&str>,
        reasoning_parser: Option<&str>,
        tools: Option<&Bound<'_, PyAny>>,
        tool_choice: Option<&Bound<'_, PyAny>>,
        parallel_tool_calls: bool,
        chat_template_kwargs: Option<&Bound<'_, PyAny>>,
        prompt_text: Option<String>,
        history_tool_calls: usize,
    ) -> PyResult<Self> {
        let cfg = config(
            tools,
            tool_choice,
            parallel_tool_calls,
            chat_template_kwargs,
            prompt_text,
            history_tool_calls,
        )?;
        Ok(Self {
            inner: Mutex::new(build(tool_call_parser, reasoning_parser, &cfg)?),
        })
    }

    /// Feeds the next piece of generated text; returns what became certain.
    fn push<'py>(&self, py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
        let cell = &self.inner;
        let d = py.detach(|| {
            cell.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(text)
        });
        ser_to_py(py, &d)
    }

    /// The output ended: flushes everything held back.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let cell = &self.inner;
        let d = py.detach(|| cell.lock().unwrap_or_else(PoisonError::into_inner).finish());
        ser_to_py(py, &d)
    }
}
