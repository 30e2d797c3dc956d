//! The Whisper fixtures shared by `whisper_parity.rs` and `whisper_wgpu.rs`: the tiny.en
//! checkpoint, the clips of `testdata/audio/` and faster-whisper's references
//! (`transcripts.jsonl`), and the check of a transcription against one.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use aphro_engine::speech::Transcription;
use serde_json::Value;

/// Segment boundaries (issue 20).
pub const TIME_TOL: f64 = 0.02;

pub fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/audio")
        .join(name)
}

pub fn model_dir() -> PathBuf {
    asset_model("whisper-tiny.en")
}

pub fn asset_model(name: &str) -> PathBuf {
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

/// A 16-bit PCM mono WAV as float samples (int16 / 32768, as the goldens read them).
pub fn read_wav(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).expect("clip");
    assert_eq!(&b[..4], b"RIFF");
    assert_eq!(&b[8..12], b"WAVE");
    let mut pos = 12;
    let (mut fmt_ok, mut data) = (false, None);
    while pos + 8 <= b.len() {
        let id = &b[pos..pos + 4];
        let len = u32::from_le_bytes(b[pos + 4..pos + 8].try_into().expect("test data")) as usize;
        let body = &b[pos + 8..(pos + 8 + len).min(b.len())];
        if id == b"fmt " {
            let u16at = |i: usize| u16::from_le_bytes([body[i], body[i + 1]]);
            let rate = u32::from_le_bytes(body[4..8].try_into().expect("test data"));
            fmt_ok = u16at(0) == 1 && u16at(2) == 1 && rate == 16000 && u16at(14) == 16;
        } else if id == b"data" {
            data = Some(body);
        }
        pos += 8 + len + (len & 1);
    }
    assert!(fmt_ok, "{}: not 16 kHz mono s16", path.display());
    data.expect("data chunk")
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0)
        .collect()
}

pub fn cases() -> Vec<Value> {
    std::fs::read_to_string(testdata("transcripts.jsonl"))
        .expect("transcripts.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

/// The WAV cases (the FLAC / MP3 container variants are the audio decoder's business).
pub fn wav_cases() -> Vec<Value> {
    cases()
        .into_iter()
        .filter(|c| c["container"] == "wav")
        .collect()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn normalize(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `got` against faster-whisper's `reference` of fixture clip `id`: text, duration, every
/// segment's boundaries, seek, text, tokens and scores.
pub fn check_reference(id: &str, got: &Transcription, r: &Value) {
    assert_eq!(
        normalize(&got.text),
        normalize(r["text"].as_str().expect("test data")),
        "{id}: text"
    );
    assert_eq!(got.language, "en");
    // The golden's duration went through float32 (7 significant digits).
    let want_duration = r["duration"].as_f64().expect("test data");
    assert!(
        (got.duration - want_duration).abs() <= 1e-6 * want_duration.max(1.0),
        "{id}: duration {} vs {want_duration}",
        got.duration
    );
    let want = r["segments"].as_array().expect("test data");
    assert_eq!(got.segments.len(), want.len(), "{id}: segment count");
    for (g, w) in got.segments.iter().zip(want) {
        let what = format!("{id} segment {}", g.id);
        assert_eq!(g.id as u64, w["id"].as_u64().expect("test data"), "{what}");
        assert_eq!(
            g.seek as u64,
            w["seek"].as_u64().expect("test data"),
            "{what}: seek"
        );
        assert!(
            (g.start - w["start"].as_f64().expect("test data")).abs() <= TIME_TOL,
            "{what}: start"
        );
        assert!(
            (g.end - w["end"].as_f64().expect("test data")).abs() <= TIME_TOL,
            "{what}: end"
        );
        assert_eq!(
            g.text,
            w["text"].as_str().expect("test data"),
            "{what}: text"
        );
        assert_eq!(g.tokens, ids(&w["tokens"]), "{what}: tokens");
        // The compression ratio depends on the deflate implementation's output length:
        // faster-whisper's is CPython's zlib, ours zlib-rs, whose streams for the same
        // text can differ by a few bytes. Equal within 5% is the same text compressing
        // alike; the 2.4 threshold it feeds is far from the values here.
        for (field, got, tol) in [
            ("avg_logprob", g.avg_logprob, 1e-3),
            ("no_speech_prob", g.no_speech_prob, 1e-3),
            (
                "compression_ratio",
                g.compression_ratio,
                0.05 * w["compression_ratio"].as_f64().expect("test data"),
            ),
        ] {
            let want = w[field].as_f64().expect("test data");
            assert!((got - want).abs() <= tol, "{what}: {field} {got} vs {want}");
        }
    }
    if id == "a08_silence" {
        assert_eq!(got.text, "");
        assert!(got.segments.is_empty());
    }
    if id == "a09_long_chunking" {
        let seeks: Vec<usize> = got.segments.iter().map(|s| s.seek).collect();
        assert_eq!(
            seeks.last(),
            Some(&2712),
            "the second window starts at 27.12 s"
        );
    }
}
