//! `/v1/audio/transcriptions` and `/translations` over HTTP on Whisper tiny.en served as a
//! speech model: every bad upload is a 400/422 with a message naming the reason (never a
//! 500), vLLM's form validation, each response format, the SSE stream, and which routes a
//! speech server mounts. Transcripts are compared with faster-whisper's greedy reference
//! (`testdata/audio/transcripts.jsonl`), whitespace-normalized.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use aphro_http::server::{Role, Server};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::Value;
use tower::ServiceExt;

fn whisper_dir() -> PathBuf {
    asset_model("whisper-tiny.en")
}

fn asset_model(name: &str) -> PathBuf {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.assets"));
    let dir = assets.join("models").join(name);
    assert!(
        dir.join("model.bin").exists(),
        "{} is missing: run `python3 scripts/fetch_assets.py`",
        dir.display()
    );
    dir
}

fn clip(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/audio")
            .join(name),
    )
    .expect("testdata/audio clip")
}

fn reference_text(id: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/audio/transcripts.jsonl");
    let case = std::fs::read_to_string(path)
        .expect("transcripts.jsonl")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json"))
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no case {id}"));
    normalized(case["reference"]["text"].as_str().expect("text"))
}

fn normalized(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The speech server every test shares (the model loads once), with small limits so the
/// limit paths are reachable with the fixture clips: 0.1 MiB per file, 3 s of audio.
fn app() -> Router {
    static APP: OnceLock<Router> = OnceLock::new();
    APP.get_or_init(|| {
        Server::builder()
            .model(whisper_dir().to_string_lossy())
            .role(Role::Speech)
            .served_model_name("whisper-tiny.en")
            .speech_threads(2)
            .max_audio_filesize_mb(0.1)
            .max_audio_duration(3.0)
            .build()
            .expect("speech server")
            .router()
    })
    .clone()
}

/// One part of a multipart form: `(name, Some(file name) for a file part, bytes)`.
type Part<'a> = (&'a str, Option<&'a str>, &'a [u8]);

fn multipart(parts: &[Part<'_>]) -> (String, Vec<u8>) {
    let boundary = "----aphro-test-boundary-7d2f";
    let mut body = Vec::new();
    for (name, file, data) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match file {
            Some(f) => body.extend_from_slice(
                format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\n\
                     Content-Type: application/octet-stream\r\n\r\n"
                )
                .as_bytes(),
            ),
            None => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
            ),
        }
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

struct Reply {
    status: StatusCode,
    content_type: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The error message, after checking the envelope's shape and status.
    fn error(&self, status: StatusCode) -> String {
        assert_eq!(self.status, status, "{}", self.body);
        let v = self.json();
        assert_eq!(v["error"]["code"], status.as_u16(), "{v}");
        v["error"]["message"].as_str().expect("message").to_owned()
    }
}

async fn post(app: Router, path: &str, parts: &[Part<'_>]) -> Reply {
    let (content_type, body) = multipart(parts);
    send(app, path, &content_type, body).await
}

async fn send(app: Router, path: &str, content_type: &str, body: Vec<u8>) -> Reply {
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", content_type)
        .body(Body::from(body))
        .expect("request");
    let resp = app.oneshot(req).await.expect("response");
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    Reply {
        status,
        content_type,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

const TRANSCRIBE: &str = "/v1/audio/transcriptions";

#[tokio::test]
async fn bad_uploads_are_client_errors_that_name_the_reason() {
    let yes = clip("a10_yes.wav");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "notes.wav",
            b"just some text, certainly not audio".to_vec(),
            "Invalid or unsupported audio file.",
        ),
        ("empty.wav", Vec::new(), "the file is empty"),
        ("cut.wav", yes[..yes.len() / 2].to_vec(), "truncated"),
        (
            "header.wav",
            yes[..30].to_vec(),
            "Invalid or unsupported audio file",
        ),
        // 132 kB: over the server's 0.1 MiB.
        (
            "big.wav",
            clip("a01_hello_us.wav"),
            "Maximum file size exceeded (parameter=audio_filesize_mb, value=0.12",
        ),
        // 4.1 s of FLAC in 77 kB: under the size limit, over the 3 s one.
        (
            "long.flac",
            clip("a01_hello_us.flac"),
            "The audio is too long",
        ),
    ];
    for (name, bytes, want) in cases {
        let r = post(app(), TRANSCRIBE, &[("file", Some(name), &bytes)]).await;
        let msg = r.error(StatusCode::BAD_REQUEST);
        assert!(msg.contains(want), "{name}: {msg}");
        let v = r.json();
        assert_eq!(v["error"]["type"], "BadRequestError", "{name}: {v}");
    }
}

#[tokio::test]
async fn malformed_forms_are_vllms_errors() {
    let yes = clip("a10_yes.wav");
    let file: Part<'_> = ("file", Some("yes.wav"), &yes);
    // The upload under another name: `file` is missing.
    let r = post(app(), TRANSCRIBE, &[("audio", Some("yes.wav"), &yes)]).await;
    let msg = r.error(StatusCode::BAD_REQUEST);
    assert!(
        msg.contains("Field required") && msg.contains("body.file"),
        "{msg}"
    );
    // A string where the file belongs: FastAPI's 422.
    let r = post(app(), TRANSCRIBE, &[("file", None, b"hello.wav")]).await;
    assert_eq!(
        r.error(StatusCode::UNPROCESSABLE_ENTITY),
        "Expected 'file' to be a file-like object, not 'str'."
    );
    assert_eq!(r.json()["error"]["type"], "Unprocessable Entity");
    // Not multipart at all.
    let r = send(
        app(),
        TRANSCRIBE,
        "application/json",
        b"{\"file\":\"x\"}".to_vec(),
    )
    .await;
    assert!(r
        .error(StatusCode::BAD_REQUEST)
        .contains("multipart/form-data"));
    let cases: Vec<(Vec<Part<'_>>, StatusCode, &str)> = vec![
        (
            vec![file, ("stream_include_usage", None, b"true")],
            StatusCode::BAD_REQUEST,
            "Stream options can only be defined when `stream=True`.",
        ),
        (
            vec![file, ("vllm_xargs", None, b"{not json")],
            StatusCode::BAD_REQUEST,
            "Failed to parse vllm_xargs. Must be valid JSON:",
        ),
        (
            vec![file, ("response_format", None, b"xml")],
            StatusCode::BAD_REQUEST,
            "Input should be 'json', 'text', 'srt', 'verbose_json' or 'vtt'",
        ),
        (
            vec![
                file,
                ("response_format", None, b"verbose_json"),
                ("stream", None, b"true"),
            ],
            StatusCode::BAD_REQUEST,
            "verbose_json format doesn't support streaming case",
        ),
        (
            vec![file, ("temperature", None, b"hot")],
            StatusCode::BAD_REQUEST,
            "body.temperature",
        ),
        (
            vec![file, ("language", None, b"xx")],
            StatusCode::BAD_REQUEST,
            "Unsupported language: 'xx'.  Must be one of ['af', 'ar', 'hy',",
        ),
        (
            vec![file, ("model", None, b"whisper-large")],
            StatusCode::NOT_FOUND,
            "The model `whisper-large` does not exist.",
        ),
        (
            vec![file, ("n", None, b"2")],
            StatusCode::BAD_REQUEST,
            "n must be 1",
        ),
        // SamplingParams' checks with vLLM's messages.
        (
            vec![file, ("temperature", None, b"-1")],
            StatusCode::BAD_REQUEST,
            "temperature must be non-negative, got -1.0.",
        ),
        (
            vec![file, ("top_p", None, b"0")],
            StatusCode::BAD_REQUEST,
            "top_p must be in (0, 1], got 0.0.",
        ),
        (
            vec![file, ("top_k", None, b"-2")],
            StatusCode::BAD_REQUEST,
            "top_k must be 0 (disable), or at least 1, got -2.",
        ),
        (
            vec![file, ("min_p", None, b"1.5")],
            StatusCode::BAD_REQUEST,
            "min_p must be in [0, 1], got 1.5.",
        ),
        (
            vec![file, ("repetition_penalty", None, b"0")],
            StatusCode::BAD_REQUEST,
            "repetition_penalty must be greater than zero, got 0.0.",
        ),
        (
            vec![file, ("presence_penalty", None, b"3")],
            StatusCode::BAD_REQUEST,
            "presence_penalty must be in [-2, 2], got 3.0.",
        ),
        (
            vec![file, ("timestamp_granularities[]", None, b"word")],
            StatusCode::BAD_REQUEST,
            "timestamp_granularities[]=word is not supported",
        ),
        // Fields the model cannot honour are refused by name, not accepted and dropped.
        (
            vec![file, ("vllm_xargs", None, br#"{"my_processor_arg": 1}"#)],
            StatusCode::BAD_REQUEST,
            r#"vllm_xargs ["my_processor_arg"] cannot be honoured"#,
        ),
        (
            vec![file, ("to_language", None, b"de")],
            StatusCode::BAD_REQUEST,
            "to_language 'de' is not supported: this model writes transcripts in the spoken language only, in 'en'",
        ),
    ];
    for (parts, status, want) in cases {
        let r = post(app(), TRANSCRIBE, &parts).await;
        let msg = r.error(status);
        assert!(msg.contains(want), "{want}: {msg}");
    }
}

#[tokio::test]
async fn every_response_format_on_the_real_model() {
    let yes = clip("a10_yes.wav");
    let want = reference_text("a10_yes");
    let file: Part<'_> = ("file", Some("yes.wav"), &yes);

    let r = post(
        app(),
        TRANSCRIBE,
        &[file, ("model", None, b"whisper-tiny.en")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(normalized(v["text"].as_str().expect("text")), want, "{v}");
    // 1.37 s of audio, billed in whole seconds.
    assert_eq!(
        v["usage"],
        serde_json::json!({"type": "duration", "seconds": 2})
    );

    let r = post(
        app(),
        TRANSCRIBE,
        &[file, ("response_format", None, b"text")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.content_type.starts_with("text/plain"),
        "{}",
        r.content_type
    );
    assert_eq!(normalized(&r.body), want);

    let r = post(
        app(),
        TRANSCRIBE,
        &[file, ("response_format", None, b"verbose_json")],
    )
    .await;
    let v = r.json();
    assert_eq!(v["language"], "en");
    assert!(
        (v["duration"].as_f64().expect("duration") - 1.370_562_5).abs() < 1e-3,
        "{v}"
    );
    assert_eq!(normalized(v["text"].as_str().expect("text")), want);
    assert_eq!(v["words"], Value::Null);
    let segments = v["segments"].as_array().expect("segments");
    assert!(!segments.is_empty(), "{v}");
    for key in [
        "id",
        "avg_logprob",
        "compression_ratio",
        "end",
        "no_speech_prob",
        "seek",
        "start",
        "temperature",
        "text",
        "tokens",
    ] {
        assert!(segments[0].get(key).is_some(), "segment lacks {key}: {v}");
    }

    let r = post(
        app(),
        TRANSCRIBE,
        &[file, ("response_format", None, b"srt")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let mut lines = r.body.lines();
    assert_eq!(lines.next(), Some("1"), "{}", r.body);
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with("00:00:00,000 --> 00:00:0")),
        "{}",
        r.body
    );
    assert_eq!(lines.next().map(normalized), Some(want.clone()));

    let r = post(
        app(),
        TRANSCRIBE,
        &[file, ("response_format", None, b"vtt")],
    )
    .await;
    assert!(r.content_type.starts_with("text/vtt"), "{}", r.content_type);
    assert!(
        r.body.starts_with("WEBVTT\n\n00:00:00.000 --> "),
        "{}",
        r.body
    );

    // An English-only model translates English audio into itself; no usage, as vLLM's.
    let r = post(app(), "/v1/audio/translations", &[file]).await;
    let v = r.json();
    assert_eq!(normalized(v["text"].as_str().expect("text")), want);
    assert!(v.get("usage").is_none(), "{v}");

    // `to_language` naming the language the model writes is accepted (an empty
    // `vllm_xargs` too); any other target is refused by name.
    let r = post(
        app(),
        "/v1/audio/translations",
        &[file, ("to_language", None, b"en")],
    )
    .await;
    assert_eq!(normalized(r.json()["text"].as_str().expect("text")), want);
    let r = post(
        app(),
        TRANSCRIBE,
        &[
            file,
            ("to_language", None, b"en"),
            ("vllm_xargs", None, b"{}"),
        ],
    )
    .await;
    assert_eq!(normalized(r.json()["text"].as_str().expect("text")), want);
    let r = post(
        app(),
        "/v1/audio/translations",
        &[file, ("to_language", None, b"fr")],
    )
    .await;
    let msg = r.error(StatusCode::BAD_REQUEST);
    assert!(
        msg.contains(
            "to_language 'fr' is not supported: this model writes translations in English only"
        ),
        "{msg}"
    );
    assert_eq!(r.json()["error"]["param"], "to_language");
}

#[tokio::test]
async fn streams_segments_then_stop_usage_and_done() {
    let yes = clip("a10_yes.wav");
    let r = post(
        app(),
        TRANSCRIBE,
        &[
            ("file", Some("yes.wav"), &yes),
            ("stream", None, b"true"),
            ("stream_include_usage", None, b"true"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.content_type.starts_with("text/event-stream"));
    let events: Vec<&str> = r
        .body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data event"))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{}", r.body);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk json"))
        .collect();
    let mut text = String::new();
    let mut openai_text = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "transcription.chunk");
        assert!(c["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("transcribe-")));
        if let Some(d) = c["choices"][0]["delta"]["content"].as_str() {
            text.push_str(d);
        }
        if c["type"] == "transcript.text.delta" {
            openai_text.push_str(c["delta"].as_str().expect("delta"));
        }
    }
    assert_eq!(normalized(&text), reference_text("a10_yes"));
    assert_eq!(openai_text, text);
    let stop = &chunks[chunks.len() - 2];
    assert_eq!(stop["choices"][0]["finish_reason"], "stop", "{stop}");
    assert_eq!(stop["type"], "transcript.text.done", "{stop}");
    assert_eq!(
        normalized(stop["text"].as_str().expect("text")),
        reference_text("a10_yes")
    );
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], serde_json::json!([]));
    let u = &usage["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().expect("p") + u["completion_tokens"].as_u64().expect("c"))
    );
}

#[tokio::test]
async fn a_speech_server_mounts_the_audio_routes_only() {
    let get = |path: &str| {
        Request::builder()
            .uri(path)
            .body(Body::empty())
            .expect("request")
    };
    let resp = app().oneshot(get("/openapi.json")).await.expect("response");
    let doc: Value = serde_json::from_slice(
        &axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body"),
    )
    .expect("json");
    let mut paths: Vec<&str> = doc["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .map(String::as_str)
        .collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "/health",
            "/metrics",
            "/ping",
            "/v1/audio/transcriptions",
            "/v1/audio/translations",
            "/v1/models",
            "/v1/models/{model}",
            "/version",
        ]
    );
    let resp = app().oneshot(get("/v1/models")).await.expect("response");
    let models: Value = serde_json::from_slice(
        &axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body"),
    )
    .expect("json");
    assert_eq!(models["data"][0]["id"], "whisper-tiny.en");
    assert_eq!(models["data"][0]["max_model_len"], 448);
    // A chat route on a speech server is not there, as on vLLM.
    let r = send(
        app(),
        "/v1/chat/completions",
        "application/json",
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (StatusCode::NOT_FOUND, r#"{"detail":"Not Found"}"#)
    );
}

/// Requests at once run at once (their decoding steps batched in the model), and each gets
/// its own transcript.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_each_get_their_own_transcript() {
    let (yes, hello_flac, hello_ogg) = (
        clip("a10_yes.wav"),
        clip("a01_hello_us.flac"),
        clip("a01_hello_us.ogg"),
    );
    let text = |r: Reply| {
        let v = r.json();
        normalized(v["text"].as_str().unwrap_or_else(|| panic!("{v}")))
    };
    let parts: [[Part<'_>; 1]; 3] = [
        [("file", Some("yes.wav"), &yes)],
        [("file", Some("hello.flac"), &hello_flac)],
        [("file", Some("hello.ogg"), &hello_ogg)],
    ];
    // Without the shared server's 3 s limit, so the clips differ.
    let app = Server::builder()
        .model(whisper_dir().to_string_lossy())
        .role(Role::Speech)
        .speech_threads(2)
        .build()
        .expect("speech server")
        .router();
    // Ogg Vorbis is lossy: its transcript alone is what it must get at once too.
    let vorbis_alone = text(post(app.clone(), TRANSCRIBE, &parts[2]).await);
    let (a, b, c) = tokio::join!(
        post(app.clone(), TRANSCRIBE, &parts[0]),
        post(app.clone(), TRANSCRIBE, &parts[1]),
        post(app, TRANSCRIBE, &parts[2]),
    );
    assert_eq!(text(a), reference_text("a10_yes"));
    assert_eq!(text(b), reference_text("a01_hello_us"));
    assert_eq!(text(c), vorbis_alone);
    assert_ne!(vorbis_alone, reference_text("a10_yes"));
}

/// A multilingual model (whisper-base): without `language` the language is detected, and
/// `/translations` runs Whisper's translate task; both equal faster-whisper's
/// (`testdata/audio/base_goldens.jsonl`).
#[tokio::test]
async fn a_multilingual_model_detects_the_language_and_translates() {
    let goldens = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/audio/base_goldens.jsonl"),
    )
    .expect("goldens");
    let golden = |task: &str| -> Value {
        goldens
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("json"))
            .find(|c| c["clip"] == "clips/a02_meeting_gb.wav" && c["task"] == task)
            .expect("golden")
    };
    let tokens = |v: &Value| -> Vec<Value> {
        v["segments"]
            .as_array()
            .expect("segments")
            .iter()
            .map(|s| s["tokens"].clone())
            .collect()
    };
    let app = Server::builder()
        .model(asset_model("whisper-base").to_string_lossy())
        .role(Role::Speech)
        .speech_threads(2)
        .build()
        .expect("speech server")
        .router();
    let wav = clip("clips/a02_meeting_gb.wav");
    let file: Part<'_> = ("file", Some("meeting.wav"), &wav);
    let r = post(
        app.clone(),
        TRANSCRIBE,
        &[file, ("response_format", None, b"verbose_json")],
    )
    .await;
    let v = r.json();
    assert_eq!(v["language"], "en", "{v}");
    assert_eq!(tokens(&v), tokens(&golden("transcribe")));
    // The translate task's tokens differ from the transcript's on this clip.
    assert_ne!(tokens(&golden("translate")), tokens(&golden("transcribe")));
    let r = post(
        app.clone(),
        "/v1/audio/translations",
        &[file, ("response_format", None, b"verbose_json")],
    )
    .await;
    let v = r.json();
    assert_eq!(tokens(&v), tokens(&golden("translate")), "{v}");
    assert_eq!(
        normalized(v["text"].as_str().expect("text")),
        normalized(golden("translate")["text"].as_str().expect("text"))
    );
    // A language the model has a token for is taken as given; one it has not is vLLM's 400.
    let r = post(app.clone(), TRANSCRIBE, &[file, ("language", None, b"de")]).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = post(app, TRANSCRIBE, &[file, ("to_language", None, b"fr")]).await;
    assert!(r
        .error(StatusCode::BAD_REQUEST)
        .contains("to_language 'fr' needs `language`"));
}
