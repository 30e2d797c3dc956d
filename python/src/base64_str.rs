//! A `kwargs_data` blob's base64 text written straight into a new Python `str`.
//!
//! `PyString::new` would copy (and scan for UTF-8) a finished Rust `String`: for a 1920x1080
//! image that is 17 MB more to allocate, write and read on every render. CPython's compact
//! ASCII `str` keeps its characters in one buffer right after the object header; this
//! writes the text there before the object is shared.
#![allow(unsafe_code)]

use aphro_core::multimodal::kwargs::KwargsBlob;
use pyo3::prelude::*;
use pyo3::types::PyString;

#[cfg(not(windows))]
mod cpython {
    use pyo3::ffi::{PyObject, Py_ssize_t};
    use std::os::raw::c_char;

    // Declared here: under the limited API (abi3-py39) pyo3-ffi leaves them out, but every
    // CPython since 3.3 exports both, and the extension links against the interpreter's
    // symbols at load time. (On Windows the limited-API python3.dll does not export them.)
    extern "C" {
        pub fn PyUnicode_New(size: Py_ssize_t, maxchar: u32) -> *mut PyObject;
        pub fn PyUnicode_AsUTF8AndSize(
            unicode: *mut PyObject,
            size: *mut Py_ssize_t,
        ) -> *const c_char;
    }
}

/// The blob's base64 text as a `str`, encoded with the GIL released.
#[cfg(not(windows))]
pub fn base64_str<'py>(py: Python<'py>, blob: &KwargsBlob<'_>) -> PyResult<Bound<'py, PyString>> {
    let len = blob.base64_len();
    let Ok(size) = pyo3::ffi::Py_ssize_t::try_from(len) else {
        return Err(pyo3::exceptions::PyMemoryError::new_err(
            "kwargs_data too large",
        ));
    };
    // SAFETY: `PyUnicode_New` returns a new reference or NULL with an exception set; with
    // maxchar 127 the object is a compact ASCII str whose `len` characters (one byte each)
    // follow its header, NUL-terminated, not yet initialized.
    let s = unsafe { Bound::from_owned_ptr_or_err(py, cpython::PyUnicode_New(size, 127))? };
    let mut got: pyo3::ffi::Py_ssize_t = 0;
    // SAFETY: for a compact ASCII str this returns its character buffer itself (its UTF-8
    // form is the same bytes) without reading or copying it.
    let data = unsafe { cpython::PyUnicode_AsUTF8AndSize(s.as_ptr(), &mut got) };
    if data.is_null() || got != size {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("str buffer unavailable")
        }));
    }
    // SAFETY: `data` points at the `len` bytes of the str created above, which nothing else
    // references yet; base64 is ASCII, so the str stays valid; the slice is dropped before
    // the str is returned.
    let buf = unsafe { std::slice::from_raw_parts_mut(data.cast_mut().cast::<u8>(), len) };
    py.detach(|| blob.write_base64(buf))
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    Ok(s.cast_into::<PyString>()?)
}

/// The blob's base64 text as a `str` (copied from a Rust string).
#[cfg(windows)]
pub fn base64_str<'py>(py: Python<'py>, blob: &KwargsBlob<'_>) -> PyResult<Bound<'py, PyString>> {
    let text = py.detach(|| blob.to_base64());
    Ok(PyString::new(py, &text))
}
