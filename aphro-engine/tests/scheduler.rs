//! EngineCore (scheduler + KV manager + sampler) driven step by step with the fake model.
mod common;

use std::collections::HashMap;

use aphro_engine::request::{
    EngineOutput, EngineRequest, FinishReason, PositionLogprobs, SamplingConfig,
};
use aphro_engine::scheduler::{EngineCore, SchedulerConfig};
use common::{logits_for, oracle_greedy, prompt, FakeRunner, RunLog, TestRng, VOCAB};

struct Setup {
    blocks: usize,
    block_size: usize,
    budget: usize,
    max_seqs: usize,
    caching: bool,
}

impl Setup {
    fn roomy(caching: bool) -> Self {
        Setup {
            blocks: 256,
            block_size: 4,
            budget: 64,
            max_seqs: 32,
            caching,
        }
    }
    /// A cache so small that 16 concurrent requests must preempt.
    fn tiny(caching: bool) -> Self {
        Setup {
            blocks: 30,
            block_size: 4,
            budget: 16,
            max_seqs: 16,
            caching,
        }
    }
    fn core_with(&self, runner: FakeRunner) -> EngineCore {
        self.core_configured(runner, |_| {})
    }
    fn core_configured(
        &self,
        runner: FakeRunner,
        configure: impl FnOnce(&mut SchedulerConfig),
    ) -> EngineCore {
        let mut cfg = SchedulerConfig {
            max_num_batched_tokens: self.budget,
            max_num_seqs: self.max_seqs,
            enable_prefix_caching: self.caching,
            max_model_len: (self.blocks * self.block_size).min(4096),
            max_logprobs: -1,
            seed: 7,
            long_prefill_token_threshold: 0,
            // Step lengths here follow the token budget alone (no wall-clock pacing).
            prefill_pacing_ratio: 0.0,
            prefix_caching_hash_algo: Default::default(),
        };
        configure(&mut cfg);
        EngineCore::new(Box::new(runner), cfg)
    }
    fn core(&self) -> (EngineCore, std::sync::Arc<std::sync::Mutex<RunLog>>) {
        let runner = FakeRunner::new(self.blocks, self.block_size);
        let log = runner.log.clone();
        (self.core_with(runner), log)
    }
}

#[derive(Debug, Default, Clone)]
struct Choice {
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
    stop_reason: Option<u32>,
    logprobs: Vec<PositionLogprobs>,
    prompt_logprobs: Option<Vec<Option<PositionLogprobs>>>,
    outputs: usize,
}

type Results = HashMap<(String, usize), Choice>;

fn collect(res: &mut Results, outs: Vec<EngineOutput>) {
    for o in outs {
        let c = res.entry((o.request_id.clone(), o.index)).or_default();
        assert!(
            c.finish.is_none(),
            "output after finish for {:?}",
            (o.request_id, o.index)
        );
        c.tokens.extend(&o.token_ids);
        c.outputs += 1;
        if let Some(lp) = o.logprobs {
            c.logprobs.extend(lp);
        }
        if o.prompt_logprobs.is_some() {
            assert!(c.prompt_logprobs.is_none());
            c.prompt_logprobs = o.prompt_logprobs;
        }
        c.finish = o.finish_reason;
        c.stop_reason = o.stop_reason;
        assert_eq!(o.usage.completion_tokens, c.tokens.len());
    }
}

fn run_to_end(core: &mut EngineCore, res: &mut Results) {
    let mut guard = 0;
    while core.has_work() {
        let outs = core.step().expect("step");
        collect(res, outs);
        guard += 1;
        assert!(guard < 100_000, "engine does not make progress");
    }
}

fn greedy(id: &str, p: Vec<u32>, max_tokens: i64) -> EngineRequest {
    let cfg = SamplingConfig {
        ignore_eos: true,
        ..SamplingConfig::greedy(max_tokens)
    };
    EngineRequest::new(id, p, cfg)
}

fn assert_clean(core: &EngineCore) {
    assert_eq!(core.num_running(), 0);
    assert_eq!(core.num_waiting(), 0);
    assert_eq!(core.num_requests(), 0);
    assert_eq!(core.block_manager().num_in_use(), 0, "blocks leaked");
}

/// 16 mixed prompts: different lengths, some sharing a prefix with the target, one equal.
fn mixed_prompts(target: &[u32]) -> Vec<Vec<u32>> {
    let mut v = vec![target.to_vec()];
    for (i, len) in [1usize, 3, 5, 8, 13, 21, 34, 55, 70, 2, 9]
        .into_iter()
        .enumerate()
    {
        v.push(prompt(100 + i as u64, len));
    }
    let mut shared = target[..20].to_vec();
    shared.extend(prompt(7, 11));
    v.push(shared);
    v.push(target[..16].to_vec());
    let mut longer = target.to_vec();
    longer.extend(prompt(8, 9));
    v.push(longer);
    v.push(target.to_vec());
    assert_eq!(v.len(), 16);
    v
}

#[test]
fn batch_invariance_with_and_without_prefix_cache_and_under_preemption() {
    let target = prompt(1, 37);
    let expected = oracle_greedy(&target, 24);
    for (name, setup) in [
        ("roomy+cache", Setup::roomy(true)),
        ("roomy", Setup::roomy(false)),
        ("tiny+cache", Setup::tiny(true)),
        ("tiny", Setup::tiny(false)),
    ] {
        let (mut core, _) = setup.core();
        let mut alone = Results::new();
        core.add_request(greedy("t", target.clone(), 24))
            .expect("add");
        run_to_end(&mut core, &mut alone);
        assert_eq!(alone[&("t".into(), 0)].tokens, expected, "{name}: alone");

        let (mut core, log) = setup.core();
        let prompts = mixed_prompts(&target);
        let mut res = Results::new();
        // Half join up front, the rest between steps while the first half runs.
        for (i, p) in prompts.iter().enumerate().take(8) {
            core.add_request(greedy(&format!("r{i}"), p.clone(), 24))
                .expect("add");
        }
        for _ in 0..3 {
            let outs = core.step().expect("step");
            collect(&mut res, outs);
        }
        for (i, p) in prompts.iter().enumerate().skip(8) {
            core.add_request(greedy(&format!("r{i}"), p.clone(), 24))
                .expect("add");
        }
        run_to_end(&mut core, &mut res);
        for (i, p) in prompts.iter().enumerate() {
            let c = &res[&(format!("r{i}"), 0)];
            assert_eq!(c.tokens, oracle_greedy(p, 24), "{name}: request {i}");
            assert_eq!(c.finish, Some(FinishReason::Length));
            assert_eq!(c.outputs, 24, "one output per token per step");
        }
        assert_eq!(res[&("r0".into(), 0)].tokens, expected);
        assert_clean(&core);
        let m = core.metrics();
        let log = log.lock().expect("log").clone();
        assert!(
            log.max_tokens_in_step <= setup.budget,
            "{name}: token budget exceeded"
        );
        assert!(log.max_seqs_in_step <= setup.max_seqs);
        if setup.blocks == 30 {
            assert!(
                m.num_preemptions > 0,
                "{name}: the tiny cache must force preemption"
            );
        }
        if setup.caching {
            assert!(
                m.prefix_cache_hits > 0,
                "{name}: shared prefixes must hit the cache"
            );
        } else {
            assert_eq!(m.prefix_cache_hits, 0);
        }
        assert_eq!(m.generation_tokens_total, 16 * 24);
    }
}

#[test]
fn two_hundred_requests_with_random_aborts_leave_no_blocks() {
    for caching in [true, false] {
        let setup = Setup {
            blocks: 64,
            block_size: 4,
            budget: 32,
            max_seqs: 8,
            caching,
        };
        let (mut core, _) = setup.core();
        let mut rng = TestRng(caching as u64 + 11);
        let mut res = Results::new();
        let mut live: Vec<(String, Vec<u32>, bool, usize)> = Vec::new(); // id, prompt, greedy, steps seen
        let mut added = 0;
        let (mut aborted_now, mut aborted_mid_prefill, mut aborted_late) = (0, 0, 0);
        let mut greedy_prompts: HashMap<String, Vec<u32>> = HashMap::new();
        while added < 200 || core.has_work() {
            for _ in 0..rng.below(4) {
                if added == 200 {
                    break;
                }
                let id = format!("q{added}");
                let len = 1 + rng.below(80);
                let p = prompt(1000 + added as u64, len);
                let max_tokens = 1 + rng.below(30) as i64;
                let is_greedy = rng.below(2) == 0;
                let cfg = if is_greedy {
                    SamplingConfig {
                        ignore_eos: true,
                        ..SamplingConfig::greedy(max_tokens)
                    }
                } else {
                    let n = 1 + rng.below(3) as i64;
                    let seed = (rng.below(2) == 0).then_some(rng.below(1000) as i64);
                    SamplingConfig {
                        n,
                        seed,
                        max_tokens: Some(max_tokens),
                        temperature: 0.8,
                        ..Default::default()
                    }
                };
                core.add_request(EngineRequest::new(&id, p.clone(), cfg))
                    .expect("add");
                if is_greedy {
                    greedy_prompts.insert(id.clone(), p.clone());
                }
                added += 1;
                live.push((id, p, is_greedy, 0));
            }
            // Random aborts: right after submission, mid-prefill, or mid-decode.
            if !live.is_empty() && rng.below(3) == 0 {
                let i = rng.below(live.len());
                let (id, p, _, steps) = live.swap_remove(i);
                let got_tokens = res.keys().any(|(r, _)| *r == id);
                if steps == 0 {
                    aborted_now += 1;
                } else if !got_tokens && p.len() > setup.budget {
                    aborted_mid_prefill += 1;
                } else {
                    aborted_late += 1;
                }
                let outs = core.abort(&id);
                assert!(
                    !outs.is_empty()
                        || res
                            .keys()
                            .filter(|(r, _)| *r == id)
                            .all(|k| res[k].finish.is_some())
                );
                collect(&mut res, outs);
            }
            if core.has_work() {
                let outs = core.step().expect("step");
                collect(&mut res, outs);
            }
            for l in live.iter_mut() {
                l.3 += 1;
            }
            live.retain(|(id, ..)| core.has_request(id));
        }
        assert_clean(&core);
        assert!(
            aborted_now > 0 && aborted_mid_prefill > 0 && aborted_late > 0,
            "{aborted_now} {aborted_mid_prefill} {aborted_late}"
        );
        // Every choice finished exactly once; greedy tokens (even of aborted requests) follow
        // the oracle, which a paging or preemption bug under this churn would break.
        let mut checked = 0;
        for ((id, _), c) in &res {
            assert!(c.finish.is_some(), "{id} never finished");
            if let Some(p) = greedy_prompts.get(id) {
                assert_eq!(c.tokens, oracle_greedy(p, c.tokens.len()), "{id}");
                checked += 1;
            }
        }
        assert!(checked > 50);
    }
}

fn sampled(id: &str, p: Vec<u32>, seed: Option<i64>, n: i64) -> EngineRequest {
    let cfg = SamplingConfig {
        n,
        seed,
        temperature: 0.9,
        top_p: 0.9,
        top_k: 20,
        ignore_eos: true,
        max_tokens: Some(24),
        ..Default::default()
    };
    EngineRequest::new(id, p, cfg)
}

/// The tokens of a one-choice sampled request run alone with `seed`.
fn sampled_alone(p: &[u32], seed: i64) -> Vec<u32> {
    let (mut core, _) = Setup::roomy(false).core();
    let mut res = Results::new();
    core.add_request(sampled("x", p.to_vec(), Some(seed), 1))
        .expect("add");
    run_to_end(&mut core, &mut res);
    res[&("x".into(), 0)].tokens.clone()
}

#[test]
fn seeded_sampling_is_reproducible_across_runs_and_batches() {
    let p = prompt(5, 29);
    let run_alone = |seed: i64| {
        let (mut core, _) = Setup::roomy(true).core();
        let mut res = Results::new();
        core.add_request(sampled("s", p.clone(), Some(seed), 1))
            .expect("add");
        run_to_end(&mut core, &mut res);
        res[&("s".into(), 0)].tokens.clone()
    };
    let a = run_alone(1234);
    assert_eq!(a.len(), 24);
    assert_eq!(a, run_alone(1234), "same seed, same tokens");
    assert_ne!(a, run_alone(1235), "the seed matters");
    // Sampling is not greedy here: it departs from the argmax path.
    assert_ne!(a, oracle_greedy(&p, 24));

    for setup in [Setup::roomy(false), Setup::tiny(true)] {
        let (mut core, _) = setup.core();
        let mut res = Results::new();
        for i in 0..8 {
            core.add_request(sampled(
                &format!("o{i}"),
                prompt(50 + i, 3 + 9 * i as usize),
                None,
                1,
            ))
            .expect("add");
        }
        core.step().map(|o| collect(&mut res, o)).expect("step");
        core.add_request(sampled("s", p.clone(), Some(1234), 1))
            .expect("add");
        run_to_end(&mut core, &mut res);
        assert_eq!(res[&("s".into(), 0)].tokens, a, "same seed inside a batch");
        assert_clean(&core);
    }
}

#[test]
fn n_greater_than_one_shares_the_prompt_and_copies_on_write() {
    // Prompt of 6 tokens with block size 4: the forked choices share a partial block.
    let p = prompt(9, 6);
    let single = |seed: i64| sampled_alone(&p, seed);
    for setup in [Setup::roomy(false), Setup::roomy(true), Setup::tiny(false)] {
        let (mut core, log) = setup.core();
        let mut res = Results::new();
        core.add_request(sampled("m", p.clone(), Some(99), 4))
            .expect("add");
        // One prefill step computes the prompt once, then all four choices share its blocks.
        collect(&mut res, core.step().expect("step"));
        assert_eq!(core.num_running(), 4);
        assert_eq!(
            core.block_manager().num_in_use(),
            2,
            "prompt blocks are shared, not copied"
        );
        run_to_end(&mut core, &mut res);
        let mut distinct = std::collections::HashSet::new();
        for i in 0..4 {
            let c = &res[&("m".into(), i)];
            // vLLM seeds choice i with seed + i.
            assert_eq!(c.tokens, single(99 + i as i64), "choice {i}");
            assert_eq!(c.finish, Some(FinishReason::Length));
            distinct.insert(c.tokens.clone());
        }
        assert!(distinct.len() > 1);
        assert!(
            log.lock().expect("log").copies >= 3,
            "shared partial block copied on write"
        );
        assert_clean(&core);
    }
}

#[test]
fn one_choice_ended_by_its_consumer_frees_its_blocks_while_the_others_go_on() {
    let p = prompt(9, 6);
    let single = |seed: i64| sampled_alone(&p, seed);
    let (mut core, _) = Setup::roomy(false).core();
    let mut res = Results::new();
    core.add_request(sampled("m", p.clone(), Some(99), 3))
        .expect("add");
    // Before the prompt is computed the choices are not forked: nothing to end alone.
    assert!(core.end_choice("m", 1).is_empty());
    for _ in 0..5 {
        collect(&mut res, core.step().expect("step"));
    }
    assert_eq!(core.num_running(), 3);
    let in_use = core.block_manager().num_in_use();
    let ended = core.end_choice("m", 1);
    assert_eq!(ended.len(), 1);
    assert_eq!(
        (ended[0].index, ended[0].finish_reason),
        (1, Some(FinishReason::Stop))
    );
    assert_eq!(ended[0].usage.completion_tokens, 5);
    collect(&mut res, ended);
    assert_eq!(
        core.num_running(),
        2,
        "the ended choice is no longer scheduled"
    );
    assert!(
        core.block_manager().num_in_use() < in_use,
        "its blocks were freed"
    );
    // Unknown, already ended or out-of-range choices change nothing.
    assert!(core.end_choice("m", 1).is_empty());
    assert!(core.end_choice("m", 7).is_empty());
    assert!(core.end_choice("nope", 0).is_empty());
    run_to_end(&mut core, &mut res);
    assert_eq!(res[&("m".into(), 1)].tokens.len(), 5);
    for i in [0, 2] {
        let c = &res[&("m".into(), i)];
        assert_eq!(
            c.tokens,
            single(99 + i as i64),
            "choice {i} goes on as alone"
        );
        assert_eq!(c.finish, Some(FinishReason::Length));
    }
    assert_clean(&core);

    // Ending every choice one by one ends the request.
    let (mut core, _) = Setup::roomy(true).core();
    core.add_request(sampled("k", p.clone(), Some(5), 2))
        .expect("add");
    core.step().expect("step");
    assert_eq!(core.end_choice("k", 0).len(), 1);
    assert_eq!(core.end_choice("k", 1).len(), 1);
    assert!(!core.has_request("k"));
    assert_eq!(core.metrics().request_success.get("stop"), Some(&1));
    assert_clean(&core);
}

#[test]
fn priority_then_arrival_order() {
    let setup = Setup {
        blocks: 64,
        block_size: 4,
        budget: 64,
        max_seqs: 1,
        caching: false,
    };
    let (mut core, _) = setup.core();
    for (id, prio) in [("a", 5), ("b", 1), ("c", 3), ("d", 1), ("e", -2)] {
        let mut r = greedy(id, prompt(id.len() as u64 + prio as u64, 5), 2);
        r.priority = prio;
        core.add_request(r).expect("add");
    }
    let mut order = Vec::new();
    while core.has_work() {
        for o in core.step().expect("step") {
            if o.finish_reason.is_some() {
                order.push(o.request_id);
            }
        }
    }
    assert_eq!(order, ["e", "b", "d", "c", "a"]);
}

/// Greedy with vLLM's stop rules, computed directly on the fake logits.
fn oracle_stops(
    p: &[u32],
    stop: &[u32],
    masked: &[u32],
    min_tokens: usize,
    max: usize,
) -> (Vec<u32>, bool) {
    let mut toks = p.to_vec();
    let mut out = Vec::new();
    while out.len() < max {
        let mut l = logits_for(&toks);
        if out.len() < min_tokens {
            for &t in masked {
                l[t as usize] = f32::NEG_INFINITY;
            }
        }
        let t = common::argmax(&l);
        toks.push(t);
        out.push(t);
        if out.len() >= min_tokens && stop.contains(&t) {
            return (out, true);
        }
    }
    (out, false)
}

#[test]
fn eos_stop_ids_min_tokens_and_ignore_eos() {
    let p = prompt(21, 12);
    let g = oracle_greedy(&p, 16);
    // A token that first appears at index >= 2, and one that never appears.
    let i = (2..16)
        .find(|&i| !g[..i].contains(&g[i]))
        .expect("a fresh token");
    let stop = g[i];
    let unused = (0..VOCAB as u32)
        .find(|t| !g.contains(t))
        .expect("unused id");
    let setup = Setup::roomy(true);
    let run = |eos: Vec<u32>, cfg: SamplingConfig| {
        let mut core = setup.core_with(FakeRunner::with_eos(setup.blocks, setup.block_size, eos));
        let mut res = Results::new();
        core.add_request(EngineRequest::new("r", p.clone(), cfg))
            .expect("add");
        run_to_end(&mut core, &mut res);
        assert_clean(&core);
        res.remove(&("r".into(), 0)).expect("output")
    };
    let base = SamplingConfig::greedy(16);

    // Primary EOS: stop with stop_reason null, the EOS id included in the output.
    let c = run(vec![stop, unused], base.clone());
    assert_eq!(
        (c.tokens.as_slice(), c.finish, c.stop_reason),
        (&g[..=i], Some(FinishReason::Stop), None)
    );
    // ignore_eos runs to max_tokens.
    let c = run(
        vec![stop],
        SamplingConfig {
            ignore_eos: true,
            ..base.clone()
        },
    );
    assert_eq!(
        (c.tokens.as_slice(), c.finish),
        (&g[..], Some(FinishReason::Length))
    );
    // A secondary EOS id reports its id as stop_reason (and ignore_eos disables it too).
    let c = run(vec![unused, stop], base.clone());
    assert_eq!((c.tokens.as_slice(), c.stop_reason), (&g[..=i], Some(stop)));
    let c = run(
        vec![unused, stop],
        SamplingConfig {
            ignore_eos: true,
            ..base.clone()
        },
    );
    assert_eq!(c.tokens, g);
    // stop_token_ids.
    let c = run(
        vec![unused],
        SamplingConfig {
            stop_token_ids: vec![stop],
            ..base.clone()
        },
    );
    assert_eq!(
        (c.tokens.as_slice(), c.finish, c.stop_reason),
        (&g[..=i], Some(FinishReason::Stop), Some(stop))
    );
    // min_tokens masks stop ids and EOS until reached; the output then differs from greedy.
    let min = i + 2;
    let c = run(
        vec![unused],
        SamplingConfig {
            stop_token_ids: vec![stop],
            min_tokens: min as i64,
            ..base.clone()
        },
    );
    let (want, stopped) = oracle_stops(&p, &[stop, unused], &[stop, unused], min, 16);
    assert_eq!(
        c.tokens, want,
        "{:?} {:?} min {min} stop {stop}",
        c.finish, c.stop_reason
    );
    assert!(c.tokens.len() >= min);
    assert!(!c.tokens[..min].contains(&stop));
    assert_eq!(
        c.finish,
        Some(if stopped {
            FinishReason::Stop
        } else {
            FinishReason::Length
        })
    );
    // max_tokens.
    let c = run(vec![unused], SamplingConfig::greedy(3));
    assert_eq!(
        (c.tokens.as_slice(), c.finish),
        (&g[..3], Some(FinishReason::Length))
    );
}

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z = l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    l.iter().map(|&x| x as f64 - z).collect()
}

fn check_position(lp: &PositionLogprobs, logits: &[f32], chosen: u32, k: usize) {
    let ls = log_softmax(logits);
    let rank_of = |t: u32| ls.iter().filter(|&&v| v >= ls[t as usize]).count();
    assert_eq!(lp.chosen.token_id, chosen);
    assert!((lp.chosen.logprob as f64 - ls[chosen as usize]).abs() < 1e-5);
    assert_eq!(lp.chosen.rank, rank_of(chosen));
    let mut by_rank: Vec<u32> = (0..VOCAB as u32).collect();
    by_rank.sort_by(|&a, &b| ls[b as usize].total_cmp(&ls[a as usize]));
    let want: Vec<u32> = by_rank[..k]
        .iter()
        .copied()
        .filter(|&t| t != chosen)
        .collect();
    let got: Vec<u32> = lp.top.iter().map(|l| l.token_id).collect();
    assert_eq!(got, want);
    for l in &lp.top {
        assert_eq!(l.rank, rank_of(l.token_id));
        assert!((l.logprob as f64 - ls[l.token_id as usize]).abs() < 1e-5);
    }
}

#[test]
fn logprobs_and_prompt_logprobs_with_ranks() {
    let p = prompt(33, 20);
    // Budget 8 chunks the 20-token prompt over three steps.
    let setup = Setup {
        blocks: 64,
        block_size: 4,
        budget: 8,
        max_seqs: 4,
        caching: true,
    };
    let (mut core, _) = setup.core();
    let g = oracle_greedy(&p, 6);
    // Bias a mid-ranked token so the sampled token is not the raw argmax.
    let l0 = logits_for(&p);
    let mut ids: Vec<u32> = (0..VOCAB as u32).collect();
    ids.sort_by(|&a, &b| l0[b as usize].total_cmp(&l0[a as usize]));
    let biased = ids[10];
    let cfg = SamplingConfig {
        logprobs: Some(3),
        prompt_logprobs: Some(2),
        ignore_eos: true,
        ..SamplingConfig::greedy(6)
    };
    core.add_request(EngineRequest::new("lp", p.clone(), cfg.clone()))
        .expect("add");
    let cfg_b = SamplingConfig {
        logit_bias: vec![(biased, 100.0)],
        max_tokens: Some(1),
        prompt_logprobs: None,
        ..cfg
    };
    core.add_request(EngineRequest::new("bias", p.clone(), cfg_b))
        .expect("add");
    let mut res = Results::new();
    run_to_end(&mut core, &mut res);

    let c = &res[&("lp".into(), 0)];
    assert_eq!(c.tokens, g);
    assert_eq!(c.logprobs.len(), 6);
    let mut ctx = p.clone();
    for (j, lp) in c.logprobs.iter().enumerate() {
        check_position(lp, &logits_for(&ctx), g[j], 3);
        assert_eq!(lp.chosen.rank, 1, "greedy picks the raw argmax");
        assert_eq!(
            lp.top.len(),
            2,
            "sampled token is in the top 3: k entries in all"
        );
        ctx.push(g[j]);
    }
    let pl = c
        .prompt_logprobs
        .as_ref()
        .expect("prompt logprobs on the first output");
    assert_eq!(pl.len(), p.len());
    assert!(pl[0].is_none());
    for (pos, entry) in pl.iter().enumerate().skip(1) {
        let entry = entry.as_ref().expect("entry");
        check_position(entry, &logits_for(&p[..pos]), p[pos], 2);
    }
    // The biased choice is sampled, but its logprob and rank are the raw model's.
    let b = &res[&("bias".into(), 0)];
    assert_eq!(b.tokens, [biased]);
    check_position(&b.logprobs[0], &l0, biased, 3);
    assert_eq!(b.logprobs[0].chosen.rank, 11);
    assert_eq!(
        b.logprobs[0].top.len(),
        3,
        "sampled token outside the top 3: k + 1 entries"
    );
    assert!(b.prompt_logprobs.is_none());
}

#[test]
fn validation_messages_match_vllm() {
    let cases: Vec<(SamplingConfig, &str)> = vec![
        (SamplingConfig { top_p: 0.0, ..Default::default() }, "top_p must be in (0, 1], got 0.0."),
        (SamplingConfig { temperature: 2.5, ..Default::default() }, "temperature must be in [0, 2], got 2.5."),
        (SamplingConfig { temperature: -1.0, ..Default::default() }, "temperature must be non-negative, got -1.0."),
        (SamplingConfig { temperature: f64::NAN, ..Default::default() }, "temperature must be a finite number, got nan."),
        (SamplingConfig { top_k: -2, ..Default::default() }, "top_k must be 0 (disable), or at least 1, got -2."),
        (SamplingConfig { min_p: 1.5, ..Default::default() }, "min_p must be in [0, 1], got 1.5."),
        (SamplingConfig { presence_penalty: 3.0, ..Default::default() }, "presence_penalty must be in [-2, 2], got 3.0."),
        (SamplingConfig { frequency_penalty: -2.5, ..Default::default() }, "frequency_penalty must be in [-2, 2], got -2.5."),
        (SamplingConfig { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty must be greater than zero, got 0.0."),
        // Python's float repr, exponents and all (CPython: `f"{-1e-05}"`, `f"{1e20}"`).
        (SamplingConfig { repetition_penalty: -1e-5, ..Default::default() }, "repetition_penalty must be greater than zero, got -1e-05."),
        (SamplingConfig { temperature: 1e20, ..Default::default() }, "temperature must be in [0, 2], got 1e+20."),
        (SamplingConfig { max_tokens: Some(0), ..Default::default() }, "max_tokens must be at least 1, got 0."),
        (SamplingConfig { min_tokens: -1, ..Default::default() }, "min_tokens must be greater than or equal to 0, got -1."),
        (SamplingConfig { min_tokens: 20, ..Default::default() }, "min_tokens must be less than or equal to max_tokens=16, got 20."),
        (SamplingConfig { logprobs: Some(-3), ..Default::default() }, "logprobs must be non-negative or -1, got -3."),
        (SamplingConfig { prompt_logprobs: Some(-2), ..Default::default() }, "prompt_logprobs must be non-negative or -1, got -2."),
        (SamplingConfig { n: 0, ..Default::default() }, "n must be at least 1, got 0."),
        (SamplingConfig { n: 2, temperature: 0.0, ..Default::default() }, "n must be 1 when using greedy sampling, got 2."),
        (SamplingConfig { stop_token_ids: vec![3, 64, 70], ..Default::default() }, "token_id(s) [64, 70] in stop_token_ids contain out-of-vocab token ids. Vocabulary size: 64"),
        (SamplingConfig { logit_bias: vec![(99, 1.0)], ..Default::default() }, "token_id(s) [99] in logit_bias contain out-of-vocab token ids. Vocabulary size: 64"),
        (SamplingConfig { allowed_token_ids: Some(vec![]), ..Default::default() }, "allowed_token_ids is not None and empty!"),
    ];
    let (core, _) = Setup::roomy(true).core();
    for (cfg, msg) in cases {
        let err = core
            .validate(&EngineRequest::new("v", vec![1, 2], cfg))
            .expect_err(msg);
        assert_eq!(err.to_string(), msg);
    }
    let too_long = EngineRequest::new("v", vec![1; 2000], SamplingConfig::default());
    assert_eq!(
        core.validate(&too_long).expect_err("too long").to_string(),
        "Input length (2000) exceeds model's maximum context length (1024)."
    );
    // Normalization: tiny temperatures clamp, -1 seed means none; the request is accepted.
    assert!(core
        .validate(&EngineRequest::new(
            "v",
            vec![1],
            SamplingConfig {
                temperature: 0.001,
                seed: Some(-1),
                ..Default::default()
            }
        ))
        .is_ok());
    // max_tokens is capped by the context.
    let plan = core
        .validate(&EngineRequest::new(
            "v",
            vec![1; 1000],
            SamplingConfig {
                max_tokens: None,
                ..Default::default()
            },
        ))
        .expect("ok");
    assert_eq!(plan.max_tokens, 24);
}

#[test]
fn prefix_cache_chains_block_hashes() {
    // B starts with A's second block: a cache keyed by block contents alone would hand B a
    // block computed after A's first block.
    let a = prompt(61, 13);
    let b = a[4..].to_vec();
    // C is block-aligned and fully cached on its second run: its last block must still be
    // recomputed to get the logits for the first token.
    let c = a[..12].to_vec();
    let (mut core, _) = Setup::roomy(true).core();
    let mut res = Results::new();
    core.add_request(greedy("a", a.clone(), 8)).expect("add");
    run_to_end(&mut core, &mut res);
    core.add_request(greedy("b", b.clone(), 8)).expect("add");
    core.add_request(greedy("a2", a.clone(), 8)).expect("add");
    core.add_request(greedy("c", c.clone(), 8)).expect("add");
    run_to_end(&mut core, &mut res);
    assert_eq!(res[&("b".into(), 0)].tokens, oracle_greedy(&b, 8));
    assert_eq!(res[&("a2".into(), 0)].tokens, oracle_greedy(&a, 8));
    assert_eq!(res[&("c".into(), 0)].tokens, oracle_greedy(&c, 8));
    // a2 reused A's three full prompt blocks, c two of them (one token must run), b none.
    let m = core.metrics();
    assert_eq!(m.prefix_cache_hits, 12 + 8);
    assert_clean(&core);
}

/// `EngineRequest::mm_features` reach the block hashes: prompts with identical tokens but
/// different images share only the blocks before the image; the same image hits.
#[test]
fn requests_with_different_images_share_only_the_text_before_them() {
    use aphro_engine::kv_hash::MmPosition;
    let p = prompt(5, 21);
    assert_eq!(p.len(), 21);
    // An image's placeholder run covers tokens 6..14 (blocks 1-3 of 4 tokens).
    let with_image = |id: &str, hash: &str| {
        let mut r = greedy(id, p.clone(), 4);
        r.mm_features = vec![MmPosition {
            identifier: hash.into(),
            offset: 6,
            length: 8,
        }];
        r
    };
    let (mut core, _) = Setup::roomy(true).core();
    let mut res = Results::new();
    core.add_request(with_image("a", "img-a")).expect("add");
    run_to_end(&mut core, &mut res);
    let hits = |core: &EngineCore| core.metrics().prefix_cache_hits;
    core.add_request(with_image("b", "img-b")).expect("add");
    run_to_end(&mut core, &mut res);
    // Block 0 (tokens 0..4) has no image: the only block b may reuse.
    assert_eq!(hits(&core), 4);
    core.add_request(with_image("a2", "img-a")).expect("add");
    run_to_end(&mut core, &mut res);
    // The same image: all five full prompt blocks (20 of 21 tokens).
    assert_eq!(hits(&core), 4 + 20);
    assert_clean(&core);
}

#[test]
fn decodes_are_scheduled_before_prefill_chunks() {
    let setup = Setup {
        blocks: 64,
        block_size: 4,
        budget: 8,
        max_seqs: 4,
        caching: false,
    };
    let (mut core, _) = setup.core();
    let mut res = Results::new();
    core.add_request(greedy("x", prompt(71, 3), 12))
        .expect("add");
    collect(&mut res, core.step().expect("step"));
    // Y's 40-token prompt needs several chunks; X must still decode a token every step.
    core.add_request(greedy("y", prompt(72, 40), 2))
        .expect("add");
    for step in 0..6 {
        let outs = core.step().expect("step");
        assert!(
            outs.iter().any(|o| o.request_id == "x"),
            "x starved at step {step}"
        );
        collect(&mut res, outs);
    }
    run_to_end(&mut core, &mut res);
    assert_eq!(
        res[&("y".into(), 0)].tokens,
        oracle_greedy(&prompt(72, 40), 2)
    );
    assert_eq!(
        res[&("x".into(), 0)].tokens,
        oracle_greedy(&prompt(71, 3), 12)
    );
}

#[test]
fn a_request_waiting_behind_a_long_prefill_is_admitted_at_once() {
    let setup = Setup {
        blocks: 256,
        block_size: 4,
        budget: 64,
        max_seqs: 4,
        caching: false,
    };
    let (mut core, _) = setup.core();
    let mut res = Results::new();
    let long = prompt(81, 600);
    core.add_request(greedy("long", long.clone(), 2))
        .expect("add");
    collect(&mut res, core.step().expect("step"));
    // The short request arrives while the long prompt has ~9 chunks to go: it shares the
    // very next step and has its first token before the long prompt does.
    core.add_request(greedy("short", prompt(82, 5), 3))
        .expect("add");
    let outs = core.step().expect("step");
    assert!(
        outs.iter()
            .any(|o| o.request_id == "short" && !o.token_ids.is_empty()),
        "the short request waited behind the long prefill"
    );
    collect(&mut res, outs);
    assert!(!res.contains_key(&("long".into(), 0)));
    run_to_end(&mut core, &mut res);
    assert_eq!(res[&("long".into(), 0)].tokens, oracle_greedy(&long, 2));
    assert_eq!(
        res[&("short".into(), 0)].tokens,
        oracle_greedy(&prompt(82, 5), 3)
    );
    assert_clean(&core);
}

#[test]
fn long_prefill_token_threshold_caps_every_chunk() {
    let setup = Setup {
        blocks: 64,
        block_size: 4,
        budget: 64,
        max_seqs: 4,
        caching: false,
    };
    let runner = FakeRunner::new(setup.blocks, setup.block_size);
    let log = runner.log.clone();
    let mut core = setup.core_configured(runner, |c| c.long_prefill_token_threshold = 10);
    let mut res = Results::new();
    let p = prompt(83, 45);
    core.add_request(greedy("p", p.clone(), 2)).expect("add");
    run_to_end(&mut core, &mut res);
    assert_eq!(res[&("p".into(), 0)].tokens, oracle_greedy(&p, 2));
    let steps = log.lock().expect("log").step_tokens.clone();
    assert_eq!(
        steps,
        [10, 10, 10, 10, 5, 1],
        "45 prompt tokens in chunks of 10"
    );
}

#[test]
fn a_paced_long_prefill_keeps_a_running_decode_producing() {
    // A step costs 2 ms plus 20 µs a token, so an unpaced 1500-token prompt fits one
    // 32 ms step, sixteen times a decode-only step; paced at 2x, chunks are ~100 tokens.
    let setup = Setup {
        blocks: 256,
        block_size: 16,
        budget: 2048,
        max_seqs: 4,
        caching: false,
    };
    let mut runner = FakeRunner::new(setup.blocks, setup.block_size);
    runner.step_cost = Some((
        std::time::Duration::from_millis(2),
        std::time::Duration::from_micros(20),
    ));
    let log = runner.log.clone();
    let mut core = setup.core_configured(runner, |c| c.prefill_pacing_ratio = 2.0);
    let mut res = Results::new();
    let short = prompt(84, 4);
    core.add_request(greedy("decode", short.clone(), 200))
        .expect("add");
    for _ in 0..4 {
        collect(&mut res, core.step().expect("step"));
    }
    let long = prompt(85, 1500);
    core.add_request(greedy("long", long.clone(), 1))
        .expect("add");
    let mut decode_tokens_meanwhile = 0;
    let mut guard = 0;
    while !res.contains_key(&("long".into(), 0)) {
        let outs = core.step().expect("step");
        decode_tokens_meanwhile += outs
            .iter()
            .filter(|o| o.request_id == "decode")
            .map(|o| o.token_ids.len())
            .sum::<usize>();
        collect(&mut res, outs);
        guard += 1;
        assert!(guard < 1000, "the long prompt makes no progress");
    }
    // Scheduling alone (no timing) guarantees one decode token per step; pacing splits the
    // prompt into many steps. The bound is loose: a slow machine's noise only shifts sizes.
    assert!(
        decode_tokens_meanwhile >= 5,
        "the decode produced {decode_tokens_meanwhile} tokens while 1500 tokens prefilled"
    );
    let steps = log.lock().expect("log").step_tokens.clone();
    assert!(steps.iter().all(|&n| n <= setup.budget));
    run_to_end(&mut core, &mut res);
    assert_eq!(res[&("long".into(), 0)].tokens, oracle_greedy(&long, 1));
    assert_eq!(
        res[&("decode".into(), 0)].tokens,
        oracle_greedy(&short, 200)
    );
    assert_clean(&core);
}
