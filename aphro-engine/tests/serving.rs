//! The serving layer on the real model (SmolLM2-135M-Instruct Q4_1): batch invariance with
//! and without prefix caching and under preemption, HF greedy parity through the whole
//! stack, seeded sampling, abort, text mode with stop strings, the `api.md` §4 wire shapes and the
//! handler checks, and 16-bit weight storage against f32.
//!
//! Prompts are short and generations a few tokens, so the file runs in seconds.

use std::path::PathBuf;

use aphro_core::protocol::{GenerateRequest, SamplingParams, StreamOptions};
use aphro_engine::model::{load_flex_runner, ModelDType, ModelLoadConfig};
use aphro_engine::runner::{BatchInput, LogitsWanted, ModelRunner, SeqInput};
use aphro_engine::serving::{
    parse_generate_request, MaxModelLen, ServingConfig, ServingEngine, ServingError, ServingStream,
};
use futures::executor::block_on;
use serde_json::{json, Value};

fn assets_dir() -> PathBuf {
    std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")))
}

fn gguf() -> String {
    let p = assets_dir().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run `python scripts/fetch_assets.py` (or set APHRO_ASSETS)",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

fn cases() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/engine/smollm2-135m-instruct.jsonl"
    );
    std::fs::read_to_string(path)
        .expect("golden cases are committed")
        .lines()
        .map(|l| serde_json::from_str(l).expect("valid jsonl"))
        .collect()
}

fn case(id: &str) -> Value {
    cases()
        .into_iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no case {id}"))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// `APHRO_TEST_DEVICE` (default `cpu`) runs these tests on a GPU (`scripts/gpu-check.sh`).
fn test_device() -> aphro_engine::backend::Device {
    std::env::var("APHRO_TEST_DEVICE")
        .unwrap_or_else(|_| "cpu".into())
        .parse()
        .expect("APHRO_TEST_DEVICE: auto, cpu, cuda or cuda:N")
}

fn engine(cfg: ServingConfig) -> ServingEngine {
    ServingEngine::new(ServingConfig {
        model: gguf(),
        device: test_device().into(),
        ..cfg
    })
    .expect("engine starts")
}

fn small() -> ServingConfig {
    ServingConfig {
        kv_cache_memory: Some(64 << 20),
        max_model_len: MaxModelLen::Auto,
        max_num_batched_tokens: 256,
        max_num_seqs: 32,
        seed: Some(0),
        ..ServingConfig::default()
    }
}

fn greedy(id: &str, prompt: Vec<u32>, max_tokens: i64) -> GenerateRequest {
    request(
        id,
        prompt,
        json!({"temperature": 0.0, "max_tokens": max_tokens}),
    )
}

fn request(id: &str, prompt: Vec<u32>, sampling: Value) -> GenerateRequest {
    parse_generate_request(&json!({
        "request_id": id, "token_ids": prompt, "sampling_params": sampling,
    }))
    .expect("valid request")
}

fn full(s: &ServingEngine, req: GenerateRequest) -> Value {
    let resp = block_on(s.generate_full(req, None)).expect("generates");
    serde_json::to_value(resp).expect("serializes")
}

fn tokens(resp: &Value) -> Vec<u32> {
    ids(&resp["choices"][0]["token_ids"])
}

/// 16 prompts of different lengths (golden prompts, some truncated).
fn mixed_prompts() -> Vec<Vec<u32>> {
    let cs = cases();
    let short: Vec<&Value> = cs
        .iter()
        .filter(|c| c["n_prompt_tokens"].as_u64().unwrap_or(0) <= 60)
        .collect();
    (0..16)
        .map(|i| {
            let p = ids(&short[i % short.len()]["prompt_token_ids"]);
            let cut = (p.len() * (4 + i % 5) / 8).clamp(1, p.len());
            p[..cut].to_vec()
        })
        .collect()
}

fn assert_idle(s: &ServingEngine) {
    let m = s.metrics_synced();
    assert_eq!(m.kv_blocks_in_use, 0, "blocks still in use: {m:?}");
    assert_eq!((m.num_running, m.num_waiting), (0, 0), "{m:?}");
}

/// The same greedy request gives identical tokens alone and inside a batch of 16 mixed
/// prompts, with prefix caching on and off, and under forced preemption.
#[test]
fn greedy_tokens_are_batch_invariant() {
    let target = ids(&case("chat-hello")["prompt_token_ids"]);
    let mut reference: Option<Vec<u32>> = None;
    // SmolLM2 needs 46,080 bytes of KV per token: 4 MiB is 5 blocks of 16, enough for one
    // request but not for 17 at once.
    for (caching, kv, name) in [
        (true, 64 << 20, "prefix caching"),
        (false, 64 << 20, "no prefix caching"),
        (true, 4 << 20, "preemption"),
    ] {
        let s = engine(ServingConfig {
            enable_prefix_caching: caching,
            kv_cache_memory: Some(kv),
            max_num_batched_tokens: 64,
            ..small()
        });
        let alone = tokens(&full(&s, greedy("alone", target.clone(), 8)));
        assert_eq!(alone.len(), 8, "{name}");
        if let Some(r) = &reference {
            assert_eq!(
                &alone, r,
                "{name}: alone differs from the first configuration"
            );
        }
        reference.get_or_insert(alone.clone());
        let mut streams: Vec<ServingStream> = mixed_prompts()
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                s.generate(greedy(&format!("mix-{i}"), p, 8), None)
                    .expect("accepted")
            })
            .collect();
        streams.insert(
            7,
            s.generate(greedy("target", target.clone(), 8), None)
                .expect("accepted"),
        );
        let resps = block_on(futures::future::join_all(
            streams.into_iter().map(ServingStream::collect_response),
        ));
        let got = serde_json::to_value(resps[7].as_ref().expect("target ran")).expect("json");
        assert_eq!(got["request_id"], "generate-tokens-target");
        assert_eq!(tokens(&got), alone, "{name}: batched differs from alone");
        assert!(resps.iter().all(Result::is_ok), "{name}");
        let m = s.metrics_synced();
        if name == "preemption" {
            assert!(m.num_preemptions > 0, "no preemption happened: {m:?}");
        }
        assert_idle(&s);
    }
}

/// Greedy output through the full engine equals HF float32's for golden cases.
#[test]
fn float32_greedy_matches_hf() {
    let s = engine(ServingConfig {
        dtype: ModelDType::Float32,
        ..small()
    });
    for id in ["chat-capital-france", "chat-fr-chat-chien"] {
        let c = case(id);
        let want = ids(&c["hf_f32"]["greedy_token_ids"]);
        let resp = full(
            &s,
            greedy(
                id,
                ids(&c["prompt_token_ids"]),
                c["max_new_tokens"].as_i64().expect("max"),
            ),
        );
        assert_eq!(tokens(&resp), want, "{id}");
        // The primary EOS ends the choice with stop_reason null (and is in token_ids).
        assert_eq!(resp["choices"][0]["finish_reason"], "stop");
        assert_eq!(resp["choices"][0]["stop_reason"], Value::Null);
    }
}

/// A seeded sampled request gives the same tokens twice, alone or next to other work.
#[test]
fn seeded_sampling_is_reproducible() {
    let s = engine(small());
    let prompt = ids(&case("raw-once-upon")["prompt_token_ids"]);
    let sampling = json!({"temperature": 1.0, "top_p": 0.9, "seed": 1234, "max_tokens": 12,
                          "ignore_eos": true});
    let a = tokens(&full(&s, request("a", prompt.clone(), sampling.clone())));
    let other = s
        .generate(
            greedy("other", ids(&case("chat-hello")["prompt_token_ids"]), 12),
            None,
        )
        .expect("accepted");
    let b = s
        .generate(request("b", prompt, sampling), None)
        .expect("accepted");
    let (_, b) = block_on(futures::future::join(
        other.collect_response(),
        b.collect_response(),
    ));
    let b = serde_json::to_value(b.expect("ran")).expect("json");
    assert_eq!(a.len(), 12);
    assert_eq!(a, tokens(&b));
}

/// Abort mid-generation: the stream ends with `abort`, and nothing stays allocated.
#[test]
fn abort_mid_generation_frees_everything() {
    let s = engine(small());
    let prompt = ids(&case("chat-hello")["prompt_token_ids"]);
    let mut req = request(
        "long",
        prompt,
        json!({"temperature": 0.0, "max_tokens": 500, "ignore_eos": true}),
    );
    req.stream = Some(true);
    let mut stream = s.generate(req, None).expect("accepted");
    let mut events = Vec::new();
    block_on(async {
        while let Some(ev) = stream.next_event().await {
            let ev = ev.expect("no error").to_json();
            if events.len() == 2 {
                s.abort(&["generate-tokens-long"]);
            }
            events.push(ev);
        }
    });
    let last = events.last().expect("events");
    assert_eq!(last["choices"][0]["finish_reason"], "abort");
    assert!(
        events.len() < 100,
        "abort took too long: {} events",
        events.len()
    );
    assert_idle(&s);
}

/// Text mode: incremental text, a stop string cuts it and ends the request (blocks freed).
#[test]
fn text_mode_with_stop_strings() {
    // f32: the HF greedy answer, "The capital of France is Paris." (Q4_1 answers otherwise).
    let s = engine(ServingConfig {
        dtype: ModelDType::Float32,
        ..small()
    });
    let prompt = ids(&case("chat-capital-france")["prompt_token_ids"]);
    let text_req = |stop: Value, include: bool, stream: bool| {
        let mut r = request(
            "t",
            prompt.clone(),
            json!({"temperature": 0.0, "max_tokens": 30, "stop": stop,
                   "include_stop_str_in_output": include, "logprobs": 1}),
        );
        r.output_mode = "text".into();
        r.stream = Some(stream);
        r
    };
    // No stop string: the whole answer, without the EOS text (skip_special_tokens).
    let plain = full(&s, text_req(json!([]), false, false));
    assert_eq!(plain["output_mode"], "text");
    assert_eq!(
        plain["choices"][0]["text"],
        "The capital of France is Paris."
    );
    let lp = &plain["choices"][0]["logprobs"]["content"][0];
    assert_eq!(lp["token"], "The");
    assert_eq!(lp["bytes"], json!([84, 104, 101]));
    assert!(lp["top_logprobs"].as_array().is_some_and(|t| !t.is_empty()));

    let cut = full(&s, text_req(json!(["Paris", "zzz"]), false, false));
    let c = &cut["choices"][0];
    assert_eq!(c["text"], "The capital of France is ");
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["stop_reason"], "Paris");
    // token_ids include the ids of the stop string.
    assert_eq!(ids(&c["token_ids"]), vec![504, 3575, 282, 4649, 314, 7042]);
    assert_eq!(
        c["logprobs"]["content"].as_array().map(Vec::len),
        Some(6),
        "one logprob entry per returned token"
    );
    assert_idle(&s);
    // The request the stop string ended counts as finished by "stop" (vLLM's frontend
    // finishes it so), not as aborted.
    let m = s.metrics_synced();
    let reasons = |r: &str| m.request_success.get(r).copied().unwrap_or(0);
    assert_eq!(
        (reasons("stop"), reasons("abort")),
        (2, 0),
        "{:?}",
        m.request_success
    );

    let kept = full(&s, text_req(json!(["Paris"]), true, false));
    assert_eq!(kept["choices"][0]["text"], "The capital of France is Paris");

    // Streaming: the deltas add up to the same text.
    let mut st = s
        .generate(text_req(json!(["Paris"]), false, true), None)
        .expect("ok");
    let mut text = String::new();
    let mut last = Value::Null;
    block_on(async {
        while let Some(ev) = st.next_event().await {
            let ev = ev.expect("no error").to_json();
            text.push_str(ev["choices"][0]["text"].as_str().unwrap_or(""));
            last = ev;
        }
    });
    assert_eq!(text, "The capital of France is ");
    assert_eq!(last["choices"][0]["stop_reason"], "Paris");
    assert_idle(&s);
}

/// With `n > 1`, a stop string that ends one choice stops the engine generating it, while
/// the other choice comes out as it would have without the stop string.
#[test]
fn a_stop_string_ends_one_choice_of_several_in_the_engine() {
    let s = engine(small());
    let prompt = ids(&case("chat-capital-france")["prompt_token_ids"]);
    let req = |stop: Value| {
        let mut r = request(
            "n2",
            prompt.clone(),
            json!({"temperature": 1.0, "seed": 11, "n": 2, "max_tokens": 40,
                   "ignore_eos": true, "stop": stop}),
        );
        r.output_mode = "text".into();
        r
    };
    let generated = |s: &ServingEngine| s.metrics_synced().generation_tokens_total;
    let free_run = full(&s, req(json!([])));
    let text = |v: &Value, i: usize| v["choices"][i]["text"].as_str().expect("text").to_owned();
    let (first, second) = (text(&free_run, 0), text(&free_run, 1));
    let before = generated(&s);
    // A word early in choice 0's text that choice 1's text lacks.
    let stop = first
        .split_inclusive(' ')
        .take(6)
        .map(str::trim)
        .find(|w| w.len() > 1 && !second.contains(w))
        .expect("a word only choice 0 has")
        .to_owned();
    let cut = full(&s, req(json!([stop])));
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    assert_eq!(cut["choices"][0]["stop_reason"], json!(stop));
    assert!(first.starts_with(cut["choices"][0]["text"].as_str().expect("text")));
    assert_eq!(text(&cut, 1), second, "the other choice is unaffected");
    assert_eq!(cut["choices"][1]["finish_reason"], "length");
    // 80 tokens without the stop string; with it, choice 0's are cut a few steps after the
    // stop (the stop is applied between engine steps).
    let spent = generated(&s) - before;
    assert!(spent <= 40 + 20, "choice 0 kept generating: {spent} tokens");
    assert_idle(&s);
}

/// §4.2/§4.3 shapes: ids, key presence, logprobs, usage events.
#[test]
fn wire_shapes() {
    let s = engine(small());
    let prompt = ids(&case("chat-hello")["prompt_token_ids"]);
    let mut req = request(
        "shape",
        prompt.clone(),
        json!({"temperature": 0.0, "max_tokens": 3, "logprobs": 2}),
    );
    req.return_token_ids = Some(true);
    let r = block_on(s.generate_full(req.clone(), Some("hdr"))).expect("ok");
    let v = serde_json::to_value(&r).expect("json");
    assert_eq!(v["request_id"], "generate-tokens-hdr");
    for k in [
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
        "ec_transfer_params",
    ] {
        assert!(
            v.as_object().is_some_and(|o| o.contains_key(k)),
            "missing {k}"
        );
    }
    assert_eq!(ids(&v["prompt_token_ids"]), prompt);
    let c = &v["choices"][0];
    assert!(c.get("text").is_none(), "tokens mode has no text");
    for k in [
        "index",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "routed_experts",
        "sampling_mask",
        "weight_versions",
    ] {
        assert!(
            c.as_object().is_some_and(|o| o.contains_key(k)),
            "choice lacks {k}"
        );
    }
    assert_eq!(c["finish_reason"], "length");
    let content = c["logprobs"]["content"].as_array().expect("content");
    assert_eq!(content.len(), 3);
    let first = &content[0];
    assert_eq!(first["token_id"], c["token_ids"][0]);
    assert_eq!(first["rank"], 1, "greedy picks rank 1");
    let top = first["top_logprobs"].as_array().expect("top");
    assert_eq!(top[0]["token_id"], first["token_id"], "sampled token first");
    assert!(top.len() == 2 || top.len() == 3);
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], prompt.len() + 3);

    // Streaming with usage: prompt ids on the first event only, per-event usage, and a
    // final usage-only event without nulls.
    req.stream = Some(true);
    req.request_id = "shape2".into();
    req.stream_options = Some(StreamOptions {
        include_usage: true,
        continuous_usage_stats: true,
    });
    let mut st = s.generate(req, None).expect("ok");
    let mut evs = Vec::new();
    block_on(async {
        while let Some(ev) = st.next_event().await {
            evs.push(ev.expect("no error").to_json());
        }
    });
    assert_eq!(evs.len(), 4, "{evs:?}");
    assert!(evs[0].get("prompt_token_ids").is_some());
    assert!(evs[1].get("prompt_token_ids").is_none());
    assert!(evs[0].get("model").is_none() && evs[0].get("metrics").is_none());
    assert_eq!(evs[1]["usage"]["completion_tokens"], 2);
    let last = &evs[3];
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": prompt.len(), "total_tokens": prompt.len() + 3,
               "completion_tokens": 3})
    );
}

fn err(r: Result<ServingStream, ServingError>) -> Value {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_envelope()["error"].clone(),
    }
}

/// The §4.1 handler checks and §10's `max_tokens` recomputation.
#[test]
fn handler_checks_and_max_tokens_default() {
    let s = engine(ServingConfig {
        max_num_seqs: 4,
        max_model_len: MaxModelLen::Tokens(40),
        ..small()
    });
    let prompt = ids(&case("chat-hello")["prompt_token_ids"]); // 31 tokens
    let e = err(s.generate(
        request("n", prompt.clone(), json!({"n": 5, "temperature": 1.0})),
        None,
    ));
    assert_eq!(
        e["message"],
        "sampling_params.n must be at most the server's max_num_seqs (4), got 5."
    );
    assert_eq!(e["code"], 400);
    let e = err(s.generate(request("t", prompt.clone(), json!({"top_p": 0})), None));
    assert_eq!(e["param"], "top_p");
    let mut d = request("d", prompt.clone(), json!({}));
    d.output_mode = "derender".into();
    d.stream = Some(true);
    assert_eq!(
        err(s.generate(d, None))["message"],
        "output_mode='derender' does not support stream=true."
    );
    let mut m = request("m", prompt.clone(), json!({}));
    m.model = Some("nope".into());
    assert_eq!(err(s.generate(m, None))["code"], 404);
    let long: Vec<u32> = (0..41).map(|i| 100 + i).collect();
    assert_eq!(
        err(s.generate(request("l", long, json!({})), None))["message"],
        "Input length (41) exceeds model's maximum context length (40)."
    );
    // `max_tokens` absent: fill the context (40 - 31 = 9); present: kept.
    let absent = full(
        &s,
        request(
            "a",
            prompt.clone(),
            json!({"temperature": 0.0, "ignore_eos": true}),
        ),
    );
    assert_eq!(tokens(&absent).len(), 9);
    assert_eq!(absent["choices"][0]["finish_reason"], "length");
    let present = full(
        &s,
        request(
            "p",
            prompt.clone(),
            json!({"temperature": 0.0, "ignore_eos": true,
                                            "max_tokens": 2}),
        ),
    );
    assert_eq!(tokens(&present).len(), 2);
    // SamplingParams' own default when built in code is 16 (explicit), capped by the room.
    let mut sp = SamplingParams {
        temperature: 0.0,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    sp.max_tokens = Some(16);
    let mut r = request("x", prompt, json!({}));
    r.sampling_params = sp;
    assert_eq!(tokens(&full(&s, r)).len(), 9);

    // A tokens-only server: no stop strings, no text mode.
    let t = engine(ServingConfig {
        tokens_only: true,
        ..small()
    });
    let p = ids(&case("chat-hello")["prompt_token_ids"]);
    assert!(
        err(t.generate(request("s", p.clone(), json!({"stop": ["x"]})), None))["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("stop strings are not supported on a --tokens-only"))
    );
    let mut tm = request("tm", p, json!({}));
    tm.output_mode = "text".into();
    assert!(err(t.generate(tm, None))["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("output_mode='text' requires a tokenizer")));
}

/// `--dtype float16|bfloat16`: 16-bit weights with f32 accumulation track the f32 path.
#[test]
fn half_precision_weights_track_f32() {
    let prompt = ids(&case("chat-capital-france")["prompt_token_ids"]);
    let logits = |dtype| {
        let mut r = load_flex_runner(&ModelLoadConfig {
            model_path: gguf().into(),
            dtype,
            cache_bytes: 8 << 20,
            min_cache_tokens: 0,
            block_size: 16,
            quiet: true,
            device: aphro_engine::backend::Device::Cpu,
            kv_cache_dtype: Default::default(),
        })
        .expect("loads");
        let batch = BatchInput {
            seqs: vec![SeqInput {
                seq_id: 1,
                token_ids: prompt.clone(),
                start_pos: 0,
                block_table: vec![0, 1, 2],
                logits: LogitsWanted::Last,
            }],
        };
        r.execute(&batch).expect("runs").remove(0).data.to_vec()
    };
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > v[b] { i } else { b })
    };
    let reference = logits(ModelDType::Float32);
    let spread = reference.iter().cloned().fold(f32::MIN, f32::max)
        - reference.iter().cloned().fold(f32::MAX, f32::min);
    for (dtype, tol) in [(ModelDType::Float16, 0.01), (ModelDType::BFloat16, 0.05)] {
        let got = logits(dtype);
        let max_err = got
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            max_err <= tol * spread,
            "{dtype:?}: max |Δlogit| {max_err} vs spread {spread}"
        );
        assert_eq!(argmax(&got), argmax(&reference), "{dtype:?}");
    }
}

/// A client cannot jump the queue under the default first-come-first-served policy, and
/// two clients that send the same request id each get their own request; an abort by that
/// id reaches both.
#[test]
fn priority_needs_the_policy_and_reused_ids_stay_apart() {
    use aphro_engine::serving::SchedulingPolicy;
    let target = ids(&case("chat-hello")["prompt_token_ids"]);
    let s = engine(small());
    let mut req = no_eos("p", target.clone(), 2);
    req.priority = -1;
    let err = s.generate(req, None).err().expect("refused");
    assert_eq!(err.status(), 400);
    assert_eq!(
        err.to_string(),
        "Got priority -1 but Priority scheduling is not enabled."
    );
    assert_eq!(err.param(), Some("priority"));

    // Same external id twice: both run to the end with their own tokens.
    let a = s
        .generate(no_eos("same", target.clone(), 6), None)
        .expect("first");
    let b = s
        .generate(no_eos("same", target.clone(), 6), None)
        .expect("second, same id");
    assert_eq!(s.num_in_flight(), 2);
    let (ra, rb) = block_on(futures::future::join(
        a.collect_response(),
        b.collect_response(),
    ));
    for r in [ra, rb] {
        let v = serde_json::to_value(r.expect("ran")).expect("json");
        assert_eq!(v["request_id"], "generate-tokens-same");
        assert_eq!(tokens(&v).len(), 6);
    }
    assert_eq!(s.num_in_flight(), 0);

    // An abort by the shared wire id aborts every request under it.
    let a = s
        .generate(no_eos("twin", target.clone(), 400), None)
        .expect("first");
    let b = s
        .generate(no_eos("twin", target.clone(), 400), None)
        .expect("second");
    s.abort(&["generate-tokens-twin"]);
    let (ra, rb) = block_on(futures::future::join(
        a.collect_response(),
        b.collect_response(),
    ));
    for r in [ra, rb] {
        let v = serde_json::to_value(r.expect("ran")).expect("json");
        assert_eq!(v["choices"][0]["finish_reason"], "abort", "{v}");
    }
    assert_idle(&s);

    let s = engine(ServingConfig {
        scheduling_policy: SchedulingPolicy::Priority,
        ..small()
    });
    let mut req = no_eos("p", target, 2);
    req.priority = -1;
    let v = serde_json::to_value(block_on(s.generate_full(req, None)).expect("accepted"))
        .expect("json");
    assert_eq!(tokens(&v).len(), 2);
}

#[test]
fn sampling_params_must_be_an_object() {
    for bad in [json!([]), json!("x"), json!(3)] {
        let err = parse_generate_request(&json!({"token_ids": [1], "sampling_params": bad}))
            .expect_err("refused");
        assert_eq!(err.status(), 400);
        assert_eq!(err.param(), Some("body.sampling_params"));
    }
}

fn no_eos(id: &str, prompt: Vec<u32>, max_tokens: i64) -> GenerateRequest {
    request(
        id,
        prompt,
        json!({"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": true}),
    )
}

/// `--max-model-len`: the model's context by default (the cache is sized to hold it unless
/// its size is given, and then start-up fails when it cannot); `auto` fits the context to
/// the cache; an explicit length is served as is.
#[test]
fn max_model_len_policy() {
    let start = |kv: Option<usize>, len: MaxModelLen| {
        ServingEngine::new(ServingConfig {
            model: gguf(),
            device: test_device().into(),
            kv_cache_memory: kv,
            max_model_len: len,
            ..ServingConfig::default()
        })
    };
    // SmolLM2's context is 8192; 16 MiB of f32 KV holds ~360 of its tokens.
    let full = start(None, MaxModelLen::Model).expect("default start");
    assert_eq!(full.max_model_len(), 8192);
    drop(full);
    let err = start(Some(16 << 20), MaxModelLen::Model)
        .err()
        .expect("a cache too small for the context is refused")
        .to_string();
    assert!(err.contains("max seq len (8192)"), "{err}");
    assert!(err.contains("estimated maximum model length is"), "{err}");
    assert!(err.contains("--max-model-len auto"), "{err}");
    let fitted = start(Some(16 << 20), MaxModelLen::Auto).expect("auto start");
    assert!(
        (300..8192).contains(&fitted.max_model_len()),
        "{}",
        fitted.max_model_len()
    );
    drop(fitted);
    let fixed = start(Some(16 << 20), MaxModelLen::Tokens(200)).expect("fixed start");
    assert_eq!(fixed.max_model_len(), 200);
    drop(fixed);
    let err = start(None, MaxModelLen::Tokens(9000))
        .err()
        .expect("longer than the model")
        .to_string();
    assert!(err.contains("maximum context length 8192"), "{err}");
}

#[test]
fn max_model_len_parses_vllm_spellings() {
    let p = |s: &str| s.parse::<MaxModelLen>();
    assert_eq!(p("4096"), Ok(MaxModelLen::Tokens(4096)));
    assert_eq!(p("32k"), Ok(MaxModelLen::Tokens(32_000)));
    assert_eq!(p("32K"), Ok(MaxModelLen::Tokens(32_768)));
    assert_eq!(p("25.6k"), Ok(MaxModelLen::Tokens(25_600)));
    assert_eq!(p("auto"), Ok(MaxModelLen::Auto));
    assert_eq!(p("-1"), Ok(MaxModelLen::Auto));
    for bad in ["", "0", "-2", "x", "1q", "1e999"] {
        assert!(p(bad).is_err(), "{bad:?}");
    }
}

/// `stream_interval`: the first token goes out at once, then events of `stream_interval`
/// tokens, and the finishing event with what is left; tokens, text and logprobs all arrive
/// and match the unbatched stream.
#[test]
fn stream_interval_batches_events() {
    let s = engine(small());
    let prompt = ids(&case("chat-hello")["prompt_token_ids"]);
    let run = |interval: Option<i64>| {
        let mut sp = json!({"temperature": 0.0, "max_tokens": 10, "ignore_eos": true,
                            "logprobs": 1});
        if let Some(n) = interval {
            sp["stream_interval"] = json!(n);
        }
        let mut req = request("si", prompt.clone(), sp);
        req.stream = Some(true);
        req.output_mode = "text".into();
        let mut stream = s.generate(req, None).expect("accepted");
        let mut events = Vec::new();
        block_on(async {
            while let Some(ev) = stream.next_event().await {
                events.push(ev.expect("no error").to_json());
            }
        });
        let choices: Vec<Value> = events
            .iter()
            .filter_map(|e| e["choices"].get(0).cloned())
            .collect();
        let sizes: Vec<usize> = choices
            .iter()
            .map(|c| c["token_ids"].as_array().map_or(0, Vec::len))
            .collect();
        let text: String = choices.iter().filter_map(|c| c["text"].as_str()).collect();
        let logprobs: usize = choices
            .iter()
            .map(|c| c["logprobs"]["content"].as_array().map_or(0, Vec::len))
            .sum();
        (sizes, text, logprobs)
    };
    let (plain, plain_text, plain_lp) = run(None);
    assert_eq!(plain.iter().sum::<usize>(), 10);
    let (batched, text, lp) = run(Some(4));
    assert_eq!(batched, vec![1, 4, 4, 1], "{batched:?}");
    assert_eq!(text, plain_text);
    assert_eq!((lp, plain_lp), (10, 10));
    assert_idle(&s);
}

/// What the engine cannot do yet is refused by name at the library entry point, so the HTTP
/// route, `aphro generate` and the Python `Engine` all refuse it.
#[test]
fn unsupported_generate_fields_are_refused_by_name() {
    let s = engine(small());
    let prompt = ids(&case("chat-hello")["prompt_token_ids"]);
    for (body, param) in [
        (
            json!({"sampling_params": {"max_tokens": 2, "thinking_token_budget": 8}}),
            "thinking_token_budget",
        ),
        (
            json!({"sampling_params": {"max_tokens": 2, "repetition_detection": {"max_pattern_size": 4}}}),
            "repetition_detection",
        ),
        (
            json!({"sampling_params": {"max_tokens": 2}, "content_parts": [{"type": "image"}]}),
            "content_parts",
        ),
        (
            json!({"sampling_params": {"max_tokens": 2}, "features": {"mm_hashes": {}}}),
            "features",
        ),
    ] {
        let mut b = body;
        b["request_id"] = json!("u");
        b["token_ids"] = json!(prompt);
        let req = parse_generate_request(&b).expect("parses");
        let err = s.generate(req, None).err().expect("refused");
        assert_eq!(err.param(), Some(param), "{err}");
        assert!(err.to_string().contains("not supported"), "{err}");
    }
    // Empty or null values are not requests for the feature.
    let b = json!({"request_id": "ok", "token_ids": prompt, "sampling_params": {"max_tokens": 1},
                   "content_parts": [], "features": null});
    let req = parse_generate_request(&b).expect("parses");
    block_on(s.generate_full(req, None)).expect("accepted");
}
