//! `/v1/embeddings` over HTTP on all-MiniLM-L6-v2 served as a pooling model: the response
//! shape, float and base64 vectors equal to the sentence-transformers goldens of
//! `testdata/pooling/`, token-id input, and vLLM's errors; the pooling server mounts only
//! the pooling and common routes.

use std::path::{Path, PathBuf};

use aphro_http::server::{Role, Server};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

fn minilm_dir() -> PathBuf {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.assets"));
    let dir = assets.join("models/all-MiniLM-L6-v2");
    assert!(
        dir.join("model.safetensors").exists(),
        "{} is missing: run `python3 scripts/fetch_assets.py`",
        dir.display()
    );
    dir
}

fn golden(id: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/pooling/embeddings.jsonl");
    std::fs::read_to_string(path)
        .expect("goldens")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json"))
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no golden {id}"))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("floats")
        .iter()
        .map(|x| x.as_f64().expect("float") as f32)
        .collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let n = chunk
            .iter()
            .map(|&c| if c == b'=' { 0 } else { val(c) })
            .fold(0u32, |acc, v| (acc << 6) | v);
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    out
}

fn app() -> axum::Router {
    use std::sync::OnceLock;
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            Server::builder()
                .model(minilm_dir().to_string_lossy())
                .role(Role::Pooling)
                .served_model_name("minilm")
                .build()
                .expect("pooling server builds")
        })
        .router()
}

async fn call(method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path);
    let body = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            Body::from(b.to_string())
        }
        None => Body::empty(),
    };
    let resp = app()
        .oneshot(req.body(body).expect("request"))
        .await
        .expect("response");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v)
}

#[tokio::test]
async fn embeddings_float_and_base64_match_goldens() {
    let hello = golden("hello-world");
    let pangram = golden("pangram");
    let (status, v) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"model": "minilm", "input": [hello["input"], pangram["input"]]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "minilm");
    assert!(v["id"].as_str().expect("id").starts_with("embd-"));
    assert!(v["created"].as_u64().is_some());
    let tokens = hello["n_tokens"].as_u64().expect("n") + pangram["n_tokens"].as_u64().expect("n");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
               "prompt_tokens_details": null})
    );
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    for (i, (d, g)) in data.iter().zip([&hello, &pangram]).enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["object"], "embedding");
        let diff = max_abs(&floats(&d["embedding"]), &floats(&g["embedding"]));
        assert!(diff <= 1e-5, "{}: {diff:e}", g["id"]);
    }
    let (status, b) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"input": hello["input"], "encoding_format": "base64"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{b}");
    let bytes = base64_decode(b["data"][0]["embedding"].as_str().expect("base64 string"));
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    // The same vector as the float response, bit for bit.
    assert_eq!(decoded, floats(&data[0]["embedding"]));
}

#[tokio::test]
async fn token_ids_truncation_and_raw_mean() {
    let ids = golden("ids-with-specials");
    let (status, v) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"input": [ids["input"]]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let diff = max_abs(
        &floats(&v["data"][0]["embedding"]),
        &floats(&ids["embedding"]),
    );
    assert!(diff <= 1e-5, "{diff:e}");
    let left = golden("truncate-16-left");
    let (status, v) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"input": left["input"], "truncate_prompt_tokens": 16,
                    "truncation_side": "left"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 16);
    let diff = max_abs(
        &floats(&v["data"][0]["embedding"]),
        &floats(&left["embedding"]),
    );
    assert!(diff <= 1e-5, "{diff:e}");
    let raw = golden("hello-world");
    let (status, v) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"input": raw["input"], "use_activation": false})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let diff = max_abs(
        &floats(&v["data"][0]["embedding"]),
        &floats(&raw["mean_pooled"]),
    );
    assert!(diff <= 1e-5, "{diff:e}");
}

#[tokio::test]
async fn errors_are_vllm_bodies() {
    let long = golden("long-paragraph");
    let (status, v) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"input": long["input"]})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["message"], long["vllm"]["error_message"]);
    assert_eq!(v["error"]["type"], "BadRequestError");
    assert_eq!(v["error"]["code"], 400);
    let (status, v) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"input": long["input"], "truncate_prompt_tokens": -1})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 256);
    let (status, v) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"input": "hi", "dimensions": 32})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["error"]["message"],
        "Model \"minilm\" does not support matryoshka representation, changing output \
         dimensions will lead to poor results."
    );
    let (status, v) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"input": "hi", "model": "other"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["message"], "The model `other` does not exist.");
    assert_eq!(v["error"]["param"], Value::Null);
    let (status, _) = call("POST", "/v1/embeddings", Some(json!({"inputs": "hi"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn pooling_server_mounts_pooling_routes_only() {
    let (status, v) = call(
        "POST",
        "/v1/chat/completions",
        Some(json!({"messages": [{"role": "user", "content": "hi"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v, json!({"detail": "Not Found"}));
    let (status, doc) = call("GET", "/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.contains_key("/v1/embeddings"));
    assert!(!paths.contains_key("/v1/chat/completions"));
    assert!(!paths.contains_key("/v1/completions"));
    let (status, models) = call("GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["data"][0]["id"], "minilm");
    assert_eq!(models["data"][0]["max_model_len"], 256);
}

#[test]
fn auto_runner_detects_the_encoder_folder() {
    assert!(aphro_engine::pooling::is_pooling_model(&minilm_dir()));
    let gguf = minilm_dir().join("../SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(!aphro_engine::pooling::is_pooling_model(&gguf));
}
