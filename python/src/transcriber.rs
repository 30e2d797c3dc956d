//! `aphro.Transcriber`: speech to text on a Whisper folder, the same decode, options and
//! response bodies as `/v1/audio/transcriptions` (`aphro_engine::transcription`).
use aphro_core::audio::format::ResponseFormat;
use aphro_engine::speech::{
    Penalties, SpeechTask, TranscribeOptions, Transcriber, TranscriberConfig, Truncation,
};
use aphro_engine::transcription::{
    decode_upload, render, TranscriptionBody, TranscriptionError, UploadLimits,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use std::path::Path;

fn error(py: Python<'_>, e: &TranscriptionError) -> PyErr {
    let status = e.status();
    let kind = if status == 400 {
        "BadRequestError"
    } else {
        "InternalServerError"
    };
    crate::errors::make(py, &e.to_string(), status, kind, e.param())
}

/// A loaded speech model (Whisper). Thread-safe; calls release the GIL.
#[pyclass(module = "aphro", name = "Transcriber", frozen)]
pub struct PyTranscriber {
    inner: Transcriber,
}

#[pymethods]
impl PyTranscriber {
    /// Loads the Whisper folder `model_dir`; `num_threads` = the threads the model computes
    /// on (default: every core); `device`: "auto" (CUDA when built in and usable), "cpu",
    /// "cuda" or "cuda:N".
    #[new]
    #[pyo3(signature = (model_dir, num_threads=None, device="auto"))]
    fn new(
        py: Python<'_>,
        model_dir: std::path::PathBuf,
        num_threads: Option<usize>,
        device: &str,
    ) -> PyResult<Self> {
        let device = device
            .parse()
            .map_err(|e: aphro_engine::backend::DeviceError| {
                pyo3::exceptions::PyValueError::new_err(e.to_string())
            })?;
        let config = TranscriberConfig {
            num_threads,
            device,
        };
        let inner = py
            .detach(|| Transcriber::load(Path::new(&model_dir), config))
            .map_err(|e| error(py, &TranscriptionError::from(e)))?;
        Ok(PyTranscriber { inner })
    }

    /// Transcribes `audio` (a file path, or the file's bytes: WAV, FLAC, MP3, Ogg Vorbis).
    /// Returns what the HTTP route's body holds: a dict for `json` / `verbose_json`, a str
    /// for `text`, `srt` and `vtt`.
    ///
    /// `temperature` 0 decodes greedily; above 0 it samples (seeded by `seed`) through
    /// `top_p` / `top_k` / `min_p`. The penalties and `hotwords` act as on the HTTP route.
    /// `task="translate"` runs Whisper's translate task (into English) on a multilingual
    /// model, as `/v1/audio/translations` does.
    #[pyo3(signature = (audio, *, language=None, prompt=None, response_format="json",
        hotwords=None, temperature=0.0, seed=None, top_p=1.0, top_k=0, min_p=0.0,
        repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0,
        task="transcribe"))]
    #[allow(clippy::too_many_arguments)]
    fn transcribe(
        &self,
        py: Python<'_>,
        audio: &Bound<'_, PyAny>,
        language: Option<String>,
        prompt: Option<String>,
        response_format: &str,
        hotwords: Option<String>,
        temperature: f32,
        seed: Option<u64>,
        top_p: f32,
        top_k: usize,
        min_p: f32,
        repetition_penalty: f32,
        frequency_penalty: f32,
        presence_penalty: f32,
        task: &str,
    ) -> PyResult<Py<PyAny>> {
        let format = ResponseFormat::parse(response_format).map_err(|m| {
            crate::errors::make(py, &m, 400, "BadRequestError", Some("response_format"))
        })?;
        let task = match task {
            "transcribe" => SpeechTask::Transcribe,
            "translate" => SpeechTask::Translate,
            other => {
                return Err(crate::errors::make(
                    py,
                    &format!("task must be 'transcribe' or 'translate', got '{other}'"),
                    400,
                    "BadRequestError",
                    Some("task"),
                ))
            }
        };
        let (bytes, name): (Vec<u8>, Option<String>) = if let Ok(b) = audio.cast::<PyBytes>() {
            (b.as_bytes().to_vec(), None)
        } else {
            let path: std::path::PathBuf = audio.extract()?;
            let bytes = std::fs::read(&path).map_err(|e| {
                pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display()))
            })?;
            (
                bytes,
                path.file_name().and_then(|n| n.to_str()).map(str::to_owned),
            )
        };
        let options = TranscribeOptions {
            task,
            language,
            prompt,
            hotwords,
            temperature,
            seed,
            truncation: Truncation {
                min_p,
                top_k,
                top_p,
            },
            penalties: Penalties {
                repetition: repetition_penalty,
                frequency: frequency_penalty,
                presence: presence_penalty,
            },
            ..TranscribeOptions::default()
        };
        let body = py
            .detach(|| -> Result<TranscriptionBody, TranscriptionError> {
                let limits = UploadLimits {
                    max_filesize_mb: f64::INFINITY,
                    max_duration_s: None,
                };
                let audio = decode_upload(&bytes, name.as_deref(), &limits)?;
                let t = self.inner.transcribe(&audio.samples, &options)?;
                Ok(render(&t, format, true))
            })
            .map_err(|e| error(py, &e))?;
        Ok(match body {
            TranscriptionBody::Json(v) => crate::convert::to_py(py, &v)?.unbind(),
            TranscriptionBody::Text { body, .. } => PyString::new(py, &body).into_any().unbind(),
        })
    }

    fn __repr__(&self) -> String {
        format!("Transcriber(name={:?})", self.inner.info().name)
    }
}
