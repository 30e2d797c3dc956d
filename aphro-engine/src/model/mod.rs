//! The model half of the engine: Llama-family weights (GGUF or safetensors), a burn forward
//! pass generic over the backend, and a [`crate::runner::ModelRunner`] with paged K/V.

pub mod arch;
pub mod config;
pub mod cpu;
pub mod flash;
pub mod llama;
pub mod moe;
pub mod ops;
pub mod quant;
pub mod runner;
pub mod weights;

use std::path::{Path, PathBuf};

use aphro_core::gguf::{GgufError, GgufFile};
use burn::backend::flex::{Flex, FlexDevice};

pub use config::LlamaConfig;
pub use llama::{Llama, WeightStorage};
pub use ops::EngineOps;
pub use runner::LlamaRunner;

use crate::backend::Device;
use crate::runner::ModelRunner;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported model architecture {0:?} (supported: {list})", list = arch::supported())]
    UnsupportedArchitecture(String),
    #[error("tensor {name} has type {ty}, which this engine cannot load")]
    UnsupportedTensorType { name: String, ty: String },
    #[error("weights lack tensor {0}")]
    MissingTensor(String),
    #[error("tensor {name} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("bad model config: {0}")]
    Config(String),
    #[error("bad weights: {0}")]
    Weights(String),
    #[error("{0} is not supported yet")]
    Unsupported(String),
    #[error("a KV cache of {cache_bytes} bytes holds no block of {block_bytes} bytes")]
    CacheTooSmall {
        cache_bytes: usize,
        block_bytes: usize,
    },
    #[error("{0} is neither a .gguf file nor a directory with config.json + safetensors")]
    UnknownFormat(PathBuf),
    #[error(transparent)]
    Device(#[from] crate::backend::DeviceError),
}

/// Weight/compute precision requested by the user (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelDType {
    /// Keep a GGUF's block quantization in memory (fused kernels); f32 otherwise.
    #[default]
    Auto,
    /// Dequantize everything to f32 (the exact-parity path).
    Float32,
    BFloat16,
    Float16,
}

/// Storage of the paged KV cache (`--kv-cache-dtype`, vLLM's name and spellings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDType {
    /// The model's compute precision: `f32` on the CPU, the 16-bit type of 16-bit weights
    /// on a GPU.
    #[default]
    Auto,
    /// IEEE half: half the bytes (and the attention memory traffic) of `f32`, rounding each
    /// cached key and value to 11 significant bits.
    Float16,
    /// bfloat16: half the bytes, 8 significant bits.
    BFloat16,
}

impl std::str::FromStr for KvCacheDType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "float16" | "fp16" | "half" => Ok(Self::Float16),
            "bfloat16" | "bf16" => Ok(Self::BFloat16),
            "fp8" | "fp8_e4m3" | "fp8_e5m2" | "fp8_inc" | "fp8_ds_mla" => Err(format!(
                "--kv-cache-dtype {s} is not supported: aphro's KV cache stores auto, float16 \
                 or bfloat16"
            )),
            _ => Err(format!(
                "invalid --kv-cache-dtype {s:?}: expected auto, float16 or bfloat16"
            )),
        }
    }
}

/// The precision the embedded default model (SmolLM2-135M, Q4_1 GGUF) runs at unless told
/// otherwise: measured by `scripts/measure_precision.py`, its 4-bit weights against 8-bit
/// activations answer badly, dequantized to f32 they match the HF float32 reference (README).
pub const EMBEDDED_DEFAULT_DTYPE: ModelDType = ModelDType::Float32;

#[derive(Debug, Clone)]
pub struct ModelLoadConfig {
    /// A `.gguf` file or an HF model directory (`config.json` + `*.safetensors`).
    pub model_path: PathBuf,
    pub dtype: ModelDType,
    /// Bytes for the paged K/V cache (all layers, K and V).
    pub cache_bytes: usize,
    /// Grow the cache to hold at least this many tokens (`usize::MAX`: one sequence of the
    /// model's full context); 0 = exactly `cache_bytes`.
    pub min_cache_tokens: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Hide the weight-loading progress bar (it is also hidden when stderr is not a TTY).
    pub quiet: bool,
    /// Where the model runs (see [`crate::backend`]).
    pub device: Device,
    /// Storage of the KV cache (`--kv-cache-dtype`).
    pub kv_cache_dtype: KvCacheDType,
}

impl Default for ModelLoadConfig {
    fn default() -> Self {
        Self {
            model_path: PathBuf::new(),
            dtype: ModelDType::Auto,
            cache_bytes: 256 << 20,
            min_cache_tokens: 0,
            block_size: 16,
            quiet: false,
            device: Device::Auto,
            kv_cache_dtype: KvCacheDType::Auto,
        }
    }
}

/// Resolve a model argument: an existing path as is, else an HF repo id (`org/name`) looked
/// up in the local Hub cache at `refs/main` ([`aphro_core::model::cached_snapshot`], the
/// lookup the renderer makes too, so weights and tokenizer come from one snapshot).
/// Downloading is the CLI's job; this never touches the network.
pub fn resolve_model_path(model: &Path) -> Result<PathBuf, ModelError> {
    if model.exists() {
        return Ok(model.to_path_buf());
    }
    let id = model.to_string_lossy();
    if id.split('/').count() == 2 {
        if let Some(dir) = aphro_core::model::cached_snapshot(&id, None, None, "config.json") {
            return Ok(dir);
        }
    }
    Err(ModelError::UnknownFormat(model.to_path_buf()))
}

/// Load the model's config and weights from `path` (see [`resolve_model_path`]) onto `device`.
pub fn load_model<B: EngineOps>(
    path: &Path,
    dtype: ModelDType,
    device: &B::Device,
) -> Result<Llama<B>, ModelError> {
    load_model_with(path, dtype, false, device)
}

/// A progress bar on stderr for loading `path`, hidden if `quiet` or stderr is not a TTY.
fn load_bar(path: &Path, quiet: bool) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tensors {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let name = path.file_name().unwrap_or(path.as_os_str());
    bar.set_message(format!("loading {}", name.to_string_lossy()));
    bar
}

/// [`load_model`]; `quiet` hides the progress bar shown while the weights load.
pub fn load_model_with<B: EngineOps>(
    path: &Path,
    dtype: ModelDType,
    quiet: bool,
    device: &B::Device,
) -> Result<Llama<B>, ModelError> {
    let path = &resolve_model_path(path)?;
    let bar = load_bar(path, quiet);
    let storage = B::weight_storage(dtype);
    if path.is_dir() {
        let cfg_path = path.join("config.json");
        let raw = std::fs::read(&cfg_path).map_err(|e| ModelError::Io(cfg_path.clone(), e))?;
        let json: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| ModelError::Config(format!("{}: {e}", cfg_path.display())))?;
        let cfg = LlamaConfig::from_hf_json(&json)?;
        let src = weights::SafetensorsWeights::open_dir(path)?;
        return Llama::load_with_progress(cfg, &src, storage, device, &bar);
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        || path.is_file()
    {
        let file = GgufFile::open(path)?;
        let cfg = LlamaConfig::from_gguf(&file)?;
        let src = weights::GgufWeights::new(file, cfg.clone());
        return Llama::load_with_progress(cfg, &src, storage, device, &bar);
    }
    Err(ModelError::UnknownFormat(path.to_path_buf()))
}

/// Load a runner on `cfg.device` (`auto`: CUDA when compiled in and usable, else the CPU).
pub fn load_runner(cfg: &ModelLoadConfig) -> Result<Box<dyn ModelRunner>, ModelError> {
    match crate::backend::resolve(cfg.device)? {
        #[cfg(feature = "cuda")]
        Device::Cuda(i) => {
            use crate::backend::cuda::{device, CudaBackend};
            Ok(Box::new(load_runner_on::<CudaBackend>(cfg, &device(i))?))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(crate::backend::DeviceError::CudaNotCompiled.into()),
        Device::Cpu | Device::Auto => Ok(Box::new(load_flex_runner(cfg)?)),
    }
}

/// Load a runner on any backend with the engine's ops (`cfg.device` is not consulted).
pub fn load_runner_on<B: EngineOps>(
    cfg: &ModelLoadConfig,
    device: &B::Device,
) -> Result<LlamaRunner<B>, ModelError> {
    let model = load_model_with::<B>(&cfg.model_path, cfg.dtype, cfg.quiet, device)?;
    // 16-bit device weights come with a 16-bit KV pool (twice the blocks per byte), unless
    // `--kv-cache-dtype` says otherwise.
    let kv = match (cfg.kv_cache_dtype, B::weight_storage(cfg.dtype)) {
        (KvCacheDType::Float16, _) => burn::tensor::FloatDType::F16,
        (KvCacheDType::BFloat16, _) => burn::tensor::FloatDType::BF16,
        (KvCacheDType::Auto, WeightStorage::Dense16(dt)) => dt,
        (KvCacheDType::Auto, _) => burn::tensor::FloatDType::F32,
    };
    let bytes = cache_bytes_for(cfg, &model.cfg, kv);
    LlamaRunner::with_kv_dtype(model, bytes, cfg.block_size, kv)
}

/// `cfg.cache_bytes`, grown to hold `cfg.min_cache_tokens` tokens (at most the model's
/// context; one more block of slack) of `model`'s K/V.
fn cache_bytes_for(
    cfg: &ModelLoadConfig,
    model: &config::LlamaConfig,
    kv: burn::tensor::FloatDType,
) -> usize {
    if cfg.min_cache_tokens == 0 {
        return cfg.cache_bytes;
    }
    let per_token = runner::kv_bytes_per_token(model, kv);
    let tokens = match cfg.min_cache_tokens {
        usize::MAX => model.max_position,
        n => n,
    };
    let blocks = tokens.div_ceil(cfg.block_size.max(1)) + 1;
    cfg.cache_bytes.max(
        blocks
            .saturating_mul(cfg.block_size.max(1))
            .saturating_mul(per_token),
    )
}

/// [`load_runner`] with the concrete type (for tracing / benchmarks).
pub fn load_flex_runner(cfg: &ModelLoadConfig) -> Result<LlamaRunner<Flex>, ModelError> {
    load_runner_on::<Flex>(cfg, &FlexDevice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{BatchInput, LogitsWanted, SeqInput};

    /// Write a random tiny model of `arch` as two safetensors shards plus an index.
    fn tiny_model(dir: &Path, arch: &str) {
        let (dm, h, kvh, d, ff, vocab, layers) =
            (32usize, 4usize, 2usize, 8usize, 48usize, 64usize, 2usize);
        let mut seed = 11u64;
        let mut rnd = |n: usize, scale: f32| -> Vec<u8> {
            crate::test_support::rand(n, &mut seed)
                .into_iter()
                .flat_map(|v| (v * scale).to_le_bytes())
                .collect()
        };
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut add = |name: String, shape: Vec<usize>, scale: f32| {
            let n = shape.iter().product();
            tensors.push((name, shape, rnd(n, scale)));
        };
        add("model.embed_tokens.weight".into(), vec![vocab, dm], 1.0);
        add("model.norm.weight".into(), vec![dm], 2.0);
        for l in 0..layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            add(p("input_layernorm.weight"), vec![dm], 2.0);
            add(p("post_attention_layernorm.weight"), vec![dm], 2.0);
            add(p("self_attn.q_proj.weight"), vec![h * d, dm], 0.5);
            add(p("self_attn.k_proj.weight"), vec![kvh * d, dm], 0.5);
            add(p("self_attn.v_proj.weight"), vec![kvh * d, dm], 0.5);
            add(p("self_attn.o_proj.weight"), vec![dm, h * d], 0.5);
            add(p("mlp.gate_proj.weight"), vec![ff, dm], 0.5);
            add(p("mlp.up_proj.weight"), vec![ff, dm], 0.5);
            add(p("mlp.down_proj.weight"), vec![dm, ff], 0.5);
            if arch == "qwen2" {
                add(p("self_attn.q_proj.bias"), vec![h * d], 0.5);
                add(p("self_attn.k_proj.bias"), vec![kvh * d], 0.5);
                add(p("self_attn.v_proj.bias"), vec![kvh * d], 0.5);
            }
            if arch == "qwen3" {
                add(p("self_attn.q_norm.weight"), vec![d], 2.0);
                add(p("self_attn.k_norm.weight"), vec![d], 2.0);
            }
        }
        let half = tensors.len() / 2;
        let mut weight_map = serde_json::Map::new();
        for (i, chunk) in [&tensors[..half], &tensors[half..]].iter().enumerate() {
            let file = format!("model-0000{}-of-00002.safetensors", i + 1);
            let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = chunk
                .iter()
                .map(|(n, s, b)| {
                    let v =
                        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                            .expect("valid view");
                    (n.clone(), v)
                })
                .collect();
            for (n, _) in &views {
                weight_map.insert(n.clone(), file.clone().into());
            }
            let bytes = safetensors::serialize(views, None).expect("serializes");
            std::fs::write(dir.join(&file), bytes).expect("write shard");
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("write");
        let cfg = serde_json::json!({
            "model_type": arch, "hidden_size": dm, "num_attention_heads": h,
            "num_key_value_heads": kvh, "head_dim": d, "intermediate_size": ff,
            "num_hidden_layers": layers, "vocab_size": vocab, "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
            "tie_word_embeddings": true, "eos_token_id": 2
        });
        std::fs::write(dir.join("config.json"), cfg.to_string()).expect("write");
    }

    fn run(
        r: &mut LlamaRunner<Flex>,
        toks: &[u32],
        start: usize,
        table: &[u32],
        want: LogitsWanted,
    ) -> Vec<f32> {
        let b = BatchInput {
            seqs: vec![SeqInput {
                seq_id: 3,
                token_ids: toks.to_vec(),
                start_pos: start,
                block_table: table.to_vec(),
                logits: want,
            }],
        };
        r.execute(&b).expect("runs").remove(0).data.to_vec()
    }

    /// Whole-prompt prefill, chunked prefill, decode and copy-on-write copies agree.
    #[test]
    fn tiny_safetensors_models_are_self_consistent() {
        for arch in ["llama", "qwen2", "qwen3"] {
            let dir = tempfile::tempdir().expect("tempdir");
            tiny_model(dir.path(), arch);
            let cfg = ModelLoadConfig {
                model_path: dir.path().to_path_buf(),
                dtype: ModelDType::Float32,
                cache_bytes: 1 << 20,
                min_cache_tokens: 0,
                block_size: 4,
                quiet: true,
                device: Device::Cpu,
                kv_cache_dtype: Default::default(),
            };
            let mut r = load_flex_runner(&cfg).expect("tiny model loads");
            assert_eq!(r.info().architecture, arch);
            let prompt: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % 64).collect();
            let t1 = [5u32, 9, 1];
            let all = run(&mut r, &prompt, 0, &t1, LogitsWanted::All);
            assert_eq!(all.len(), 11 * 64);
            assert!(all.iter().all(|v| v.is_finite()));
            // Chunked prefill into other blocks, then one decode step.
            let t2 = [7u32, 2, 8];
            run(&mut r, &prompt[..6], 0, &t2, LogitsWanted::None);
            run(&mut r, &prompt[6..10], 6, &t2, LogitsWanted::None);
            let last = run(&mut r, &prompt[10..], 10, &t2, LogitsWanted::Last);
            for (a, b) in last.iter().zip(&all[10 * 64..]) {
                assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "{arch}: {a} vs {b}");
            }
            // Copy the blocks of t2 elsewhere and decode through the copies.
            r.copy_blocks(&[(7, 10), (2, 11), (8, 12)]).expect("copies");
            let via_copy = run(&mut r, &prompt[10..], 10, &[10, 11, 12], LogitsWanted::Last);
            assert_eq!(via_copy, last);
            assert!(r.copy_blocks(&[(0, 9999)]).is_err());
        }
    }

    /// A tiny random Llama as a GGUF file whose projections use every block format the
    /// fused kernels take (Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, Q4_0, Q4_1; Q8_0 embeddings/head).
    fn tiny_kquant_gguf(path: &Path) {
        let (dm, ff, heads, kv_heads, vocab, layers) = (256usize, 512, 4usize, 2usize, 64, 2);
        let mut seed = 5u64;
        let mut byte = move || crate::test_support::lcg(&mut seed) as u8;
        let f16b = |v: f32| half::f16::from_f32(v).to_le_bytes();
        // (ggml type id, elements per block, bytes per block, offsets of f16 scales).
        let layout = |ty: u32| -> (usize, usize, Vec<(usize, f32)>) {
            match ty {
                2 => (32, 18, vec![(0, 0.004)]),
                3 => (32, 20, vec![(0, 0.004), (2, -0.03)]),
                6 => (32, 22, vec![(0, 0.004)]),
                8 => (32, 34, vec![(0, 0.002)]),
                7 => (32, 24, vec![(0, 0.002), (2, -0.03)]),
                12 => (256, 144, vec![(0, 0.0003), (2, 0.0002)]),
                13 => (256, 176, vec![(0, 0.0002), (2, 0.0002)]),
                14 => (256, 210, vec![(208, 0.0002)]),
                _ => (1, 4, vec![]),
            }
        };
        let mut tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)> = Vec::new();
        let mut add = |name: String, cols: usize, rows: usize, ty: u32| {
            let (block, bytes, scales) = layout(ty);
            let mut data = Vec::new();
            if ty == 0 {
                for _ in 0..cols * rows {
                    data.extend_from_slice(
                        &(1.0f32 + (byte() as f32 - 128.0) / 512.0).to_le_bytes(),
                    );
                }
            } else {
                for _ in 0..cols * rows / block {
                    let start = data.len();
                    data.extend((0..bytes).map(|_| byte()));
                    for &(at, v) in &scales {
                        data[start + at..start + at + 2].copy_from_slice(&f16b(v));
                    }
                }
            }
            let dims = if rows == 1 {
                vec![cols as u64]
            } else {
                vec![cols as u64, rows as u64]
            };
            tensors.push((name, dims, ty, data));
        };
        let kv = kv_heads * dm / heads;
        add("token_embd.weight".into(), dm, vocab, 8);
        add("output_norm.weight".into(), dm, 1, 0);
        for l in 0..layers {
            let p = |n: &str| format!("blk.{l}.{n}.weight");
            add(p("attn_norm"), dm, 1, 0);
            add(p("ffn_norm"), dm, 1, 0);
            // Layer 0 and layer 1 use different formats for the same projections.
            let (q_ty, o_ty) = if l == 0 { (12, 3) } else { (13, 7) };
            add(p("attn_q"), dm, dm, q_ty);
            add(p("attn_k"), dm, kv, 6);
            add(p("attn_v"), dm, kv, 14);
            add(p("attn_output"), dm, dm, o_ty);
            add(p("ffn_gate"), dm, ff, 12);
            add(p("ffn_up"), dm, ff, 2);
            add(p("ffn_down"), ff, dm, 14);
        }
        let put_str = |b: &mut Vec<u8>, s: &str| {
            b.extend_from_slice(&(s.len() as u64).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        };
        let ints = [
            ("llama.embedding_length", dm),
            ("llama.feed_forward_length", ff),
            ("llama.block_count", layers),
            ("llama.attention.head_count", heads),
            ("llama.attention.head_count_kv", kv_heads),
            ("llama.vocab_size", vocab),
            ("llama.context_length", 256),
        ];
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(ints.len() as u64 + 1).to_le_bytes());
        put_str(&mut b, "general.architecture");
        b.extend_from_slice(&8u32.to_le_bytes());
        put_str(&mut b, "llama");
        for (k, v) in ints {
            put_str(&mut b, k);
            b.extend_from_slice(&4u32.to_le_bytes());
            b.extend_from_slice(&(v as u32).to_le_bytes());
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in &tensors {
            put_str(&mut b, name);
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

    /// The fused kernels on K-quant/Q5_0 weights compute what the dequantized f32 model
    /// does, up to the 8-bit activation rounding; the packed weights dequantize exactly.
    #[test]
    fn kquant_gguf_fused_path_tracks_the_f32_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tiny-kquant.gguf");
        tiny_kquant_gguf(&path);
        let load = |dtype| {
            load_flex_runner(&ModelLoadConfig {
                model_path: path.clone(),
                dtype,
                cache_bytes: 1 << 20,
                min_cache_tokens: 0,
                block_size: 4,
                quiet: true,
                device: Device::Cpu,
                kv_cache_dtype: Default::default(),
            })
            .expect("tiny K-quant GGUF loads")
        };
        let prompt: Vec<u32> = (0..9).map(|i| (i * 11 + 2) % 64).collect();
        let table = [0u32, 1, 2];
        let f32_logits = run(
            &mut load(ModelDType::Float32),
            &prompt,
            0,
            &table,
            LogitsWanted::All,
        );
        let fused = run(
            &mut load(ModelDType::Auto),
            &prompt,
            0,
            &table,
            LogitsWanted::All,
        );
        assert_eq!(fused.len(), 9 * 64);
        for (row, (a, b)) in fused.chunks(64).zip(f32_logits.chunks(64)).enumerate() {
            let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            let cos = dot / (na * nb);
            assert!(cos > 0.999, "row {row}: cosine {cos}");
            assert!(nb > 1e-3, "row {row}: degenerate logits");
        }
    }

    /// An `org/name` id resolves to the snapshot `refs/main` names in the Hub cache (the
    /// layout huggingface_hub writes), even when another snapshot is newer on disk.
    #[test]
    fn hub_ids_resolve_to_cached_snapshots() {
        let hub = tempfile::tempdir().expect("tempdir");
        let repo = hub.path().join("models--acme--tiny");
        let snap = repo.join("snapshots/abc123");
        std::fs::create_dir_all(&snap).expect("mkdir");
        tiny_model(&snap, "llama");
        std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
        std::fs::write(repo.join("refs/main"), "abc123").expect("ref");
        // A snapshot of another revision, written later: newest by mtime, but not `main`.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let other = repo.join("snapshots/fff999");
        std::fs::create_dir_all(&other).expect("mkdir");
        tiny_model(&other, "llama");
        // No other test reads HF_HUB_CACHE, so setting it here cannot race.
        std::env::set_var("HF_HUB_CACHE", hub.path());
        assert_eq!(
            resolve_model_path(Path::new("acme/tiny")).expect("resolves"),
            snap
        );
        let model = load_model::<Flex>(Path::new("acme/tiny"), ModelDType::Auto, &FlexDevice)
            .expect("loads from the cache");
        assert_eq!(model.cfg.architecture, "llama");
        assert!(resolve_model_path(Path::new("acme/missing")).is_err());
    }

    #[test]
    fn unknown_format_and_architecture_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.json"), r#"{"model_type": "mamba"}"#)
            .expect("write");
        let e = load_model::<Flex>(dir.path(), ModelDType::Float32, &FlexDevice)
            .err()
            .expect("mamba is unsupported");
        assert!(e.to_string().contains("mamba"), "{e}");
    }
}
