//! The engine roles over real HTTP on loopback: `aphro serve MODEL --tokens-only` (generate,
//! abort, SSE framing, disconnects) and the integrated `aphro serve MODEL` (OpenAI chat and
//! completions), plus the seed's disaggregated round trip: `aphro launch render` on one port,
//! `aphro serve --tokens-only` on another, render → generate → derender.
mod common;

use common::{assets, json, Server};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::time::{Duration, Instant};

fn gguf() -> String {
    assets()
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        .to_string_lossy()
        .into_owned()
}

fn engine_flags() -> Vec<&'static str> {
    vec![
        "--kv-cache-memory",
        "16777216",
        "--max-model-len",
        "auto",
        "--max-num-seqs",
        "16",
    ]
}

fn tokens_only() -> Server {
    let model = gguf();
    let mut args = vec![
        "serve",
        model.as_str(),
        "--tokens-only",
        "--served-model-name",
        "smol",
    ];
    args.extend(engine_flags());
    Server::start(&args)
}

/// Raw HTTP/1.1 POST that returns the open socket, to read SSE incrementally or hang up.
fn open_post(base: &str, path: &str, body: &Value) -> std::net::TcpStream {
    let addr = base.trim_start_matches("http://");
    let mut sock = std::net::TcpStream::connect(addr).expect("connect");
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).expect("write");
    sock
}

fn metric(s: &Server, name: &str) -> f64 {
    let (_, text) = s.get("/metrics", &[]);
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn gen_request(max_tokens: u64, stream: bool) -> Value {
    json!({"request_id": "t1", "token_ids": [1, 9690, 198, 2683, 359, 253, 5356, 2, 198, 1, 4093, 198, 19556, 2, 198, 1, 520, 9531, 198],
           "sampling_params": {"temperature": 0.0, "max_tokens": max_tokens}, "stream": stream})
}

#[test]
fn tokens_only_generate_stream_abort_and_disconnect() {
    let s = tokens_only();
    // Non-streaming.
    let (status, body) = s.post(
        "/inference/v1/generate",
        &gen_request(8, false),
        &[("x-request-id", "abc")],
    );
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    assert_eq!(v["request_id"], "generate-tokens-abc");
    assert_eq!(v["output_mode"], "tokens");
    let ids = v["choices"][0]["token_ids"]
        .as_array()
        .expect("ids")
        .clone();
    assert!(!ids.is_empty() && ids.len() <= 8);
    assert_eq!(v["usage"]["completion_tokens"], json!(ids.len()));
    // A full dump, as vLLM's `GenerateResponse.model_dump()`: every key in its field order,
    // nulls included (`UsageInfo.completion_tokens_details` too).
    assert_eq!(
        keys(&v),
        [
            "request_id",
            "model",
            "created",
            "output_mode",
            "choices",
            "usage",
            "prompt_logprobs",
            "prompt_token_id_logprobs",
            "prompt_token_ids",
            "mm_placeholders",
            "metrics",
            "kv_transfer_params",
            "ec_transfer_params"
        ]
    );
    assert_eq!(
        keys(&v["choices"][0]),
        [
            "index",
            "logprobs",
            "finish_reason",
            "stop_reason",
            "token_ids",
            "routed_experts",
            "sampling_mask",
            "weight_versions"
        ]
    );
    assert_eq!(
        keys(&v["usage"]),
        [
            "prompt_tokens",
            "total_tokens",
            "completion_tokens",
            "prompt_tokens_details",
            "completion_tokens_details"
        ]
    );

    // Streaming: exact SSE framing, same greedy tokens, ends with [DONE].
    let mut sock = open_post(&s.base, "/inference/v1/generate", &gen_request(8, true));
    let mut raw = String::new();
    sock.read_to_string(&mut raw).expect("read");
    let body = raw
        .split("\r\n\r\n")
        .skip(1)
        .collect::<Vec<_>>()
        .join("\r\n\r\n");
    assert!(raw.contains("text/event-stream"), "{raw}");
    assert!(body.contains("data: [DONE]"), "{body}");
    let mut streamed = Vec::new();
    for line in body.lines().filter(|l| l.starts_with("data: {")) {
        let ev = json(&line["data: ".len()..]);
        for c in ev["choices"].as_array().into_iter().flatten() {
            streamed.extend(c["token_ids"].as_array().into_iter().flatten().cloned());
        }
    }
    assert_eq!(
        streamed, ids,
        "streamed and non-streamed greedy tokens differ"
    );

    // Handler errors.
    let (status, body) = s.post(
        "/inference/v1/generate",
        &json!({"token_ids": [], "sampling_params": {}}),
        &[],
    );
    assert_eq!(status, 400, "{body}");
    let mut with_stop = gen_request(4, false);
    with_stop["sampling_params"]["stop"] = json!(["x"]);
    let (status, body) = s.post("/inference/v1/generate", &with_stop, &[]);
    assert_eq!(status, 400, "{body}");
    let mut text_mode = gen_request(4, false);
    text_mode["output_mode"] = json!("text");
    assert_eq!(s.post("/inference/v1/generate", &text_mode, &[]).0, 400);
    let (status, body) = s.post_raw("/abort_requests", "application/json", "{}");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Missing 'request_ids'"), "{body}");
    let (status, body) = s.post_raw(
        "/inference/v1/abort_requests",
        "application/json",
        "not json",
    );
    assert_eq!(status, 400, "{body}");

    // Abort a long request by id: it finishes with finish_reason "abort".
    let long = json!({"request_id": "long", "token_ids": [1, 4093, 198], "stream": false,
                      "sampling_params": {"temperature": 0.0, "max_tokens": 4000, "ignore_eos": true}});
    let base = s.base.clone();
    let handle = std::thread::spawn(move || {
        let mut sock = open_post(&base, "/inference/v1/generate", &long);
        let mut raw = String::new();
        let _ = sock.read_to_string(&mut raw);
        raw
    });
    wait_until("the long request to run", || {
        metric(&s, "vllm:num_requests_running") >= 1.0
    });
    let (status, body) = s.post(
        "/inference/v1/abort_requests",
        &json!({"request_ids": ["generate-tokens-long"]}),
        &[],
    );
    assert_eq!((status, body.as_str()), (200, ""));
    let raw = handle.join().expect("thread");
    assert!(raw.contains("\"finish_reason\":\"abort\""), "{raw}");

    // Disconnects: a client that hangs up mid-generation, streamed or not, frees its request.
    for stream in [true, false] {
        let req = json!({"token_ids": [1, 4093, 198], "stream": stream,
                         "sampling_params": {"temperature": 0.0, "max_tokens": 4000, "ignore_eos": true}});
        let sock = open_post(&s.base, "/inference/v1/generate", &req);
        if stream {
            let mut reader = BufReader::new(sock.try_clone().expect("clone"));
            let mut line = String::new();
            while !line.starts_with("data: {") {
                line.clear();
                reader.read_line(&mut line).expect("read");
            }
        } else {
            wait_until("the request to run", || {
                metric(&s, "vllm:num_requests_running") >= 1.0
            });
        }
        sock.shutdown(std::net::Shutdown::Both).expect("hang up");
        drop(sock);
        wait_until("the engine to drop the request", || {
            metric(&s, "vllm:num_requests_running") == 0.0
                && metric(&s, "vllm:kv_cache_usage_perc") == 0.0
        });
    }
    assert!(metric(&s, "vllm:generation_tokens_total") > 0.0);
}

#[test]
fn integrated_server_and_disaggregated_round_trip_agree() {
    let model = gguf();
    let mut args = vec![
        "serve",
        model.as_str(),
        "--served-model-name",
        "smol",
        "--enable-scale-out",
    ];
    args.extend(engine_flags());
    let full = Server::start(&args);
    let render = Server::start(&[
        "launch",
        "render",
        model.as_str(),
        "--served-model-name",
        "smol",
    ]);
    let engine = tokens_only();

    let chat = json!({"model": "smol", "messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_tokens": 12, "temperature": 0});
    // Integrated.
    let (status, body) = full.post("/v1/chat/completions", &chat, &[]);
    assert_eq!(status, 200, "{body}");
    let integrated = json(&body);
    assert!(integrated["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("chatcmpl-")));
    let answer = integrated["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned();
    assert!(!answer.is_empty());

    // Disaggregated: render → generate → derender, as the seed's httpx client does.
    let (status, body) = render.post("/v1/chat/completions/render", &chat, &[]);
    assert_eq!(status, 200, "{body}");
    let rendered = json(&body);
    let (status, body) = engine.post("/inference/v1/generate", &rendered, &[]);
    assert_eq!(status, 200, "{body}");
    let generated = json(&body);
    let n_prompt = rendered["token_ids"].as_array().map(Vec::len).unwrap_or(0);
    let (status, body) = render.post(
        "/v1/chat/completions/derender",
        &json!({"generate_response": generated, "prompt_tokens": n_prompt,
                "prompt_token_ids": rendered["token_ids"], "chat_request": chat}),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    let disagg = json(&body);
    assert_eq!(
        disagg["choices"][0]["message"]["content"],
        json!(answer),
        "the two deployments disagree"
    );
    assert_eq!(disagg["usage"], integrated["usage"]);

    // Streaming chat on the integrated server gives the same text.
    let mut streamed_chat = chat.clone();
    streamed_chat["stream"] = json!(true);
    let mut sock = open_post(&full.base, "/v1/chat/completions", &streamed_chat);
    let mut raw = String::new();
    sock.read_to_string(&mut raw).expect("read");
    let mut text = String::new();
    for line in raw.lines().filter(|l| l.starts_with("data: {")) {
        let ev = json(&line["data: ".len()..]);
        for c in ev["choices"].as_array().into_iter().flatten() {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
        }
    }
    let last_data = raw.lines().rfind(|l| l.starts_with("data: "));
    assert_eq!(last_data, Some("data: [DONE]"), "{raw}");
    assert_eq!(text, answer);

    // Completions, two prompts batched.
    let (status, body) = full.post(
        "/v1/completions",
        &json!({"model": "smol", "prompt": ["Once upon a time", "The sky is"], "max_tokens": 5, "temperature": 0}),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2));
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")));
}

fn sse_events(raw: &str) -> Vec<Value> {
    let lines: Vec<&str> = raw.lines().filter(|l| l.starts_with("data: ")).collect();
    assert_eq!(lines.last().copied(), Some("data: [DONE]"), "{raw}");
    lines[..lines.len() - 1]
        .iter()
        .map(|l| json(&l["data: ".len()..]))
        .collect()
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

fn stream_post(base: &str, path: &str, body: &Value) -> Vec<Value> {
    let mut sock = open_post(base, path, body);
    let mut raw = String::new();
    sock.read_to_string(&mut raw).expect("read");
    let body = raw.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    assert!(raw.contains("text/event-stream"), "{raw}");
    // The response is chunked: keep only the event lines.
    sse_events(body)
}

/// The integrated server's streams in vLLM's exact shapes, multi-prompt streaming
/// completions, and the per-request histograms of /metrics.
#[test]
fn integrated_stream_shapes_multi_prompt_streaming_and_request_metrics() {
    let model = gguf();
    let mut args = vec![
        "serve",
        model.as_str(),
        "--served-model-name",
        "smol",
        "--enable-scale-out",
    ];
    args.extend(engine_flags());
    let s = Server::start(&args);

    // Chat: `exclude_unset` chunks (`api.md` §8.1).
    let events = stream_post(
        &s.base,
        "/v1/chat/completions",
        &json!({"model": "smol", "messages": [{"role": "user", "content": "Hi there"}],
                "max_tokens": 8, "ignore_eos": true, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}}),
    );
    assert!(events.len() >= 3, "{events:?}");
    let first = &events[0];
    assert_eq!(keys(first), ["id", "object", "created", "model", "choices"]);
    assert_eq!(
        first["choices"],
        json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}])
    );
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["model"], "smol");
    let id = first["id"].as_str().expect("id");
    assert!(id.starts_with("chatcmpl-"), "{id}");
    let (usage, token_chunks) = events[1..].split_last().expect("usage chunk");
    let (last, middle) = token_chunks.split_last().expect("final chunk");
    assert!(!middle.is_empty());
    for c in middle {
        assert_eq!(
            keys(c),
            ["id", "object", "created", "model", "choices"],
            "{c}"
        );
        let ch = &c["choices"][0];
        assert_eq!(
            keys(ch),
            ["index", "delta", "logprobs", "finish_reason", "token_ids"],
            "{c}"
        );
        assert_eq!(keys(&ch["delta"]), ["content"], "{c}");
        assert_eq!(
            (&ch["finish_reason"], &ch["logprobs"], &ch["token_ids"]),
            (&Value::Null, &Value::Null, &Value::Null)
        );
    }
    let ch = &last["choices"][0];
    assert_eq!(
        keys(ch),
        [
            "index",
            "delta",
            "logprobs",
            "finish_reason",
            "stop_reason",
            "token_ids"
        ],
        "{last}"
    );
    assert_eq!(ch["finish_reason"], "length");
    assert_eq!(
        keys(usage),
        ["id", "object", "created", "model", "choices", "usage"]
    );
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        keys(&usage["usage"]),
        ["prompt_tokens", "total_tokens", "completion_tokens"]
    );
    assert_eq!(usage["usage"]["completion_tokens"], 8);
    for e in &events {
        assert_eq!((&e["id"], &e["created"]), (&first["id"], &first["created"]));
    }

    // Completions: two prompts × n=2 streamed, interleaved with index = prompt * n + choice,
    // the same text as the non-streaming response, one summed usage chunk.
    let req = json!({"model": "smol", "prompt": ["Once upon a time", "The sky is"], "n": 2,
                     "max_tokens": 5, "ignore_eos": true, "temperature": 1.0, "seed": 7});
    let (status, body) = s.post("/v1/completions", &req, &[]);
    assert_eq!(status, 200, "{body}");
    let whole = json(&body);
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = stream_post(&s.base, "/v1/completions", &streamed);
    let (usage, chunks) = events.split_last().expect("usage chunk");
    let mut texts = vec![String::new(); 4];
    let mut finished = [0; 4];
    let cmpl_id = chunks[0]["id"].as_str().expect("id");
    assert!(cmpl_id.starts_with("cmpl-"), "{cmpl_id}");
    for c in chunks {
        assert_eq!(c["id"], json!(cmpl_id));
        assert_eq!(c["object"], "text_completion");
        let ch = &c["choices"][0];
        let i = ch["index"].as_u64().expect("index") as usize;
        assert!(i < 4, "{c}");
        texts[i].push_str(ch["text"].as_str().expect("text"));
        if !ch["finish_reason"].is_null() {
            finished[i] += 1;
        }
    }
    assert_eq!(finished, [1; 4]);
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(json!(t), whole["choices"][i]["text"], "choice {i}");
    }
    assert_eq!(
        keys(usage),
        ["id", "object", "created", "model", "choices", "usage"]
    );
    assert_eq!(usage["usage"]["completion_tokens"], 20);
    assert_eq!(
        usage["usage"]["prompt_tokens"],
        whole["usage"]["prompt_tokens"]
    );

    // Per-request histograms: five finished requests (1 chat + 2 × 2 completion prompts).
    let finished_requests = 5.0;
    for name in [
        "vllm:request_prompt_tokens_count",
        "vllm:request_generation_tokens_count",
        "vllm:request_params_n_count",
        "vllm:request_params_max_tokens_count",
        "vllm:request_prefill_time_seconds_count",
        "vllm:request_decode_time_seconds_count",
        "vllm:request_inference_time_seconds_count",
    ] {
        assert_eq!(metric(&s, name), finished_requests, "{name}");
    }
    assert_eq!(metric(&s, "vllm:request_params_n_sum"), 1.0 + 4.0 * 2.0);
    assert_eq!(
        metric(&s, "vllm:request_params_max_tokens_sum"),
        8.0 + 4.0 * 5.0
    );
    assert_eq!(
        metric(&s, "vllm:request_generation_tokens_sum"),
        8.0 + 4.0 * 10.0
    );
    assert_eq!(
        metric(&s, "vllm:request_generation_tokens_sum"),
        metric(&s, "vllm:generation_tokens_total")
    );
    assert_eq!(
        metric(&s, "vllm:request_prompt_tokens_sum"),
        metric(&s, "vllm:prompt_tokens_total")
    );
    assert!(metric(&s, "vllm:iteration_tokens_total_count") > 0.0);
    assert!(metric(&s, "vllm:iteration_tokens_total_sum") > 0.0);
    assert!(
        metric(&s, "vllm:request_decode_time_seconds_sum")
            <= metric(&s, "vllm:request_inference_time_seconds_sum")
    );
    let (_, text) = s.get("/metrics", &[]);
    assert!(
        text.contains("vllm:request_params_n_bucket{engine=\"0\",model_name=\"smol\",le=\"2\"} 5"),
        "{text}"
    );
}

/// Stop strings end requests on the integrated OpenAI routes: the engine finishes the
/// request at the token that completes one (no chunk after the finish chunk, no tokens
/// generated past it), the text is cut as vLLM cuts it, and `stop_reason` names the string.
#[test]
fn integrated_routes_stop_at_stop_strings() {
    let model = gguf();
    let mut args = vec![
        "serve",
        model.as_str(),
        "--served-model-name",
        "smol",
        "--enable-scale-out",
    ];
    args.extend(engine_flags());
    let s = Server::start(&args);
    let completion = |extra: Value| {
        let mut body = json!({"model": "smol", "prompt": "1, 2, 3, 4,", "max_tokens": 20,
                              "temperature": 0, "ignore_eos": true});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (status, text) = s.post("/v1/completions", &body, &[]);
        assert_eq!(status, 200, "{text}");
        json(&text)
    };
    let free = completion(json!({}));
    let full = free["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    assert_eq!(free["choices"][0]["finish_reason"], "length");
    // A stop string from the middle of the free-running text.
    let mid = full
        .char_indices()
        .nth(full.chars().count() / 2)
        .map_or(0, |(i, _)| i);
    let stop: String = full[mid..].chars().take(2).collect();
    let cut = full.find(&stop).expect("stop occurs");
    // The free-running request's tokens are counted once its metrics land; only then is
    // the counter a baseline for the next request.
    wait_until("the first request's metrics", || {
        metric(&s, "vllm:generation_tokens_total") == 20.0
    });
    let before = 20.0;
    let stopped = completion(json!({"stop": [stop.clone()]}));
    let c = &stopped["choices"][0];
    assert_eq!(c["text"], full[..cut], "{stopped}");
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["stop_reason"], stop);
    // The engine generated exactly what was returned, not max_tokens.
    let returned = stopped["usage"]["completion_tokens"]
        .as_f64()
        .expect("usage");
    assert!(returned < 20.0, "{stopped}");
    wait_until("generation metric", || {
        metric(&s, "vllm:generation_tokens_total") - before == returned
    });
    // A plain string, and include_stop_str_in_output.
    let one = completion(json!({"stop": stop.clone(), "include_stop_str_in_output": true}));
    assert_eq!(one["choices"][0]["text"], full[..cut + stop.len()], "{one}");
    // min_tokens past the stop string's position: the stop is not honoured before it.
    let late = completion(json!({"stop": [stop.clone()], "min_tokens": 20}));
    assert_eq!(late["choices"][0]["finish_reason"], "length", "{late}");

    // Chat, non-streaming and streaming.
    let chat_body = |extra: Value, stream: bool| {
        let mut body = json!({"model": "smol", "max_tokens": 16, "temperature": 0,
            "ignore_eos": true, "stream": stream,
            "messages": [{"role": "user", "content": "Count from one to twenty in words."}]});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        body
    };
    let (_, text) = s.post("/v1/chat/completions", &chat_body(json!({}), false), &[]);
    let free = json(&text);
    let content = free["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned();
    let mid = content
        .char_indices()
        .nth(content.chars().count() / 2)
        .map_or(0, |(i, _)| i);
    let stop: String = content[mid..].chars().take(2).collect();
    let cut = content.find(&stop).expect("stop occurs");
    let (_, text) = s.post(
        "/v1/chat/completions",
        &chat_body(json!({"stop": [stop.clone()]}), false),
        &[],
    );
    let stopped = json(&text);
    assert_eq!(
        stopped["choices"][0]["message"]["content"],
        content[..cut],
        "{stopped}"
    );
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    assert_eq!(stopped["choices"][0]["stop_reason"], stop);
    let events = stream_post(
        &s.base,
        "/v1/chat/completions",
        &chat_body(json!({"stop": [stop.clone()]}), true),
    );
    let (usage, chunks) = events.split_last().expect("usage chunk");
    let finish_at = chunks
        .iter()
        .position(|c| !c["choices"][0]["finish_reason"].is_null())
        .expect("a finish chunk");
    assert_eq!(
        finish_at,
        chunks.len() - 1,
        "chunks after the finish chunk: {events:?}"
    );
    assert_eq!(chunks[finish_at]["choices"][0]["finish_reason"], "stop");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content[..cut]);
    assert_eq!(
        usage["usage"]["completion_tokens"],
        stopped["usage"]["completion_tokens"]
    );
}

#[test]
fn serve_flags_scale_out_token_id_logprobs_and_skip_tokenizer_init() {
    let model = gguf();
    let start = |extra: &[&str]| {
        let mut args = vec!["serve", model.as_str(), "--served-model-name", "smol"];
        args.extend(engine_flags());
        args.extend_from_slice(extra);
        Server::start(&args)
    };

    // Without --enable-scale-out the integrated server refuses the scale-out routes (vLLM 403).
    let plain = start(&[]);
    for path in ["/inference/v1/generate", "/v1/completions/render"] {
        let (status, body) = plain.post(path, &gen_request(2, false), &[]);
        assert_eq!(status, 403, "{path}: {body}");
        let v = json(&body);
        assert_eq!(v["error"]["type"], "PermissionDeniedError", "{body}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("--enable-scale-out")),
            "{body}"
        );
    }
    let (status, _) = plain.post(
        "/v1/completions",
        &json!({"prompt": "1, 2,", "max_tokens": 1}),
        &[],
    );
    assert_eq!(status, 200);
    drop(plain);

    // --return-tokens-as-token-ids: every logprob token is a `token_id:N` placeholder, on the
    // OpenAI routes (a request can still turn it off) and in generate's text mode.
    let ids = start(&["--return-tokens-as-token-ids", "--enable-scale-out"]);
    let completion = |extra: Value| {
        let mut body = json!({"prompt": "1, 2, 3,", "max_tokens": 3, "temperature": 0,
                              "logprobs": 1});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (status, text) = ids.post("/v1/completions", &body, &[]);
        assert_eq!(status, 200, "{text}");
        json(&text)
    };
    let placeholders = |tokens: &Value| {
        tokens
            .as_array()
            .expect("tokens")
            .iter()
            .all(|t| t.as_str().is_some_and(|t| t.starts_with("token_id:")))
    };
    let r = completion(json!({}));
    assert!(placeholders(&r["choices"][0]["logprobs"]["tokens"]), "{r}");
    let r = completion(json!({"return_tokens_as_token_ids": false}));
    assert!(!placeholders(&r["choices"][0]["logprobs"]["tokens"]), "{r}");
    let mut text_mode = gen_request(3, false);
    text_mode["output_mode"] = json!("text");
    text_mode["sampling_params"]["logprobs"] = json!(1);
    let (status, body) = ids.post("/inference/v1/generate", &text_mode, &[]);
    assert_eq!(status, 200, "{body}");
    let content = &json(&body)["choices"][0]["logprobs"]["content"];
    for e in content.as_array().expect("content") {
        assert!(
            e["token"]
                .as_str()
                .is_some_and(|t| t.starts_with("token_id:")),
            "{e}"
        );
        assert!(e["bytes"].is_null(), "{e}");
    }
    drop(ids);

    // --skip-tokenizer-init: tokens in and out only.
    let bare = start(&["--skip-tokenizer-init", "--enable-scale-out"]);
    let (status, body) = bare.post("/inference/v1/generate", &gen_request(3, false), &[]);
    assert_eq!(status, 200, "{body}");
    let (status, body) = bare.post("/inference/v1/generate", &text_mode, &[]);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("requires a tokenizer"), "{body}");
    let mut with_stop = gen_request(3, false);
    with_stop["sampling_params"]["stop"] = json!(["x"]);
    let (status, body) = bare.post("/inference/v1/generate", &with_stop, &[]);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("detokenize is True"), "{body}");
    for path in ["/v1/completions", "/tokenize"] {
        let (status, body) = bare.post(path, &json!({"prompt": "hi"}), &[]);
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains("skip_tokenizer_init=True"), "{path}: {body}");
    }
}

/// `--generation-config` / `--override-generation-config` for a GGUF model: the sampling
/// defaults come from a `generation_config.json` beside the file, from none (`vllm`), and
/// with the override's keys on top, on every route that fills in defaults.
#[test]
fn generation_config_flags_for_a_gguf_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let linked = dir.path().join("smol.gguf");
    std::os::unix::fs::symlink(gguf(), &linked).expect("symlink");
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"max_new_tokens": 3, "temperature": 0.0}"#,
    )
    .expect("generation_config.json");
    let model = linked.to_string_lossy().into_owned();
    let completion_tokens = |extra: &[&str]| {
        let mut args = vec!["serve", model.as_str(), "--served-model-name", "smol"];
        args.extend(engine_flags());
        args.extend_from_slice(extra);
        let s = Server::start(&args);
        // Chat: its max_tokens defaults to None, so the generation config's applies (a
        // completion's defaults to 16, as in vLLM).
        let (status, body) = s.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Count to ten."}],
                    "ignore_eos": true}),
            &[],
        );
        assert_eq!(status, 200, "{body}");
        let v = json(&body);
        v["usage"]["completion_tokens"].as_u64().expect("usage")
    };
    assert_eq!(
        completion_tokens(&[]),
        3,
        "generation_config.json beside the GGUF"
    );
    assert_eq!(
        completion_tokens(&["--override-generation-config", r#"{"max_new_tokens": 5}"#]),
        5
    );
    assert_eq!(
        completion_tokens(&[
            "--generation-config",
            "vllm",
            "--override-generation-config",
            r#"{"max_new_tokens": 4}"#,
        ]),
        4
    );
    let other = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        other.path().join("generation_config.json"),
        r#"{"max_new_tokens": 2}"#,
    )
    .expect("generation_config.json");
    let other_dir = other.path().to_string_lossy().into_owned();
    assert_eq!(
        completion_tokens(&["--generation-config", other_dir.as_str()]),
        2
    );
}

/// generate with `output_mode: "derender"` and logprobs: the engine runs the request in
/// tokens mode and the derenderer builds the message and its chat-shaped logprobs.
#[test]
fn generate_derender_with_logprobs() {
    let model = gguf();
    let mut args = vec![
        "serve",
        model.as_str(),
        "--served-model-name",
        "smol",
        "--enable-scale-out",
    ];
    args.extend(engine_flags());
    let s = Server::start(&args);
    let mut body = gen_request(3, false);
    body["output_mode"] = json!("derender");
    body["sampling_params"]["logprobs"] = json!(1);
    let (status, text) = s.post("/inference/v1/generate", &body, &[]);
    assert_eq!(status, 200, "{text}");
    let v = json(&text);
    assert_eq!(v["output_mode"], "derender", "{v}");
    let choice = &v["choices"][0];
    let content = choice["message"]["content"].as_str().expect("content");
    let tokens: Vec<&str> = choice["logprobs"]["content"]
        .as_array()
        .expect("logprobs")
        .iter()
        .map(|e| e["token"].as_str().expect("token"))
        .collect();
    assert_eq!(tokens.len(), 3, "{v}");
    assert_eq!(tokens.concat(), content, "{v}");
}

/// The integrated server loads the model's tokenizer side once: the renderer, the derenderer
/// and the engine's detokenizer read one `Model` (one tokenizer, one template, one
/// generation config), not three copies of the files.
#[test]
fn integrated_state_shares_one_loaded_model() {
    use aphro_http::cli::{Cli, Command};
    use clap::Parser;
    let model = gguf();
    let mut argv = vec!["aphro", "serve", model.as_str()];
    argv.extend(engine_flags());
    let Command::Serve(args) = Cli::try_parse_from(argv).expect("argv").command else {
        panic!("not serve");
    };
    let state = aphro_http::cli::serve::build_state(args).expect("state");
    let engine_model = state
        .engine
        .as_ref()
        .and_then(|e| e.model())
        .expect("engine model");
    let renderer = state.renderer.as_ref().expect("renderer");
    let derenderer = state.derenderer.as_ref().expect("derenderer");
    assert!(std::ptr::eq(renderer.model(), engine_model.as_ref()));
    assert!(std::ptr::eq(derenderer.model(), engine_model.as_ref()));
    let engine_tok = state
        .engine
        .as_ref()
        .and_then(|e| e.tokenizer())
        .expect("tokenizer");
    assert!(std::sync::Arc::ptr_eq(engine_tok, &engine_model.tokenizer));
}

/// One request through an axum app in this process (no socket): (status, body text).
fn in_process_call(
    rt: &tokio::runtime::Runtime,
    app: axum::Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, String) {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;
    rt.block_on(async move {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .expect("request");
        let resp = app.oneshot(req).await.expect("response");
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&bytes).into_owned())
    })
}

/// `Server::builder()` without a command line: the integrated role under a base path,
/// without the document routes, merged into another axum app, answers a chat as the binary
/// does; the render role builds the same way.
#[test]
fn server_builder_mounts_under_a_base_path() {
    use aphro_engine::serving::{MaxModelLen, ServingConfig};
    use aphro_http::server::{Role, Server};

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let call = |app: axum::Router, method: &str, path: &str, body: Option<Value>| {
        in_process_call(&rt, app, method, path, body)
    };

    let server = Server::builder()
        .model(gguf())
        .served_model_name("smol")
        .engine(ServingConfig {
            kv_cache_memory: Some(16 << 20),
            max_model_len: MaxModelLen::Auto,
            max_num_seqs: 4,
            ..ServingConfig::default()
        })
        .base_path("/llm/")
        .docs(false)
        .max_body_bytes(4096)
        .build()
        .expect("builds");
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "host app" }))
        .merge(server.router());
    assert_eq!(
        call(app.clone(), "GET", "/", None),
        (200, "host app".into())
    );
    let (status, body) = call(
        app.clone(),
        "POST",
        "/llm/v1/chat/completions",
        Some(json!({"model": "smol", "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": "Hi"}]})),
    );
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    assert_eq!(v["model"], "smol");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    // The OpenAI family under the builder's body limit: the JSON 413.
    let big = json!({"model": "smol", "messages": [{"role": "user", "content": "x".repeat(5000)}]});
    for path in ["/llm/v1/chat/completions", "/llm/v1/completions"] {
        let (status, body) = call(app.clone(), "POST", path, Some(big.clone()));
        assert_eq!(status, 413, "{path}: {body}");
        assert_eq!(json(&body)["error"]["code"], 413, "{path}");
    }
    assert_eq!(call(app.clone(), "GET", "/llm/openapi.json", None).0, 404);
    assert_eq!(call(app.clone(), "GET", "/v1/models", None).0, 404);

    let render = Server::builder()
        .model(gguf())
        .role(Role::Render)
        .max_model_len(512)
        .build()
        .expect("render role");
    let app = render.router();
    let (status, body) = call(app.clone(), "GET", "/v1/models", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["data"][0]["max_model_len"], 512);
    assert_eq!(call(app.clone(), "GET", "/openapi.json", None).0, 200);
    assert_eq!(
        call(app, "POST", "/v1/chat/completions", Some(json!({}))).0,
        404
    );

    // The served context is honoured on the engine roles too, never dropped.
    let engine = Server::builder()
        .model(gguf())
        .role(Role::TokensOnly)
        .engine(ServingConfig {
            kv_cache_memory: Some(16 << 20),
            ..ServingConfig::default()
        })
        .max_model_len(256)
        .build()
        .expect("tokens-only role");
    assert_eq!(engine.state().settings.max_model_len, 256);
    assert!(Server::builder()
        .model(gguf())
        .role(Role::Render)
        .skip_tokenizer_init(true)
        .build()
        .is_err());
}

/// Engine failure semantics through the server (an injected failure standing in for a
/// device error): with `--data-parallel-size 2` one failed engine leaves the server serving;
/// once both failed, `/health` and every route that needs an engine answer 503 with an
/// OpenAI error body naming the reason, and `/metrics` shows both engines.
#[test]
fn failed_engines_give_503_with_the_reason_on_every_route() {
    use aphro_engine::serving::{MaxModelLen, ServingConfig};
    use aphro_http::server::Server;

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let call = |app: axum::Router, method: &str, path: &str, body: Option<Value>| {
        in_process_call(&rt, app, method, path, body)
    };
    let server = Server::builder()
        .model(gguf())
        .served_model_name("smol")
        .engine(ServingConfig {
            kv_cache_memory: Some(16 << 20),
            max_model_len: MaxModelLen::Auto,
            max_num_seqs: 4,
            data_parallel_size: 2,
            ..ServingConfig::default()
        })
        .enable_scale_out(true)
        .build()
        .expect("builds");
    let app = server.router();
    let chat = json!({"model": "smol", "max_tokens": 2, "temperature": 0,
                      "messages": [{"role": "user", "content": "Hi"}]});
    let (_, metrics) = call(app.clone(), "GET", "/metrics", None);
    for engine in ["0", "1"] {
        assert!(
            metrics.contains(&format!(
                "vllm:num_requests_running{{engine=\"{engine}\",model_name=\"smol\"}}"
            )),
            "{metrics}"
        );
    }
    let serving = server.state().engine.clone().expect("engine");
    let engines: Vec<_> = serving.engines().collect();
    engines[0].inject_failure("injected: CUDA error: an illegal memory access");
    wait_until("engine 0 fails", || !engines[0].is_healthy());
    assert_eq!(call(app.clone(), "GET", "/health", None).0, 200);
    let (status, body) = call(
        app.clone(),
        "POST",
        "/v1/chat/completions",
        Some(chat.clone()),
    );
    assert_eq!(status, 200, "the healthy engine serves: {body}");

    engines[1].inject_failure("injected: device lost");
    wait_until("engine 1 fails", || !engines[1].is_healthy());
    let (status, body) = call(app.clone(), "GET", "/health", None);
    assert_eq!(status, 503);
    assert!(
        body.contains("illegal memory access") && body.contains("device lost"),
        "{body}"
    );
    let generate = json!({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}});
    let completion = json!({"model": "smol", "prompt": "Hi", "max_tokens": 2});
    let messages = json!({"model": "smol", "max_tokens": 2,
                          "messages": [{"role": "user", "content": "Hi"}]});
    for (path, body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
        ("/inference/v1/generate", generate),
        ("/v1/messages", messages),
    ] {
        let (status, text) = call(app.clone(), "POST", path, Some(body));
        assert_eq!(status, 503, "{path}: {text}");
        let v = json(&text);
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("device lost")),
            "{path}: {text}"
        );
        if path == "/v1/messages" {
            // Anthropic's envelope: `{"type": "error", "error": {"type", "message"}}`.
            assert_eq!(v["type"], "error", "{path}");
        } else {
            assert_eq!(v["error"]["code"], 503, "{path}");
        }
    }
}

/// The full-vocabulary logits at the last prompt position of an engine golden (HF float32).
fn golden_logits(case: &Value) -> Vec<f64> {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/engine")
        .join(
            case["logits_check"]["full_logits_file"]
                .as_str()
                .expect("file"),
        );
    std::fs::read(file)
        .expect("golden logits")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        .collect()
}

/// `/generative_scoring` (endpoints.md §1.10) against HF float32's logits: two chat goldens share
/// their system-prompt prefix (the query, as token ids) and differ after it (the items); each
/// score is the first label's probability, over the labels (`apply_softmax`) or over the
/// vocabulary. Text input tokenizes the query with special tokens and the item without;
/// `item_first` swaps them; the refusals are vLLM's 400s.
#[test]
fn generative_scoring_matches_hf_logits() {
    let model = gguf();
    let mut args = vec!["serve", model.as_str(), "--served-model-name", "smol"];
    args.extend(engine_flags());
    args.extend(["--dtype", "float32"]);
    let s = Server::start(&args);
    let cases: Vec<Value> = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/engine/smollm2-135m-instruct.jsonl"),
    )
    .expect("engine goldens")
    .lines()
    .map(json)
    .filter(|c: &Value| c["logits_check"].is_object())
    .collect();
    let case = |id: &str| cases.iter().find(|c| c["id"] == id).expect("case").clone();
    let ids = |c: &Value| -> Vec<u64> {
        c["prompt_token_ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id"))
            .collect()
    };
    let (fr, zh) = (case("chat-capital-france"), case("chat-zh-great-wall"));
    let (a, b) = (ids(&fr), ids(&zh));
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(common > 10 && common < a.len().min(b.len()));
    let labels = [504u32, 60, 180, 18, 15319];
    let want = |c: &Value, softmax: bool| -> f64 {
        let l = golden_logits(c);
        if softmax {
            let max = labels
                .iter()
                .map(|&t| l[t as usize])
                .fold(f64::MIN, f64::max);
            let sum: f64 = labels.iter().map(|&t| (l[t as usize] - max).exp()).sum();
            (l[labels[0] as usize] - max).exp() / sum
        } else {
            let lse = c["logits_check"]["logsumexp"].as_f64().expect("lse");
            (l[labels[0] as usize] - lse).exp()
        }
    };
    for softmax in [true, false] {
        let body = json!({"model": "smol", "query": &a[..common],
            "items": [&a[common..], &b[common..]], "label_token_ids": labels,
            "apply_softmax": softmax});
        let (status, text) = s.post("/generative_scoring", &body, &[("x-request-id", "gs1")]);
        assert_eq!(status, 200, "{text}");
        let r = json(&text);
        assert_eq!(r["id"], "generative-scoring-gs1");
        assert_eq!(
            (r["object"].as_str(), r["model"].as_str()),
            (Some("list"), Some("smol"))
        );
        for (i, c) in [&fr, &zh].into_iter().enumerate() {
            let d = &r["data"][i];
            assert_eq!(
                (d["index"].as_u64(), d["object"].as_str()),
                (Some(i as u64), Some("score"))
            );
            let (got, want) = (d["score"].as_f64().expect("score"), want(c, softmax));
            assert!(
                (got - want).abs() <= 1e-3 * want.max(1e-3),
                "item {i}: {got} vs HF {want}"
            );
        }
        let prompt = (a.len() + b.len()) as u64;
        assert_eq!(
            r["usage"],
            json!({"prompt_tokens": prompt, "total_tokens": prompt + 2, "completion_tokens": 2,
                   "prompt_tokens_details": null})
        );
    }
    // Text: the raw golden split into a query and an item tokenizes to the same ids.
    let raw = case("raw-once-upon");
    let text = raw["text"].as_str().expect("text");
    let (q, item) = text.split_at(text.find(" by the sea").expect("split"));
    let top = raw["logits_check"]["top20_token_ids"].clone();
    let body = json!({"query": q, "items": [item], "label_token_ids": [top[0], top[1]]});
    let (status, out) = s.post("/generative_scoring", &body, &[]);
    assert_eq!(status, 200, "{out}");
    let r = json(&out);
    let l = golden_logits(&raw);
    let (l0, l1) = (
        l[top[0].as_u64().expect("id") as usize],
        l[top[1].as_u64().expect("id") as usize],
    );
    let want = 1.0 / (1.0 + (l1 - l0).exp());
    let got = r["data"][0]["score"].as_f64().expect("score");
    assert!((got - want).abs() <= 1e-3, "text: {got} vs HF {want}");
    assert_eq!(r["usage"]["prompt_tokens"], raw["n_prompt_tokens"]);
    // item_first: the item's ids come first (here the whole prompt, the query empty text).
    let body = json!({"query": "", "items": [text], "item_first": true,
                      "label_token_ids": [top[0], top[1]]});
    let (status, out) = s.post("/generative_scoring", &body, &[]);
    assert_eq!(status, 200, "{out}");
    let got = json(&out)["data"][0]["score"].as_f64().expect("score");
    assert!((got - want).abs() <= 1e-3, "item_first: {got} vs HF {want}");
    for (body, message) in [
        (
            json!({"query": "q", "items": ["a"], "label_token_ids": []}),
            "label_token_ids must contain at least one token ID.".to_string(),
        ),
        (
            json!({"query": "q", "items": ["a"], "label_token_ids": [49152]}),
            "label_token_id 49152 is out of vocabulary range [0, 49152). Please provide valid \
             token IDs."
                .to_string(),
        ),
        (
            json!({"query": "q", "items": [], "label_token_ids": [1]}),
            "items must contain at least one item.".to_string(),
        ),
    ] {
        let (status, out) = s.post("/generative_scoring", &body, &[]);
        assert_eq!(status, 400, "{body}: {out}");
        assert_eq!(json(&out)["error"]["message"], message, "{body}");
    }
    let (status, _) = s.post(
        "/generative_scoring",
        &json!({"model": "nope", "query": "q", "items": ["a"], "label_token_ids": [1]}),
        &[],
    );
    assert_eq!(status, 404);
}

/// `aphro serve` on the Gemma-3-270M GGUF (SentencePiece vocabulary, no chat template of
/// its own) with `--chat-template` answers a chat, tokenizing the rendered prompt as the
/// model's own `tokenizer.json` does.
#[test]
fn gemma3_gguf_answers_a_chat_with_the_given_template() {
    let model = assets().join("models/gemma-3-270m-q4_k_m.gguf");
    let model = model.to_string_lossy().into_owned();
    let tok_dir = assets().join("tokenizers/gemma3");
    let cfg: Value = json(
        &std::fs::read_to_string(tok_dir.join("tokenizer_config.json")).expect("gemma3 config"),
    );
    let template = cfg["chat_template"].as_str().expect("gemma3 template");
    let dir = std::env::temp_dir().join(format!("aphro-gemma3-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let template_path = dir.join("gemma3.jinja");
    std::fs::write(&template_path, template).expect("write template");
    let template_path = template_path.to_string_lossy().into_owned();
    let mut args = vec![
        "serve",
        model.as_str(),
        "--served-model-name",
        "gemma",
        "--chat-template",
        template_path.as_str(),
    ];
    args.extend(engine_flags());
    let s = Server::start(&args);
    let chat = json!({"model": "gemma", "messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_tokens": 12, "temperature": 0});
    let (status, body) = s.post("/v1/chat/completions", &chat, &[]);
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(!answer.trim().is_empty(), "{body}");
    let rendered = "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n";
    let hf = aphro_core::tokenizer::Tokenizer::from_file(&tok_dir.join("tokenizer.json"))
        .expect("gemma3 tokenizer");
    let want = hf.encode(rendered, false).expect("encodes").len() as u64;
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(want), "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}
