//! `aphro bench`: engine throughput on synthetic prompts — prefill tok/s at 512 / 2k / 4k / 8k
//! prompt tokens, batch-1 decode tok/s (128 tokens) from context 0 / 2k / 8k, aggregate decode
//! tok/s at 8/16/32 concurrent requests, and a running decode's inter-token latency while an
//! 8k prompt prefills, and how long an abort during that prefill takes to free the engine.
//! Greedy, `ignore_eos`, prefix caching off unless asked for (repeated prompts would otherwise
//! hit the cache). Without `--kv-cache-memory` / `--num-gpu-blocks-override` the cache is
//! sized so every measurement's sequences fit together (none is preempted).
use anyhow::Context;
use aphro_engine::engine::Engine;
use aphro_engine::request::{EngineRequest, SamplingConfig};
use aphro_engine::serving::ServingEngine;
use futures::StreamExt;
use serde_json::json;
use std::process::ExitCode;
use std::time::Instant;

use super::generate::EngineArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Print one JSON object: `prefill` (`[{prompt_tokens, tok_s}]`), `decode`
    /// (`[{context, tok_s}]`), `aggregate_tok_s` (`{"8": ..}`), `stall` and `abort` (or
    /// null), and `prefill_tok_s` / `decode_tok_s` (the first point of each).
    #[arg(long)]
    pub json: bool,
    /// Prompt lengths of the prefill measurements (each capped to `max_model_len - 1`).
    #[arg(
        long,
        alias = "prefill-len",
        value_delimiter = ',',
        default_value = "512,2048,4096,8192"
    )]
    pub prefill_lens: Vec<usize>,
    /// Context lengths the batch-1 decode measurements start from (each capped so the
    /// decoded tokens fit in `max_model_len`); 0 = a one-token prompt.
    #[arg(long, value_delimiter = ',', default_value = "0,2048,8192")]
    pub decode_contexts: Vec<usize>,
    /// Tokens generated per request in the decode measurements.
    #[arg(long, default_value_t = 128)]
    pub decode_tokens: usize,
    /// Prompt length of the aggregate-decode requests.
    #[arg(long, default_value_t = 32, hide = true)]
    pub decode_prompt_len: usize,
    /// Concurrency levels of the aggregate measurement.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32")]
    pub concurrency: Vec<usize>,
    /// Prompt length of the stall measurement: a running decode's inter-token latency while a
    /// prompt this long prefills, next to its idle value (capped to `max_model_len - 1`;
    /// 0 skips it).
    #[arg(long, default_value_t = 8192)]
    pub stall_prompt_len: usize,
}

/// Most tokens the stall measurement's decode generates (it is aborted once the long prompt
/// has its first token).
const STALL_DECODE_TOKENS: usize = 8192;

impl Args {
    /// Tokens the measurements hold in the KV cache at once, at most.
    fn cache_tokens_needed(&self) -> usize {
        let prefill = self.prefill_lens.iter().copied().max().unwrap_or(0);
        let decode = self.decode_contexts.iter().copied().max().unwrap_or(0) + self.decode_tokens;
        let aggregate = self.concurrency.iter().copied().max().unwrap_or(0)
            * (self.decode_prompt_len + self.decode_tokens);
        let stall = match self.stall_prompt_len {
            0 => 0,
            n => n + self.decode_prompt_len + STALL_DECODE_TOKENS,
        };
        prefill.max(decode).max(aggregate).max(stall).max(1)
    }
}

/// Synthetic prompt `salt` of `len` ordinary (non-special) token ids.
fn prompt(len: usize, salt: usize, vocab: usize) -> Vec<u32> {
    let span = vocab.saturating_sub(100).max(1);
    (0..len)
        .map(|i| (100 + (i * 7919 + salt * 104_729 + 13) % span) as u32)
        .collect()
}

fn request(id: String, prompt: Vec<u32>, max_tokens: usize) -> EngineRequest {
    let mut s = SamplingConfig::greedy(max_tokens as i64);
    s.ignore_eos = true;
    EngineRequest::new(id, prompt, s)
}

/// Run `reqs` concurrently; returns (seconds from submission to the end, tokens generated,
/// seconds from the first token to the last of the first request).
fn run_batch(engine: &Engine, reqs: Vec<EngineRequest>) -> anyhow::Result<(f64, usize, f64)> {
    run_spread(&[engine], reqs)
}

/// [`run_batch`] over several engines (`--data-parallel-size`), requests dealt round-robin.
fn run_spread(engines: &[&Engine], reqs: Vec<EngineRequest>) -> anyhow::Result<(f64, usize, f64)> {
    let t0 = Instant::now();
    let streams: Vec<_> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| engines[i % engines.len()].generate(r))
        .collect();
    let outs = futures::executor::block_on(futures::future::join_all(streams.into_iter().map(
        |mut s| async move {
            let mut n = 0usize;
            let (mut first, mut last) = (None, None);
            while let Some(item) = s.next().await {
                let out = item?;
                if !out.token_ids.is_empty() {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = Some(now);
                }
                n += out.token_ids.len();
            }
            Ok::<_, aphro_engine::engine::EngineError>((n, first, last))
        },
    )));
    let wall = t0.elapsed().as_secs_f64();
    let mut total = 0;
    let mut decode_span = 0.0;
    for (i, o) in outs.into_iter().enumerate() {
        let (n, first, last) = o.context("benchmark request failed")?;
        total += n;
        if i == 0 {
            if let (Some(f), Some(l)) = (first, last) {
                decode_span = l.duration_since(f).as_secs_f64();
            }
        }
    }
    Ok((wall, total, decode_span))
}

/// A running decode's inter-token latency, idle and while a long prompt prefills.
#[derive(Debug)]
struct Stall {
    prompt_tokens: usize,
    idle_itl_s: f64,
    /// The decode's idle inter-token latency once the prompt is done: its context grew by
    /// every token it made meanwhile, and a decode step's attention grows with it.
    idle_after_itl_s: Option<f64>,
    itl_median_s: f64,
    /// Median over the gaps during the prefill of gap / the idle latency at that gap's
    /// context (interpolated between the idle values before and after): the prompt's own
    /// cost to the stream, without the stream's growing context.
    context_matched_ratio: Option<f64>,
    /// The mean of those ratios (the pacer holds the average step; single expensive prompt
    /// tokens show in the max).
    context_matched_mean: Option<f64>,
    itl_mean_s: f64,
    itl_max_s: f64,
    tokens_during_prefill: usize,
    prefill_s: f64,
    /// The decode finished before the prompt's first token (the window is then incomplete).
    decode_ended_early: bool,
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Start a decode, let it settle (idle gaps), submit a `long` prompt, and read the decode's
/// gaps until that prompt's first token: what a chat stream feels while a long prompt lands.
fn measure_stall(
    engine: &Engine,
    decode: EngineRequest,
    long: EngineRequest,
) -> anyhow::Result<Stall> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    const IDLE_TOKENS: usize = 24;
    let prompt_tokens = long.prompt_token_ids.len();
    let stamps = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut stream = engine.generate(decode);
    let consumer = {
        let (stamps, stop) = (stamps.clone(), stop.clone());
        // Ok(true): the decode ran out of tokens before the prompt finished prefilling.
        std::thread::spawn(move || -> anyhow::Result<bool> {
            futures::executor::block_on(async {
                while !stop.load(Ordering::Acquire) {
                    let Some(item) = stream.next().await else {
                        return Ok(!stop.load(Ordering::Acquire));
                    };
                    let out = item.context("stall decode failed")?;
                    if !out.token_ids.is_empty() {
                        stamps.lock().expect("stamps").push(Instant::now());
                    }
                }
                Ok(false)
            })
            // Dropping the stream aborts the decode.
        })
    };
    let count = || stamps.lock().expect("stamps").len();
    while count() < IDLE_TOKENS && !consumer.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let submitted = Instant::now();
    let (prefill_s, _, _) = run_batch(engine, vec![long])?;
    let done = Instant::now();
    // The decode alone again, at the context it has reached: the idle value at the end.
    let at_done = count();
    while count() < at_done + IDLE_TOKENS && !consumer.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    stop.store(true, Ordering::Release);
    let stamps = stamps.lock().expect("stamps").clone();
    let decode_ended_early = consumer
        .join()
        .map_err(|_| anyhow::anyhow!("stall consumer panicked"))??;
    let gaps = |from: Instant, to: Instant| -> Vec<f64> {
        stamps
            .windows(2)
            .filter(|w| w[1] > from && w[1] <= to)
            .map(|w| w[1].duration_since(w[0]).as_secs_f64())
            .collect()
    };
    // Skip the first few idle gaps (the decode's own prefill and warm-up).
    let idle: Vec<f64> = stamps
        .windows(2)
        .skip(4)
        .take_while(|w| w[1] <= submitted)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    // The gap still open when the prompt finished counts for the maximum (a decode starved
    // for the whole prefill has no complete gap inside the window at all).
    let during = gaps(submitted, done);
    let open = stamps
        .iter()
        .rev()
        .find(|t| **t <= done)
        .map_or(0.0, |last| done.duration_since(*last).as_secs_f64());
    let itl_max_s = during.iter().copied().fold(open, f64::max);
    let itl_median_s = if during.is_empty() {
        open
    } else {
        median(during.clone())
    };
    let tokens_during_prefill = stamps
        .iter()
        .filter(|t| **t > submitted && **t <= done)
        .count();
    let idle_itl_s = median(idle);
    // Skip the first gap after the prompt finished (it may still hold the prompt's last step).
    let after: Vec<f64> = stamps
        .windows(2)
        .filter(|w| w[0] > done)
        .skip(1)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    let idle_after_itl_s = (after.len() >= IDLE_TOKENS / 2).then(|| median(after));
    let ratios = idle_after_itl_s.and_then(|end| {
        let first = stamps.iter().position(|t| *t > submitted)?;
        let last = stamps.iter().rposition(|t| *t <= done)?;
        let span = (last.saturating_sub(first)).max(1) as f64;
        let ratios: Vec<f64> = (first.max(1)..=last)
            .map(|i| {
                let gap = stamps[i].duration_since(stamps[i - 1]).as_secs_f64();
                let frac = (i.saturating_sub(first)) as f64 / span;
                gap / (idle_itl_s + (end - idle_itl_s) * frac).max(1e-9)
            })
            .collect();
        (!ratios.is_empty()).then_some(ratios)
    });
    let context_matched_mean = ratios
        .as_ref()
        .map(|r| r.iter().sum::<f64>() / r.len() as f64);
    let context_matched_ratio = ratios.map(median);
    let itl_mean_s = if during.is_empty() {
        open
    } else {
        during.iter().sum::<f64>() / during.len() as f64
    };
    Ok(Stall {
        prompt_tokens,
        idle_itl_s,
        idle_after_itl_s,
        context_matched_ratio,
        context_matched_mean,
        itl_mean_s,
        itl_max_s,
        itl_median_s,
        tokens_during_prefill,
        prefill_s,
        decode_ended_early,
    })
}

/// Submit `req`, abort it after `after`, and return the seconds from the abort to its stream's
/// end (the engine drops a request between steps, so this is the rest of the running step).
fn measure_abort(
    engine: &Engine,
    req: EngineRequest,
    after: std::time::Duration,
) -> anyhow::Result<f64> {
    let id = req.request_id.clone();
    let mut stream = engine.generate(req);
    let (tx, rx) = std::sync::mpsc::channel::<Instant>();
    let consumer = std::thread::spawn(move || {
        futures::executor::block_on(async { while stream.next().await.is_some() {} });
        let _ = tx.send(Instant::now());
    });
    std::thread::sleep(after);
    let aborted = Instant::now();
    engine.abort(&id);
    let ended = rx
        .recv()
        .map_err(|_| anyhow::anyhow!("abort consumer panicked"))?;
    consumer
        .join()
        .map_err(|_| anyhow::anyhow!("abort consumer panicked"))?;
    Ok(ended.saturating_duration_since(aborted).as_secs_f64())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut cfg = args.engine.serving_config(false)?;
    cfg.tokens_only = true;
    if cfg.kv_cache_memory.is_none() && cfg.num_gpu_blocks_override.is_none() {
        cfg.num_gpu_blocks_override =
            Some(args.cache_tokens_needed().div_ceil(cfg.block_size.max(1)));
        // A cache sized to the measurements may hold less than the model's context.
        if cfg.max_model_len == aphro_engine::serving::MaxModelLen::Model {
            cfg.max_model_len = aphro_engine::serving::MaxModelLen::Auto;
        }
    }
    let max_conc = args.concurrency.iter().copied().max().unwrap_or(1);
    cfg.max_num_seqs = cfg.max_num_seqs.max(max_conc);
    let block_size = cfg.block_size.max(1);
    let serving = ServingEngine::new(cfg).context("starting the engine")?;
    let engine = serving.engine();
    let engines: Vec<&Engine> = serving.engines().collect();
    let vocab = engine.model_info().vocab_size;
    let max_len = engine.max_model_len();
    let mut salt = 0usize;
    let mut next = |len: usize| {
        salt += 1;
        (format!("bench-{salt}"), prompt(len.max(1), salt, vocab))
    };
    // Warm-up (thread pools, page faults of the weights).
    let (id, p) = next(16);
    run_batch(engine, vec![request(id, p, 2)])?;

    let mut prefill = Vec::new();
    for &len in &args.prefill_lens {
        let len = len.clamp(1, max_len.saturating_sub(1).max(1));
        let (id, p) = next(len);
        let (wall, _, _) = run_batch(engine, vec![request(id, p, 1)])?;
        prefill.push((len, len as f64 / wall));
    }

    let mut decode = Vec::new();
    for &context in &args.decode_contexts {
        let context = context.min(max_len.saturating_sub(args.decode_tokens + 1));
        let (id, p) = next(context);
        let (_, n, span) = run_batch(engine, vec![request(id, p, args.decode_tokens)])?;
        let tok_s = if span > 0.0 {
            n.saturating_sub(1) as f64 / span
        } else {
            0.0
        };
        decode.push((context, tok_s));
    }

    let mut aggregate = Vec::new();
    for &c in &args.concurrency {
        let reqs = (0..c)
            .map(|_| {
                let (id, p) = next(args.decode_prompt_len);
                request(id, p, args.decode_tokens)
            })
            .collect();
        // With data parallelism every engine takes its share (the router's least-loaded
        // rule for prompts that share nothing).
        let (wall, n, _) = run_spread(&engines, reqs)?;
        aggregate.push((c, n as f64 / wall));
    }

    let stall = if args.stall_prompt_len > 0 {
        let decode_prompt = args.decode_prompt_len.max(1);
        let long_len = args
            .stall_prompt_len
            .min(max_len.saturating_sub(decode_prompt + 1))
            .max(1);
        let (id, p) = next(decode_prompt);
        // The decode must outlast the prefill; it is aborted when the prefill is done. Both
        // fit in the cache together (a preempted prompt would measure recomputation).
        let cache_tokens = engine.metrics().kv_blocks_total * block_size;
        let d_tokens = STALL_DECODE_TOKENS
            .min(max_len.saturating_sub(decode_prompt))
            .min(cache_tokens.saturating_sub(long_len + decode_prompt + 2 * block_size))
            .max(1);
        let d = request(id, p, d_tokens);
        let (id, p) = next(long_len);
        Some(measure_stall(engine, d, request(id, p, 1))?)
    } else {
        None
    };
    // A client gone during a long prefill: time from the abort to the engine dropping it.
    let abort = match (args.stall_prompt_len, prefill.last()) {
        (0, _) | (_, None) => None,
        (len, Some(&(_, tok_s))) => {
            let len = len.clamp(1, max_len.saturating_sub(1).max(1));
            let (id, p) = next(len);
            // Halfway through the prefill, as measured above.
            let after = std::time::Duration::from_secs_f64(0.5 * len as f64 / tok_s.max(1e-9));
            Some((len, measure_abort(engine, request(id, p, 1), after)?))
        }
    };
    serving.shutdown();

    if args.json {
        let agg: serde_json::Map<String, serde_json::Value> = aggregate
            .iter()
            .map(|(c, v)| (c.to_string(), json!(v)))
            .collect();
        let stall_json = stall.as_ref().map(|s| {
            json!({
                "prompt_tokens": s.prompt_tokens,
                "idle_itl_ms": s.idle_itl_s * 1e3,
                "idle_after_itl_ms": s.idle_after_itl_s.map(|v| v * 1e3),
                "context_matched_ratio": s.context_matched_ratio,
                "context_matched_mean_ratio": s.context_matched_mean,
                "itl_mean_ms": s.itl_mean_s * 1e3,
                "itl_median_ms": s.itl_median_s * 1e3,
                "itl_max_ms": s.itl_max_s * 1e3,
                "tokens_during_prefill": s.tokens_during_prefill,
                "prefill_s": s.prefill_s,
                "decode_ended_early": s.decode_ended_early,
            })
        });
        println!(
            "{}",
            json!({
                "prefill": prefill.iter().map(|(n, v)| json!({"prompt_tokens": n, "tok_s": v})).collect::<Vec<_>>(),
                "decode": decode.iter().map(|(c, v)| json!({"context": c, "tok_s": v})).collect::<Vec<_>>(),
                "aggregate_tok_s": agg,
                "data_parallel_size": engines.len(),
                "stall": stall_json,
                "abort": abort.map(|(n, s)| json!({"prompt_tokens": n, "delay_ms": s * 1e3})),
                "prefill_tok_s": prefill.first().map(|p| p.1),
                "decode_tok_s": decode.first().map(|d| d.1),
            })
        );
    } else {
        println!("{:<40} {:>10}", "measurement", "tok/s");
        for (n, v) in &prefill {
            println!("{:<40} {:>10.1}", format!("prefill ({n} tokens)"), v);
        }
        for (c, v) in &decode {
            println!(
                "{:<40} {:>10.1}",
                format!(
                    "decode batch 1, context {c} ({} tokens)",
                    args.decode_tokens
                ),
                v
            );
        }
        for (c, v) in &aggregate {
            println!(
                "{:<40} {:>10.1}",
                if engines.len() > 1 {
                    format!(
                        "aggregate decode, {c} concurrent, {} engines",
                        engines.len()
                    )
                } else {
                    format!("aggregate decode, {c} concurrent")
                },
                v
            );
        }
        if let Some(s) = &stall {
            println!(
                "decode inter-token latency while a {}-token prompt prefills ({:.1} s): \
                 median {:.1} ms, max {:.1} ms, idle {:.1} ms (median {:.2}x idle), \
                 {} tokens meanwhile",
                s.prompt_tokens,
                s.prefill_s,
                s.itl_median_s * 1e3,
                s.itl_max_s * 1e3,
                s.idle_itl_s * 1e3,
                s.itl_median_s / s.idle_itl_s.max(1e-9),
                s.tokens_during_prefill
            );
            if let (Some(after), Some(r), Some(m)) = (
                s.idle_after_itl_s,
                s.context_matched_ratio,
                s.context_matched_mean,
            ) {
                println!(
                    "  mean {:.1} ms; idle {:.1} ms once the prompt is done (the decode's \
                     context grew); against the idle latency at the same context: median \
                     {:.2}x, mean {:.2}x",
                    s.itl_mean_s * 1e3,
                    after * 1e3,
                    r,
                    m
                );
            }
            if s.decode_ended_early {
                println!("  (the decode finished before the prompt did: the window is partial)");
            }
        }
        if let Some((n, s)) = abort {
            println!(
                "abort halfway through a {n}-token prefill: the engine drops it {:.1} ms later",
                s * 1e3
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
