//! The pooling routes over HTTP on all-MiniLM-L6-v2 served as a pooling model (and on the
//! cross-encoder of `testdata/pooling/cross_encoder/`): `/v1/embeddings`, `/v2/embed`,
//! `/pooling`, `/classify`, `/score` (`/v1/score`) and `/rerank` (`/v1/rerank`,
//! `/v2/rerank`) — response shapes, values equal to the sentence-transformers goldens of
//! `testdata/pooling/`, token-id input, vLLM's errors, and which routes each server mounts.

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

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/pooling")
        .join(name)
}

fn golden(id: &str) -> Value {
    golden_in("embeddings.jsonl", id)
}

fn golden_in(file: &str, id: &str) -> Value {
    std::fs::read_to_string(testdata(file))
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

/// The cross-encoder folder as `compose_model_dir.py` writes it (MiniLM's tensors under
/// `bert.`, the seeded head, the head's config, MiniLM's tokenizer), served as `minilm-ce`.
fn cross_encoder_app() -> axum::Router {
    use std::sync::OnceLock;
    static SERVER: OnceLock<(tempfile::TempDir, Server)> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let src = minilm_dir();
            let out = tempfile::tempdir().expect("tempdir");
            let base = std::fs::read(src.join("model.safetensors")).expect("read MiniLM");
            let head = std::fs::read(testdata("cross_encoder/head.safetensors")).expect("head");
            let base = safetensors::SafeTensors::deserialize(&base).expect("MiniLM");
            let head = safetensors::SafeTensors::deserialize(&head).expect("head");
            let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = base
                .tensors()
                .into_iter()
                .filter(|(n, _)| n != "embeddings.position_ids")
                .map(|(n, t)| (format!("bert.{n}"), t))
                .collect();
            tensors.extend(head.tensors());
            let bytes = safetensors::serialize(tensors, None).expect("serialize");
            std::fs::write(out.path().join("model.safetensors"), bytes).expect("write");
            std::fs::copy(
                testdata("cross_encoder/config.json"),
                out.path().join("config.json"),
            )
            .expect("config");
            for f in ["tokenizer.json", "tokenizer_config.json", "vocab.txt"] {
                std::fs::copy(src.join(f), out.path().join(f)).expect("tokenizer file");
            }
            let server = Server::builder()
                .model(out.path().to_string_lossy())
                .role(Role::Pooling)
                .served_model_name("minilm-ce")
                .build()
                .expect("cross-encoder server builds");
            (out, server)
        })
        .1
        .router()
}

async fn call(method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    call_on(app(), method, path, body).await
}

async fn call_on(
    app: axum::Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path);
    let body = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            Body::from(b.to_string())
        }
        None => Body::empty(),
    };
    let resp = app
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

    // `embed_dtype` / `endianness` (vLLM's `tensor2binary`): the vector cast to the type,
    // each element's bytes in the requested order; within half a unit in the last place of
    // the type from the golden.
    let golden_vec = floats(&hello["embedding"]);
    for (dtype, endianness, width, tol) in [
        ("float32", "big", 4, 1e-5f32),
        ("float16", "little", 2, 5e-4),
        ("float16", "big", 2, 5e-4),
        ("bfloat16", "big", 2, 2e-3),
        ("bfloat16", "native", 2, 2e-3),
    ] {
        let (status, b) = call(
            "POST",
            "/v1/embeddings",
            Some(json!({"input": hello["input"], "encoding_format": "base64",
                        "embed_dtype": dtype, "endianness": endianness})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let bytes = base64_decode(b["data"][0]["embedding"].as_str().expect("base64 string"));
        assert_eq!(bytes.len(), golden_vec.len() * width, "{dtype}");
        let decoded: Vec<f32> = bytes
            .chunks_exact(width)
            .map(|c| {
                let mut c = c.to_vec();
                if endianness == "big" {
                    c.reverse();
                }
                match dtype {
                    "float16" => half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
                    "bfloat16" => half::bf16::from_le_bytes([c[0], c[1]]).to_f32(),
                    _ => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                }
            })
            .collect();
        let diff = max_abs(&decoded, &golden_vec);
        assert!(diff <= tol, "{dtype} {endianness}: {diff:e}");
    }
    // fp8 (torch's float8_e4m3fn / float8_e5m2): one byte per element, within half a step
    // of the type from the golden (relative 2^-4 / 2^-3; the subnormal step below).
    for (dtype, exp_bits, rel, subnormal_half_step) in [
        ("fp8_e4m3", 4, 1.0 / 16.0, 2f32.powi(-10)),
        ("fp8_e5m2", 5, 1.0 / 8.0, 2f32.powi(-17)),
    ] {
        let (status, b) = call(
            "POST",
            "/v1/embeddings",
            Some(json!({"input": hello["input"], "encoding_format": "base64",
                        "embed_dtype": dtype})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let bytes = base64_decode(b["data"][0]["embedding"].as_str().expect("base64 string"));
        assert_eq!(bytes.len(), golden_vec.len(), "{dtype}");
        for (i, (&byte, &g)) in bytes.iter().zip(&golden_vec).enumerate() {
            let x = fp8_to_f32(byte, exp_bits);
            let tol = (g.abs() * rel).max(subnormal_half_step) + 1e-5;
            assert!((x - g).abs() <= tol, "{dtype}[{i}]: {x} vs {g}");
        }
    }
}

/// An fp8 byte (sign, `exp_bits` exponent bits, the rest mantissa; IEEE-style bias and
/// subnormals) as f32. NaN and infinity do not occur in normalized embeddings.
fn fp8_to_f32(b: u8, exp_bits: u32) -> f32 {
    let man_bits = 7 - exp_bits;
    let bias = (1i32 << (exp_bits - 1)) - 1;
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> man_bits) & ((1 << exp_bits) - 1)) as i32;
    let m = (b & ((1 << man_bits) - 1)) as f32 / (1 << man_bits) as f32;
    if e == 0 {
        sign * m * 2f32.powi(1 - bias)
    } else {
        sign * (1.0 + m) * 2f32.powi(e - bias)
    }
}

/// A POST's status, headers and raw body (the binary `encoding_format`s).
async fn call_raw(
    app: axum::Router,
    path: &str,
    body: Value,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let resp = app.oneshot(req).await.expect("response");
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
    (parts.status, parts.headers, bytes.to_vec())
}

/// `encoding_format: "bytes"` and `"bytes_only"` (vLLM's `encode_pooling_bytes`): the vectors'
/// bytes back to back as `application/octet-stream`; `bytes` says in its `metadata` header
/// where each lies. Decoded, they are the golden vectors.
#[tokio::test]
async fn bytes_and_bytes_only_decode_to_the_goldens() {
    let cases = [golden("hello-world"), golden("pangram")];
    let inputs: Vec<&Value> = cases.iter().map(|c| &c["input"]).collect();
    let tokens: u64 = cases
        .iter()
        .map(|c| c["n_tokens"].as_u64().expect("n"))
        .sum();
    let decode = |bytes: &[u8], dtype: &str, big: bool| -> Vec<f32> {
        let width = if dtype == "float32" { 4 } else { 2 };
        bytes
            .chunks_exact(width)
            .map(|c| {
                let mut c = c.to_vec();
                if big {
                    c.reverse();
                }
                match dtype {
                    "float16" => half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
                    _ => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                }
            })
            .collect()
    };
    for (path, dtype, endianness, tol) in [
        ("/v1/embeddings", "float32", "little", 1e-5f32),
        ("/v1/embeddings", "float16", "big", 5e-4),
        ("/pooling", "float32", "big", 1e-5),
    ] {
        let (status, headers, body) = call_raw(
            app(),
            path,
            json!({"input": inputs, "encoding_format": "bytes", "embed_dtype": dtype,
                   "endianness": endianness}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers["content-type"], "application/octet-stream");
        let meta: Value =
            serde_json::from_str(headers["metadata"].to_str().expect("ascii")).expect("json");
        let prefix = if path == "/pooling" {
            "pooling-"
        } else {
            "embd-"
        };
        assert!(
            meta["id"].as_str().expect("id").starts_with(prefix),
            "{meta}"
        );
        assert_eq!(meta["model"], "minilm");
        assert!(meta["created"].as_u64().is_some());
        assert_eq!(
            meta["usage"],
            json!({"prompt_tokens": tokens, "total_tokens": tokens})
        );
        let items = meta["data"].as_array().expect("data");
        assert_eq!(items.len(), 2);
        let width = if dtype == "float32" { 4 } else { 2 };
        assert_eq!(body.len(), 2 * 384 * width);
        for (i, (item, case)) in items.iter().zip(&cases).enumerate() {
            assert_eq!(item["index"], i);
            assert_eq!(item["embed_dtype"], dtype);
            assert_eq!(item["endianness"], endianness);
            assert_eq!(item["shape"], json!([384]));
            let (start, end) = (
                item["start"].as_u64().expect("start") as usize,
                item["end"].as_u64().expect("end") as usize,
            );
            assert_eq!((start, end), (i * 384 * width, (i + 1) * 384 * width));
            let v = decode(&body[start..end], dtype, endianness == "big");
            let diff = max_abs(&v, &floats(&case["embedding"]));
            assert!(diff <= tol, "{path} {dtype}: {diff:e}");
        }
        // `bytes_only`: the same body, no header.
        let (status, headers, only) = call_raw(
            app(),
            path,
            json!({"input": inputs, "encoding_format": "bytes_only", "embed_dtype": dtype,
                   "endianness": endianness}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert!(headers.get("metadata").is_none());
        assert_eq!(only, body, "{path} {dtype}");
    }
    // `/pooling` base64 honours `embed_dtype` and `endianness` too.
    let (status, v) = call(
        "POST",
        "/pooling",
        Some(json!({"input": inputs[0], "encoding_format": "base64",
                    "embed_dtype": "float16", "endianness": "big"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let bytes = base64_decode(v["data"][0]["data"].as_str().expect("b64"));
    let diff = max_abs(
        &decode(&bytes, "float16", true),
        &floats(&cases[0]["embedding"]),
    );
    assert!(diff <= 5e-4, "{diff:e}");
}

/// MiniLM served with a chat template that places BERT's own special tokens, so a rendered
/// one-message chat tokenizes to the golden ids of its text.
fn chat_app() -> axum::Router {
    use std::sync::OnceLock;
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            Server::builder()
                .model(minilm_dir().to_string_lossy())
                .role(Role::Pooling)
                .served_model_name("minilm")
                .frontend(aphro_http::server::FrontendOptions {
                    chat_template: Some(
                        "{% for m in messages %}[CLS] {{ m['content'] }} [SEP]{% endfor %}\
                         {% if add_generation_prompt %} answer{% endif %}"
                            .into(),
                    ),
                    ..Default::default()
                })
                .build()
                .expect("pooling server with a chat template builds")
        })
        .router()
}

/// `add_special_tokens: false` on text input, and chat `messages` (rendered through the chat
/// template, then tokenized without special tokens unless asked), against the goldens.
#[tokio::test]
async fn add_special_tokens_and_chat_messages() {
    let bare = golden("ids-no-specials");
    let (status, v) = call(
        "POST",
        "/v1/embeddings",
        Some(json!({"input": "Hello world", "add_special_tokens": false})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    let diff = max_abs(
        &floats(&v["data"][0]["embedding"]),
        &floats(&bare["embedding"]),
    );
    assert!(diff <= 1e-5, "{diff:e}");

    let hello = golden("hello-world");
    let chat = json!([{"role": "user", "content": hello["input"]}]);
    for path in ["/v1/embeddings", "/pooling"] {
        let (status, v) = call_on(chat_app(), "POST", path, Some(json!({"messages": chat}))).await;
        assert_eq!(status, StatusCode::OK, "{path}: {v}");
        assert_eq!(v["usage"]["prompt_tokens"], hello["n_tokens"], "{path}");
        let got = if path == "/pooling" {
            &v["data"][0]["data"]
        } else {
            &v["data"][0]["embedding"]
        };
        let diff = max_abs(&floats(got), &floats(&hello["embedding"]));
        assert!(diff <= 1e-5, "{path}: {diff:e}");
    }
    // Special tokens on top of the template's: [CLS] [CLS] hello world [SEP] [SEP].
    let (status, v) = call_on(
        chat_app(),
        "POST",
        "/v1/embeddings",
        Some(json!({"messages": chat, "add_special_tokens": true})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 6);
    // `add_generation_prompt` reaches the template (one more token).
    let (status, v) = call_on(
        chat_app(),
        "POST",
        "/v1/embeddings",
        Some(json!({"messages": chat, "add_generation_prompt": true})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    let (status, v) = call_on(
        chat_app(),
        "POST",
        "/v1/embeddings",
        Some(json!({"messages": chat, "add_generation_prompt": true,
                    "continue_final_message": true})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["error"]["message"],
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
    );

    // MiniLM itself has no chat template: vLLM's refusal; a request template is untrusted.
    let (status, v) = call("POST", "/v1/embeddings", Some(json!({"messages": chat}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["error"]["message"],
        "As of transformers v4.44, default chat template is no longer allowed, so you must \
         provide a chat template if the tokenizer does not define one."
    );
    let (status, v) = call(
        "POST",
        "/pooling",
        Some(json!({"messages": chat, "chat_template": "{{ messages }}"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["error"]["message"],
        "Chat template is passed with request, but --trust-request-chat-template is not set. \
         Refused request with untrusted chat template."
    );
    // Neither `input` nor `messages`: pydantic's union error names both.
    let (status, v) = call("POST", "/v1/embeddings", Some(json!({"inputs": "hi"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let message = v["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("input") && message.contains("messages"),
        "{message}"
    );
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
    let mut mounted: Vec<&str> = paths.keys().map(String::as_str).collect();
    mounted.sort_unstable();
    // vLLM's routes for an embedding model (pooling task `embed`): no /classify, no text routes.
    for p in [
        "/pooling",
        "/rerank",
        "/score",
        "/v1/embeddings",
        "/v1/rerank",
        "/v1/score",
        "/v2/embed",
        "/v2/rerank",
    ] {
        assert!(mounted.contains(&p), "{p} missing from {mounted:?}");
    }
    for p in ["/classify", "/v1/chat/completions", "/v1/completions"] {
        assert!(!mounted.contains(&p), "{p} mounted: {mounted:?}");
    }
    // The shared request parts are documented once and referenced by every request.
    let schemas = &doc["components"]["schemas"];
    for (schema, fields) in [
        (
            "PoolingParamsFields",
            &[
                "truncate_prompt_tokens",
                "truncation_side",
                "use_activation",
            ][..],
        ),
        (
            "EncodingParams",
            &["encoding_format", "embed_dtype", "endianness"][..],
        ),
        ("CompletionInput", &["input", "add_special_tokens"][..]),
        (
            "ChatInput",
            &["messages", "add_generation_prompt", "add_special_tokens"][..],
        ),
    ] {
        for f in fields {
            assert!(
                schemas[schema]["properties"][f].is_object(),
                "{schema}.{f} undocumented: {}",
                schemas[schema]
            );
        }
    }
    for (request, parts) in [
        (
            "EmbeddingRequest",
            &["PoolingInput", "EncodingParams", "PoolingParamsFields"][..],
        ),
        (
            "PoolingRequest",
            &["PoolingInput", "EncodingParams", "PoolingParamsFields"][..],
        ),
        ("ScoreRequest", &["PoolingParamsFields"][..]),
        ("RerankRequest", &["PoolingParamsFields"][..]),
    ] {
        let text = schemas[request].to_string();
        for part in parts {
            assert!(
                text.contains(&format!("#/components/schemas/{part}")),
                "{request} does not include {part}: {text}"
            );
        }
    }
    let (status, v) = call("POST", "/classify", Some(json!({"input": "hi"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v, json!({"detail": "Not Found"}));
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

fn assert_close(got: &Value, want: &Value, tol: f64, what: &str) {
    let (g, w) = (
        got.as_f64().expect("number"),
        want.as_f64().expect("number"),
    );
    assert!((g - w).abs() <= tol, "{what}: {g} vs {w}");
}

#[tokio::test]
async fn score_goldens_in_every_request_form() {
    let lines = std::fs::read_to_string(testdata("score.jsonl")).expect("score goldens");
    for case in lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json"))
    {
        let (q, d) = (&case["request"]["queries"], &case["request"]["documents"]);
        if case["vllm"]["status"] == 400 {
            let (status, v) = call(
                "POST",
                "/score",
                Some(json!({"queries": q, "documents": d})),
            )
            .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{}: {v}", case["id"]);
            assert_eq!(v["error"]["type"], "BadRequestError");
            continue;
        }
        // The four field pairs vLLM accepts, on both paths.
        for (path, body) in [
            ("/score", json!({"queries": q, "documents": d})),
            ("/v1/score", json!({"queries": q, "items": d})),
            ("/score", json!({"data_1": q, "data_2": d})),
            (
                "/v1/score",
                json!({"text_1": q, "text_2": d, "model": "minilm"}),
            ),
        ] {
            let (status, v) = call("POST", path, Some(body)).await;
            assert_eq!(status, StatusCode::OK, "{} {path}: {v}", case["id"]);
            assert!(v["id"].as_str().expect("id").starts_with("score-"));
            assert_eq!(v["object"], "list");
            assert_eq!(v["model"], "minilm");
            let tokens = &case["vllm"]["usage_prompt_tokens"];
            assert_eq!(
                v["usage"],
                json!({"prompt_tokens": tokens, "total_tokens": tokens,
                       "completion_tokens": 0, "prompt_tokens_details": null}),
                "{}",
                case["id"]
            );
            let data = v["data"].as_array().expect("data");
            let want = case["scores"].as_array().expect("scores");
            assert_eq!(data.len(), want.len(), "{}", case["id"]);
            for (i, (d, w)) in data.iter().zip(want).enumerate() {
                assert_eq!(d["index"], i);
                assert_eq!(d["object"], "score");
                assert_close(&d["score"], w, 1e-4, case["id"].as_str().unwrap_or("?"));
            }
        }
    }
    let refusals = [
        (
            json!({"queries": ["a", "b"], "documents": ["a", "b", "c"]}),
            "Input lengths must be either 1:1, 1:N or N:N",
        ),
        (
            json!({"queries": [], "documents": ["a"]}),
            "At least one text element must be given",
        ),
        (
            json!({"queries": "a", "documents": []}),
            "At least one text_pair element must be given",
        ),
    ];
    for (body, message) in refusals {
        let (status, v) = call("POST", "/score", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(v["error"]["message"], message);
        assert_eq!(v["error"]["type"], "BadRequestError");
        assert_eq!(v["error"]["code"], 400);
    }
    let (status, v) = call("POST", "/score", Some(json!({"queries": "a"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = call(
        "POST",
        "/score",
        Some(json!({"model": "x", "queries": "a", "documents": "b"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["message"], "The model `x` does not exist.");
}

async fn check_rerank(app: axum::Router, served: &str, case: &Value, path: &str) {
    let (status, v) = call_on(app, "POST", path, Some(case["request"].clone())).await;
    assert_eq!(status, StatusCode::OK, "{} {path}: {v}", case["id"]);
    assert!(v["id"].as_str().expect("id").starts_with("score-"));
    assert_eq!(v["model"], served);
    assert_eq!(v["usage"], case["usage"], "{}", case["id"]);
    let got = v["results"].as_array().expect("results");
    let want = case["results"].as_array().expect("results");
    assert_eq!(got.len(), want.len(), "{}: {v}", case["id"]);
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g["index"], w["index"], "{}: order", case["id"]);
        assert_eq!(g["document"]["text"], w["document"]["text"]);
        assert_eq!(g["document"]["multi_modal"], Value::Null);
        assert_close(
            &g["relevance_score"],
            &w["relevance_score"],
            1e-4,
            case["id"].as_str().unwrap_or("?"),
        );
    }
}

#[tokio::test]
async fn rerank_goldens_on_both_models_and_every_alias() {
    let lines = std::fs::read_to_string(testdata("rerank.jsonl")).expect("rerank goldens");
    for case in lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json"))
    {
        for path in ["/rerank", "/v1/rerank", "/v2/rerank"] {
            if case["model"] == "cross-encoder" {
                check_rerank(cross_encoder_app(), "minilm-ce", &case, path).await;
            } else {
                check_rerank(app(), "minilm", &case, path).await;
            }
        }
    }
    let (status, v) = call(
        "POST",
        "/rerank",
        Some(json!({"query": "q", "documents": []})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        v["error"]["message"],
        "At least one text_pair element must be given"
    );
    let (status, v) = call(
        "POST",
        "/v2/rerank",
        Some(json!({"query": "q", "documents": ["a"], "top_n": -1})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let long = golden("long-paragraph");
    let (status, v) = call(
        "POST",
        "/v1/rerank",
        Some(json!({"query": "q", "documents": [long["input"]]})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["message"], long["vllm"]["error_message"]);
}

#[tokio::test]
async fn cross_encoder_server_classifies_and_scores() {
    let lines = std::fs::read_to_string(testdata("classify.jsonl")).expect("classify goldens");
    let cases: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let inputs: Vec<&Value> = cases.iter().map(|c| &c["input"]).collect();
    let (status, v) = call_on(
        cross_encoder_app(),
        "POST",
        "/classify",
        Some(json!({"input": inputs, "model": "minilm-ce"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().expect("id").starts_with("classify-"));
    let tokens: u64 = cases
        .iter()
        .map(|c| c["n_tokens"].as_u64().expect("n"))
        .sum();
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    for (i, (d, c)) in v["data"]
        .as_array()
        .expect("data")
        .iter()
        .zip(&cases)
        .enumerate()
    {
        assert_eq!(d["index"], i);
        assert_eq!(d["label"], c["vllm"]["data"]["label"]);
        assert_eq!(d["num_classes"], 1);
        assert_close(&d["probs"][0], &c["sigmoid"], 1e-4, "classify");
    }
    // use_activation: false gives the raw logit; /pooling returns the same probabilities.
    let (status, v) = call_on(
        cross_encoder_app(),
        "POST",
        "/classify",
        Some(json!({"input": cases[0]["input"], "use_activation": false})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_close(&v["data"][0]["probs"][0], &cases[0]["logit"], 1e-4, "logit");
    let (status, v) = call_on(
        cross_encoder_app(),
        "POST",
        "/pooling",
        Some(json!({"input": cases[0]["input"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"][0]["object"], "pooling");
    assert_close(
        &v["data"][0]["data"][0],
        &cases[0]["sigmoid"],
        1e-4,
        "pooling",
    );
    // Cross-encoder /score: the classifier's sigmoid of `[CLS] q [SEP] d [SEP]`.
    let ce = std::fs::read_to_string(testdata("cross_encoder_score.jsonl")).expect("ce goldens");
    let ce: Vec<Value> = ce
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let c = &ce[0];
    let (status, v) = call_on(
        cross_encoder_app(),
        "POST",
        "/score",
        Some(json!({"queries": c["query"], "documents": c["document"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_close(
        &v["data"][0]["score"],
        &c["vllm"]["score"],
        1e-4,
        "ce score",
    );
    assert_eq!(
        v["usage"]["prompt_tokens"],
        c["vllm"]["usage_prompt_tokens"]
    );
    // Its routes: /classify, /pooling and the score family; no embedding routes.
    let (status, doc) = call_on(cross_encoder_app(), "GET", "/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    let paths = doc["paths"].as_object().expect("paths");
    for p in [
        "/classify",
        "/pooling",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
    ] {
        assert!(paths.contains_key(p), "{p} missing");
    }
    for p in ["/v1/embeddings", "/v2/embed"] {
        assert!(!paths.contains_key(p), "{p} mounted");
        let (status, v) =
            call_on(cross_encoder_app(), "POST", p, Some(json!({"input": "hi"}))).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(v, json!({"detail": "Not Found"}));
    }
    let (status, v) = call_on(
        cross_encoder_app(),
        "POST",
        "/classify",
        Some(json!({"input": ""})),
    )
    .await;
    // "" is `[CLS] [SEP]`, as for an embedding; an empty id list is refused.
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = call_on(
        cross_encoder_app(),
        "POST",
        "/classify",
        Some(json!({"input": [[]]})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["type"], "BadRequestError");
}

#[tokio::test]
async fn cohere_v2_embed() {
    let hello = golden("hello-world");
    let pangram = golden("pangram");
    let texts = json!([hello["input"], pangram["input"]]);
    let (status, v) = call(
        "POST",
        "/v2/embed",
        Some(
            json!({"texts": texts, "embedding_types": ["float", "base64", "binary", "ubinary"],
                    "model": "minilm"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().expect("id").starts_with("embd-"));
    assert_eq!(v["response_type"], "embeddings_by_type");
    assert_eq!(v["texts"], texts);
    assert_eq!(v["meta"]["api_version"], json!({"version": "2"}));
    let tokens = hello["n_tokens"].as_u64().expect("n") + pangram["n_tokens"].as_u64().expect("n");
    assert_eq!(
        v["meta"]["billed_units"],
        json!({"input_tokens": tokens, "image_tokens": 0})
    );
    for (i, g) in [&hello, &pangram].into_iter().enumerate() {
        let f = floats(&v["embeddings"]["float"][i]);
        assert!(max_abs(&f, &floats(&g["embedding"])) <= 1e-5);
        let bytes = base64_decode(v["embeddings"]["base64"][i].as_str().expect("b64"));
        let decoded: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(decoded, f);
        let ub: Vec<i64> = v["embeddings"]["ubinary"][i]
            .as_array()
            .expect("ubinary")
            .iter()
            .map(|x| x.as_i64().expect("int"))
            .collect();
        assert_eq!(ub.len(), 384 / 8);
        for (j, byte) in ub.iter().enumerate() {
            let want: i64 = (0..8)
                .map(|k| i64::from(f[j * 8 + k] >= 0.0) << (7 - k))
                .sum();
            assert_eq!(*byte, want);
            assert_eq!(v["embeddings"]["binary"][i][j], want - 128);
        }
    }
    // Only the requested types; float by default.
    let (status, v) = call("POST", "/v2/embed", Some(json!({"texts": ["hi"]}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v["embeddings"]
            .as_object()
            .expect("embeddings")
            .keys()
            .collect::<Vec<_>>(),
        ["float"]
    );
    // truncate: END (the default) cuts an over-long text; NONE with max_tokens refuses it.
    let long = golden("long-paragraph");
    let (status, v) = call("POST", "/v2/embed", Some(json!({"texts": [long["input"]]}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["meta"]["billed_units"]["input_tokens"], 256);
    let (status, v) = call(
        "POST",
        "/v2/embed",
        Some(json!({"texts": ["hello world"], "truncate": "NONE", "max_tokens": 3})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        v["error"]["message"],
        "Input of 4 tokens exceeds max_tokens=3 with truncate=NONE. Set truncate to END or \
         START to allow truncation."
    );
    let (status, v) = call("POST", "/v2/embed", Some(json!({"model": "minilm"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        v["error"]["message"],
        "One of texts, images, or inputs must be provided"
    );
    let (status, v) = call(
        "POST",
        "/v2/embed",
        Some(json!({"texts": ["hi"], "input_type": "search_query"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        v["error"]["message"],
        "Unsupported input_type 'search_query'. This model does not define any input_type \
         task instructions."
    );
}

#[tokio::test]
async fn pooling_route_on_an_embedding_model() {
    let hello = golden("hello-world");
    let (status, v) = call(
        "POST",
        "/pooling",
        Some(json!({"input": [hello["input"]], "task": "embed"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().expect("id").starts_with("pooling-"));
    assert_eq!(v["data"][0]["object"], "pooling");
    assert!(max_abs(&floats(&v["data"][0]["data"]), &floats(&hello["embedding"])) <= 1e-5);
    assert_eq!(v["usage"]["prompt_tokens"], hello["n_tokens"]);
    let (status, v) = call(
        "POST",
        "/pooling",
        Some(json!({"input": "hi", "dimensions": 8})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        v["error"]["message"],
        "dimensions is currently not supported"
    );
    let (status, v) = call(
        "POST",
        "/pooling",
        Some(json!({"input": "hi", "task": "classify"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let long = golden("long-paragraph");
    let (status, v) = call("POST", "/pooling", Some(json!({"input": long["input"]}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["message"], long["vllm"]["error_message"]);
}

/// A generative server (the integrated role on SmolLM2) mounts none of the pooling routes:
/// they answer FastAPI's 404, as on vLLM.
#[test]
fn generative_server_has_no_pooling_routes() {
    let gguf = minilm_dir().join("../SmolLM2-135M-Instruct.Q4_1.gguf");
    let server = Server::builder()
        .model(gguf.to_string_lossy())
        .served_model_name("smol")
        .engine(aphro_engine::serving::ServingConfig {
            kv_cache_memory: Some(16 << 20),
            max_model_len: aphro_engine::serving::MaxModelLen::Auto,
            max_num_seqs: 4,
            ..aphro_engine::serving::ServingConfig::default()
        })
        .build()
        .expect("generative server builds");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        for path in [
            "/v1/embeddings",
            "/v2/embed",
            "/pooling",
            "/classify",
            "/score",
            "/v1/score",
            "/rerank",
            "/v1/rerank",
            "/v2/rerank",
        ] {
            let (status, v) =
                call_on(server.router(), "POST", path, Some(json!({"input": "hi"}))).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
            assert_eq!(v, json!({"detail": "Not Found"}), "{path}");
        }
    });
}

/// 32 concurrent `/v1/embeddings` requests (one text each) are served through the engine's
/// batcher and answer the same vectors as the same texts sent one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_equal_single_ones() {
    let path = testdata("embeddings.jsonl");
    let cases: Vec<Value> = std::fs::read_to_string(path)
        .expect("goldens")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .filter(|c: &Value| c["input"].is_string() && c["vllm"]["status"] == 200)
        .take(32)
        .collect();
    assert!(cases.len() >= 24);
    let mut single = Vec::new();
    for c in &cases {
        let (status, v) = call("POST", "/v1/embeddings", Some(json!({"input": c["input"]}))).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        single.push(floats(&v["data"][0]["embedding"]));
    }
    let tasks: Vec<_> = cases
        .iter()
        .map(|c| {
            let body = json!({"input": c["input"]});
            tokio::spawn(async move { call("POST", "/v1/embeddings", Some(body)).await })
        })
        .collect();
    for ((task, c), one) in tasks.into_iter().zip(&cases).zip(&single) {
        let (status, v) = task.await.expect("task");
        assert_eq!(status, StatusCode::OK, "{v}");
        let got = floats(&v["data"][0]["embedding"]);
        let diff = max_abs(&got, one);
        assert!(diff <= 1e-6, "{}: concurrent vs single {diff:e}", c["id"]);
        assert!(
            max_abs(&got, &floats(&c["embedding"])) <= 1e-5,
            "{}",
            c["id"]
        );
        assert_eq!(v["usage"]["prompt_tokens"], c["n_tokens"]);
    }
}

/// `aphro embed --model DIR --jsonl`: one `/v1/embeddings` response per line, the golden
/// vector, and vLLM's error body (non-zero exit) for an over-long line.
#[test]
fn embed_cli_jsonl() {
    use std::io::Write;
    let hello = golden("hello-world");
    let long = golden("long-paragraph");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_aphro"))
        .args([
            "embed",
            "--jsonl",
            "--served-model-name",
            "minilm",
            "--model",
        ])
        .arg(minilm_dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("aphro embed runs");
    let input = format!(
        "{}\n{}\n",
        json!({"input": [hello["input"]]}),
        json!({"input": long["input"]})
    );
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("output");
    assert!(
        !out.status.success(),
        "a failed line makes the exit non-zero"
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["model"], "minilm");
    assert_eq!(lines[0]["usage"]["prompt_tokens"], hello["n_tokens"]);
    let diff = max_abs(
        &floats(&lines[0]["data"][0]["embedding"]),
        &floats(&hello["embedding"]),
    );
    assert!(diff <= 1e-5, "{diff:e}");
    assert_eq!(lines[1]["error"]["message"], long["vllm"]["error_message"]);
    assert_eq!(lines[1]["error"]["code"], 400);
}
