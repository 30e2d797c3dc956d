//! `api.md` §6/§7 error cases (status + message), checked before any decode or parse, and the exact
//! response shapes of §13.
mod common;
use aphro_core::protocol::{
    parse_derender_chat_body, parse_derender_completion_body, DerenderChatBody,
    DerenderCompletionBody,
};
use aphro_core::{DerenderOptions, Derenderer, Error, Model};
use serde_json::{json, Value};
use std::sync::Arc;

fn model() -> Arc<Model> {
    let p = common::asset("tokenizers/qwen3");
    Arc::new(Model::load(p.to_str().unwrap_or_default()).expect("qwen3 tokenizer"))
}

fn derenderer(parsers: bool) -> Derenderer {
    Derenderer::new(
        model(),
        DerenderOptions {
            served_model_name: Some("qwen".into()),
            tool_call_parser: parsers.then(|| "hermes".into()),
            reasoning_parser: parsers.then(|| "qwen3".into()),
            enable_auto_tool_choice: true,
            max_model_len: Some(64),
            max_logprobs: 5,
            return_tokens_as_token_ids: false,
        },
    )
    .expect("derenderer")
}

fn chat(d: &Derenderer, body: Value) -> Result<Value, Error> {
    match parse_derender_chat_body(&body)? {
        DerenderChatBody::Full(r) => d
            .derender_chat(*r)
            .map(|x| serde_json::to_value(x).unwrap_or_default()),
        DerenderChatBody::Stream(r) => d
            .derender_chat_stream(*r)
            .map(|x| serde_json::to_value(x).unwrap_or_default()),
    }
}

fn completion(d: &Derenderer, body: Value) -> Result<Value, Error> {
    match parse_derender_completion_body(&body)? {
        DerenderCompletionBody::Full(r) => d
            .derender_completion(*r)
            .map(|x| serde_json::to_value(x).unwrap_or_default()),
        DerenderCompletionBody::Stream(r) => d
            .derender_completion_stream(*r)
            .map(|x| serde_json::to_value(x).unwrap_or_default()),
    }
}

fn expect_err(r: Result<Value, Error>, status: u16, needle: &str) {
    match r {
        Ok(v) => panic!("expected {status} containing {needle:?}, got OK {v}"),
        Err(e) => {
            assert_eq!(e.status(), status, "status of {e}");
            assert!(
                e.to_string().contains(needle),
                "message {:?} lacks {needle:?}",
                e.to_string()
            );
            let env = e.to_envelope();
            assert_eq!(env["error"]["code"], json!(status));
        }
    }
}

fn gen(ids: Value) -> Value {
    json!({"request_id": "generate-tokens-chatcmpl-abc",
           "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": null, "token_ids": ids}]})
}

fn chat_req() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}]})
}

#[test]
fn unknown_model_is_404() {
    let d = derenderer(false);
    let r = chat(
        &d,
        json!({"model": "nope", "generate_response": gen(json!([1, 2]))}),
    );
    expect_err(r, 404, "The model `nope` does not exist.");
    let r = completion(
        &d,
        json!({"model": "nope", "generate_responses": [gen(json!([1]))]}),
    );
    expect_err(r, 404, "does not exist");
}

#[test]
fn text_mode_response_is_400() {
    let d = derenderer(false);
    let mut g = gen(json!([1, 2]));
    g["output_mode"] = json!("text");
    let r = chat(&d, json!({"generate_response": g}));
    expect_err(r, 400, "output_mode");
    let mut g = gen(json!([1, 2]));
    g["output_mode"] = json!("derender");
    match chat(&d, json!({"generate_response": g})) {
        Err(e) => assert_eq!(e.error_type(), "Bad Request"),
        Ok(_) => panic!("derender-mode response accepted"),
    }
}

#[test]
fn missing_chat_request_with_parser_is_400() {
    let d = derenderer(true);
    let r = chat(&d, json!({"generate_response": gen(json!([1, 2]))}));
    expect_err(
        r,
        400,
        "chat_request is required when a tool or reasoning parser is configured",
    );
}

#[test]
fn empty_token_ids_is_400() {
    let d = derenderer(false);
    expect_err(
        chat(&d, json!({"generate_response": gen(json!([]))})),
        400,
        "choice 0 has empty or null token_ids",
    );
    expect_err(
        chat(&d, json!({"generate_response": gen(Value::Null)})),
        400,
        "choice 0 has empty or null token_ids",
    );
}

#[test]
fn bounds_are_400() {
    let d = derenderer(false);
    // token_ids longer than max_model_len (64).
    let long: Vec<u32> = vec![9707; 65];
    expect_err(
        chat(&d, json!({"generate_response": gen(json!(long))})),
        400,
        "more than max_model_len=64",
    );
    // Too many choices.
    let many: Vec<Value> = (0..16385)
        .map(|i| json!({"index": i, "token_ids": [1]}))
        .collect();
    expect_err(
        chat(
            &d,
            json!({"generate_response": {"request_id": "x", "choices": many}}),
        ),
        400,
        "too many choices",
    );
    // logprobs content longer than max_model_len.
    let mut g = gen(json!([1]));
    let entries: Vec<Value> = (0..65)
        .map(|_| json!({"token_id": 1, "logprob": -0.1}))
        .collect();
    g["choices"][0]["logprobs"] = json!({"content": entries});
    expect_err(
        chat(&d, json!({"generate_response": g})),
        400,
        "logprobs entries",
    );
    // top_logprobs beyond max_logprobs (5, +1 for the sampled token).
    let mut g = gen(json!([1]));
    let top: Vec<Value> = (0..7)
        .map(|i| json!({"token_id": i, "logprob": -1.0, "rank": i + 1}))
        .collect();
    g["choices"][0]["logprobs"] =
        json!({"content": [{"token_id": 1, "logprob": -0.1, "rank": 1, "top_logprobs": top}]});
    expect_err(
        chat(&d, json!({"generate_response": g})),
        400,
        "max_logprobs=5",
    );
    // prompt_token_ids longer than max_model_len.
    expect_err(
        chat(
            &d,
            json!({"generate_response": gen(json!([1])), "prompt_token_ids": long}),
        ),
        400,
        "prompt_token_ids has 65 ids",
    );
    // prompt_logprobs longer than max_model_len.
    let mut g = gen(json!([1]));
    g["prompt_logprobs"] = json!(vec![Value::Null; 65]);
    expect_err(
        chat(&d, json!({"generate_response": g})),
        400,
        "prompt_logprobs has 65 entries",
    );
    // usage overflow: caller-supplied prompt_tokens near u64::MAX.
    expect_err(
        chat(
            &d,
            json!({"generate_response": gen(json!([1, 2])), "prompt_tokens": u64::MAX}),
        ),
        400,
        "overflows",
    );
}

#[test]
fn streaming_errors_are_400() {
    let d = derenderer(true);
    let chunk = json!({"request_id": "generate-tokens-chatcmpl-abc",
        "choices": [{"index": 0, "finish_reason": null, "token_ids": [9707]}]});
    // stop strings cannot be applied to text already sent.
    let mut req = chat_req();
    req["stop"] = json!(["END"]);
    expect_err(
        chat(
            &d,
            json!({"stream": true, "generate_chunk": chunk, "prompt_token_ids": [1],
                   "chat_request": req}),
        ),
        400,
        "stop strings are not supported by streaming derender",
    );
    // prompt_token_ids required with a parser.
    expect_err(
        chat(
            &d,
            json!({"stream": true, "generate_chunk": chunk, "chat_request": chat_req()}),
        ),
        400,
        "prompt_token_ids is required",
    );
    // chat_request required with a parser.
    expect_err(
        chat(
            &d,
            json!({"stream": true, "generate_chunk": chunk, "prompt_token_ids": [1]}),
        ),
        400,
        "chat_request is required",
    );
    // At most one choice per chunk.
    let two = json!({"request_id": "x", "choices": [
        {"index": 0, "token_ids": [1]}, {"index": 1, "token_ids": [1]}]});
    expect_err(
        chat(
            &d,
            json!({"stream": true, "generate_chunk": two, "prompt_token_ids": [1],
                   "chat_request": chat_req()}),
        ),
        400,
        "at most one choice",
    );
    // Inconsistent carried state.
    expect_err(
        chat(
            &d,
            json!({"stream": true, "generate_chunk": chunk, "prompt_token_ids": [1],
                   "chat_request": chat_req(),
                   "stream_state": {"output_token_ids": [1, 2], "output_chunk_lens": [1]}}),
        ),
        400,
        "invalid stream_state",
    );
    // A forged detokenizer window.
    expect_err(
        chat(
            &d,
            json!({"stream": true, "generate_chunk": chunk, "prompt_token_ids": [1],
                   "chat_request": chat_req(),
                   "stream_state": {"aphro": {"v": 2, "tokens": 1, "detokenizer":
                       {"ids": [1], "read_offset": 5, "skip_special_tokens": false}}}}),
        ),
        400,
        "invalid stream_state",
    );
    // prompt + earlier output + delta beyond max_model_len.
    let prompt: Vec<u32> = vec![9707; 64];
    expect_err(
        chat(
            &d,
            json!({"stream": true, "generate_chunk": chunk, "prompt_token_ids": prompt,
                   "chat_request": chat_req()}),
        ),
        400,
        "exceed max_model_len=64",
    );
    // Unknown model in streaming too.
    expect_err(
        chat(
            &d,
            json!({"stream": true, "model": "nope", "generate_chunk": chunk,
                   "prompt_token_ids": [1], "chat_request": chat_req()}),
        ),
        404,
        "does not exist",
    );
}

#[test]
fn completion_errors_are_400() {
    let d = derenderer(false);
    expect_err(
        completion(&d, json!({"generate_responses": []})),
        400,
        "at least 1 item",
    );
    expect_err(
        completion(
            &d,
            json!({"generate_responses": [gen(json!([1]))], "prompt_tokens": [1, 2]}),
        ),
        400,
        "same length",
    );
    expect_err(
        completion(&d, json!({"generate_responses": [gen(json!([]))]})),
        400,
        "choice 0 has empty or null token_ids",
    );
    let chunk = json!({"request_id": "x", "choices": [{"index": 0, "token_ids": [1]}]});
    expect_err(
        completion(
            &d,
            json!({"stream": true, "generate_chunk": chunk,
                   "completion_request": {"prompt": "a", "stop": ["x"]}}),
        ),
        400,
        "stop strings are not supported",
    );
    // Missing required field → structural 400.
    match completion(&d, json!({"stream": false})) {
        Err(e) => {
            assert_eq!(e.status(), 400);
            assert_eq!(e.error_type(), "Bad Request");
        }
        Ok(v) => panic!("accepted {v}"),
    }
}

fn ids(d: &Derenderer, s: &str) -> Vec<u32> {
    d.model().tokenizer.encode(s, false).expect("encode")
}

#[test]
fn chat_shape_matches_observed_vllm() {
    let d = derenderer(true);
    let out = "Need weather</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let mut token_ids = ids(&d, out);
    let eos = d
        .model()
        .tokenizer
        .token_to_id("<|im_end|>")
        .expect("im_end");
    token_ids.push(eos);
    let n = token_ids.len();
    let prompt = ids(&d, "<|im_start|>assistant\n<think>\n");
    let mut req = chat_req();
    req["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let v = chat(
        &d,
        json!({"generate_response": gen(json!(token_ids)), "prompt_tokens": 21,
               "prompt_token_ids": prompt, "chat_request": req}),
    )
    .expect("derender");
    assert_eq!(v["id"], "generate-tokens-chatcmpl-abc");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "qwen");
    let keys: Vec<&str> = v
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    // §13: derender leaves the fingerprint to the serving front end.
    assert_eq!(v["system_fingerprint"], Value::Null);
    assert_eq!(
        keys,
        [
            "id",
            "object",
            "created",
            "model",
            "choices",
            "service_tier",
            "system_fingerprint",
            "usage",
            "prompt_logprobs",
            "prompt_token_ids",
            "prompt_text",
            "kv_transfer_params",
            "ec_transfer_params",
            "metrics"
        ]
    );
    let c = &v["choices"][0];
    assert_eq!(
        c["message"],
        json!({"role": "assistant", "content": null, "refusal": null, "annotations": null,
               "audio": null, "function_call": null,
               "tool_calls": [{"id": c["message"]["tool_calls"][0]["id"], "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}],
               "reasoning": "Need weather"})
    );
    assert!(c["message"]["tool_calls"][0]["id"]
        .as_str()
        .is_some_and(|s| s.starts_with("chatcmpl-tool-")));
    assert_eq!(c["finish_reason"], "tool_calls");
    assert_eq!(c["stop_reason"], Value::Null);
    assert_eq!(c["logprobs"], Value::Null);
    assert_eq!(c["token_ids"], Value::Null);
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 21, "total_tokens": 21 + n, "completion_tokens": n,
               "prompt_tokens_details": null, "completion_tokens_details": null})
    );
}

#[test]
fn stop_token_drop_and_stop_strings() {
    let d = derenderer(false);
    let mut t = ids(&d, "Hello world. END and more");
    let eos = d
        .model()
        .tokenizer
        .token_to_id("<|im_end|>")
        .expect("im_end");
    t.push(eos);
    // Stop string from the request, matched after decoding.
    let v = chat(
        &d,
        json!({"generate_response": gen(json!(t)),
               "chat_request": {"messages": [], "stop": ["END"]}}),
    )
    .expect("derender");
    assert_eq!(v["choices"][0]["message"]["content"], "Hello world. ");
    assert_eq!(v["choices"][0]["stop_reason"], "END");
    // A stop token id from stop_token_ids becomes stop_reason.
    let mut t2 = ids(&d, "Hi");
    t2.push(13);
    let v = chat(
        &d,
        json!({"generate_response": gen(json!(t2)),
               "chat_request": {"messages": [], "stop_token_ids": [13]}}),
    )
    .expect("derender");
    assert_eq!(v["choices"][0]["message"]["content"], "Hi");
    assert_eq!(v["choices"][0]["stop_reason"], 13);
}

#[test]
fn logprobs_resolve_to_chat_and_completion_shapes() {
    let d = derenderer(false);
    let t = ids(&d, "Hi there");
    let entries: Vec<Value> = t
        .iter()
        .map(|&id| {
            json!({"token_id": id, "logprob": -0.5, "rank": 1,
            "top_logprobs": [{"token_id": id, "logprob": -0.5, "rank": 1},
                             {"token_id": 0, "logprob": -2.0, "rank": 2}]})
        })
        .collect();
    let mut g = gen(json!(t));
    g["choices"][0]["finish_reason"] = json!("length");
    g["choices"][0]["logprobs"] = json!({"content": entries});
    let v = chat(
        &d,
        json!({"generate_response": g.clone(),
               "chat_request": {"messages": [], "logprobs": true, "top_logprobs": 1}}),
    )
    .expect("derender");
    let lp = &v["choices"][0]["logprobs"]["content"];
    assert_eq!(lp.as_array().map(Vec::len), Some(t.len()));
    assert_eq!(lp[1]["token"], " there");
    assert_eq!(lp[1]["bytes"], json!(b" there".to_vec()));
    assert_eq!(lp[1]["top_logprobs"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let v = completion(
        &d,
        json!({"generate_responses": [g], "completion_request": {"prompt": "x", "logprobs": 2}}),
    )
    .expect("completion");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["Hi", " there"]));
    assert_eq!(lp["text_offset"], json!([0, 2]));
    assert_eq!(lp["top_logprobs"][1].as_object().map(|o| o.len()), Some(2));
    assert_eq!(v["choices"][0]["text"], "Hi there");
    assert_eq!(v["object"], "text_completion");
}

/// §2.4: a token that is part of a multi-byte character decodes to U+FFFD alone; its logprob
/// `token` is repaired with the preceding sampled ids (vLLM's `_correct_decoded_token`): the
/// leading pieces give `""`, the completing one the whole character, so the tokens concatenate
/// to the text — in one response, and across streamed chunks through the carried context.
#[test]
fn logprob_tokens_of_split_characters_are_repaired() {
    let d = derenderer(false);
    let text = "Crab 🦀, clef 𝄞, ok";
    let t = ids(&d, text);
    let tok = &d.model().tokenizer;
    let alone = |id: u32| tok.decode(&[id], false).expect("decode");
    assert!(
        t.iter().any(|&id| alone(id).ends_with('\u{FFFD}')),
        "the text must hold a character split over tokens"
    );
    let entry = |id: u32| {
        json!({"token_id": id, "logprob": -0.5, "rank": 1,
               "top_logprobs": [{"token_id": id, "logprob": -0.5, "rank": 1}]})
    };
    let check = |lp: &Value| {
        let entries = lp.as_array().expect("logprob entries");
        let mut joined = String::new();
        for (e, &id) in entries.iter().zip(&t) {
            let token = e["token"].as_str().expect("token");
            assert!(!token.contains('\u{FFFD}'), "unrepaired token {token:?}");
            if alone(id).ends_with('\u{FFFD}') {
                assert_eq!(e["bytes"], json!(token.as_bytes()));
            }
            assert_eq!(e["top_logprobs"][0]["token"], e["token"]);
            joined.push_str(token);
        }
        joined
    };
    let mut g = gen(json!(t));
    g["choices"][0]["finish_reason"] = json!("length");
    g["choices"][0]["logprobs"] =
        json!({"content": t.iter().map(|&id| entry(id)).collect::<Vec<_>>()});
    let v = chat(
        &d,
        json!({"generate_response": g.clone(),
               "chat_request": {"messages": [], "logprobs": true, "top_logprobs": 1}}),
    )
    .expect("derender");
    assert_eq!(check(&v["choices"][0]["logprobs"]["content"]), text);
    let v = completion(
        &d,
        json!({"generate_responses": [g], "completion_request": {"prompt": "x", "logprobs": 1}}),
    )
    .expect("completion");
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .map(|a| { a.iter().filter_map(Value::as_str).collect::<String>() }),
        Some(text.to_owned())
    );
    // One token per streamed call: the repair context comes from the carried state.
    let mut state = Value::Null;
    let mut joined = String::new();
    for (i, &id) in t.iter().enumerate() {
        let last = i + 1 == t.len();
        let r = chat(
            &d,
            json!({"stream": true, "stream_state": state,
                   "chat_request": {"messages": [], "logprobs": true, "top_logprobs": 1},
                   "generate_chunk": {"request_id": "g", "choices": [{"index": 0,
                       "token_ids": [id], "finish_reason": if last { json!("length") } else { Value::Null },
                       "logprobs": {"content": [entry(id)]}}]}}),
        )
        .expect("stream call");
        let e = &r["chunk"]["choices"][0]["logprobs"]["content"][0];
        let token = e["token"].as_str().expect("token");
        assert!(
            !token.contains('\u{FFFD}'),
            "unrepaired streamed token {token:?}"
        );
        joined.push_str(token);
        state = r["stream_state"].clone();
    }
    assert_eq!(joined, text);
}

#[test]
fn streaming_usage_only_chunk_and_vllm_state_fields() {
    let d = derenderer(false);
    let r = chat(
        &d,
        json!({"stream": true, "prompt_tokens": 7, "generate_chunk": {"request_id": "g",
            "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}}),
    )
    .expect("usage chunk");
    assert_eq!(r["chunk"]["choices"], json!([]));
    assert_eq!(r["chunk"]["usage"]["prompt_tokens"], 7);
    assert_eq!(r["chunk"]["usage"]["total_tokens"], 12);
    // A state produced by vLLM (replay ids, no `aphro` object) is accepted.
    let first = ids(&d, "Hello");
    let r = chat(
        &d,
        json!({"stream": true, "generate_chunk": {"request_id": "g",
            "choices": [{"index": 0, "token_ids": ids(&d, " world"), "finish_reason": "length"}]},
            "stream_state": {"output_token_ids": first, "output_chunk_lens": [first.len()],
                             "role_sent": true}}),
    )
    .expect("vllm state");
    assert_eq!(r["chunk"]["choices"][0]["delta"]["content"], " world");
    assert_eq!(r["chunk"]["choices"][0]["delta"]["role"], Value::Null);
    assert_eq!(r["chunk"]["choices"][0]["finish_reason"], "length");
    assert_eq!(r["stream_state"]["output_token_ids"], json!([]));
}

#[test]
fn no_panic_on_odd_input() {
    let d = derenderer(true);
    for body in [
        json!(null),
        json!([]),
        json!({"stream": "yes"}),
        json!({"generate_response": {"request_id": "x", "choices": [{"token_ids": [4294967295u64]}]},
               "chat_request": chat_req()}),
        json!({"generate_response": {"request_id": "x", "choices": [{"token_ids": [-1]}]}}),
        json!({"stream": true, "generate_chunk": {"request_id": "x",
            "choices": [{"token_ids": [4294967295u64], "finish_reason": "stop", "stop_reason": 4294967295u64}]},
            "prompt_token_ids": [], "chat_request": chat_req()}),
    ] {
        let _ = chat(&d, body);
    }
}

/// The carried parser snapshot is client data: a forged, foreign or outdated one is a 400 on
/// the portable path (no live state to resume), never a panic.
#[test]
fn tampered_parser_state_is_400() {
    let d = derenderer(true);
    let first = json!({"request_id": "r", "choices": [
        {"index": 0, "token_ids": ids(&d, "<think>a</think>Hi <tool_call>{"), "finish_reason": null}]});
    let out = chat(
        &d,
        json!({"stream": true, "generate_chunk": first, "prompt_token_ids": [1],
               "chat_request": chat_req()}),
    )
    .expect("first call");
    let mut state = out["stream_state"].clone();
    assert_eq!(state["aphro"]["v"], 2);
    assert_eq!(state["aphro"]["parser"]["tool"]["kind"], "format");
    // Portable path: no session, so the snapshot is what the server resumes from.
    state["aphro"]["session"] = Value::Null;
    let next = json!({"request_id": "r", "choices": [
        {"index": 0, "token_ids": ids(&d, "\"name\": \"f\"}"), "finish_reason": null}]});
    let call = |st: &Value| {
        chat(
            &d,
            json!({"stream": true, "generate_chunk": next, "prompt_token_ids": [1],
                   "chat_request": chat_req(), "stream_state": st}),
        )
    };
    call(&state).expect("untampered state resumes");
    let tampered = |f: &dyn Fn(&mut Value)| {
        let mut s = state.clone();
        f(&mut s);
        s
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            tampered(&|s| s["aphro"]["parser"]["tool"]["emitted"] = json!(1_000_000)),
            "invalid stream_state",
        ),
        (
            tampered(&|s| s["aphro"]["parser"]["tool"]["found"] = json!(u64::MAX)),
            "invalid stream_state",
        ),
        (
            tampered(&|s| {
                s["aphro"]["parser"]["reasoning"] = json!({"kind": "buffered", "buf": ""})
            }),
            "invalid stream_state",
        ),
        (
            tampered(&|s| s["aphro"]["parser"]["tool"] = json!({"kind": "none"})),
            "invalid stream_state",
        ),
        (
            tampered(&|s| s["aphro"]["parser"]["v"] = json!(7)),
            "invalid stream_state",
        ),
        (
            tampered(&|s| s["aphro"]["parser"]["tool"]["kind"] = json!("bogus")),
            "unknown variant",
        ),
        (
            tampered(&|s| {
                if let Some(a) = s["aphro"].as_object_mut() {
                    a.remove("parser");
                }
            }),
            "aphro.parser is missing",
        ),
        (
            tampered(&|s| {
                s["aphro"]["v"] = json!(1);
                s["aphro"]["parser_text"] = json!("<think>a</think>Hi <tool_call>{");
            }),
            "unsupported state version 1",
        ),
    ];
    for (st, needle) in cases {
        expect_err(call(&st), 400, needle);
    }
    // A parser snapshot sent to a server without parsers.
    let plain = derenderer(false);
    expect_err(
        chat(
            &plain,
            json!({"stream": true, "generate_chunk": next, "prompt_token_ids": [1],
                   "chat_request": chat_req(), "stream_state": state}),
        ),
        400,
        "no tool or reasoning parser is configured",
    );
}

/// A vLLM-produced stream state is resumed from `output_token_ids`: its `prev_tokens` and
/// offsets must describe the same tokens, or the client gets a 400 instead of text that
/// differs from vLLM's.
#[test]
fn inconsistent_vllm_stream_state_is_400() {
    let d = derenderer(false);
    let out = ids(&d, "Hello world");
    let toks: Vec<String> = out
        .iter()
        .map(|&i| d.model().tokenizer.id_to_token(i).unwrap_or_default())
        .collect();
    let chunk = json!({"request_id": "g", "choices": [{"index": 0, "token_ids": ids(&d, "!"),
        "finish_reason": null}]});
    let call = |state: Value| {
        chat(
            &d,
            json!({"stream": true, "generate_chunk": chunk, "stream_state": state}),
        )
    };
    let n = toks.len();
    // Consistent: prev_tokens are the output's tokens (after up to 7 prompt tokens).
    let mut with_context = vec!["Ġa".to_owned(), "b".to_owned()];
    with_context.extend(toks.clone());
    call(
        json!({"prev_tokens": toks, "prefix_offset": 0, "read_offset": n,
                "output_token_ids": out, "output_chunk_lens": [n]}),
    )
    .expect("consistent state");
    call(
        json!({"prev_tokens": with_context, "prefix_offset": 1, "read_offset": n + 2,
                "output_token_ids": out, "output_chunk_lens": [n]}),
    )
    .expect("consistent state with prompt context");
    // Offsets out of order or past the tokens.
    expect_err(
        call(
            json!({"prev_tokens": toks, "prefix_offset": 2, "read_offset": 1,
                    "output_token_ids": out, "output_chunk_lens": [n]}),
        ),
        400,
        "prefix_offset",
    );
    expect_err(
        call(
            json!({"prev_tokens": toks, "prefix_offset": 0, "read_offset": n + 1,
                    "output_token_ids": out, "output_chunk_lens": [n]}),
        ),
        400,
        "read_offset",
    );
    // prev_tokens that are not the output's tokens.
    let mut wrong = toks.clone();
    wrong[n - 1] = "Ġforged".into();
    expect_err(
        call(
            json!({"prev_tokens": wrong, "prefix_offset": 0, "read_offset": n,
                    "output_token_ids": out, "output_chunk_lens": [n]}),
        ),
        400,
        "is not the token of output_token_ids",
    );
    // More prompt context than vLLM ever carries.
    let mut long = vec!["x".to_owned(); 8];
    long.extend(toks);
    expect_err(
        call(
            json!({"prev_tokens": long, "prefix_offset": 0, "read_offset": n + 8,
                    "output_token_ids": out, "output_chunk_lens": [n]}),
        ),
        400,
        "prompt context",
    );
    // Out-of-vocabulary ids anywhere: carried, streamed or non-streaming.
    expect_err(
        call(json!({"output_token_ids": [9_999_999], "output_chunk_lens": [1]})),
        400,
        "out of vocabulary",
    );
    expect_err(
        chat(&d, json!({"generate_response": gen(json!([9_999_999]))})),
        400,
        "Token id 9999999 is out of vocabulary",
    );
}
