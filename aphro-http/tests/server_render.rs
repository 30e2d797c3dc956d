//! The GPU-less frontend (`aphro launch render`) over real HTTP on loopback: the seed's
//! render → (tokens) → derender flow, streaming through the stateless state, and the error
//! cases of the wire spec, each asserting status and body shape.
mod common;

use common::{assets, json, Server};
use serde_json::{json, Value};

const MODEL_OUTPUT: &str = "<think>Need weather</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>";

fn chat_request() -> Value {
    json!({
        "model": "qwen3",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "max_tokens": 64
    })
}

fn start() -> Server {
    let dir = assets().join("tokenizers/qwen3");
    Server::start(&[
        "launch",
        "render",
        dir.to_str().expect("utf-8 path"),
        "--served-model-name",
        "qwen3",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--enable-auto-tool-choice",
        "--api-key",
        "sekret",
    ])
}

const AUTH: (&str, &str) = ("authorization", "Bearer sekret");

fn tokenize(s: &Server, text: &str) -> Vec<u64> {
    let (status, body) = s.post(
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    json(&body)["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(Value::as_u64)
        .collect()
}

#[test]
fn render_then_derender_round_trip() {
    let s = start();
    let (status, body) = s.post(
        "/v1/chat/completions/render",
        &chat_request(),
        &[AUTH, ("x-request-id", "abc")],
    );
    assert_eq!(status, 200, "{body}");
    let rendered = json(&body);
    assert_eq!(rendered["request_id"], "chatcmpl-abc");
    assert_eq!(
        rendered["sampling_params"]["skip_special_tokens"], false,
        "hermes keeps markers"
    );
    assert_eq!(rendered["reasoning_ended"], false);
    assert_eq!(rendered["parse_context"]["tool_choice"], "auto");
    let prompt_ids = rendered["token_ids"].clone();
    let n_prompt = prompt_ids.as_array().map(Vec::len).unwrap_or(0);
    assert!(n_prompt > 10);

    let out_ids = tokenize(&s, MODEL_OUTPUT);
    let gen = json!({"request_id": "generate-tokens-chatcmpl-abc", "output_mode": "tokens",
        "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": null, "token_ids": out_ids}]});
    let (status, body) = s.post(
        "/v1/chat/completions/derender",
        &json!({"generate_response": gen, "prompt_tokens": n_prompt, "prompt_token_ids": prompt_ids,
                "chat_request": chat_request()}),
        &[AUTH],
    );
    assert_eq!(status, 200, "{body}");
    let resp = json(&body);
    assert_eq!(resp["id"], "generate-tokens-chatcmpl-abc");
    assert_eq!(resp["object"], "chat.completion");
    let choice = &resp["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["reasoning"], "Need weather");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"city\": \"Paris\"}");
    assert!(call["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("chatcmpl-tool-")));
    assert_eq!(resp["usage"]["completion_tokens"], json!(out_ids.len()));

    // The same output streamed in chunks of 3 ids through the client-carried state.
    let mut state = Value::Null;
    let mut reasoning = String::new();
    let mut names = Vec::new();
    let mut args = String::new();
    let mut finish = Value::Null;
    let chunks: Vec<&[u64]> = out_ids.chunks(3).collect();
    for (i, ids) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let chunk = json!({"request_id": "generate-tokens-chatcmpl-abc", "output_mode": "tokens",
            "choices": [{"index": 0, "finish_reason": if last { json!("stop") } else { Value::Null },
                         "stop_reason": null, "token_ids": ids}]});
        let (status, body) = s.post(
            "/v1/chat/completions/derender",
            &json!({"stream": true, "generate_chunk": chunk, "stream_state": state,
                    "prompt_token_ids": prompt_ids, "chat_request": chat_request()}),
            &[AUTH],
        );
        assert_eq!(status, 200, "chunk {i}: {body}");
        let v = json(&body);
        state = v["stream_state"].clone();
        for c in v["chunk"]["choices"].as_array().into_iter().flatten() {
            let d = &c["delta"];
            if let Some(r) = d["reasoning"].as_str() {
                reasoning.push_str(r);
            }
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                if let Some(n) = tc["function"]["name"].as_str() {
                    names.push(n.to_owned());
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    args.push_str(a);
                }
            }
            if !c["finish_reason"].is_null() {
                finish = c["finish_reason"].clone();
            }
        }
    }
    assert_eq!(reasoning, "Need weather");
    assert_eq!(names, vec!["get_weather".to_owned()]);
    assert_eq!(args, "{\"city\": \"Paris\"}");
    assert_eq!(finish, "tool_calls");
}

#[test]
fn completion_render_tokenize_detokenize_and_common_routes() {
    let s = start();
    let (status, body) = s.post(
        "/v1/completions/render",
        &json!({"model": "qwen3", "prompt": ["Hello", "World"]}),
        &[AUTH],
    );
    assert_eq!(status, 200, "{body}");
    let arr = json(&body);
    let id0 = arr[0]["request_id"].as_str().expect("id");
    assert!(id0.starts_with("cmpl-") && id0.ends_with("-0"), "{id0}");
    assert_eq!(
        arr[1]["sampling_params"]["max_tokens"], 16,
        "completions default to 16"
    );

    let ids = tokenize(&s, "Hello world");
    let (status, body) = s.post("/detokenize", &json!({"tokens": ids}), &[]);
    assert_eq!(
        (status, json(&body)["prompt"].clone()),
        (200, json!("Hello world"))
    );

    let (status, body) = s.get("/v1/models", &[AUTH]);
    assert_eq!(status, 200);
    assert_eq!(json(&body)["data"][0]["id"], "qwen3");
    assert_eq!(s.get("/version", &[]).0, 200);
    assert_eq!(s.get("/health", &[]).0, 200);
    let (status, metrics) = s.get("/metrics", &[]);
    assert_eq!(status, 200);
    assert!(metrics.contains("http_requests_total") || metrics.is_empty() || metrics.contains('#'));
}

#[test]
fn error_cases_keep_vllm_status_and_envelope() {
    let s = start();
    let envelope = |status: u16, body: &str, kind: &str| {
        let v = json(body);
        assert_eq!(v["error"]["code"], json!(status), "{body}");
        assert_eq!(v["error"]["type"], kind, "{body}");
        v
    };
    // API key: guarded prefixes only; the 401 body is vLLM's exact one.
    let (status, body) = s.post("/v1/chat/completions/render", &chat_request(), &[]);
    assert_eq!(
        (status, body.as_str()),
        (401, r#"{"error":"Unauthorized"}"#)
    );
    let (status, _) = s.post(
        "/v1/chat/completions/render",
        &chat_request(),
        &[("authorization", "bearer sekret")],
    );
    assert_eq!(status, 200, "lower-case scheme is accepted");
    // Media type.
    let (status, body) = s.post_raw("/tokenize", "text/plain", "{}");
    assert_eq!(status, 400);
    let v = envelope(400, &body, "Bad Request");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("Only 'application/json' is allowed"));
    // Structural validation names the field.
    let (status, body) = s.post(
        "/v1/chat/completions/render",
        &json!({"model": "qwen3"}),
        &[AUTH],
    );
    assert_eq!(status, 400);
    assert_eq!(
        envelope(400, &body, "Bad Request")["error"]["param"],
        "body.messages"
    );
    // Semantic validation.
    let mut bad = chat_request();
    bad["top_p"] = json!(0);
    let (status, body) = s.post("/v1/chat/completions/render", &bad, &[AUTH]);
    assert_eq!(status, 400);
    assert_eq!(
        envelope(400, &body, "BadRequestError")["error"]["param"],
        "top_p"
    );
    // Unknown model.
    let mut bad = chat_request();
    bad["model"] = json!("nope");
    let (status, body) = s.post("/v1/chat/completions/render", &bad, &[AUTH]);
    assert_eq!(status, 404);
    assert_eq!(
        envelope(404, &body, "NotFoundError")["error"]["param"],
        "model"
    );
    // Derender without chat_request while parsers are configured.
    let gen = json!({"request_id": "generate-tokens-x", "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": null, "token_ids": [1, 2]}]});
    let (status, body) = s.post(
        "/v1/chat/completions/derender",
        &json!({"generate_response": gen}),
        &[AUTH],
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("chat_request is required"), "{body}");
    // Empty token ids.
    let gen = json!({"request_id": "generate-tokens-x", "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": null, "token_ids": []}]});
    let (status, body) = s.post(
        "/v1/chat/completions/derender",
        &json!({"generate_response": gen, "chat_request": chat_request()}),
        &[AUTH],
    );
    assert_eq!(status, 400, "{body}");
    // Unknown routes answer FastAPI's default body; the engine's routes are not mounted here.
    let (status, body) = s.post("/inference/v1/generate", &json!({}), &[AUTH]);
    assert_eq!((status, body.as_str()), (404, r#"{"detail":"Not Found"}"#));
    let (status, body) = s.post("/v1/chat/completions", &chat_request(), &[AUTH]);
    assert_eq!((status, body.as_str()), (404, r#"{"detail":"Not Found"}"#));
}

/// Template kwargs the chat template never reads, and `reasoning_effort` on a template without
/// it, are refused by name instead of being silently dropped; a kwarg it does read works.
#[test]
fn unread_template_kwargs_and_reasoning_effort_are_refused() {
    let s = start();
    let chat = |extra: Value| {
        let mut body = json!({"model": "qwen3", "messages": [{"role": "user", "content": "Hi"}]});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (status, text) = s.post("/v1/chat/completions/render", &body, &[AUTH]);
        (status, json(&text))
    };

    // qwen3's template reads `enable_thinking`: accepted, and it changes the prompt.
    let (status, on) = chat(json!({"chat_template_kwargs": {"enable_thinking": true}}));
    assert_eq!(status, 200, "{on}");
    let (status, off) = chat(json!({"chat_template_kwargs": {"enable_thinking": false}}));
    assert_eq!(status, 200, "{off}");
    assert_ne!(on["token_ids"], off["token_ids"]);

    let (status, body) =
        chat(json!({"chat_template_kwargs": {"enable_thinking": true, "tone": "formal"}}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["param"], "chat_template_kwargs.tone");
    assert_eq!(body["error"]["code"], 400);
    let msg = body["error"]["message"].as_str().expect("message");
    assert!(
        msg.contains("chat_template_kwargs.tone is not read"),
        "{msg}"
    );

    // A valid effort the template never reads.
    let (status, body) = chat(json!({"reasoning_effort": "low"}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["param"], "reasoning_effort");

    // A value outside the OpenAI set is refused whatever the template.
    let (status, body) = chat(json!({"reasoning_effort": "extreme"}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "Bad Request");
    assert_eq!(body["error"]["param"], "body.reasoning_effort");
}
