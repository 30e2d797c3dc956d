//! The CubeCL kernels of the GPU backends, run for real under `burn-wgpu` (in CI on Mesa's
//! lavapipe, a CPU Vulkan driver) and compared with the plain burn reference on the CPU:
//! block tables, GQA head mapping, partial last blocks, several sequences of different
//! lengths, prefill over a cached prefix, contexts longer than one cube's lanes, the KV
//! write, and 16-bit K/V where the adapter supports it.
//!
//! Without a Vulkan adapter the tests print why and pass, except under `CI=true`, where a
//! missing adapter fails them (CI installs lavapipe: `mesa-vulkan-drivers`).

use aphro_engine::backend::wgpu::{WgpuBackend, WgpuDevice};
use aphro_engine::model::ops::{reference, AttnSeq, AttnShape, EngineOps};
use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Tensor, TensorData, TensorPrimitive};

type W = WgpuBackend;

#[path = "common/wgpu.rs"]
mod wgpu_probe;
use wgpu_probe::device;

fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn on_w(v: &[f32], shape: [usize; 2], dev: &WgpuDevice) -> FloatTensor<W> {
    Tensor::<W, 2>::from_data(TensorData::new(v.to_vec(), shape), dev)
        .into_primitive()
        .tensor()
}

fn on_flex(v: &[f32], shape: [usize; 2]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(v.to_vec(), shape))
}

fn read_w(t: FloatTensor<W>) -> Vec<f32> {
    Tensor::<W, 2>::from_primitive(TensorPrimitive::Float(t))
        .cast(FloatDType::F32)
        .into_data()
        .to_vec::<f32>()
        .expect("f32 data")
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = 0f32;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let err = (a - b).abs() / (1.0 + b.abs());
        assert!(err <= tol, "{what}: [{i}] {a} vs {b}");
        worst = worst.max(err);
    }
    eprintln!("{what}: max rel err {worst:.2e}");
}

struct Case {
    name: &'static str,
    shape: AttnShape,
    num_blocks: usize,
    /// (q_len, start_pos, block table) per sequence.
    seqs: Vec<(usize, usize, Vec<u32>)>,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "gqa mixed prefill+decode",
            shape: AttnShape {
                num_heads: 6,
                num_kv_heads: 2,
                head_dim: 8,
                block_size: 4,
                scale: 0.35,
                window: None,
            },
            num_blocks: 16,
            seqs: vec![
                // Prefill of 5 after a cached prefix of 6 (last block partial), a table
                // longer than needed, non-contiguous blocks.
                (5, 6, vec![11, 3, 14, 0]),
                // Decode in a partially filled first block.
                (1, 2, vec![6]),
                // Whole-prompt prefill from 0.
                (7, 0, vec![9, 1]),
                // Decode with a single key in its last block.
                (1, 8, vec![2, 5, 7]),
            ],
        },
        Case {
            name: "long context, more keys than lanes, smollm2 heads",
            shape: AttnShape {
                num_heads: 9,
                num_kv_heads: 3,
                head_dim: 64,
                block_size: 16,
                scale: 0.125,
                window: None,
            },
            num_blocks: 12,
            seqs: vec![
                (1, 70, vec![4, 10, 1, 8, 3]),
                (9, 33, vec![0, 7, 2]),
                (1, 0, vec![11]),
            ],
        },
        Case {
            name: "sliding window 20 cutting inside blocks",
            shape: AttnShape {
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 32,
                block_size: 16,
                scale: 0.2,
                window: Some(20),
            },
            num_blocks: 12,
            seqs: vec![
                (1, 70, vec![4, 10, 1, 8, 3]),
                (30, 3, vec![0, 7, 2]),
                (1, 5, vec![11]),
            ],
        },
        Case {
            name: "mha, block size 1",
            shape: AttnShape {
                num_heads: 2,
                num_kv_heads: 2,
                head_dim: 16,
                block_size: 1,
                scale: 0.25,
                window: None,
            },
            num_blocks: 12,
            seqs: vec![(3, 2, vec![7, 0, 9, 4, 2]), (1, 3, vec![1, 3, 5, 11])],
        },
    ]
}

/// Runs every case with K/V of `kv` type; `round` maps f32 K/V to what that type holds.
fn check_attention(dev: &WgpuDevice, kv: FloatDType, round: fn(f32) -> f32, tol: f32) {
    let mut seed = 42;
    for c in cases() {
        let s = &c.shape;
        let kv_w = s.num_kv_heads * s.head_dim;
        let rows = c.num_blocks * s.block_size;
        let kc: Vec<f32> = rand(rows * kv_w, &mut seed)
            .into_iter()
            .map(round)
            .collect();
        let vc: Vec<f32> = rand(rows * kv_w, &mut seed)
            .into_iter()
            .map(round)
            .collect();
        let mut seqs = Vec::new();
        let mut tokens = 0;
        for (q_len, start_pos, table) in &c.seqs {
            seqs.push(AttnSeq {
                q_offset: tokens,
                q_len: *q_len,
                start_pos: *start_pos,
                block_table: table,
            });
            tokens += q_len;
        }
        let qdim = s.num_heads * s.head_dim;
        let q = rand(tokens * qdim, &mut seed);
        let want = reference::paged_attention::<Flex>(
            on_flex(&q, [tokens, qdim]),
            &on_flex(&kc, [rows, kv_w]),
            &on_flex(&vc, [rows, kv_w]),
            &seqs,
            s,
        )
        .into_data()
        .to_vec::<f32>()
        .expect("f32");
        let cast = |t: FloatTensor<W>| {
            Tensor::<W, 2>::from_primitive(TensorPrimitive::Float(t))
                .cast(kv)
                .into_primitive()
                .tensor()
        };
        let kw = cast(on_w(&kc, [rows, kv_w], dev));
        let vw = cast(on_w(&vc, [rows, kv_w], dev));
        let got =
            <W as EngineOps>::paged_attention(on_w(&q, [tokens, qdim], dev), &kw, &vw, &seqs, s);
        assert_close(
            &read_w(got),
            &want,
            tol,
            &format!("{} ({kv:?} K/V)", c.name),
        );
    }
}

#[test]
fn paged_attention_kernel_matches_reference() {
    let Some(dev) = device() else { return };
    check_attention(&dev, FloatDType::F32, |x| x, 1e-5);
}

#[test]
fn paged_attention_kernel_reads_f16_kv() {
    let Some(dev) = device() else { return };
    if !W::supports_dtype(&dev, DType::F16) {
        eprintln!("SKIPPED: this adapter has no f16 storage (shader-f16)");
        return;
    }
    check_attention(
        &dev,
        FloatDType::F16,
        |x| half::f16::from_f32(x).to_f32(),
        1e-4,
    );
}

#[test]
fn reshape_and_cache_kernel_writes_slots_in_place() {
    let Some(dev) = device() else { return };
    let mut seed = 7;
    let (rows, w) = (40, 24);
    let cache = rand(rows * w, &mut seed);
    let new = rand(5 * w, &mut seed);
    // A prefill run that crosses into a non-adjacent block, plus a lone decode slot.
    let slots = [13, 14, 15, 32, 3];
    let want = reference::reshape_and_cache::<Flex>(
        on_flex(&cache, [rows, w]),
        on_flex(&new, [5, w]),
        &slots,
    )
    .into_data()
    .to_vec::<f32>()
    .expect("f32");
    let got = <W as EngineOps>::reshape_and_cache(
        on_w(&cache, [rows, w], &dev),
        on_w(&new, [5, w], &dev),
        &slots,
    );
    assert_eq!(read_w(got), want);
}

/// Prefill + decode through the real model wiring (weights on the device, the KV write and
/// attention kernels inside the forward pass) agree with the CPU backend.
#[test]
fn tiny_model_on_wgpu_matches_cpu() {
    use aphro_engine::model::{Llama, LlamaRunner};
    use aphro_engine::runner::{BatchInput, LogitsWanted, ModelRunner, SeqInput};
    let Some(dev) = device() else { return };
    let cfg = aphro_engine::model::LlamaConfig::from_hf_json(&serde_json::json!({
        "model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
        "num_hidden_layers": 2, "vocab_size": 64, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
        "tie_word_embeddings": true, "eos_token_id": 2
    }))
    .expect("config");
    let weights = TinyWeights::new(&cfg);
    let cpu = Llama::<Flex>::load(cfg.clone(), &weights, false, &Default::default()).expect("cpu");
    let gpu = Llama::<W>::load_with(
        cfg,
        &weights,
        <W as EngineOps>::weight_storage(aphro_engine::model::ModelDType::Float32),
        &dev,
    )
    .expect("gpu");
    let mut cpu = LlamaRunner::new(cpu, 1 << 20, 4).expect("runner");
    let mut gpu = LlamaRunner::new(gpu, 1 << 20, 4).expect("runner");
    let prompt: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % 64).collect();
    let steps: [(&[u32], usize, LogitsWanted); 3] = [
        (&prompt[..6], 0, LogitsWanted::All),
        (&prompt[6..10], 6, LogitsWanted::All),
        (&prompt[10..], 10, LogitsWanted::Last),
    ];
    for (toks, start, want) in steps {
        let batch = BatchInput {
            seqs: vec![SeqInput {
                seq_id: 1,
                token_ids: toks.to_vec(),
                start_pos: start,
                block_table: vec![7, 2, 8],
                logits: want,
            }],
        };
        let a = cpu
            .execute(&batch)
            .expect("cpu step")
            .remove(0)
            .data
            .to_vec();
        let b = gpu
            .execute(&batch)
            .expect("gpu step")
            .remove(0)
            .data
            .to_vec();
        assert_close(&b, &a, 1e-4, &format!("logits at {start}"));
    }
}

/// Random f32 weights for a tiny Llama, served as a [`WeightSource`].
struct TinyWeights(std::collections::HashMap<String, (Vec<usize>, Vec<f32>)>);

impl TinyWeights {
    fn new(cfg: &aphro_engine::model::LlamaConfig) -> Self {
        let (dm, d, ff) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
        let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
        let mut seed = 11u64;
        let mut m = std::collections::HashMap::new();
        let mut add = |name: String, shape: Vec<usize>, scale: f32| {
            let n = shape.iter().product();
            let v = rand(n, &mut seed).into_iter().map(|x| x * scale).collect();
            m.insert(name, (shape, v));
        };
        add(
            "model.embed_tokens.weight".into(),
            vec![cfg.vocab_size, dm],
            1.0,
        );
        add("model.norm.weight".into(), vec![dm], 2.0);
        for l in 0..cfg.num_layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            add(p("input_layernorm.weight"), vec![dm], 2.0);
            add(p("post_attention_layernorm.weight"), vec![dm], 2.0);
            add(p("self_attn.q_proj.weight"), vec![qd, dm], 0.5);
            add(p("self_attn.k_proj.weight"), vec![kvd, dm], 0.5);
            add(p("self_attn.v_proj.weight"), vec![kvd, dm], 0.5);
            add(p("self_attn.o_proj.weight"), vec![dm, qd], 0.5);
            add(p("mlp.gate_proj.weight"), vec![ff, dm], 0.5);
            add(p("mlp.up_proj.weight"), vec![ff, dm], 0.5);
            add(p("mlp.down_proj.weight"), vec![dm, ff], 0.5);
        }
        Self(m)
    }
}

impl aphro_engine::model::weights::WeightSource for TinyWeights {
    fn get(
        &self,
        name: &str,
        _keep_quant: bool,
    ) -> Result<Option<aphro_engine::model::weights::HostTensor>, aphro_engine::model::ModelError>
    {
        Ok(self.0.get(name).map(
            |(shape, data)| aphro_engine::model::weights::HostTensor::F32 {
                shape: shape.clone(),
                data: data.clone(),
            },
        ))
    }
}
