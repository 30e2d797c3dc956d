//! Mixture-of-experts models against HF transformers: tiny random-weight Qwen3-MoE, Mixtral
//! and OLMoE checkpoints with float32 greedy goldens (testdata/arch, see its README).
//!
//! Every case's greedy ids must equal transformers' (a split is accepted only where the
//! recorded top-1 margin is below 1e-3), per-step top-5 logprobs and the full last-prompt
//! logits must agree, and the same ids must come out of the engine with the batch case's
//! prompts running together, with prefix caching on and off and every prompt prefilled in
//! chunks.

use std::path::PathBuf;

use aphro_engine::engine::{Engine, EngineConfig};
use aphro_engine::model::{load_flex_runner, LlamaRunner, ModelDType, ModelLoadConfig};
use aphro_engine::request::{EngineRequest, SamplingConfig};
use aphro_engine::runner::{BatchInput, LogitsWanted, ModelRunner, SeqInput};
use burn::backend::Flex;
use futures::executor::block_on;
use futures::StreamExt;
use serde_json::Value;

const MODELS: &[&str] = &["qwen3-moe", "mixtral", "olmoe"];
const BLOCK: usize = 16;

fn arch_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/arch"))
}

fn jsonl(name: &str) -> Vec<Value> {
    let p = arch_dir().join("goldens").join(name);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("valid jsonl"))
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// A greedy case: prompt, new-token count, golden ids, per-step margins and top-5.
struct Case {
    id: String,
    prompt: Vec<u32>,
    max_new: usize,
    want: Vec<u32>,
    margins: Vec<f64>,
    top5: Value,
    logits_file: Option<String>,
}

fn case_of(id: String, v: &Value) -> Case {
    Case {
        id,
        prompt: ids(&v["prompt_token_ids"]),
        max_new: v["max_new_tokens"].as_u64().expect("max_new_tokens") as usize,
        want: ids(&v["greedy_token_ids"]),
        margins: floats(&v["top1_margin"]),
        top5: v["top5"].clone(),
        logits_file: v["logits_file"].as_str().map(String::from),
    }
}

/// The 5 single cases and the 4 prompts of the batch case.
fn cases(model: &str) -> (Vec<Case>, Vec<Case>) {
    let single = jsonl(&format!("{model}.jsonl"))
        .iter()
        .map(|v| case_of(v["id"].as_str().expect("id").to_string(), v))
        .collect();
    let batch = jsonl(&format!("{model}.batch.jsonl"));
    let batch = batch[0]["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .enumerate()
        .map(|(i, v)| case_of(format!("{model}/batch4[{i}]"), v))
        .collect();
    (single, batch)
}

fn load_cfg(model: &str) -> ModelLoadConfig {
    ModelLoadConfig {
        model_path: arch_dir().join("models").join(model),
        dtype: ModelDType::Float32,
        cache_bytes: 16 << 20,
        min_cache_tokens: 0,
        block_size: BLOCK,
        quiet: true,
        device: aphro_engine::backend::Device::Cpu,
        kv_cache_dtype: Default::default(),
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = row
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    row.iter().map(|&v| v as f64 - lse).collect()
}

/// Whole-prompt prefill, then greedy decode on the runner; (ids, logits of every step).
fn greedy(r: &mut LlamaRunner<Flex>, prompt: &[u32], max_new: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let table: Vec<u32> = (0..(prompt.len() + max_new).div_ceil(BLOCK) as u32).collect();
    let mut step = |toks: &[u32], start: usize| {
        let batch = BatchInput {
            seqs: vec![SeqInput {
                seq_id: 1,
                token_ids: toks.to_vec(),
                start_pos: start,
                block_table: table.clone(),
                logits: LogitsWanted::Last,
            }],
        };
        r.execute(&batch).expect("step runs").remove(0).data
    };
    let mut logits = vec![step(prompt, 0)];
    let mut out = Vec::new();
    loop {
        let next = argmax(logits.last().expect("logits"));
        out.push(next);
        if out.len() == max_new {
            return (out, logits);
        }
        let pos = prompt.len() + out.len() - 1;
        logits.push(step(&[next], pos));
    }
}

/// `got` equals `want`, or first differs at a step whose reference margin is a near-tie
/// (returned, to be reported).
fn check_ids(c: &Case, got: &[u32], how: &str) -> Option<usize> {
    let split = got.iter().zip(&c.want).position(|(a, b)| a != b);
    match split {
        None => assert_eq!(got.len(), c.want.len(), "{} ({how}): length", c.id),
        Some(i) => assert!(
            c.margins[i] < 1e-3,
            "{} ({how}): step {i} gives {} where transformers gives {} (margin {})\n got  {got:?}\n want {:?}",
            c.id,
            got[i],
            c.want[i],
            c.margins[i],
            c.want
        ),
    }
    split
}

#[test]
fn greedy_ids_and_logits_match_transformers() {
    for model in MODELS {
        let mut r = load_flex_runner(&load_cfg(model)).expect("fixture loads");
        let (single, batch) = cases(model);
        for c in single.iter().chain(&batch) {
            let (got, logits) = greedy(&mut r, &c.prompt, c.max_new);
            if let Some(i) = check_ids(c, &got, "runner") {
                eprintln!("{}: accepted near-tie split at step {i}", c.id);
                continue;
            }
            // Top-5 logprobs of every step.
            let mut worst = 0f64;
            for (step, (row, top5)) in logits
                .iter()
                .zip(c.top5.as_array().expect("top5"))
                .enumerate()
            {
                let lp = log_softmax(row);
                for pair in top5.as_array().expect("pairs") {
                    let (id, want) = (pair[0].as_u64().expect("id"), pair[1].as_f64().expect("lp"));
                    let d = (lp[id as usize] - want).abs();
                    worst = worst.max(d);
                    assert!(
                        d < 1e-3,
                        "{} step {step} id {id}: {} vs {want}",
                        c.id,
                        lp[id as usize]
                    );
                }
            }
            // The full logits at the last prompt position, within 1e-4 of their scale.
            if let Some(f) = &c.logits_file {
                let bytes = std::fs::read(arch_dir().join("goldens").join(f)).expect("logits file");
                let want: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                assert_eq!(want.len(), logits[0].len(), "{}: vocab", c.id);
                let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                let diff = logits[0]
                    .iter()
                    .zip(&want)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    diff <= 1e-4 * scale,
                    "{}: last-prompt logits differ by {diff} (scale {scale})",
                    c.id
                );
                eprintln!("{}: logits max |diff| {diff:.2e} (scale {scale:.2}), top-5 logprob max |diff| {worst:.2e}", c.id);
            }
        }
    }
}

/// Every case through the engine at once (the batch case's prompts run together with the
/// others), prefills cut into chunks of at most 4 tokens; with prefix caching the whole set
/// runs twice, the second time over cached prefixes.
#[test]
fn engine_batches_match_transformers_with_and_without_prefix_caching() {
    for model in MODELS {
        let (single, batch) = cases(model);
        let all: Vec<&Case> = single.iter().chain(&batch).collect();
        for prefix_caching in [false, true] {
            let runner = load_flex_runner(&load_cfg(model)).expect("fixture loads");
            let engine = Engine::new(
                Box::new(runner),
                EngineConfig {
                    max_num_batched_tokens: 32,
                    max_num_seqs: 16,
                    long_prefill_token_threshold: 4,
                    enable_prefix_caching: prefix_caching,
                    seed: Some(0),
                    ..Default::default()
                },
            )
            .expect("engine");
            let rounds = if prefix_caching { 2 } else { 1 };
            for round in 0..rounds {
                let streams: Vec<_> = all
                    .iter()
                    .map(|c| {
                        let sampling = SamplingConfig {
                            ignore_eos: true,
                            ..SamplingConfig::greedy(c.max_new as i64)
                        };
                        let id = format!("{}#{round}", c.id);
                        engine.generate(EngineRequest::new(id, c.prompt.clone(), sampling))
                    })
                    .collect();
                for (c, s) in all.iter().zip(streams) {
                    let got: Vec<u32> = block_on(s.collect::<Vec<_>>())
                        .into_iter()
                        .flat_map(|o| o.expect("generates").token_ids)
                        .collect();
                    let how = format!("engine, prefix caching {prefix_caching}, round {round}");
                    if let Some(i) = check_ids(c, &got, &how) {
                        eprintln!("{} ({how}): accepted near-tie split at step {i}", c.id);
                    }
                }
            }
            let hits = engine.metrics_synced().prefix_cache_hits;
            if prefix_caching {
                assert!(hits > 0, "{model}: the second round reused no cached block");
            } else {
                assert_eq!(hits, 0, "{model}: prefix caching is off");
            }
        }
    }
}
