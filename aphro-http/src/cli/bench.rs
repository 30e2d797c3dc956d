//! `aphro bench`: engine throughput on synthetic prompts — prefill tok/s (512-token prompt),
//! decode tok/s at batch 1 (128 tokens), aggregate decode tok/s at 8/16/32 concurrent
//! requests. Greedy, `ignore_eos`, prefix caching off unless asked for (repeated prompts
//! would otherwise hit the cache).
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
    /// Print `{"prefill_tok_s", "decode_tok_s", "aggregate_tok_s": {"8", "16", "32"}}`.
    #[arg(long)]
    pub json: bool,
    /// Prompt length of the prefill measurement.
    #[arg(long, default_value_t = 512, hide = true)]
    pub prefill_len: usize,
    /// Tokens generated per request in the decode measurements.
    #[arg(long, default_value_t = 128, hide = true)]
    pub decode_tokens: usize,
    /// Prompt length of the decode requests.
    #[arg(long, default_value_t = 32, hide = true)]
    pub decode_prompt_len: usize,
    /// Concurrency levels of the aggregate measurement.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32", hide = true)]
    pub concurrency: Vec<usize>,
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
    let t0 = Instant::now();
    let streams: Vec<_> = reqs.into_iter().map(|r| engine.generate(r)).collect();
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

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut cfg = args.engine.serving_config(false)?;
    cfg.tokens_only = true;
    let max_conc = args.concurrency.iter().copied().max().unwrap_or(1);
    cfg.max_num_seqs = cfg.max_num_seqs.max(max_conc);
    let serving = ServingEngine::new(cfg).context("starting the engine")?;
    let engine = serving.engine();
    let vocab = engine.model_info().vocab_size;
    let mut salt = 0usize;
    let mut next = |len: usize| {
        salt += 1;
        (format!("bench-{salt}"), prompt(len, salt, vocab))
    };
    // Warm-up (thread pools, page faults of the weights).
    let (id, p) = next(16);
    run_batch(engine, vec![request(id, p, 2)])?;

    let (id, p) = next(args.prefill_len);
    let (wall, _, _) = run_batch(engine, vec![request(id, p, 1)])?;
    let prefill = args.prefill_len as f64 / wall;

    let (id, p) = next(args.decode_prompt_len);
    let (_, n, span) = run_batch(engine, vec![request(id, p, args.decode_tokens)])?;
    let decode = if span > 0.0 {
        n.saturating_sub(1) as f64 / span
    } else {
        0.0
    };

    let mut aggregate = Vec::new();
    for &c in &args.concurrency {
        let reqs = (0..c)
            .map(|_| {
                let (id, p) = next(args.decode_prompt_len);
                request(id, p, args.decode_tokens)
            })
            .collect();
        let (wall, n, _) = run_batch(engine, reqs)?;
        aggregate.push((c, n as f64 / wall));
    }
    serving.shutdown();

    if args.json {
        let agg: serde_json::Map<String, serde_json::Value> = aggregate
            .iter()
            .map(|(c, v)| (c.to_string(), json!(v)))
            .collect();
        println!(
            "{}",
            json!({"prefill_tok_s": prefill, "decode_tok_s": decode, "aggregate_tok_s": agg})
        );
    } else {
        println!("{:<32} {:>10}", "measurement", "tok/s");
        println!(
            "{:<32} {:>10.1}",
            format!("prefill ({} tokens)", args.prefill_len),
            prefill
        );
        println!(
            "{:<32} {:>10.1}",
            format!("decode batch 1 ({} tokens)", args.decode_tokens),
            decode
        );
        for (c, v) in &aggregate {
            println!(
                "{:<32} {:>10.1}",
                format!("aggregate decode, {c} concurrent"),
                v
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
