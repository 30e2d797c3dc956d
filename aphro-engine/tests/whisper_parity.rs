//! Whisper tiny.en (`$APHRO_ASSETS/models/whisper-tiny.en`, the CTranslate2 checkpoint of
//! `scripts/fetch_assets.py`) against the goldens of `testdata/audio/` (see its README):
//! the log-mel front end against openai-whisper's (float64), the greedy decoder against
//! CTranslate2 float32 given the same features and prompt (`vllm_style`), and whole
//! transcriptions against faster-whisper 1.2.1 (`reference`).

use std::sync::OnceLock;

use aphro_engine::speech::mel::MelFrontEnd;
use aphro_engine::speech::{
    GenerateRequest, Penalties, SpeechError, SpeechTask, TranscribeOptions, Transcriber,
    TranscriberConfig,
};
use serde_json::Value;

#[path = "common/whisper.rs"]
mod whisper;
use whisper::*;

/// The fixture README's tolerance for a float32 front end.
const MEL_TOL: f32 = 1e-4;

fn transcriber() -> &'static Transcriber {
    static T: OnceLock<Transcriber> = OnceLock::new();
    T.get_or_init(|| {
        // WHISPER_THREADS sizes the pool when measuring the real-time factor.
        let num_threads = std::env::var("WHISPER_THREADS")
            .ok()
            .and_then(|v| v.parse().ok());
        Transcriber::load(
            &model_dir(),
            TranscriberConfig {
                num_threads,
                ..TranscriberConfig::default()
            },
        )
        .expect("tiny.en loads")
    })
}

fn frames(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .expect("frames")
        .iter()
        .map(|f| {
            f.as_array()
                .expect("frame")
                .iter()
                .map(|x| x.as_f64().expect("test data") as f32)
                .collect()
        })
        .collect()
}

fn check_frame(what: &str, got: impl Fn(usize) -> f32, want: &[f32]) {
    assert_eq!(want.len(), 80);
    for (m, &w) in want.iter().enumerate() {
        let g = got(m);
        assert!(
            (g - w).abs() <= MEL_TOL,
            "{what} mel bin {m}: got {g}, golden {w}"
        );
    }
}

#[test]
fn log_mel_matches_openai_whisper() {
    let fe = MelFrontEnd::new(80).expect("80-bin front end");
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(testdata("mel_frontend.json")).expect("test data"),
    )
    .expect("test data");
    for clip in golden["clips"].as_array().expect("test data") {
        let name = clip["clip"].as_str().expect("test data");
        let samples = read_wav(&testdata(name));
        assert_eq!(
            samples.len() as u64,
            clip["num_samples"].as_u64().expect("test data")
        );
        let variants = [
            ("no_pad", 0),
            ("padded_30s", 480_000 - samples.len()),
            ("faster_whisper_frontend", 160),
        ];
        for (variant, pad) in variants {
            let g = &clip[variant];
            let mel = fe.log_mel(&samples, pad);
            assert_eq!(
                mel.n_frames as u64,
                g["n_frames"].as_u64().expect("test data"),
                "{name} {variant}"
            );
            for (t, want) in frames(&g["first_frames"]).iter().enumerate() {
                check_frame(
                    &format!("{name} {variant} frame {t}"),
                    |m| mel.at(m, t),
                    want,
                );
            }
            if let Some(probes) = g["probe_frames"].as_object() {
                for (t, want) in probes {
                    let t: usize = t.parse().expect("test data");
                    let want: Vec<f32> = want
                        .as_array()
                        .expect("test data")
                        .iter()
                        .map(|x| x.as_f64().expect("test data") as f32)
                        .collect();
                    check_frame(
                        &format!("{name} {variant} frame {t}"),
                        |m| mel.at(m, t),
                        &want,
                    );
                }
            }
            for key in ["frame_mid", "frame_tail"] {
                if let Some(want) = g.get(key) {
                    let t = g[format!("{key}_index")].as_u64().expect("test data") as usize;
                    let want: Vec<f32> = want
                        .as_array()
                        .expect("test data")
                        .iter()
                        .map(|x| x.as_f64().expect("test data") as f32)
                        .collect();
                    check_frame(&format!("{name} {variant} {key}"), |m| mel.at(m, t), &want);
                }
            }
            for (stat, got) in [
                ("max", mel.data.iter().copied().fold(f32::MIN, f32::max)),
                ("min", mel.data.iter().copied().fold(f32::MAX, f32::min)),
            ] {
                if let Some(want) = g.get(stat).and_then(Value::as_f64) {
                    assert!(
                        (got as f64 - want).abs() <= MEL_TOL as f64,
                        "{name} {variant} {stat}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// The greedy decoder given vLLM's features (each chunk zero-padded to 30 s) and each of the
/// three prompts: CTranslate2 float32's token ids exactly.
#[test]
fn greedy_tokens_equal_ctranslate2_for_vllm_style_prompts() {
    let t = transcriber();
    let mut compared = 0;
    for case in wav_cases() {
        let id = case["id"].as_str().expect("test data");
        let samples = read_wav(&testdata(case["file"].as_str().expect("test data")));
        for chunk in case["vllm_style"]["chunks"].as_array().expect("test data") {
            let (a, b) = (
                chunk["start_sample"].as_u64().expect("test data") as usize,
                chunk["end_sample"].as_u64().expect("test data") as usize,
            );
            let variants = chunk["variants"].as_object().expect("test data");
            let requests: Vec<GenerateRequest> = variants
                .iter()
                .map(|(name, v)| GenerateRequest {
                    prompt: ids(&v["prompt_token_ids"]),
                    // Only `vllm_suppress_blank` forbids <|endoftext|> and " " at the start;
                    // none of the variants suppresses anything else.
                    suppress_blank: name == "vllm_suppress_blank",
                    suppress_tokens: false,
                    max_new_tokens: None,
                })
                .collect();
            let outputs = t.generate(&samples[a..b], &requests).expect("generate");
            for ((name, v), got) in variants.iter().zip(outputs) {
                let want = ids(&v["token_ids"]);
                assert_eq!(
                    got, want,
                    "{id} chunk {a}..{b} variant {name}: token ids differ from CTranslate2"
                );
                compared += 1;
            }
        }
    }
    assert!(compared >= 45, "{compared} chunk decodes compared");
}

/// Whole transcriptions as faster-whisper makes them: text, segment boundaries and seeks.
#[test]
fn transcripts_equal_faster_whisper() {
    let t = transcriber();
    let (mut total_audio, mut total_compute) = (0.0, 0.0);
    for case in wav_cases() {
        let id = case["id"].as_str().expect("test data");
        let samples = read_wav(&testdata(case["file"].as_str().expect("test data")));
        let r = &case["reference"];
        let mut streamed = Vec::new();
        let started = std::time::Instant::now();
        let got = t
            .transcribe_with(&samples, &TranscribeOptions::default(), &mut |s| {
                streamed.push(s.clone())
            })
            .expect("transcribe");
        let secs = started.elapsed().as_secs_f64();
        total_audio += got.duration;
        total_compute += secs;
        eprintln!(
            "{id}: {:.2} s of audio in {secs:.3} s (real-time factor {:.1})",
            got.duration,
            got.duration / secs
        );
        assert_eq!(streamed, got.segments, "{id}: streamed segments");
        check_reference(id, &got, r);
    }
    eprintln!(
        "all clips: {total_audio:.2} s of audio in {total_compute:.3} s (real-time factor {:.1}, WHISPER_THREADS={:?})",
        total_audio / total_compute,
        std::env::var("WHISPER_THREADS").ok()
    );
}

/// The burn network (`Transcriber::load_on`, the code the CubeCL GPUs run) on burn's CPU
/// backend: every clip equal to faster-whisper's reference, as the host network is, with
/// three transcriptions at once sharing their decoding steps. `whisper_wgpu.rs` runs the
/// same network on a Vulkan device.
#[test]
fn burn_network_transcripts_equal_faster_whisper() {
    let t = Transcriber::load_on::<burn_flex::Flex>(
        &model_dir(),
        TranscriberConfig::default(),
        &Default::default(),
    )
    .expect("tiny.en loads on burn-flex");
    transcribe_all_concurrently(&t, 3);
}

/// A multilingual checkpoint (openai/whisper-base): the language detected on the first
/// window with its probability, the transcripts, and the translate task, against
/// faster-whisper 1.2.1 (`testdata/audio/base_goldens.jsonl`, made by
/// `scripts/make_whisper_base_goldens.py`).
#[test]
fn multilingual_base_detects_transcribes_and_translates_as_faster_whisper() {
    let t = Transcriber::load(&asset_model("whisper-base"), TranscriberConfig::default())
        .expect("whisper-base loads");
    let info = t.info();
    assert!(info.is_multilingual, "{info:?}");
    assert_eq!(info.languages.len(), 99, "{info:?}");
    let goldens = std::fs::read_to_string(testdata("base_goldens.jsonl")).expect("goldens");
    let mut translated = 0;
    for line in goldens.lines() {
        let case: Value = serde_json::from_str(line).expect("json");
        let what = format!("{} {}", case["clip"], case["task"]);
        let task = match case["task"].as_str() {
            Some("translate") => {
                translated += 1;
                SpeechTask::Translate
            }
            _ => SpeechTask::Transcribe,
        };
        let samples = read_wav(&testdata(case["clip"].as_str().expect("test data")));
        let opts = TranscribeOptions {
            task,
            ..TranscribeOptions::default()
        };
        let got = t.transcribe(&samples, &opts).expect("transcribe");
        assert_eq!(
            got.language,
            case["language"].as_str().expect("test data"),
            "{what}"
        );
        let want_p = case["language_probability"].as_f64().expect("test data");
        assert!(
            (got.language_probability - want_p).abs() <= 1e-3 && want_p < 1.0,
            "{what}: language probability {} vs {want_p}",
            got.language_probability
        );
        assert_eq!(
            normalize(&got.text),
            normalize(case["text"].as_str().expect("test data")),
            "{what}: text"
        );
        let want = case["segments"].as_array().expect("test data");
        assert_eq!(got.segments.len(), want.len(), "{what}: segment count");
        for (g, w) in got.segments.iter().zip(want) {
            let what = format!("{what} segment {}", g.id);
            assert_eq!(g.tokens, ids(&w["tokens"]), "{what}: tokens");
            assert_eq!(
                g.seek as u64,
                w["seek"].as_u64().expect("test data"),
                "{what}"
            );
            for (field, got, tol) in [
                ("start", g.start, TIME_TOL),
                ("end", g.end, TIME_TOL),
                ("avg_logprob", g.avg_logprob, 1e-3),
                ("no_speech_prob", g.no_speech_prob, 1e-3),
            ] {
                let want = w[field].as_f64().expect("test data");
                assert!((got - want).abs() <= tol, "{what}: {field} {got} vs {want}");
            }
        }
    }
    assert_eq!(translated, 3, "the goldens cover the translate task");
}

/// Transcriptions on several threads at once share their decoding steps (one batched step
/// decodes a token of each), and each still equals faster-whisper's, clip for clip.
#[test]
fn concurrent_transcriptions_batch_their_steps_and_equal_faster_whisper() {
    // Its own model, so the batch counters see only these calls.
    let t = Transcriber::load(&model_dir(), TranscriberConfig::default()).expect("tiny.en loads");
    transcribe_all_concurrently(&t, 3);
}

/// Every clip on `workers` threads at once, each equal to faster-whisper's reference; the
/// steps must have been shared.
fn transcribe_all_concurrently(t: &Transcriber, workers: usize) {
    let cases = wav_cases();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let id = case["id"].as_str().expect("test data");
                let samples = read_wav(&testdata(case["file"].as_str().expect("test data")));
                let got = t
                    .transcribe(&samples, &TranscribeOptions::default())
                    .expect("transcribe");
                check_reference(id, &got, &case["reference"]);
            });
        }
    });
    let stats = t.batch_stats();
    eprintln!("{stats:?}");
    assert!(
        stats.largest >= 2 && stats.tokens > stats.steps,
        "{workers} transcriptions at once never shared a step: {stats:?}"
    );
    assert!(stats.largest <= workers, "{stats:?}");
}

/// `hotwords`, `repetition_penalty` and an initial prompt with hotwords against faster-whisper
/// 1.2.1 (`testdata/audio/option_goldens.jsonl`, made by
/// `scripts/make_whisper_option_goldens.py`): the same tokens in every segment.
#[test]
fn decoding_options_equal_faster_whisper() {
    let t = transcriber();
    let goldens = std::fs::read_to_string(testdata("option_goldens.jsonl")).expect("goldens");
    let mut penalized_differs = false;
    for line in goldens.lines() {
        let case: Value = serde_json::from_str(line).expect("json");
        let what = format!("{} {}", case["clip"], case["options"]);
        let o = &case["options"];
        let opts = TranscribeOptions {
            hotwords: o["hotwords"].as_str().map(str::to_owned),
            prompt: o["initial_prompt"].as_str().map(str::to_owned),
            penalties: Penalties {
                repetition: o["repetition_penalty"].as_f64().unwrap_or(1.0) as f32,
                ..Penalties::NONE
            },
            ..Default::default()
        };
        let samples = read_wav(&testdata(case["clip"].as_str().expect("clip")));
        let got = t.transcribe(&samples, &opts).expect("transcribe");
        let want = case["segments"].as_array().expect("segments");
        let got_tokens: Vec<&Vec<u32>> = got.segments.iter().map(|s| &s.tokens).collect();
        let want_tokens: Vec<Vec<u32>> = want.iter().map(|w| ids(&w["tokens"])).collect();
        assert_eq!(got_tokens.len(), want_tokens.len(), "{what}: segment count");
        for (g, w) in got_tokens.iter().zip(&want_tokens) {
            assert_eq!(*g, w, "{what}: tokens");
        }
        assert_eq!(
            normalize(&got.text),
            normalize(case["text"].as_str().expect("text"))
        );
        if o.get("repetition_penalty").is_some() {
            let plain = t
                .transcribe(&samples, &TranscribeOptions::default())
                .expect("transcribe");
            penalized_differs |= plain.text != got.text;
        }
    }
    assert!(
        penalized_differs,
        "some penalized case must differ from plain greedy, or the goldens test nothing"
    );
}

#[test]
fn request_errors_are_typed_400s() {
    let t = transcriber();
    let err = |opts: TranscribeOptions, samples: &[f32]| {
        t.transcribe(samples, &opts).expect_err("rejected")
    };
    let e = err(
        TranscribeOptions {
            language: Some("xx".into()),
            ..Default::default()
        },
        &[0.0; 1600][..],
    );
    assert!(matches!(e, SpeechError::UnsupportedLanguage { .. }));
    assert_eq!(e.status(), 400);
    assert!(e
        .to_string()
        .starts_with("Unsupported language: 'xx'.  Must be one of ['af',"));
    let e = err(TranscribeOptions::default(), &[0.0, f32::NAN][..]);
    assert_eq!(e.status(), 400);
    let e = err(
        TranscribeOptions {
            temperature: -1.0,
            ..Default::default()
        },
        &[0.0; 16][..],
    );
    assert_eq!(e.status(), 400);
    let e = err(
        TranscribeOptions {
            penalties: Penalties {
                repetition: 0.0,
                ..Penalties::NONE
            },
            ..Default::default()
        },
        &[0.0; 16][..],
    );
    assert_eq!(e.status(), 400);
    assert_eq!(
        e.to_string(),
        "repetition_penalty must be greater than zero, got 0.0."
    );
    // An English-only model takes any Whisper language as English (faster-whisper).
    let ok = t
        .transcribe(
            &[0.0; 16000],
            &TranscribeOptions {
                language: Some("fr".into()),
                ..Default::default()
            },
        )
        .expect("fr on tiny.en");
    assert_eq!(ok.language, "en");
    // A prompt longer than the window gets a typed error, not a panic.
    let e = t
        .generate(
            &[0.0; 160],
            &[GenerateRequest {
                prompt: vec![50257; 500],
                suppress_blank: false,
                suppress_tokens: false,
                max_new_tokens: None,
            }],
        )
        .expect_err("too long");
    assert_eq!(e.status(), 400);
}

#[test]
fn info_and_detection() {
    fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<Transcriber>();
    let t = transcriber();
    let info = t.info();
    assert!(!info.is_multilingual);
    assert_eq!((info.n_mels, info.max_target_positions), (80, 448));
    assert_eq!(info.languages, vec!["en"]);
    assert!(Transcriber::is_speech_model(&model_dir()));
    assert!(!Transcriber::is_speech_model(&testdata("clips")));
    let truncated = tempfile::tempdir().expect("test data");
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(model_dir().join(f), truncated.path().join(f)).expect("test data");
    }
    let bin = std::fs::read(model_dir().join("model.bin")).expect("test data");
    std::fs::write(truncated.path().join("model.bin"), &bin[..bin.len() / 3]).expect("test data");
    match Transcriber::load(truncated.path(), TranscriberConfig::default()) {
        Err(SpeechError::Weights(msg)) => assert!(msg.contains("truncated"), "{msg}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a truncated model.bin loaded"),
    }
}
