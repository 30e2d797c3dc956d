//! MoE decode cost follows the *active* experts: batch-1 decode tok/s of one random
//! Mixtral-shaped model (8 experts per layer) routed top-1, top-2 and top-8, next to a dense
//! model whose MLP has the width of all 8 experts together (the same parameter count).
//! `cargo run -p aphro-engine --example moe_scaling` (aphro-engine builds at opt-level 3 in
//! the dev profile; best of 3 timed runs; `APHRO_BENCH_DECODE` sets the decode length).

use std::path::Path;
use std::time::Instant;

use aphro_engine::model::{load_flex_runner, ModelDType, ModelLoadConfig};
use aphro_engine::runner::{BatchInput, LogitsWanted, ModelRunner, SeqInput};

const HIDDEN: usize = 256;
const EXPERT_FF: usize = 1024;
const EXPERTS: usize = 8;
const LAYERS: usize = 4;
const VOCAB: usize = 1024;

/// A random model directory: Mixtral with `top_k` of 8 experts, or (`top_k == 0`) a dense
/// Llama whose MLP is `EXPERTS * EXPERT_FF` wide.
fn write_model(dir: &Path, top_k: usize) {
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut rnd = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5).to_le_bytes()
            })
            .collect()
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>| {
        let n = shape.iter().product();
        tensors.push((name, shape, rnd(n)));
    };
    let (h, kvh, d) = (4, 2, 64);
    add("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN]);
    add("model.norm.weight".into(), vec![HIDDEN]);
    add("lm_head.weight".into(), vec![VOCAB, HIDDEN]);
    for l in 0..LAYERS {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        add(p("input_layernorm.weight"), vec![HIDDEN]);
        add(p("post_attention_layernorm.weight"), vec![HIDDEN]);
        add(p("self_attn.q_proj.weight"), vec![h * d, HIDDEN]);
        add(p("self_attn.k_proj.weight"), vec![kvh * d, HIDDEN]);
        add(p("self_attn.v_proj.weight"), vec![kvh * d, HIDDEN]);
        add(p("self_attn.o_proj.weight"), vec![HIDDEN, h * d]);
        if top_k == 0 {
            let ff = EXPERTS * EXPERT_FF;
            add(p("mlp.gate_proj.weight"), vec![ff, HIDDEN]);
            add(p("mlp.up_proj.weight"), vec![ff, HIDDEN]);
            add(p("mlp.down_proj.weight"), vec![HIDDEN, ff]);
            continue;
        }
        add(p("block_sparse_moe.gate.weight"), vec![EXPERTS, HIDDEN]);
        for e in 0..EXPERTS {
            let x = |w: &str| p(&format!("block_sparse_moe.experts.{e}.{w}.weight"));
            add(x("w1"), vec![EXPERT_FF, HIDDEN]);
            add(x("w3"), vec![EXPERT_FF, HIDDEN]);
            add(x("w2"), vec![HIDDEN, EXPERT_FF]);
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .expect("valid view");
            (n.clone(), v)
        })
        .collect();
    let bytes = safetensors::serialize(views, None).expect("serializes");
    std::fs::write(dir.join("model.safetensors"), bytes).expect("write weights");
    let mut cfg = serde_json::json!({
        "model_type": if top_k == 0 { "llama" } else { "mixtral" },
        "hidden_size": HIDDEN, "num_attention_heads": h, "num_key_value_heads": kvh,
        "head_dim": d, "intermediate_size": if top_k == 0 { EXPERTS * EXPERT_FF } else { EXPERT_FF },
        "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096, "tie_word_embeddings": false, "eos_token_id": 2
    });
    if top_k > 0 {
        cfg["num_local_experts"] = EXPERTS.into();
        cfg["num_experts_per_tok"] = top_k.into();
    }
    std::fs::write(dir.join("config.json"), cfg.to_string()).expect("write config");
}

/// Best-of-3 batch-1 decode tok/s over `steps` tokens after a 16-token prompt.
fn decode_tok_s(dir: &Path, steps: usize) -> f64 {
    let block = 16;
    let mut r = load_flex_runner(&ModelLoadConfig {
        model_path: dir.to_path_buf(),
        dtype: ModelDType::Float32,
        cache_bytes: 64 << 20,
        min_cache_tokens: 0,
        block_size: block,
        quiet: true,
        device: aphro_engine::backend::Device::Cpu,
        kv_cache_dtype: Default::default(),
    })
    .expect("model loads");
    let table: Vec<u32> = (0..(16 + steps).div_ceil(block) as u32).collect();
    let mut step = |toks: Vec<u32>, start: usize| {
        r.execute(&BatchInput {
            seqs: vec![SeqInput {
                seq_id: 0,
                token_ids: toks,
                start_pos: start,
                block_table: table.clone(),
                logits: LogitsWanted::Last,
            }],
        })
        .expect("step");
    };
    let prompt: Vec<u32> = (0..16).map(|i| 5 + i * 61 % 1000).collect();
    let mut best = 0f64;
    for _ in 0..3 {
        step(prompt.clone(), 0);
        let t = Instant::now();
        for i in 0..steps {
            // Varying tokens, so the routing varies too.
            step(vec![(7 + i as u32 * 131) % VOCAB as u32], 16 + i);
        }
        best = best.max(steps as f64 / t.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let steps = std::env::var("APHRO_BENCH_DECODE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    println!(
        "batch-1 decode, f32, {LAYERS} layers, hidden {HIDDEN}, {EXPERTS} experts x {EXPERT_FF}, \
         {} threads",
        rayon::current_num_threads()
    );
    let mut rows = Vec::new();
    for (label, top_k) in [
        ("moe top-1 of 8", 1),
        ("moe top-2 of 8", 2),
        ("moe top-8 of 8", 8),
        ("dense, ffn = 8 experts wide", 0),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        write_model(dir.path(), top_k);
        let tok_s = decode_tok_s(dir.path(), steps);
        println!("{label:<30} {tok_s:>8.1} tok/s");
        rows.push((label, tok_s));
    }
    let (top2, dense) = (rows[1].1, rows[3].1);
    println!("top-2 / dense-equivalent: {:.2}x", top2 / dense);
}
