//! `aphro render` end to end: a tokenizer directory, the SmolLM2 `.gguf`, and a hub id
//! resolved from a cache laid out the way hf-hub lays it out.
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn assets_dir() -> PathBuf {
    std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")))
}

fn asset(rel: &str) -> PathBuf {
    let p = assets_dir().join(rel);
    assert!(
        p.exists(),
        "test asset {} is missing: run `python3 scripts/fetch_assets.py`",
        p.display()
    );
    p
}

/// Runs `aphro render` with `args`, feeding `stdin`; returns (exit ok, stdout, stderr).
fn aphro(args: &[&str], stdin: &str, envs: &[(&str, &Path)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aphro"));
    cmd.arg("render")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.env("HF_HUB_OFFLINE", "1");
    let mut child = cmd.spawn().expect("spawn aphro");
    // A command that fails before reading its input (e.g. a model that cannot be found) closes
    // the pipe early; that is a legitimate outcome, judged by the exit status below.
    if let Err(e) = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
    {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
    }
    let out = child.wait_with_output().expect("wait");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"Hello! How are you?"}],"request_id":"abc","max_tokens":8}"#;

#[test]
fn render_on_a_tokenizer_dir() {
    let dir = asset("tokenizers/qwen3");
    let (ok, out, err) = aphro(&["--model", dir.to_str().expect("utf-8")], CHAT, &[]);
    assert!(ok, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["request_id"], "chatcmpl-abc");
    assert_eq!(
        v["token_ids"],
        serde_json::json!([
            151644, 872, 198, 9707, 0, 2585, 525, 498, 30, 151645, 198, 151644, 77091, 198
        ])
    );
    assert_eq!(v["sampling_params"]["max_tokens"], 8);
    assert_eq!(v["sampling_params"]["output_kind"], 2);
    assert_eq!(v["parse_context"]["history_tool_call_cnt"], 0);
    assert!(v.get("reasoning_ended").is_some_and(Value::is_null));

    // A bad request prints the error envelope and exits non-zero.
    let bad = r#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#;
    let (ok, out, _) = aphro(&["--model", dir.to_str().expect("utf-8")], bad, &[]);
    assert!(!ok);
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["error"]["type"], "BadRequestError");
    assert_eq!(v["error"]["param"], "top_p");
    assert_eq!(v["error"]["code"], 400);

    // --jsonl: one line per request, errors inline, non-zero exit if any failed.
    let batch = format!("{CHAT}\n{{\"prompt\":[\"a\",\"b\"],\"request_id\":\"x\"}}\n{bad}\n");
    let (ok, out, _) = aphro(
        &["--model", dir.to_str().expect("utf-8"), "--jsonl"],
        &batch,
        &[],
    );
    assert!(!ok);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1][0]["request_id"], "cmpl-x-0");
    assert_eq!(lines[1][1]["request_id"], "cmpl-x-1");
    assert_eq!(lines[1][0]["sampling_params"]["max_tokens"], 16);
    assert!(lines[2].get("error").is_some());
}

#[test]
fn render_on_the_smollm2_gguf() {
    let gguf = asset("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let (ok, out, err) = aphro(&["--model", gguf.to_str().expect("utf-8")], CHAT, &[]);
    assert!(ok, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    // Same ids as the smollm2/single_user golden.
    let golden = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/render/smollm2.jsonl"
    ))
    .expect("golden");
    let case: Value = golden
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json"))
        .find(|c| c["id"] == "smollm2/single_user")
        .expect("case");
    assert_eq!(v["token_ids"], case["prompt_token_ids"]);
}

#[test]
fn render_on_a_cached_hub_id() {
    let cache = tempfile::tempdir().expect("tempdir");
    let repo = cache.path().join("models--acme--tiny-qwen");
    let rev = "0123456789abcdef0123456789abcdef01234567";
    let snap = repo.join("snapshots").join(rev);
    std::fs::create_dir_all(&snap).expect("mkdir");
    std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
    std::fs::write(repo.join("refs").join("main"), rev).expect("ref");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(asset(&format!("tokenizers/qwen3/{f}")), snap.join(f)).expect("copy");
    }
    std::fs::write(
        snap.join("config.json"),
        r#"{"model_type":"qwen3","max_position_embeddings":64}"#,
    )
    .expect("config");
    std::fs::write(
        snap.join("generation_config.json"),
        r#"{"temperature":0.6,"top_k":20,"top_p":0.95,"eos_token_id":[151645,151643]}"#,
    )
    .expect("gen");
    let chat = r#"{"messages":[{"role":"user","content":"Hello! How are you?"}]}"#;
    let envs = [("HF_HUB_CACHE", cache.path())];
    let (ok, out, err) = aphro(&["--model", "acme/tiny-qwen"], chat, &envs);
    assert!(ok, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    let sp = &v["sampling_params"];
    assert_eq!(v["token_ids"].as_array().map(Vec::len), Some(14));
    assert_eq!(
        sp["max_tokens"],
        64 - 14,
        "fills the context from config.json"
    );
    assert_eq!(sp["temperature"], 0.6);
    assert_eq!(sp["top_k"], 20);
    assert_eq!(sp["stop_token_ids"], serde_json::json!([]));

    // Prompt longer than the context.
    let long = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "word ".repeat(100)
    );
    let (ok, out, _) = aphro(&["--model", "acme/tiny-qwen"], &long, &envs);
    assert!(!ok);
    assert!(
        out.contains("exceeds model's maximum context length (64)"),
        "{out}"
    );

    // Not cached and offline: a clear error naming the id.
    let (ok, _, err) = aphro(&["--model", "acme/not-there"], chat, &envs);
    assert!(!ok);
    assert!(err.contains("acme/not-there"), "{err}");
}
