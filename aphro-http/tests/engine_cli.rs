//! `aphro generate` and `aphro bench` end to end on the SmolLM2 GGUF.
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn gguf() -> String {
    let dir = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let p = dir.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "test asset {} is missing: run `python3 scripts/fetch_assets.py`",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

/// Runs `aphro <args>` feeding `stdin`; returns (exit ok, stdout, stderr).
fn aphro(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aphro"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn aphro");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const ENGINE_FLAGS: &[&str] = &[
    "--kv-cache-memory",
    "33554432",
    "--max-model-len",
    "auto",
    "--max-num-seqs",
    "8",
];

#[test]
fn generate_jsonl_keeps_order_and_reports_bad_lines() {
    let model = gguf();
    // Render output shapes: a chat prompt (`model` set by the client), a broken line, a raw
    // prompt in text mode, an invalid sampling value.
    let lines = [
        r#"{"request_id":"chatcmpl-a","model":"whatever","token_ids":[1,9690,198,2683,359,253,5356,5646,11173,3365,3511,308,34519,28,7018,411,407,19712,8182,2,198,1,4093,198,19556,17,2,198,1,520,9531,198],"sampling_params":{"temperature":0.0,"max_tokens":4},"stream":false}"#,
        r#"{"request_id": "broken", "token_ids": [1, 2"#,
        r#"{"request_id":"b","token_ids":[7042,314],"sampling_params":{"temperature":0.0,"max_tokens":3},"output_mode":"text"}"#,
        r#"{"request_id":"c","token_ids":[5],"sampling_params":{"top_p":0}}"#,
    ];
    let mut args = vec!["generate", "--model", &model, "--jsonl"];
    args.extend_from_slice(ENGINE_FLAGS);
    let (ok, out, err) = aphro(&args, &lines.join("\n"));
    assert!(!ok, "a bad line makes the exit status non-zero");
    let outs: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(outs.len(), 4, "stdout: {out}\nstderr: {err}");
    assert_eq!(outs[0]["request_id"], "generate-tokens-chatcmpl-a");
    assert_eq!(
        outs[0]["choices"][0]["token_ids"].as_array().map(Vec::len),
        Some(4)
    );
    assert_eq!(outs[1]["error"]["code"], 400);
    assert_eq!(outs[2]["request_id"], "generate-tokens-b");
    assert_eq!(outs[2]["output_mode"], "text");
    assert!(outs[2]["choices"][0]["text"].is_string());
    assert_eq!(outs[3]["error"]["param"], "top_p");
}

#[test]
fn generate_single_request_from_file() {
    let model = gguf();
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("req.json");
    std::fs::write(
        &input,
        "{\n  \"token_ids\": [1, 4093, 198],\n  \"sampling_params\": {\"temperature\": 0.0, \"max_tokens\": 2}\n}\n",
    )
    .expect("write");
    let mut args = vec![
        "generate",
        "--model",
        &model,
        "--input",
        input.to_str().expect("utf-8"),
        "--dtype",
        "auto",
        "--no-enable-prefix-caching",
    ];
    args.extend_from_slice(ENGINE_FLAGS);
    let (ok, out, err) = aphro(&args, "");
    assert!(ok, "stderr: {err}");
    let v: Value = serde_json::from_str(out.trim()).expect("json");
    assert!(v["request_id"]
        .as_str()
        .is_some_and(|s| s.starts_with("generate-tokens-")));
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

#[test]
fn bench_json_shape() {
    let model = gguf();
    let mut args = vec![
        "bench",
        "--model",
        &model,
        "--json",
        "--decode-tokens",
        "3",
        "--decode-prompt-len",
        "4",
        "--prefill-lens",
        "16,40",
        "--decode-contexts",
        "0,24",
        "--concurrency",
        "2,4",
        "--stall-prompt-len",
        "48",
    ];
    args.extend_from_slice(ENGINE_FLAGS);
    let (ok, out, err) = aphro(&args, "");
    assert!(ok, "stderr: {err}");
    let v: Value = serde_json::from_str(out.trim()).expect("json");
    assert!(v["prefill_tok_s"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    assert!(v["decode_tok_s"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    let lens: Vec<u64> = v["prefill"]
        .as_array()
        .expect("prefill points")
        .iter()
        .map(|p| p["prompt_tokens"].as_u64().expect("prompt_tokens"))
        .collect();
    assert_eq!(lens, [16, 40], "{v}");
    let contexts: Vec<u64> = v["decode"]
        .as_array()
        .expect("decode points")
        .iter()
        .map(|p| p["context"].as_u64().expect("context"))
        .collect();
    assert_eq!(contexts, [0, 24], "{v}");
    let agg = v["aggregate_tok_s"].as_object().expect("object");
    assert_eq!(
        agg.keys().map(String::as_str).collect::<Vec<_>>(),
        ["2", "4"]
    );
    assert!(agg.values().all(|x| x.as_f64().is_some_and(|x| x > 0.0)));
    // The running decode produced tokens beside the prompt, and both latencies are real.
    let stall = &v["stall"];
    assert_eq!(stall["prompt_tokens"], 48, "{v}");
    assert!(
        stall["idle_itl_ms"].as_f64().is_some_and(|x| x > 0.0),
        "{v}"
    );
    assert!(stall["itl_max_ms"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    assert!(
        v["abort"]["delay_ms"].as_f64().is_some_and(|x| x >= 0.0),
        "{v}"
    );
}

/// `aphro transcribe --device`: the CPU transcribes the fixture clip as faster-whisper does;
/// a CUDA device on a build without CUDA, and an unknown device, are errors that say so.
#[test]
fn transcribe_runs_on_the_device_asked_for() {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let model = assets.join("models/whisper-tiny.en");
    assert!(
        model.join("model.bin").exists(),
        "test asset {} is missing: run `python3 scripts/fetch_assets.py`",
        model.display()
    );
    let model = model.to_string_lossy().into_owned();
    let clip = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/audio/a10_yes.wav");
    let (ok, out, err) = aphro(
        &["transcribe", "--device", "cpu", "--model", &model, clip],
        "",
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "Yes.");
    let (ok, _, err) = aphro(
        &["transcribe", "--device", "cuda:0", "--model", &model, clip],
        "",
    );
    if cfg!(feature = "cuda") {
        return;
    }
    assert!(!ok);
    assert!(err.contains("CUDA"), "{err}");
    let (ok, _, err) = aphro(
        &["transcribe", "--device", "tpu", "--model", &model, clip],
        "",
    );
    assert!(!ok);
    assert!(err.contains("unknown device"), "{err}");
}
