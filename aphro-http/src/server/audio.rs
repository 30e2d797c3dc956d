//! `POST /v1/audio/transcriptions` and `/v1/audio/translations` on a speech model
//! (`endpoints.md` §6), thin over [`aphro_engine::transcription`] and
//! [`aphro_engine::speech::Transcriber`]. The body is `multipart/form-data` (parsed by
//! multer, axum's multipart backend, over the body the router's size and time limits already
//! read). Form fields are checked like vLLM's pydantic form models: text fields are coerced
//! the way pydantic's lax mode coerces form strings, and errors come back in vLLM's envelope.
use super::render::header_request_id;
use super::{unix_now, AppState};
use crate::error::{json_response, ApiError};
use crate::extract::LimitedBytes;
use aphro_core::audio::format::ResponseFormat;
use aphro_core::protocol::{verify_sampling_args, SamplingArgs};
use aphro_engine::speech::{
    Penalties, Segment, SpeechError, SpeechTask, TranscribeOptions, Transcriber, Transcription,
    Truncation,
};
use aphro_engine::transcription::{
    decode_upload, effective_task, render, TranscriptionBody, TranscriptionError, UploadLimits,
};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// A loaded speech model and the server's upload limits.
pub struct SpeechServing {
    pub transcriber: Arc<Transcriber>,
    pub limits: UploadLimits,
    /// Transcriptions running at once ([`SpeechServing::MAX_CONCURRENT`] at most); the
    /// rest wait in arrival order (the semaphore is fair).
    gate: Arc<tokio::sync::Semaphore>,
}

impl SpeechServing {
    /// The most transcriptions run at once. Concurrent ones share each decoding step (one
    /// read of the weights for all), which stops paying once the step is compute-bound;
    /// every running one holds its audio, encoder activations and caches (~30 MB on tiny).
    pub const MAX_CONCURRENT: usize = 8;

    /// `max_num_seqs`: `--max-num-seqs`, capped at [`Self::MAX_CONCURRENT`].
    pub fn new(transcriber: Arc<Transcriber>, limits: UploadLimits, max_num_seqs: usize) -> Self {
        SpeechServing {
            transcriber,
            limits,
            gate: Arc::new(tokio::sync::Semaphore::new(
                max_num_seqs.clamp(1, Self::MAX_CONCURRENT),
            )),
        }
    }
}

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(transcriptions))
        .routes(routes!(translations))
}

impl From<TranscriptionError> for ApiError {
    fn from(e: TranscriptionError) -> Self {
        let err = match e.status() {
            400 => ApiError::bad_request(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        };
        match e.param() {
            Some(p) => err.with_param(p),
            None => err,
        }
    }
}

impl From<SpeechError> for ApiError {
    fn from(e: SpeechError) -> Self {
        TranscriptionError::from(e).into()
    }
}

/// The form fields of vLLM's `TranscriptionRequest` (the translation form is a subset; other
/// fields are accepted and ignored, as vLLM's `extra="allow"` models do).
#[derive(Debug, Deserialize, ToSchema)]
pub struct TranscriptionForm {
    /// The audio file: WAV, FLAC, MP3 or Ogg Vorbis.
    #[serde(skip)]
    #[schema(value_type = String, format = Binary)]
    pub file: (),
    pub model: Option<String>,
    /// ISO-639-1 code of the spoken language.
    pub language: Option<String>,
    /// Hint phrases put before the previous text in every window's prompt (faster-whisper).
    pub hotwords: Option<String>,
    /// Text the model continues from (Whisper's previous-text prompt).
    #[serde(default)]
    pub prompt: String,
    /// `json` (default), `text`, `verbose_json`, `srt` or `vtt`.
    #[serde(default = "default_format")]
    pub response_format: String,
    /// `segment`; `word` is refused (only segment timestamps are produced).
    #[serde(default, rename = "timestamp_granularities[]")]
    #[schema(rename = "timestamp_granularities[]")]
    pub timestamp_granularities: Vec<Granularity>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_include_usage: bool,
    #[serde(default)]
    pub stream_continuous_usage_stats: bool,
    /// Extra engine arguments as a JSON object string (vLLM's, for custom logits
    /// processors): only `{}` is accepted, as the speech decoder has none.
    pub vllm_xargs: Option<String>,
    /// The language of the text out: the spoken one (transcriptions) or `en` (translations);
    /// any other is refused.
    pub to_language: Option<String>,
    #[serde(default)]
    pub use_beam_search: bool,
    #[serde(default = "one")]
    pub n: i64,
    #[serde(default = "one_f")]
    pub length_penalty: f64,
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    #[serde(default)]
    pub temperature: f64,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub seed: Option<i64>,
    #[serde(default)]
    pub frequency_penalty: f64,
    #[serde(default)]
    pub presence_penalty: f64,
    pub max_completion_tokens: Option<i64>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Word,
    Segment,
}

fn default_format() -> String {
    "json".into()
}
fn one() -> i64 {
    1
}
fn one_f() -> f64 {
    1.0
}

/// Fields pydantic reads as booleans, integers and floats: their form strings are coerced
/// before the typed parse, so `"true"` and `"0.2"` work and `"hot"` is a validation error.
const BOOL_FIELDS: &[&str] = &[
    "stream",
    "stream_include_usage",
    "stream_continuous_usage_stats",
    "use_beam_search",
    "include_stop_str_in_output",
];
const INT_FIELDS: &[&str] = &["n", "top_k", "seed", "max_completion_tokens"];
const FLOAT_FIELDS: &[&str] = &[
    "length_penalty",
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
];

/// pydantic's lax string → bool.
fn lax_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Some(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

/// A text form value as the JSON value pydantic would validate.
fn coerce(name: &str, value: String) -> Value {
    if BOOL_FIELDS.contains(&name) {
        if let Some(b) = lax_bool(&value) {
            return Value::Bool(b);
        }
    } else if INT_FIELDS.contains(&name) {
        if let Ok(i) = value.trim().parse::<i64>() {
            return Value::from(i);
        }
    } else if FLOAT_FIELDS.contains(&name) {
        if let Some(n) = value
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
        {
            return Value::Number(n);
        }
    }
    Value::String(value)
}

/// An uploaded file part.
pub struct Upload {
    pub file_name: Option<String>,
    pub bytes: Bytes,
}

/// Splits a multipart body into the `file` upload and the text fields (as a JSON object for
/// the typed parse). A `file` sent as a text field is vLLM's 422.
async fn read_form(headers: &HeaderMap, body: Bytes) -> Result<(Upload, Value), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let boundary = multer::parse_boundary(content_type).map_err(|_| {
        ApiError::validation(format!(
            "The body must be multipart/form-data with a 'file' field (got Content-Type \
             '{content_type}')."
        ))
    })?;
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut upload = None;
    let mut file_as_text = false;
    let mut fields = Map::new();
    let malformed =
        |e: multer::Error| ApiError::validation(format!("Malformed multipart/form-data body: {e}"));
    while let Some(field) = multipart.next_field().await.map_err(malformed)? {
        let name = field.name().unwrap_or("").to_owned();
        let file_name = field.file_name().map(str::to_owned);
        let is_file = file_name.is_some();
        let data = field.bytes().await.map_err(malformed)?;
        if name == "file" {
            if is_file {
                upload = Some(Upload {
                    file_name,
                    bytes: data,
                });
            } else {
                file_as_text = true;
            }
            continue;
        }
        if is_file {
            // A file under another name is an unknown field: accepted and ignored.
            continue;
        }
        let text = String::from_utf8_lossy(&data).into_owned();
        if name == "timestamp_granularities[]" || name == "timestamp_granularities" {
            let list = fields
                .entry("timestamp_granularities[]")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(items) = list {
                items.push(Value::String(text));
            }
            continue;
        }
        let value = coerce(&name, text);
        fields.insert(name, value);
    }
    match upload {
        Some(u) => Ok((u, Value::Object(fields))),
        None if file_as_text => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Unprocessable Entity",
            "Expected 'file' to be a file-like object, not 'str'.",
        )
        .with_param("file")),
        None => Err(ApiError::validation(
            "1 validation error:\n  {'type': 'missing', 'loc': 'body.file', 'msg': 'Field required', 'input': None}",
        )
        .with_param("body.file")),
    }
}

/// A request checked and ready to run.
struct Prepared {
    model: String,
    format: ResponseFormat,
    options: TranscribeOptions,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
}

fn speech(state: &AppState) -> Result<&Arc<SpeechServing>, ApiError> {
    state
        .speech
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("The model does not support the Transcriptions API"))
}

/// vLLM's checks, in vLLM's order: the form's types and validators, the model name, the
/// response format and its combination with streaming, the language.
fn prepare(
    state: &AppState,
    serving: &SpeechServing,
    task: SpeechTask,
    fields: &Value,
) -> Result<Prepared, ApiError> {
    let form: TranscriptionForm = aphro_core::validation::from_body(fields)?;
    if !form.stream && (form.stream_include_usage || form.stream_continuous_usage_stats) {
        return Err(ApiError::bad_request(
            "Stream options can only be defined when `stream=True`.",
        )
        .with_param("stream_include_usage"));
    }
    if task == SpeechTask::Transcribe {
        if let Some(raw) = &form.vllm_xargs {
            match serde_json::from_str::<Value>(raw) {
                // vLLM hands these to custom logits processors; the Whisper decoder has
                // none, so a key would be dropped without effect. Say so instead.
                Ok(Value::Object(keys)) if !keys.is_empty() => {
                    let names: Vec<&str> = keys.keys().map(String::as_str).collect();
                    return Err(ApiError::bad_request(format!(
                        "vllm_xargs {names:?} cannot be honoured: the speech decoder has no custom \
                         logits processors to pass them to"
                    ))
                    .with_param("vllm_xargs"));
                }
                Ok(Value::Object(_)) => {}
                Ok(_) => {
                    return Err(ApiError::bad_request(
                        "Failed to parse vllm_xargs. Must be valid JSON: expected a JSON object",
                    )
                    .with_param("vllm_xargs"))
                }
                Err(e) => {
                    return Err(ApiError::bad_request(format!(
                        "Failed to parse vllm_xargs. Must be valid JSON: {e}"
                    ))
                    .with_param("vllm_xargs"))
                }
            }
        }
    }
    let model = state.resolve_model(form.model.as_deref().filter(|m| !m.is_empty()))?;
    let format = ResponseFormat::parse(&form.response_format)
        .map_err(|m| ApiError::bad_request(m).with_param("response_format"))?;
    if form.stream && form.use_beam_search {
        return Err(ApiError::bad_request(
            "Streaming is not currently supported with beam search",
        ));
    }
    if form.stream && format.needs_timestamps() {
        return Err(ApiError::bad_request(format!(
            "{} format doesn't support streaming case",
            format.as_str()
        ))
        .with_param("response_format"));
    }
    if form.use_beam_search {
        return Err(ApiError::bad_request(
            "use_beam_search is not supported by this server: decoding is greedy or sampled",
        )
        .with_param("use_beam_search"));
    }
    if form.n != 1 {
        return Err(ApiError::bad_request(format!(
            "n must be 1 for transcriptions, got {}. (parameter=n, value={})",
            form.n, form.n
        ))
        .with_param("n"));
    }
    // SamplingParams' checks, as vLLM builds them from the form (null → 1 / 0 / 0 / 1).
    let sampling = SamplingArgs {
        n: form.n,
        presence_penalty: form.presence_penalty,
        frequency_penalty: form.frequency_penalty,
        repetition_penalty: form.repetition_penalty.unwrap_or(1.0),
        temperature: form.temperature,
        top_p: form.top_p.unwrap_or(1.0),
        top_k: form.top_k.unwrap_or(0),
        min_p: form.min_p.unwrap_or(0.0),
        max_tokens: None,
        min_tokens: 0,
        stream_interval: None,
        logprobs: None,
        prompt_logprobs: None,
    };
    verify_sampling_args(&sampling).map_err(|e| ApiError::from(e.into_error()))?;
    // vLLM accepts `word` and returns `words: null`; a client that asked for word timings
    // is told instead of getting none.
    if form
        .timestamp_granularities
        .iter()
        .any(|g| matches!(g, Granularity::Word))
    {
        return Err(ApiError::bad_request(
            "timestamp_granularities[]=word is not supported: this server returns segment timestamps only",
        )
        .with_param("timestamp_granularities[]"));
    }
    let max_new_tokens = match form.max_completion_tokens {
        Some(n) if n < 1 => {
            return Err(ApiError::bad_request(format!(
                "max_completion_tokens must be at least 1, got {n}."
            ))
            .with_param("max_completion_tokens"))
        }
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        None => None,
    };
    let info = serving.transcriber.info();
    let language = form.language.filter(|l| !l.is_empty());
    let spoken = serving
        .transcriber
        .resolve_language(language.as_deref())
        .map_err(ApiError::from)?;
    check_to_language(
        form.to_language.as_deref().filter(|l| !l.is_empty()),
        task,
        spoken,
    )?;
    let options = TranscribeOptions {
        task: effective_task(task, info.is_multilingual),
        language,
        prompt: Some(form.prompt).filter(|p| !p.is_empty()),
        hotwords: form.hotwords.filter(|h| !h.trim().is_empty()),
        temperature: form.temperature as f32,
        truncation: Truncation {
            min_p: sampling.min_p as f32,
            // -1 and 0 both disable top-k.
            top_k: usize::try_from(sampling.top_k).unwrap_or(0),
            top_p: sampling.top_p as f32,
        },
        penalties: Penalties {
            repetition: sampling.repetition_penalty as f32,
            frequency: sampling.frequency_penalty as f32,
            presence: sampling.presence_penalty as f32,
        },
        seed: form.seed.map(|s| s as u64),
        with_timestamps: true,
        max_new_tokens,
    };
    Ok(Prepared {
        model,
        format,
        options,
        stream: form.stream,
        include_usage: form.stream_include_usage,
        continuous_usage: form.stream_continuous_usage_stats && form.stream_include_usage,
    })
}

/// `to_language` names the language of the text out. Whisper writes the spoken language
/// (transcriptions) or English (translations) and nothing else, so any other value is a 400
/// rather than a field accepted and ignored as vLLM does. `spoken`: the language the
/// transcript will be in, when known before decoding (`None`: detected per request).
fn check_to_language(
    to_language: Option<&str>,
    task: SpeechTask,
    spoken: Option<&str>,
) -> Result<(), ApiError> {
    let Some(target) = to_language else {
        return Ok(());
    };
    let out = match task {
        SpeechTask::Translate => Some("en"),
        SpeechTask::Transcribe => spoken,
    };
    match out {
        Some(out) if out == target => Ok(()),
        Some(out) => Err(ApiError::bad_request(format!(
            "to_language '{target}' is not supported: this model writes {}, in '{out}'",
            match task {
                SpeechTask::Translate => "translations in English only",
                SpeechTask::Transcribe => "transcripts in the spoken language only",
            }
        ))
        .with_param("to_language")),
        None => Err(ApiError::bad_request(format!(
            "to_language '{target}' needs `language`: the transcript is in the spoken \
             language, which is otherwise detected"
        ))
        .with_param("to_language")),
    }
}

/// Transcribe audio into the language spoken in it.
#[utoipa::path(post, path = "/v1/audio/transcriptions", tag = "audio",
    request_body(content = TranscriptionForm, content_type = "multipart/form-data"),
    responses(
    (status = 200, description = "The transcript: `json` / `verbose_json` as JSON, `text` and `srt` as text/plain, `vtt` as text/vtt; with `stream=true` server-sent `transcription.chunk` events.", body = Value),
    (status = 400, description = "Invalid upload (not audio, empty, truncated, too long, too large) or form field.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 422, description = "`file` sent as a text field.", body = super::openapi::ErrorResponse),
))]
async fn transcriptions(
    State(state): State<AppState>,
    headers: HeaderMap,
    LimitedBytes(body): LimitedBytes,
) -> Result<Response, ApiError> {
    handle(state, headers, body, SpeechTask::Transcribe).await
}

/// Transcribe audio into English (on an English-only model: the English transcript).
#[utoipa::path(post, path = "/v1/audio/translations", tag = "audio",
    request_body(content = TranscriptionForm, content_type = "multipart/form-data"),
    responses(
    (status = 200, description = "The English text, in the requested format (`json` has no usage, as vLLM's).", body = Value),
    (status = 400, description = "Invalid upload or form field.", body = super::openapi::ErrorResponse),
    (status = 401, description = "Missing or wrong API key.", body = super::openapi::UnauthorizedResponse),
    (status = 404, description = "Unknown `model`.", body = super::openapi::ErrorResponse),
    (status = 422, description = "`file` sent as a text field.", body = super::openapi::ErrorResponse),
))]
async fn translations(
    State(state): State<AppState>,
    headers: HeaderMap,
    LimitedBytes(body): LimitedBytes,
) -> Result<Response, ApiError> {
    handle(state, headers, body, SpeechTask::Translate).await
}

async fn handle(
    state: AppState,
    headers: HeaderMap,
    body: Bytes,
    task: SpeechTask,
) -> Result<Response, ApiError> {
    let serving = speech(&state)?.clone();
    let (upload, fields) = read_form(&headers, body).await?;
    let prepared = prepare(&state, &serving, task, &fields)?;
    // Decoding is CPU work: off the async workers, and before any response is started, so a
    // bad upload is a 400 even on a streaming request.
    let limits = serving.limits;
    let audio = tokio::task::spawn_blocking(move || {
        decode_upload(&upload.bytes, upload.file_name.as_deref(), &limits)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    let (prefix, object) = match task {
        SpeechTask::Transcribe => ("transcribe", "transcription.chunk"),
        SpeechTask::Translate => ("translate", "translation.chunk"),
    };
    let id = format!(
        "{prefix}-{}",
        header_request_id(&headers)
            .map(str::to_owned)
            .unwrap_or_else(aphro_core::protocol::random_request_id)
    );
    let permit = serving
        .gate
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let transcriber = serving.transcriber.clone();
    if prepared.stream {
        return Ok(stream(
            transcriber,
            audio.samples,
            prepared,
            id,
            object,
            permit,
        ));
    }
    let options = prepared.options.clone();
    let transcription = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        transcriber.transcribe(&audio.samples, &options)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(
        match render(
            &transcription,
            prepared.format,
            task == SpeechTask::Transcribe,
        ) {
            TranscriptionBody::Json(v) => json_response(StatusCode::OK, &v),
            TranscriptionBody::Text { body, content_type } => {
                let mut resp = (StatusCode::OK, body).into_response();
                resp.headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
                resp
            }
        },
    )
}

/// What the model thread sends the response stream.
enum Progress {
    Segment { text: String, tokens: usize },
    Done(Result<Transcription, SpeechError>),
}

/// The SSE response: one `transcription.chunk` per final segment, then a chunk with
/// `finish_reason: "stop"`, the usage chunk when asked, and `[DONE]`. Each chunk also
/// carries OpenAI's event fields (`type` `transcript.text.delta` with `delta`, then
/// `transcript.text.done` with the whole `text`), so both vLLM's and OpenAI's readers work. The model runs on a
/// blocking thread; when the client goes away the channel's sends fail quietly and the
/// thread ends with the transcription it is running (bounded by the audio's length).
fn stream(
    transcriber: Arc<Transcriber>,
    samples: Vec<f32>,
    prepared: Prepared,
    id: String,
    object: &'static str,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let options = prepared.options.clone();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let mut on_segment = |s: &Segment| {
            let _ = tx.send(Progress::Segment {
                text: s.text.clone(),
                tokens: s.tokens.len(),
            });
        };
        let result = transcriber.transcribe_with(&samples, &options, &mut on_segment);
        let _ = tx.send(Progress::Done(result));
    });
    let created = unix_now();
    let model = prepared.model.clone();
    let chunk = move |choices: Value, usage: Option<Value>| {
        let mut v = json!({
            "id": id,
            "object": object,
            "created": created,
            "model": model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    };
    let usage = |prompt: usize, completion: usize| json!({"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion});
    struct St {
        rx: tokio::sync::mpsc::UnboundedReceiver<Progress>,
        completion: usize,
        pending: Vec<Result<Value, ApiError>>,
        finished: bool,
    }
    let continuous = prepared.continuous_usage;
    let include_usage = prepared.include_usage;
    let events = futures::stream::unfold(
        St {
            rx,
            completion: 0,
            pending: Vec::new(),
            finished: false,
        },
        move |mut st| {
            let chunk = chunk.clone();
            async move {
                loop {
                    if let Some(item) = (!st.pending.is_empty()).then(|| st.pending.remove(0)) {
                        return Some((item, st));
                    }
                    if st.finished {
                        return None;
                    }
                    match st.rx.recv().await {
                        Some(Progress::Segment { text, tokens }) => {
                            st.completion += tokens;
                            let u = continuous.then(|| usage(0, st.completion));
                            let mut c = chunk(json!([{"delta": {"content": text}}]), u);
                            // OpenAI's event shape on the same chunk, for its SDK's
                            // `event.type` / `event.delta` readers.
                            c["type"] = Value::from("transcript.text.delta");
                            c["delta"] = Value::from(text);
                            st.pending.push(Ok(c));
                        }
                        Some(Progress::Done(Ok(t))) => {
                            st.finished = true;
                            let (p, c) = (t.prompt_tokens, t.completion_tokens);
                            let u = continuous.then(|| usage(p, c));
                            let mut stop = chunk(
                                json!([{"delta": {"content": ""}, "finish_reason": "stop", "stop_reason": null}]),
                                u,
                            );
                            stop["type"] = Value::from("transcript.text.done");
                            stop["text"] = Value::from(t.text.clone());
                            st.pending.push(Ok(stop));
                            if include_usage {
                                st.pending.push(Ok(chunk(json!([]), Some(usage(p, c)))));
                            }
                        }
                        Some(Progress::Done(Err(e))) => {
                            st.finished = true;
                            st.pending.push(Err(ApiError::from(e)));
                        }
                        None => {
                            st.finished = true;
                            st.pending
                                .push(Err(ApiError::internal("the transcription thread stopped")));
                        }
                    }
                }
            }
        },
    );
    crate::sse::sse_response(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_strings_are_coerced_as_pydantic_does() {
        assert_eq!(coerce("stream", "true".into()), Value::Bool(true));
        assert_eq!(coerce("stream", "Off".into()), Value::Bool(false));
        assert_eq!(coerce("stream", "maybe".into()), Value::from("maybe"));
        assert_eq!(coerce("seed", " 42".into()), Value::from(42));
        assert_eq!(coerce("temperature", "0.2".into()), Value::from(0.2));
        assert_eq!(coerce("temperature", "hot".into()), Value::from("hot"));
        assert_eq!(coerce("language", "en".into()), Value::from("en"));
    }
}
