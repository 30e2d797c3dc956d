//! The threaded `Engine` facade: streaming, abort, stream drop, n>1, errors, metrics.
mod common;

use aphro_engine::engine::{Engine, EngineConfig, EngineError, GenerateStream};
use aphro_engine::request::{
    EngineOutput, EngineRequest, FinishReason, SamplingConfig, ValidationError,
};
use std::sync::Arc;

use common::{oracle_greedy, prompt, FakeRunner, Gate, OpenOnDrop, TestRng};
use futures::executor::block_on;
use futures::StreamExt;

fn engine(blocks: usize) -> Engine {
    let cfg = EngineConfig {
        max_num_batched_tokens: 32,
        max_num_seqs: 8,
        seed: Some(3),
        ..Default::default()
    };
    Engine::new(Box::new(FakeRunner::new(blocks, 4)), cfg).expect("engine")
}

/// An engine whose steps only run when the test grants permits. Keep the guard alive
/// for the test's duration (it is dropped before the engine, opening the gate).
fn gated_engine(blocks: usize) -> (Engine, Arc<Gate>, OpenOnDrop) {
    let gate = Arc::new(Gate::default());
    let mut runner = FakeRunner::new(blocks, 4);
    runner.gate = Some(gate.clone());
    let cfg = EngineConfig {
        max_num_batched_tokens: 32,
        max_num_seqs: 8,
        seed: Some(3),
        ..Default::default()
    };
    let e = Engine::new(Box::new(runner), cfg).expect("engine");
    // Bindings drop in reverse order: the guard (last) opens the gate before the engine
    // shuts down.
    let guard = OpenOnDrop(gate.clone());
    (e, gate, guard)
}

fn greedy(id: &str, p: Vec<u32>, max_tokens: Option<i64>) -> EngineRequest {
    EngineRequest::new(
        id,
        p,
        SamplingConfig {
            ignore_eos: true,
            max_tokens,
            ..SamplingConfig::greedy(1)
        },
    )
}

fn drain(s: GenerateStream) -> Vec<Result<EngineOutput, EngineError>> {
    block_on(s.collect::<Vec<_>>())
}

#[test]
fn streams_one_delta_per_step_and_matches_the_oracle() {
    let e = engine(64);
    let p = prompt(3, 10);
    let outs = drain(e.generate(greedy("a", p.clone(), Some(12))));
    assert_eq!(outs.len(), 12);
    let outs: Vec<EngineOutput> = outs.into_iter().map(|o| o.expect("ok")).collect();
    let tokens: Vec<u32> = outs.iter().flat_map(|o| o.token_ids.clone()).collect();
    assert_eq!(tokens, oracle_greedy(&p, 12));
    assert!(outs[..11]
        .iter()
        .all(|o| o.finish_reason.is_none() && o.token_ids.len() == 1));
    let last = &outs[11];
    assert_eq!(last.finish_reason, Some(FinishReason::Length));
    assert_eq!(
        (last.usage.prompt_tokens, last.usage.completion_tokens),
        (10, 12)
    );
    let m = e.metrics_synced();
    assert_eq!(
        (m.num_running, m.num_waiting, m.kv_blocks_in_use),
        (0, 0, 0)
    );
    assert_eq!(m.generation_tokens_total, 12);
    assert_eq!(m.prompt_tokens_total, 10);
    assert_eq!(m.time_to_first_token.count, 1);
    assert_eq!(m.inter_token_latency.count, 11);
    assert_eq!(m.e2e_request_latency.count, 1);
    assert_eq!(m.request_success.get("length"), Some(&1));
    // The same prompt again hits the prefix cache.
    let outs = drain(e.generate(greedy("b", p.clone(), Some(2))));
    assert_eq!(
        outs.last()
            .and_then(|o| o.as_ref().ok())
            .map(|o| o.usage.cached_tokens),
        Some(8)
    );
    assert!(e.metrics_synced().prefix_cache_hits >= 8);
    e.shutdown();
}

#[test]
fn abort_and_dropped_streams_free_blocks() {
    let (e, gate, _open) = gated_engine(64);
    // No max_tokens: runs until the context (256 tokens) is full unless aborted.
    let mut s = e.generate(greedy("long", prompt(4, 10), None));
    gate.allow(1);
    let first = block_on(s.next()).expect("item").expect("ok");
    assert_eq!(first.token_ids.len(), 1);
    e.abort("long");
    gate.open();
    let rest: Vec<EngineOutput> = block_on(s.collect::<Vec<_>>())
        .into_iter()
        .map(|o| o.expect("ok"))
        .collect();
    let last = rest.last().expect("a final output");
    assert_eq!(last.finish_reason, Some(FinishReason::Abort));
    assert!(rest.len() < 200);
    assert_eq!(e.metrics_synced().kv_blocks_in_use, 0);
}

#[test]
fn generation_tokens_count_what_the_consumer_took() {
    // vLLM counts generated tokens in its frontend: a consumer that stops reading (as a stop
    // string does, a step before its abort reaches the engine) is not charged for the tokens
    // the engine sampled past that point.
    let (e, gate, _open) = gated_engine(64);
    let mut s = e.generate(greedy("stopped", prompt(6, 10), Some(12)));
    gate.allow(4);
    for _ in 0..2 {
        block_on(s.next()).expect("item").expect("ok");
    }
    // The engine runs ahead of the consumer: four tokens sampled (three inter-token gaps).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while e.metrics().inter_token_latency.count < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the engine never ran its four steps"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(s);
    gate.open();
    let m = e.metrics_synced();
    assert!(m.inter_token_latency.count >= 3);
    assert_eq!(m.generation_tokens_total, 2);
    assert_eq!(m.kv_blocks_in_use, 0);
}

#[test]
fn dropping_the_stream_aborts_the_request() {
    // A client that goes away: dropping the stream aborts the request.
    let (e, gate, _open) = gated_engine(64);
    let mut s = e.generate(greedy("gone", prompt(5, 40), None));
    gate.allow(2); // a 32-token prefill chunk, then the rest of the prompt + first token
    block_on(s.next()).expect("item").expect("ok");
    // Not metrics_synced: the engine may be parked in the gated step 3. The published
    // snapshot is at least step 1's, when the prompt's blocks were already held.
    assert!(e.metrics().kv_blocks_in_use > 0);
    drop(s);
    gate.open();
    let m = e.metrics_synced();
    assert_eq!(
        (m.num_running, m.num_waiting, m.kv_blocks_in_use),
        (0, 0, 0)
    );
    assert_eq!(m.request_success.get("abort"), Some(&1));
    // The id is free again.
    assert_eq!(
        drain(e.generate(greedy("gone", prompt(5, 3), Some(2)))).len(),
        2
    );
}

#[test]
fn two_hundred_streams_with_random_aborts_and_drops() {
    let (e, gate, _open) = gated_engine(48);
    let mut rng = TestRng(77);
    // (stream, choices, items to read before dropping; MAX = to the end)
    let mut kept: Vec<(GenerateStream, usize, usize)> = Vec::new();
    for i in 0..200u64 {
        let p = prompt(i, 1 + rng.below(60));
        let max_tokens = Some(1 + rng.below(20) as i64);
        let n = if i % 3 == 0 { 2 } else { 1 };
        let cfg = if n == 2 {
            SamplingConfig {
                n: 2,
                temperature: 0.7,
                max_tokens,
                ..Default::default()
            }
        } else {
            SamplingConfig {
                ignore_eos: true,
                max_tokens,
                ..SamplingConfig::greedy(1)
            }
        };
        let id = format!("r{i}");
        let s = e.generate(EngineRequest::new(&id, p, cfg));
        match rng.below(5) {
            0 => drop(s), // the client vanished at once
            1 => {
                e.abort(&id); // aborted at once; its stream still ends with "abort"
                kept.push((s, n as usize, usize::MAX));
            }
            2 => kept.push((s, n as usize, rng.below(3))),
            _ => kept.push((s, n as usize, usize::MAX)),
        }
    }
    // Nothing ran yet, so every immediate abort lands before the request's first step.
    gate.open();
    let mut aborted = 0;
    for (mut s, n, k) in kept {
        let (mut got, mut finished) = (0, 0);
        while got < k {
            match block_on(s.next()) {
                None => break,
                Some(Ok(o)) => {
                    got += 1;
                    if o.finished() {
                        finished += 1;
                        aborted += usize::from(o.finish_reason == Some(FinishReason::Abort));
                    }
                }
                Some(Err(err)) => panic!("{err}"),
            }
        }
        if k == usize::MAX {
            assert_eq!(
                finished,
                n,
                "{}: every choice finishes once",
                s.request_id()
            );
        }
    }
    assert!(aborted > 0);
    let m = e.metrics_synced();
    assert_eq!(
        (m.num_running, m.num_waiting, m.kv_blocks_in_use),
        (0, 0, 0)
    );
    assert!(e.is_healthy());
}

#[test]
fn n_choices_are_tagged_by_index() {
    let e = engine(64);
    let cfg = SamplingConfig {
        n: 3,
        seed: Some(5),
        temperature: 1.0,
        ignore_eos: true,
        max_tokens: Some(5),
        ..Default::default()
    };
    let outs: Vec<EngineOutput> = drain(e.generate(EngineRequest::new("n", prompt(8, 7), cfg)))
        .into_iter()
        .map(|o| o.expect("ok"))
        .collect();
    for i in 0..3 {
        let mine: Vec<&EngineOutput> = outs.iter().filter(|o| o.index == i).collect();
        assert_eq!(mine.len(), 5);
        assert_eq!(
            mine.last().and_then(|o| o.finish_reason),
            Some(FinishReason::Length)
        );
    }
    assert_eq!(outs.len(), 15);
}

#[test]
fn invalid_and_duplicate_requests_are_rejected() {
    let (e, gate, _open) = gated_engine(64);
    gate.open();
    let bad = EngineRequest::new(
        "x",
        vec![1],
        SamplingConfig {
            top_p: 0.0,
            ..Default::default()
        },
    );
    let err = e.validate(&bad).expect_err("invalid");
    assert_eq!(err.to_string(), "top_p must be in (0, 1], got 0.0.");
    let outs = drain(e.generate(bad));
    assert!(matches!(
        &outs[..],
        [Err(EngineError::InvalidRequest(
            ValidationError::Param { .. }
        ))]
    ));
    let empty = drain(e.generate(EngineRequest::new("y", vec![], SamplingConfig::default())));
    assert!(
        matches!(&outs[..], [Err(_)])
            && matches!(
                &empty[..],
                [Err(EngineError::InvalidRequest(
                    ValidationError::EmptyPrompt
                ))]
            )
    );

    let (e, gate, _open) = gated_engine(64);
    let mut first = e.generate(greedy("dup", prompt(1, 5), None));
    gate.allow(1);
    block_on(first.next()).expect("item").expect("ok");
    // Submitted while "dup" runs; the engine reads it after the step the gate lets through.
    let second = e.generate(greedy("dup", prompt(1, 5), Some(3)));
    gate.allow(1);
    let second = drain(second);
    assert_eq!(
        second,
        vec![Err(EngineError::DuplicateRequestId("dup".into()))]
    );
    // The rejected duplicate did not disturb the original.
    e.abort("dup");
    gate.open();
    let rest: Vec<_> = block_on(first.collect::<Vec<_>>());
    assert_eq!(
        rest.last()
            .and_then(|o| o.as_ref().ok())
            .and_then(|o| o.finish_reason),
        Some(FinishReason::Abort)
    );
}

#[test]
fn a_runner_failure_fails_requests_and_kills_the_engine() {
    let mut runner = FakeRunner::new(64, 4);
    runner.fail_at_step = Some(3);
    let e = Engine::new(Box::new(runner), EngineConfig::default()).expect("engine");
    let outs = drain(e.generate(greedy("a", prompt(2, 5), Some(10))));
    assert_eq!(outs.len(), 4, "three tokens, then the error");
    assert!(outs[..3].iter().all(|o| o.is_ok()));
    assert!(matches!(&outs[3], Err(EngineError::Runner(m)) if m.contains("injected failure")));
    assert!(!e.is_healthy());
    assert!(!e.metrics_synced().healthy);
    let after = drain(e.generate(greedy("b", prompt(2, 5), Some(10))));
    assert!(matches!(&after[..], [Err(EngineError::Dead(_))]));
    e.shutdown();
}

#[test]
fn config_is_checked() {
    let too_long = EngineConfig {
        max_model_len: Some(1000),
        ..Default::default()
    };
    assert!(matches!(
        Engine::new(Box::new(FakeRunner::new(64, 4)), too_long),
        Err(EngineError::Config(_))
    ));
    let e = Engine::new(Box::new(FakeRunner::new(64, 4)), EngineConfig::default()).expect("engine");
    assert_eq!(e.max_model_len(), 256, "clamped to what the cache holds");
}

#[test]
fn handles_are_shareable_across_async_tasks() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    fn assert_send_unpin<T: Send + Unpin + 'static>() {}
    assert_send_sync::<Engine>();
    assert_send_unpin::<GenerateStream>();
    assert_send_sync::<EngineError>();
}
