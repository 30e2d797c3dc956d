//! `aphro derender`, `aphro tokenize`, `aphro detokenize` end to end through the binary.
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn asset(rel: &str) -> PathBuf {
    let dir = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let p = dir.join(rel);
    assert!(
        p.exists(),
        "test asset {} is missing: run `python3 scripts/fetch_assets.py`",
        p.display()
    );
    p
}

fn qwen3() -> String {
    asset("tokenizers/qwen3").to_string_lossy().into_owned()
}

/// Runs `aphro <args>` with `stdin`; returns (exit ok, stdout lines as JSON).
fn aphro(args: &[&str], stdin: &str) -> (bool, Vec<Value>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aphro"))
        .args(args)
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
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    (out.status.success(), lines)
}

#[test]
fn tokenize_then_derender_with_parsers() {
    let m = qwen3();
    let output = "<think>Need weather</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (ok, v) = aphro(
        &["tokenize", "--model", &m],
        &json!({"prompt": output, "add_special_tokens": false}).to_string(),
    );
    assert!(ok);
    let ids = v[0]["tokens"].clone();
    assert_eq!(v[0]["count"], json!(ids.as_array().map(Vec::len)));
    let (ok, v) = aphro(
        &["detokenize", "--model", &m],
        &json!({"tokens": ids}).to_string(),
    );
    assert!(ok);
    assert_eq!(v[0]["prompt"], output);
    let body = json!({
        "generate_response": {"request_id": "generate-tokens-chatcmpl-abc",
            "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": null, "token_ids": ids}]},
        "prompt_tokens": 3, "prompt_token_ids": [9707],
        "chat_request": {"messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}
    });
    let (ok, v) = aphro(
        &[
            "derender",
            "--model",
            &m,
            "--tool-call-parser",
            "hermes",
            "--reasoning-parser",
            "qwen3",
            "--enable-auto-tool-choice",
        ],
        &body.to_string(),
    );
    assert!(ok, "{v:?}");
    let c = &v[0]["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls");
    assert_eq!(c["message"]["reasoning"], "Need weather");
    assert_eq!(
        c["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(v[0]["id"], "generate-tokens-chatcmpl-abc");
}

#[test]
fn derender_jsonl_and_errors() {
    let m = qwen3();
    let good = json!({"generate_responses": [{"request_id": "r0",
        "choices": [{"index": 0, "token_ids": [9707], "finish_reason": "length"}]}]});
    let bad = json!({"generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": []}]}});
    let input = format!("{good}\n{bad}\nnot json\n");
    let (ok, v) = aphro(&["derender", "--model", &m, "--jsonl"], &input);
    assert!(!ok, "errors must give a non-zero exit");
    assert_eq!(v.len(), 3);
    assert_eq!(v[0]["object"], "text_completion");
    assert_eq!(v[0]["choices"][0]["text"], "Hello");
    assert_eq!(v[1]["error"]["code"], 400);
    assert_eq!(
        v[1]["error"]["message"],
        "choice 0 has empty or null token_ids"
    );
    assert_eq!(v[2]["error"]["type"], "Bad Request");
    // A parser without chat_request is a 400 with vLLM's message.
    let body = json!({"generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": [9707]}]}});
    let (ok, v) = aphro(
        &["derender", "--model", &m, "--reasoning-parser", "qwen3"],
        &body.to_string(),
    );
    assert!(!ok);
    assert!(v[0]["error"]["message"]
        .as_str()
        .is_some_and(|s| s.starts_with("chat_request is required")));
}

#[test]
fn tokenize_detokenize_jsonl() {
    let m = qwen3();
    let (ok, v) = aphro(
        &["tokenize", "--model", &m, "--jsonl"],
        "{\"prompt\": \"hi\", \"return_token_strs\": true}\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
    );
    assert!(ok, "{v:?}");
    assert_eq!(v.len(), 2);
    assert!(v[0]["token_strs"].is_array());
    assert!(v[1]["count"].as_u64().is_some_and(|n| n > 3));
    let (ok, v) = aphro(
        &["detokenize", "--model", &m, "--jsonl"],
        "{\"tokens\": [9707]}\n{\"tokens\": [-1]}\n",
    );
    assert!(!ok);
    assert_eq!(v[0]["prompt"], "Hello");
    assert_eq!(v[1]["error"]["code"], 400);
}
