//! `aphro_core::Error` -> the Python exception hierarchy of `aphro._errors`.
//!
//! The exception carries the same `message`, `type`, `param` and status `code` as the HTTP
//! route's error body, so code written against the server can switch to in-process calls
//! without changing its error handling.
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class<'py>(py: Python<'py>, status: u16) -> PyResult<Bound<'py, PyType>> {
    let m = ERRORS.get_or_try_init(py, || py.import("aphro._errors").map(Bound::unbind))?;
    let name = match status {
        400 | 422 => "BadRequestError",
        404 => "NotFoundError",
        _ => "InternalServerError",
    };
    Ok(m.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// Builds the exception for an error with the given wire fields.
pub fn make(py: Python<'_>, message: &str, status: u16, kind: &str, param: Option<&str>) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = class(py, status)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("status", status)?;
        kwargs.set_item("type", kind)?;
        kwargs.set_item("param", param)?;
        let exc = cls.call((message,), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|e| e)
}

/// The exception for an error body: what the HTTP route would answer, as an exception.
pub fn from_response(py: Python<'_>, r: &aphro_core::protocol::ErrorResponse) -> PyErr {
    let e = &r.error;
    make(py, &e.message, e.code, &e.kind, e.param.as_deref())
}

/// The Python exception for a core error.
pub fn core(py: Python<'_>, e: &aphro_core::Error) -> PyErr {
    from_response(py, &e.to_error_response())
}

/// An `InternalServerError` (500).
pub fn internal(py: Python<'_>, message: &str) -> PyErr {
    make(py, message, 500, "InternalServerError", None)
}

/// Extension trait: `result.py_err(py)?` for core results.
pub trait CoreResultExt<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> CoreResultExt<T> for aphro_core::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| core(py, &e))
    }
}

/// Deserializes a typed body from a JSON value; a failure is the structural 400 every entry
/// point gives (`aphro_core::validation`: the field's path and pydantic's wording).
pub fn from_value<T: serde::de::DeserializeOwned>(
    py: Python<'_>,
    v: serde_json::Value,
) -> PyResult<T> {
    aphro_core::validation::from_body::<T>(&v).map_err(|e| core(py, &e))
}
