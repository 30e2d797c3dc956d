//! `--data-parallel-size 2` on the real model (SmolLM2-135M-Instruct Q4_1): two engines
//! behind one [`ServingEngine`], each with its own KV pool and thread pool. Which engine ran
//! a request is read from that engine's own metrics, never from the router.
//!
//! Checked: a session stays on one engine; without one, a prompt goes to the engine that was
//! sent the longest prefix of it (ties to the least loaded); an engine that fails is taken out
//! and the other serves everything; with none left, requests get the 503 error naming the
//! reason; both engines give the greedy tokens one engine gives.

use std::path::PathBuf;

use aphro_core::protocol::GenerateRequest;
use aphro_engine::serving::{
    parse_generate_request, MaxModelLen, ServingConfig, ServingEngine, ServingError,
};
use futures::executor::block_on;
use serde_json::json;

fn gguf() -> String {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let p = assets.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch_assets.py",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

fn serving(dp: usize) -> ServingEngine {
    ServingEngine::new(ServingConfig {
        model: gguf(),
        kv_cache_memory: Some(32 << 20),
        max_model_len: MaxModelLen::Auto,
        max_num_seqs: 8,
        seed: Some(0),
        data_parallel_size: dp,
        ..ServingConfig::default()
    })
    .expect("engines start")
}

fn greedy(id: &str, prompt: &[u32], max_tokens: i64) -> GenerateRequest {
    parse_generate_request(&json!({
        "request_id": id, "token_ids": prompt,
        "sampling_params": {"temperature": 0.0, "max_tokens": max_tokens},
    }))
    .expect("valid request")
}

/// Requests each engine has finished, from its own (synced) metrics.
fn served(s: &ServingEngine) -> Vec<u64> {
    s.engines()
        .map(|e| e.metrics_synced().request_success.values().sum())
        .collect()
}

/// Run one request to the end and return the engine that served it and its tokens.
fn run(s: &ServingEngine, req: GenerateRequest, session: Option<&str>) -> (usize, Vec<u32>) {
    let before = served(s);
    let resp = block_on(
        s.generate_routed(req, None, session)
            .expect("accepted")
            .collect_response(),
    )
    .expect("generates");
    let after = served(s);
    let moved: Vec<usize> = (0..after.len())
        .filter(|&i| after[i] != before[i])
        .collect();
    assert_eq!(moved.len(), 1, "{before:?} -> {after:?}");
    (
        moved[0],
        resp.choices[0].token_ids.clone().unwrap_or_default(),
    )
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 200 + (seed * 7919 + i * 31) % 20000)
        .collect()
}

#[test]
fn sessions_stay_on_one_engine_and_both_engines_serve() {
    let s = serving(2);
    assert_eq!(s.engines().count(), 2);
    let mut homes = std::collections::HashMap::new();
    // Start session "b" while "a" is running so the two sessions land on different engines
    // (no shared prefix: the least loaded engine takes the new one).
    let a = s
        .generate_routed(greedy("a0", &prompt(1, 40), 24), None, Some("a"))
        .expect("a");
    let b = s
        .generate_routed(greedy("b0", &prompt(2, 40), 4), None, Some("b"))
        .expect("b");
    block_on(b.collect_response()).expect("b runs");
    block_on(a.collect_response()).expect("a runs");
    for turn in 1..4 {
        for session in ["a", "b"] {
            // Each turn is a different prompt: only the session keeps it in place.
            let p = prompt(
                10 * turn + session.len() as u32 + (session == "b") as u32,
                20,
            );
            let (e, _) = run(
                &s,
                greedy(&format!("{session}{turn}"), &p, 2),
                Some(session),
            );
            assert_eq!(
                *homes.entry(session).or_insert(e),
                e,
                "session {session} moved"
            );
        }
    }
    assert_ne!(homes["a"], homes["b"], "{homes:?}");
}

#[test]
fn a_prompt_goes_to_the_engine_that_saw_its_prefix() {
    let s = serving(2);
    let (pa, pb) = (prompt(3, 64), prompt(4, 64));
    // A runs (engine 0: both idle, lowest rank); B arrives while A is running (engine 1).
    let a = s
        .generate_routed(greedy("a", &pa, 16), None, None)
        .expect("a");
    let b = s
        .generate_routed(greedy("b", &pb, 2), None, None)
        .expect("b");
    block_on(b.collect_response()).expect("b");
    block_on(a.collect_response()).expect("a");
    let m = served(&s);
    assert_eq!(m, vec![1, 1]);
    // Later prompts that extend A or B follow them, in either order.
    for (p, want) in [(&pb, 1), (&pa, 0), (&pa, 0), (&pb, 1)] {
        let mut longer = p.clone();
        longer.extend([5, 6, 7]);
        let (e, _) = run(&s, greedy("x", &longer, 2), None);
        assert_eq!(e, want);
    }
}

#[test]
fn engines_agree_and_a_failed_engine_is_taken_out() {
    let one = serving(1);
    let s = serving(2);
    let (pa, pb) = (prompt(5, 30), prompt(6, 30));
    let (_, want_a) = run(&one, greedy("ref-a", &pa, 12), None);
    let (_, want_b) = run(&one, greedy("ref-b", &pb, 12), None);
    // A runs on engine 0, B (arriving while A runs) on engine 1: each equals one engine.
    let a = s
        .generate_routed(greedy("a", &pa, 12), None, None)
        .expect("a");
    let b = s
        .generate_routed(greedy("b", &pb, 12), None, None)
        .expect("b");
    let (ra, rb) = (
        block_on(a.collect_response()).expect("a"),
        block_on(b.collect_response()).expect("b"),
    );
    assert_eq!(ra.choices[0].token_ids.as_deref(), Some(&want_a[..]));
    assert_eq!(rb.choices[0].token_ids.as_deref(), Some(&want_b[..]));
    assert_eq!(served(&s), vec![1, 1]);

    // Engine 0 fails: every request, even one with the prefix engine 0 saw, goes to 1.
    s.engines()
        .next()
        .expect("engine 0")
        .inject_failure("injected: device lost");
    while s.engines().next().expect("engine 0").is_healthy() {
        std::thread::yield_now();
    }
    assert!(s.is_healthy());
    assert_eq!(s.failure(), None);
    for i in 0..3 {
        let (e, got) = run(&s, greedy(&format!("after{i}"), &pa, 12), Some("pinned"));
        assert_eq!((e, got), (1, want_a.clone()));
    }

    // None left: a 503 naming the reason, on every new request and in `failure()`.
    s.engines()
        .nth(1)
        .expect("engine 1")
        .inject_failure("injected: out of memory");
    while s.is_healthy() {
        std::thread::yield_now();
    }
    let err = match s.generate(greedy("late", &pa, 2), None) {
        Err(e) => e,
        Ok(_) => panic!("a request was accepted with no engine left"),
    };
    assert!(matches!(err, ServingError::Engine(_)));
    assert_eq!(err.status(), 503);
    let reason = s.failure().expect("a reason");
    assert!(
        reason.contains("device lost") && reason.contains("out of memory"),
        "{reason}"
    );
}

#[test]
fn zero_engines_is_a_start_up_error() {
    let err = ServingEngine::new(ServingConfig {
        model: gguf(),
        data_parallel_size: 0,
        ..ServingConfig::default()
    });
    assert!(matches!(err, Err(ServingError::Load(m)) if m.contains("data-parallel-size")));
}

/// `--device` with a list: one engine per device (`--data-parallel-size` left at 1 or equal
/// to the list), refused before any model loads when the list cannot place the engines.
#[test]
fn a_device_list_places_one_engine_on_each_device() {
    let start = |device: &str, dp: usize| {
        ServingEngine::new(ServingConfig {
            model: gguf(),
            device: device.parse().expect("a device list"),
            kv_cache_memory: Some(32 << 20),
            max_model_len: MaxModelLen::Auto,
            data_parallel_size: dp,
            ..ServingConfig::default()
        })
    };
    let Err(ServingError::Load(e)) = start("cpu,cuda:1", 3) else {
        panic!("three engines on two devices must be refused")
    };
    assert!(e.contains("names 2 devices") && e.contains("is 3"), "{e}");
    if !aphro_engine::backend::cuda_compiled() {
        // Each listed GPU is checked before anything loads.
        let Err(ServingError::Load(e)) = start("cuda:0,cuda:1", 1) else {
            panic!("a CUDA device without CUDA support must be refused")
        };
        assert!(e.contains("no CUDA support"), "{e}");
    }
    // One device for several engines: all of them there.
    let s = start("cpu", 2).expect("two engines on the CPU");
    assert_eq!(s.engines().count(), 2);
}
