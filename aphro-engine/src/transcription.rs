//! The work of `/v1/audio/transcriptions` and `/translations` as a plain API, shared by the
//! HTTP routes, `aphro transcribe` and Python's `aphro.Transcriber` (`endpoints.md` §6): the
//! upload checks (file size, decode, duration limit), the options a request maps to, and the
//! response bodies of every `response_format`.
use aphro_core::audio::format::{self, ResponseFormat};
use aphro_core::audio::{self as core_audio, AudioError, DecodedAudio};
use serde_json::{json, Value};

use crate::speech::{Segment, SpeechError, SpeechTask, Transcription};

/// vLLM's default `VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`.
pub const DEFAULT_MAX_FILESIZE_MB: f64 = 25.0;

/// `VLLM_MAX_AUDIO_CLIP_FILESIZE_MB` from the environment, else 25.
pub fn max_filesize_mb_from_env() -> f64 {
    std::env::var("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .unwrap_or(DEFAULT_MAX_FILESIZE_MB)
}

/// What an upload may be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UploadLimits {
    /// Largest file, in MiB (vLLM's `VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`).
    pub max_filesize_mb: f64,
    /// Longest audio, in seconds (`--max-audio-duration`); `None` = no limit.
    pub max_duration_s: Option<f64>,
}

impl Default for UploadLimits {
    fn default() -> Self {
        UploadLimits {
            max_filesize_mb: DEFAULT_MAX_FILESIZE_MB,
            max_duration_s: None,
        }
    }
}

/// Why a transcription request failed; [`TranscriptionError::status`] and
/// [`TranscriptionError::param`] say how a server answers it.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptionError {
    /// vLLM's message and parameter name.
    #[error("Maximum file size exceeded (parameter=audio_filesize_mb, value={size_mb})")]
    FileTooLarge { size_mb: f64 },
    #[error(transparent)]
    Audio(#[from] AudioError),
    #[error(transparent)]
    Speech(#[from] SpeechError),
}

impl TranscriptionError {
    pub fn status(&self) -> u16 {
        match self {
            TranscriptionError::FileTooLarge { .. } | TranscriptionError::Audio(_) => 400,
            TranscriptionError::Speech(e) => e.status(),
        }
    }

    pub fn param(&self) -> Option<&'static str> {
        match self {
            TranscriptionError::FileTooLarge { .. } => Some("audio_filesize_mb"),
            TranscriptionError::Audio(e) => Some(e.param()),
            TranscriptionError::Speech(SpeechError::UnsupportedLanguage { .. }) => Some("language"),
            TranscriptionError::Speech(_) => None,
        }
    }
}

/// Checks the upload's size (vLLM's rule: `len / 1024² > limit`), then decodes it to 16 kHz
/// mono within the duration limit.
pub fn decode_upload(
    bytes: &[u8],
    file_name: Option<&str>,
    limits: &UploadLimits,
) -> Result<DecodedAudio, TranscriptionError> {
    let size_mb = bytes.len() as f64 / (1024.0 * 1024.0);
    if size_mb > limits.max_filesize_mb {
        return Err(TranscriptionError::FileTooLarge { size_mb });
    }
    Ok(core_audio::decode_audio_limited(
        bytes,
        file_name,
        limits.max_duration_s,
    )?)
}

/// The task a model runs for a route: an English-only model cannot translate, and its input
/// is English, so `/translations` transcribes (English in, English out).
pub fn effective_task(task: SpeechTask, is_multilingual: bool) -> SpeechTask {
    if is_multilingual {
        task
    } else {
        SpeechTask::Transcribe
    }
}

/// A finished response body: JSON, or text with its media type.
#[derive(Debug, Clone, PartialEq)]
pub enum TranscriptionBody {
    Json(Value),
    Text {
        body: String,
        content_type: &'static str,
    },
}

/// One verbose_json segment, in vLLM's field order.
pub fn segment_json(s: &Segment) -> Value {
    json!({
        "id": s.id,
        "avg_logprob": s.avg_logprob,
        "compression_ratio": s.compression_ratio,
        "end": s.end,
        "no_speech_prob": s.no_speech_prob,
        "seek": s.seek,
        "start": s.start,
        "temperature": s.temperature,
        "text": s.text,
        "tokens": s.tokens,
    })
}

/// The response body of `format` for a finished transcription. `json` carries the duration
/// usage on `/transcriptions` only (`with_usage`), as vLLM's translation response has none.
pub fn render(t: &Transcription, format: ResponseFormat, with_usage: bool) -> TranscriptionBody {
    let cues = || t.segments.iter().map(|s| (s.start, s.end, s.text.as_str()));
    match format {
        ResponseFormat::Json if with_usage => TranscriptionBody::Json(json!({
            "text": t.text,
            "usage": {"type": "duration", "seconds": format::usage_seconds(t.duration)},
        })),
        ResponseFormat::Json => TranscriptionBody::Json(json!({"text": t.text})),
        ResponseFormat::VerboseJson => TranscriptionBody::Json(json!({
            "duration": t.duration,
            "language": t.language,
            "text": t.text,
            "segments": t.segments.iter().map(segment_json).collect::<Vec<_>>(),
            "words": null,
        })),
        ResponseFormat::Text => TranscriptionBody::Text {
            body: t.text.clone(),
            content_type: format.content_type(),
        },
        ResponseFormat::Srt => TranscriptionBody::Text {
            body: format::srt(cues()),
            content_type: format.content_type(),
        },
        ResponseFormat::Vtt => TranscriptionBody::Text {
            body: format::vtt(cues()),
            content_type: format.content_type(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcription() -> Transcription {
        let seg = |id, start, end, text: &str| Segment {
            id,
            seek: 0,
            start,
            end,
            text: text.to_owned(),
            tokens: vec![50363, 383, 50563],
            avg_logprob: -0.5,
            compression_ratio: 1.0,
            no_speech_prob: 0.04,
            temperature: 0.0,
        };
        Transcription {
            text: " Hello world. Second <b> part.".into(),
            language: "en".into(),
            language_probability: 1.0,
            duration: 4.140437,
            segments: vec![
                seg(1, 0.0, 2.0, " Hello world."),
                seg(2, 2.0, 3.9995, " Second <b> part."),
            ],
            prompt_tokens: 1,
            completion_tokens: 6,
        }
    }

    #[test]
    fn every_response_format() {
        let t = transcription();
        assert_eq!(
            render(&t, ResponseFormat::Json, true),
            TranscriptionBody::Json(json!({
                "text": " Hello world. Second <b> part.",
                "usage": {"type": "duration", "seconds": 5},
            }))
        );
        assert_eq!(
            render(&t, ResponseFormat::Json, false),
            TranscriptionBody::Json(json!({"text": " Hello world. Second <b> part."}))
        );
        let TranscriptionBody::Json(v) = render(&t, ResponseFormat::VerboseJson, true) else {
            panic!("verbose_json is JSON")
        };
        assert_eq!(v["duration"], 4.140437);
        assert_eq!(v["words"], Value::Null);
        assert_eq!(v["segments"][1]["end"], 3.9995);
        assert_eq!(v["segments"][0]["tokens"], json!([50363, 383, 50563]));
        let keys: Vec<&str> = v["segments"][0]
            .as_object()
            .expect("segment")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "id",
                "avg_logprob",
                "compression_ratio",
                "end",
                "no_speech_prob",
                "seek",
                "start",
                "temperature",
                "text",
                "tokens"
            ]
        );
        assert_eq!(
            render(&t, ResponseFormat::Srt, true),
            TranscriptionBody::Text {
                body: "1\n00:00:00,000 --> 00:00:02,000\nHello world.\n\n\
                       2\n00:00:02,000 --> 00:00:04,000\nSecond <b> part.\n"
                    .into(),
                content_type: "text/plain; charset=utf-8",
            }
        );
        assert_eq!(
            render(&t, ResponseFormat::Vtt, true),
            TranscriptionBody::Text {
                body: "WEBVTT\n\n00:00:00.000 --> 00:00:02.000\nHello world.\n\n\
                       00:00:02.000 --> 00:00:04.000\nSecond &lt;b> part.\n"
                    .into(),
                content_type: "text/vtt; charset=utf-8",
            }
        );
        assert_eq!(
            render(&t, ResponseFormat::Text, true),
            TranscriptionBody::Text {
                body: " Hello world. Second <b> part.".into(),
                content_type: "text/plain; charset=utf-8",
            }
        );
    }

    #[test]
    fn uploads_over_the_size_limit_are_refused_before_decoding() {
        let limits = UploadLimits {
            max_filesize_mb: 0.001,
            max_duration_s: None,
        };
        let e = decode_upload(&[0u8; 2000], Some("x.wav"), &limits).expect_err("too big");
        assert_eq!(e.status(), 400);
        assert_eq!(e.param(), Some("audio_filesize_mb"));
        assert!(
            e.to_string().starts_with(
                "Maximum file size exceeded (parameter=audio_filesize_mb, value=0.0019"
            ),
            "{e}"
        );
        let e = decode_upload(b"", None, &UploadLimits::default()).expect_err("empty");
        assert_eq!((e.status(), e.param()), (400, Some("file")));
    }
}
