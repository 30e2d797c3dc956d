//! Mixture-of-experts models against HF transformers: tiny random-weight Qwen3-MoE, Mixtral,
//! OLMoE and GPT-OSS checkpoints with float32 greedy goldens (testdata/arch, see its README).
//!
//! Every case's greedy ids must equal transformers' (a split is accepted only where the
//! recorded top-1 margin is below 1e-3), per-step top-5 logprobs and the full last-prompt
//! logits must agree, and the same ids must come out of the engine with the batch case's
//! prompts running together, with prefix caching on and off and every prompt prefilled in
//! chunks.

use std::path::PathBuf;

use aphro_engine::engine::{Engine, EngineConfig};
use aphro_engine::model::{load_flex_runner, ModelDType, ModelLoadConfig};
use aphro_engine::request::{EngineRequest, SamplingConfig};
use aphro_engine::runner::{BatchInput, LogitsWanted, ModelRunner, SeqInput};
use futures::executor::block_on;
use futures::StreamExt;
use serde_json::Value;

const MODELS: &[&str] = &["qwen3-moe", "mixtral", "olmoe", "gpt-oss"];
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
fn greedy(r: &mut dyn ModelRunner, prompt: &[u32], max_new: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
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
        r.execute(&batch)
            .expect("step runs")
            .remove(0)
            .data
            .to_vec()
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

/// transformers' full logits at the last prompt position.
fn golden_logits(c: &Case) -> Vec<f32> {
    let f = c.logits_file.as_ref().expect("case has a logits file");
    std::fs::read(arch_dir().join("goldens").join(f))
        .expect("logits file")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `got` within 1e-4 of the golden logits' scale (max |logit|); returns (max diff, scale).
fn check_last_logits(c: &Case, got: &[f32]) -> (f32, f32) {
    let want = golden_logits(c);
    assert_eq!(want.len(), got.len(), "{}: vocab", c.id);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(&want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff <= 1e-4 * scale,
        "{}: last-prompt logits differ by {diff} (scale {scale})",
        c.id
    );
    (diff, scale)
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
            if c.logits_file.is_some() {
                let (diff, scale) = check_last_logits(c, &logits[0]);
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

/// llama.cpp's layout of an HF MoE checkpoint: what `convert_hf_to_gguf.py` writes (Q/K rows
/// permuted for `llama`, each layer's experts stacked into one 3-D tensor), with the experts
/// as Q8_0 blocks (`quant_experts`) or f32.
fn write_gguf(model: &str, path: &std::path::Path, quant_experts: bool) {
    use aphro_engine::model::weights::gguf_name;
    let dir = arch_dir().join("models").join(model);
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config"))
            .expect("json");
    let bytes = std::fs::read(dir.join("model.safetensors")).expect("weights");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let f32s = |name: &str| -> (Vec<usize>, Vec<f32>) {
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let v = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (t.shape().to_vec(), v)
    };
    let u = |k: &str| cfg[k].as_u64().unwrap_or(0) as usize;
    let (arch, permute) = match model {
        "mixtral" => ("llama", true),
        "qwen3-moe" => ("qwen3moe", false),
        other => panic!("no GGUF layout for {other}"),
    };
    let (layers, experts, heads, kv_heads) = (
        u("num_hidden_layers"),
        u("num_local_experts").max(u("num_experts")),
        u("num_attention_heads"),
        u("num_key_value_heads"),
    );
    let head_dim = u("head_dim");
    // (name, ggml dims fastest-first, ggml type, bytes)
    let mut tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)> = Vec::new();
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let q8_0 = |v: &[f32]| -> Vec<u8> {
        let mut out = Vec::new();
        for b in v.chunks_exact(32) {
            let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let d = amax / 127.0;
            out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
            out.extend(b.iter().map(|x| (x * inv).round() as i8 as u8));
        }
        out
    };
    for name in st.names() {
        if name.contains(".experts.") {
            continue;
        }
        let (shape, mut v) = f32s(name);
        let g = gguf_name(name).unwrap_or_else(|| panic!("no GGUF name for {name}"));
        let h = if name.contains("q_proj") {
            heads
        } else if name.contains("k_proj") {
            kv_heads
        } else {
            0
        };
        if permute && h > 0 {
            // llama.cpp: w.reshape(h, 2, d/2, cols).swapaxes(1, 2).
            let cols = shape[1];
            let d = shape[0] / h;
            let src = v.clone();
            for hh in 0..h {
                for i in 0..d / 2 {
                    for j in 0..2 {
                        let (to, from) = (hh * d + 2 * i + j, hh * d + j * d / 2 + i);
                        v[to * cols..(to + 1) * cols]
                            .copy_from_slice(&src[from * cols..(from + 1) * cols]);
                    }
                }
            }
        }
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        tensors.push((g, dims, 0, f32_bytes(&v)));
    }
    let (prefix, names) = if model == "mixtral" {
        ("block_sparse_moe.experts", ["w1", "w3", "w2"])
    } else {
        ("mlp.experts", ["gate_proj", "up_proj", "down_proj"])
    };
    for l in 0..layers {
        for (part, g) in names
            .iter()
            .zip(["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"])
        {
            let mut all = Vec::new();
            let mut shape = Vec::new();
            for e in 0..experts {
                let (s, v) = f32s(&format!("model.layers.{l}.{prefix}.{e}.{part}.weight"));
                shape = s;
                all.extend(v);
            }
            let dims = vec![shape[1] as u64, shape[0] as u64, experts as u64];
            let (ty, data) = if quant_experts {
                (8, q8_0(&all))
            } else {
                (0, f32_bytes(&all))
            };
            tensors.push((format!("blk.{l}.{g}.weight"), dims, ty, data));
        }
    }
    let str_ = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    let mut kv: Vec<(String, u32, Vec<u8>)> = Vec::new();
    let mut s = Vec::new();
    str_(&mut s, arch);
    kv.push(("general.architecture".into(), 8, s));
    for (k, v) in [
        ("embedding_length", u("hidden_size")),
        ("feed_forward_length", u("intermediate_size")),
        (
            "expert_feed_forward_length",
            match u("moe_intermediate_size") {
                0 => u("intermediate_size"),
                w => w,
            },
        ),
        ("block_count", layers),
        ("attention.head_count", heads),
        ("attention.head_count_kv", kv_heads),
        ("attention.key_length", head_dim),
        ("context_length", u("max_position_embeddings")),
        ("vocab_size", u("vocab_size")),
        ("expert_count", experts),
        ("expert_used_count", u("num_experts_per_tok")),
    ] {
        kv.push((format!("{arch}.{k}"), 4, (v as u32).to_le_bytes().to_vec()));
    }
    for (k, v) in [
        ("rope.freq_base", cfg["rope_theta"].as_f64().expect("theta")),
        (
            "attention.layer_norm_rms_epsilon",
            cfg["rms_norm_eps"].as_f64().expect("eps"),
        ),
    ] {
        kv.push((format!("{arch}.{k}"), 6, (v as f32).to_le_bytes().to_vec()));
    }
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, ty, v) in &kv {
        str_(&mut b, k);
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(v);
    }
    let mut offset = 0u64;
    for (name, dims, ty, data) in &tensors {
        str_(&mut b, name);
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        offset += (data.len() as u64).div_ceil(32) * 32;
    }
    for (_, _, _, data) in &tensors {
        while b.len() % 32 != 0 {
            b.push(0);
        }
        b.extend_from_slice(data);
    }
    std::fs::write(path, b).expect("write gguf");
}

/// The same checkpoints as llama.cpp lays them out in a GGUF: f32 experts give transformers'
/// ids and logits; Q8_0 experts run quantized (the fused CPU kernels) and stay close.
#[test]
fn gguf_moe_matches_transformers_and_runs_quantized_experts() {
    for model in ["mixtral", "qwen3-moe"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (f32_path, q8_path) = (tmp.path().join("f32.gguf"), tmp.path().join("q8.gguf"));
        write_gguf(model, &f32_path, false);
        write_gguf(model, &q8_path, true);
        let load = |path: &std::path::Path, dtype| {
            load_flex_runner(&ModelLoadConfig {
                model_path: path.to_path_buf(),
                dtype,
                ..load_cfg(model)
            })
            .unwrap_or_else(|e| panic!("{model} GGUF loads: {e}"))
        };
        let (single, _) = cases(model);
        let mut r = load(&f32_path, ModelDType::Float32);
        for c in &single {
            let (got, logits) = greedy(&mut r, &c.prompt, c.max_new);
            check_ids(c, &got, "f32 GGUF");
            if c.logits_file.is_some() {
                check_last_logits(c, &logits[0]);
            }
        }
        let c = single
            .iter()
            .find(|c| c.logits_file.is_some())
            .expect("a case with logits");
        let want = golden_logits(c);
        let mut quant = load(&q8_path, ModelDType::Auto);
        let mut dequant = load(&q8_path, ModelDType::Float32);
        let (_, q) = greedy(&mut quant, &c.prompt, 1);
        let (_, dq) = greedy(&mut dequant, &c.prompt, 1);
        let cos = |a: &[f32], b: &[f32]| {
            let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            dot / (n(a) * n(b))
        };
        // The quantized kernels round activations to 8 bits: a different computation from
        // the dequantized path, both close to transformers.
        assert_ne!(q[0], dq[0], "{model}: Q8_0 experts did not run quantized");
        // 8-bit experts are lossy (these logits are peaked, std ~5): a loose bound that
        // still catches a wrong expert, a wrong slice or a wrong weight.
        for (how, l, reference) in [
            ("quantized vs transformers", &q[0], &want),
            ("dequantized vs transformers", &dq[0], &want),
            ("quantized vs dequantized", &q[0], &dq[0]),
        ] {
            let c = cos(l, reference);
            assert!(c > 0.99, "{model} Q8_0 experts, {how}: cosine {c}");
            eprintln!("{model} Q8_0 experts, {how}: cosine {c:.6}");
        }
    }
}

/// The MoE models on the CubeCL path (burn-wgpu; lavapipe in CI): the same ids and
/// last-prompt logits as transformers. Qwen3-MoE and GPT-OSS by default (lavapipe runs all
/// four in about 30 s on two cores); `APHRO_WGPU_ALL=1` runs all of them.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_moe_matches_transformers() {
    use aphro_engine::backend::wgpu::WgpuBackend;
    use aphro_engine::model::load_runner_on;
    let Some(dev) = wgpu_probe::device() else {
        return;
    };
    // Qwen3-MoE and GPT-OSS (its attention sinks run on the backend's burn-op default)
    // unless APHRO_WGPU_ALL asks for every model.
    let all = std::env::var_os("APHRO_WGPU_ALL").is_some();
    for model in MODELS
        .iter()
        .filter(|m| all || ["qwen3-moe", "gpt-oss"].contains(m))
    {
        let mut r = load_runner_on::<WgpuBackend>(&load_cfg(model), &dev).expect("loads on wgpu");
        let (single, _) = cases(model);
        for c in &single {
            let (got, logits) = greedy(&mut r, &c.prompt, c.max_new);
            check_ids(c, &got, "wgpu");
            if c.logits_file.is_some() {
                let (diff, scale) = check_last_logits(c, &logits[0]);
                eprintln!(
                    "{} (wgpu): logits max |diff| {diff:.2e} (scale {scale:.2})",
                    c.id
                );
            }
        }
    }
}

#[cfg(feature = "wgpu")]
#[path = "common/wgpu.rs"]
mod wgpu_probe;
