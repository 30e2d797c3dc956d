//! The serving layer: `GenerateRequest` in, `GenerateResponse` / stream events out.
//!
//! [`ServingEngine`] loads the model runner (and, unless `tokens_only`, the tokenizer and
//! `generation_config.json` defaults through [`aphro_core::Model`]), starts the [`Engine`],
//! and implements `POST /inference/v1/generate` of `docs/spec/api.md` §4 as a plain Rust API so
//! the HTTP server, the CLI and the Python bindings share it:
//!
//! * [`ServingEngine::parse_request`]: JSON body → `GenerateRequest`, remembering which
//!   `sampling_params` keys were absent (§10: `max_tokens` recomputed, generation_config
//!   defaults applied);
//! * [`ServingEngine::generate`]: the §4.1 handler checks in vLLM's order, then submits;
//!   the returned [`ServingStream`] yields §4.3 events or collects the §4.2 response;
//! * [`ServingEngine::abort`], [`ServingEngine::metrics`], [`ServingEngine::is_healthy`].
//!
//! Text mode (`output_mode: "text"`) detokenizes incrementally with stop strings; a stop
//! string ends the choice and, once every choice of the request ended, aborts the engine
//! request so its KV blocks are freed at once.

mod generative_scoring;
pub mod text;

use aphro_core::structured::{Constraint, GrammarCompiler, GrammarMatcher};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use aphro_core::detokenizer::{token_text, DetokenizeOptions};
use aphro_core::model::GenerationDefaults;
use aphro_core::protocol::GenerateRequest;
use aphro_core::{Model, Tokenizer};
use futures::{Stream, StreamExt};
use serde_json::{json, Map, Value};

use crate::backend::{Device, Devices};
use crate::engine::{Engine, EngineConfig, EngineError, GenerateStream};
use crate::metrics::MetricsSnapshot;
use crate::model::{load_runner, resolve_model_path, KvCacheDType, ModelDType, ModelLoadConfig};
use crate::request::{
    EngineRequest, PositionLogprobs, SamplingConfig, ValidationError, MAX_N_SEQUENCES,
};
use crate::runner::ModelRunner;
use aphro_core::protocol::{
    clamp_logprob, ChoiceLogProbs, GenerateChoice, GenerateResponse, GenerateStreamEvent,
    GenerateStreamResponse, GenerateUsageEvent, ResponseMessage, StopReason, UsageInfo,
    UsageInfoSparse,
};
use text::{ChoiceDelta, ChoiceState, TextSpec};

/// Everything needed to start a [`ServingEngine`] (vLLM's engine flags).
#[derive(Debug, Clone, PartialEq)]
pub struct ServingConfig {
    /// A `.gguf` file, an HF model directory, or a hub id in the local cache.
    pub model: String,
    pub dtype: ModelDType,
    /// Where the model runs (`--device`): one device for every engine, or one per
    /// data-parallel engine (`cuda:0,cuda:1`).
    pub device: Devices,
    /// Bytes of the paged KV cache (`--kv-cache-memory`); `None`: 256 MiB, or more when
    /// one sequence of the served context needs more.
    pub kv_cache_memory: Option<usize>,
    /// Storage of the KV cache (`--kv-cache-dtype`).
    pub kv_cache_dtype: KvCacheDType,
    /// Tokens per KV block (`--block-size`).
    pub block_size: usize,
    /// `--num-gpu-blocks-override`: the cache holds this many blocks (plus one spare)
    /// whatever `kv_cache_memory` says — e.g. room for several full-length sequences.
    pub num_gpu_blocks_override: Option<usize>,
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub enable_prefix_caching: bool,
    /// `--long-prefill-token-threshold` (see [`EngineConfig`]).
    pub long_prefill_token_threshold: usize,
    /// `--prefill-pacing-ratio` (see [`EngineConfig`]).
    pub prefill_pacing_ratio: f64,
    /// The context served (`--max-model-len`); the render role must be given the same.
    pub max_model_len: MaxModelLen,
    /// `--max-logprobs` (-1 = vocabulary size).
    pub max_logprobs: i64,
    /// Seeds requests without their own `seed` (`--seed`); `None` = OS entropy.
    pub seed: Option<u64>,
    /// The name `model` must match and responses report; default: `model`.
    pub served_model_name: Option<String>,
    /// `--tokens-only`: no tokenizer, `output_mode="tokens"` only, no stop strings.
    pub tokens_only: bool,
    /// `--skip-tokenizer-init`: no tokenizer is loaded, so only `output_mode="tokens"` works
    /// and stop strings are refused (nothing can detokenize to find them).
    pub skip_tokenizer_init: bool,
    /// `--return-tokens-as-token-ids`: text-mode logprob tokens are `token_id:N`
    /// placeholders without bytes, as on `/v1/completions`.
    pub return_tokens_as_token_ids: bool,
    /// `--scheduling-policy`: a request's `priority` counts only under `Priority`.
    pub scheduling_policy: SchedulingPolicy,
    /// Request size limits (`n`, stop strings) shared with the renderer.
    pub limits: aphro_core::RequestLimits,
    /// `--generation-config`: where the sampling defaults come from.
    pub generation_config: aphro_core::model::GenerationConfig,
    /// `--override-generation-config`: keys laid over those defaults.
    pub override_generation_config: Map<String, Value>,
    /// `--prefix-caching-hash-algo` (`endpoints.md §4.5`).
    pub prefix_caching_hash_algo: crate::kv::HashAlgo,
    /// `--kv-events-config` (`endpoints.md §4.1`); `None`: no KV events.
    pub kv_events_config: Option<crate::kv_publisher::KvEventsConfig>,
    /// `--data-parallel-size`: engines behind this front end, each with its own KV pool,
    /// scheduler and (on the CPU) share of the cores. Requests are routed by
    /// [`ServingEngine::generate_routed`]'s rules.
    pub data_parallel_size: usize,
}

/// vLLM's `--max-model-len`: how long a sequence the server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxModelLen {
    /// The model's context; start-up fails when the KV cache cannot hold one sequence of it.
    #[default]
    Model,
    /// `auto` / `-1`: the model's context, shortened (with a warning) to what the cache holds.
    Auto,
    /// A fixed length (at most the model's context and what the cache holds).
    Tokens(usize),
}

impl std::str::FromStr for MaxModelLen {
    type Err = String;
    /// `auto`, `-1`, or a count with vLLM's suffixes: `1k` = 1000, `1K` = 1024, `25.6k`.
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("auto") || t == "-1" {
            return Ok(MaxModelLen::Auto);
        }
        let bad = || {
            format!(
                "invalid max_model_len {s:?}: expected a token count (e.g. 4096, 32k, 32K) or auto"
            )
        };
        let (num, mult) = match t.char_indices().last() {
            Some((i, c)) if c.is_ascii_alphabetic() => {
                let m: f64 = match c {
                    'k' => 1e3,
                    'm' => 1e6,
                    'g' => 1e9,
                    'K' => 1024.0,
                    'M' => 1024.0 * 1024.0,
                    'G' => 1024.0 * 1024.0 * 1024.0,
                    _ => return Err(bad()),
                };
                (&t[..i], m)
            }
            _ => (t, 1.0),
        };
        let v: f64 = num.parse().map_err(|_| bad())?;
        let n = (v * mult).round();
        if !(n.is_finite() && n >= 1.0 && n <= usize::MAX as f64) {
            return Err(bad());
        }
        Ok(MaxModelLen::Tokens(n as usize))
    }
}

/// vLLM's `--scheduling-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulingPolicy {
    /// First come, first served; a non-zero `priority` is refused with a 400, so no client
    /// can move itself ahead of others.
    #[default]
    Fcfs,
    /// Lower `priority` values run first (ties first come, first served).
    Priority,
}

impl std::str::FromStr for SchedulingPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "priority" => Ok(Self::Priority),
            other => Err(format!(
                "unknown scheduling policy `{other}` (expected fcfs or priority)"
            )),
        }
    }
}

impl Default for ServingConfig {
    fn default() -> Self {
        let e = EngineConfig::default();
        Self {
            model: String::new(),
            dtype: ModelDType::Auto,
            device: Devices::default(),
            kv_cache_memory: None,
            kv_cache_dtype: KvCacheDType::Auto,
            block_size: 16,
            num_gpu_blocks_override: None,
            max_num_batched_tokens: e.max_num_batched_tokens,
            max_num_seqs: e.max_num_seqs,
            enable_prefix_caching: e.enable_prefix_caching,
            long_prefill_token_threshold: e.long_prefill_token_threshold,
            prefill_pacing_ratio: e.prefill_pacing_ratio,
            max_model_len: MaxModelLen::Model,
            max_logprobs: e.max_logprobs,
            seed: None,
            served_model_name: None,
            tokens_only: false,
            skip_tokenizer_init: false,
            return_tokens_as_token_ids: false,
            scheduling_policy: SchedulingPolicy::Fcfs,
            limits: aphro_core::RequestLimits::default(),
            generation_config: aphro_core::model::GenerationConfig::Auto,
            override_generation_config: Map::new(),
            prefix_caching_hash_algo: e.prefix_caching_hash_algo,
            kv_events_config: None,
            data_parallel_size: 1,
        }
    }
}

/// A request that failed (an HTTP status with vLLM's error envelope, §1.2) or a startup
/// failure.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    /// Request validation / handler checks (400 / 404), with aphro-core's envelope rules.
    #[error(transparent)]
    Request(#[from] aphro_core::Error),
    /// The engine rejected or failed the request.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The model or tokenizer could not be loaded / the engine not started.
    #[error("{0}")]
    Load(String),
}

impl ServingError {
    fn bad_request(msg: impl Into<String>) -> Self {
        ServingError::Request(aphro_core::Error::bad_request(msg))
    }

    fn validation(msg: impl Into<String>, param: &str) -> Self {
        ServingError::Request(aphro_core::Error::validation(msg, Some(param)))
    }

    /// The HTTP status (`error.code`).
    pub fn status(&self) -> u16 {
        match self {
            ServingError::Request(e) => e.status(),
            ServingError::Engine(EngineError::InvalidRequest(_))
            | ServingError::Engine(EngineError::DuplicateRequestId(_)) => 400,
            ServingError::Engine(EngineError::Dead(_)) => 503,
            ServingError::Engine(_) | ServingError::Load(_) => 500,
        }
    }

    pub fn error_type(&self) -> &'static str {
        match self {
            ServingError::Request(e) => e.error_type(),
            ServingError::Engine(EngineError::InvalidRequest(_))
            | ServingError::Engine(EngineError::DuplicateRequestId(_)) => "BadRequestError",
            ServingError::Engine(EngineError::Dead(_)) => "ServiceUnavailableError",
            ServingError::Engine(_) | ServingError::Load(_) => "InternalServerError",
        }
    }

    pub fn param(&self) -> Option<&str> {
        match self {
            ServingError::Request(e) => e.param(),
            ServingError::Engine(EngineError::InvalidRequest(ValidationError::Param {
                param,
                ..
            })) => *param,
            _ => None,
        }
    }

    /// The error body this error answers with.
    pub fn to_error_response(&self) -> aphro_core::protocol::ErrorResponse {
        aphro_core::protocol::ErrorResponse::new(
            self.status(),
            self.error_type(),
            self.to_string(),
            self.param(),
        )
    }

    /// `{"error": {"message", "type", "param", "code"}}` as JSON.
    pub fn to_envelope(&self) -> Value {
        self.to_error_response().to_value()
    }
}

/// The three generate output modes (§4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    Tokens,
    Text,
    Derender,
}

impl OutputMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tokens" => Some(Self::Tokens),
            "text" => Some(Self::Text),
            "derender" => Some(Self::Derender),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tokens => "tokens",
            Self::Text => "text",
            Self::Derender => "derender",
        }
    }
}

/// The engine behind `/inference/v1/generate`. All methods take `&self`; share it in an `Arc`.
///
/// With `--data-parallel-size N` it fronts N engines ([`Replica`]s) and routes each request:
/// a session id pins a conversation to one engine; otherwise the engine whose earlier prompts
/// share the longest prefix with this one wins (its prefix cache likely holds it), ties going
/// to the least loaded; an engine that failed is taken out, and with none left requests get
/// `503` with the reason.
pub struct ServingEngine {
    replicas: Vec<Replica>,
    /// Session id → the engine its conversation lives on.
    sessions: Mutex<SessionTable>,
    /// The tokenizer-side model (tokenizer, chat template, generation defaults) as loaded
    /// here, for a renderer and derenderer of the same process to share.
    model: Option<Arc<Model>>,
    tokenizer: Option<Arc<Tokenizer>>,
    defaults: GenerationDefaults,
    /// generation_config EOS ids the weights' config did not list (stop like stop ids).
    extra_eos: Vec<u32>,
    served_model_name: String,
    tokens_only: bool,
    skip_tokenizer_init: bool,
    return_tokens_as_token_ids: bool,
    model_path: PathBuf,
    scheduling_policy: SchedulingPolicy,
    limits: aphro_core::RequestLimits,
    /// Wire id (`generate-tokens-<client id>`) → the (engine, engine id) of the requests
    /// running under it. Clients may reuse an id; each request still gets its own engine id,
    /// and an abort by the wire id reaches all of them.
    in_flight: Arc<InFlight>,
    next_serial: std::sync::atomic::AtomicU64,
    /// Structured outputs: built on the first constrained request (a token trie over the
    /// whole vocabulary costs tens of milliseconds; servers that never see one skip it).
    grammar_compiler: std::sync::OnceLock<Result<Arc<GrammarCompiler>, String>>,
}

/// One data-parallel engine and what routing knows about it.
struct Replica {
    engine: Engine,
    /// Requests running on it now (streams not yet finished or dropped).
    load: Arc<std::sync::atomic::AtomicUsize>,
    /// Block keys of the prompts routed to it ([`prefix_keys`]).
    sent: Mutex<SentPrefixes>,
    /// Publishes this engine's KV-cache events (`--kv-events-config`, rank = its index);
    /// declared after `engine` so the engine's last batches are queued before it stops.
    _kv_publisher: Option<crate::kv_publisher::KvEventPublisher>,
}

/// Tokens per routing key: one key per full block of this many prompt tokens.
const ROUTE_BLOCK: usize = 16;
/// Keys remembered per engine; the oldest are forgotten first.
const MAX_SENT_KEYS: usize = 1 << 20;
/// Sessions remembered; the oldest are forgotten first (a forgotten session is routed
/// afresh, by prefix, which usually finds the same engine).
const MAX_SESSIONS: usize = 1 << 16;

/// The chained block keys of a prompt: key `i` covers tokens `..(i+1)*ROUTE_BLOCK` (and the
/// cache salt), so a shared key means a shared prefix up to that block.
fn prefix_keys(tokens: &[u32], salt: Option<&str>) -> Vec<u64> {
    use std::hash::{Hash, Hasher};
    let mut keys = Vec::with_capacity(tokens.len() / ROUTE_BLOCK);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    salt.hash(&mut h);
    for block in tokens.chunks_exact(ROUTE_BLOCK) {
        block.hash(&mut h);
        keys.push(h.finish());
    }
    keys
}

#[derive(Default)]
struct SentPrefixes {
    keys: HashSet<u64>,
    order: std::collections::VecDeque<u64>,
}

impl SentPrefixes {
    /// How many leading keys of a prompt this engine has been sent before.
    fn matched(&self, keys: &[u64]) -> usize {
        keys.iter().take_while(|k| self.keys.contains(k)).count()
    }

    fn record(&mut self, keys: &[u64]) {
        for &k in keys {
            if self.keys.insert(k) {
                self.order.push_back(k);
            }
        }
        while self.order.len() > MAX_SENT_KEYS {
            if let Some(k) = self.order.pop_front() {
                self.keys.remove(&k);
            }
        }
    }
}

#[derive(Default)]
struct SessionTable {
    home: HashMap<String, usize>,
    order: std::collections::VecDeque<String>,
}

impl SessionTable {
    fn pin(&mut self, session: &str, replica: usize) {
        if self.home.insert(session.to_owned(), replica).is_none() {
            self.order.push_back(session.to_owned());
        }
        while self.order.len() > MAX_SESSIONS {
            if let Some(s) = self.order.pop_front() {
                self.home.remove(&s);
            }
        }
    }
}

type InFlight = Mutex<HashMap<String, Vec<(usize, String)>>>;

/// Removes one engine id from [`ServingEngine::in_flight`] (and its engine's load) when its
/// stream is dropped.
struct InFlightEntry {
    table: Arc<InFlight>,
    wire_id: String,
    replica: usize,
    engine_id: String,
    load: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for InFlightEntry {
    fn drop(&mut self) {
        self.load.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut t) = self.table.lock() {
            if let Some(ids) = t.get_mut(&self.wire_id) {
                ids.retain(|(r, i)| !(*r == self.replica && i == &self.engine_id));
                if ids.is_empty() {
                    t.remove(&self.wire_id);
                }
            }
        }
    }
}

/// The id [`ServingEngine::abort`] knows a request by: `generate-tokens-<request_id>`
/// (`api.md` §4.4), for the request's own (or its `X-Request-Id`) id.
pub fn wire_request_id(request_id: &str) -> String {
    format!("generate-tokens-{request_id}")
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `--kv-cache-memory` when not given (grown to one full-length sequence when needed).
pub const DEFAULT_KV_CACHE_BYTES: usize = 256 << 20;

/// The context the server accepts, from `--max-model-len` and what the runner's cache holds
/// (vLLM's `_check_enough_kv_cache_memory` / auto-fit).
fn served_len(cfg: &ServingConfig, runner: &dyn ModelRunner) -> Result<usize, ServingError> {
    let info = runner.info();
    let capacity = runner.num_blocks().saturating_mul(runner.block_size());
    let gib =
        |tokens: usize| tokens as f64 * info.kv_bytes_per_token as f64 / f64::from(1u32 << 30);
    let wanted = match cfg.max_model_len {
        MaxModelLen::Tokens(n) => n,
        MaxModelLen::Model | MaxModelLen::Auto => info.max_position,
    };
    if wanted > info.max_position {
        return Err(ServingError::Load(format!(
            "max_model_len {wanted} is longer than the model's maximum context length {}",
            info.max_position
        )));
    }
    if wanted <= capacity {
        return Ok(wanted);
    }
    if cfg.max_model_len == MaxModelLen::Auto {
        tracing::warn!(
            "max_model_len auto: reduced from {wanted} to {capacity} to fit the KV cache ({:.2} GiB)",
            gib(capacity)
        );
        return Ok(capacity);
    }
    Err(ServingError::Load(format!(
        "To serve at least one request with the model's max seq len ({wanted}), ({:.2} GiB KV \
         cache is needed, which is larger than the available KV cache memory ({:.2} GiB). Based \
         on the available memory, the estimated maximum model length is {capacity}. Try \
         increasing --kv-cache-memory, decreasing --max-model-len, or passing --max-model-len \
         auto to fit it to the cache.",
        gib(wanted),
        gib(capacity)
    )))
}

impl ServingEngine {
    /// Load the model (and tokenizer) and start the engine thread.
    pub fn new(cfg: ServingConfig) -> Result<Self, ServingError> {
        if cfg.model.is_empty() {
            return Err(ServingError::Load("no model given".into()));
        }
        let model_path = resolve_model_path(Path::new(&cfg.model))
            .map_err(|e| ServingError::Load(e.to_string()))?;
        // Without an explicit cache size, the cache holds at least one sequence of the
        // served context, so the default never has to shorten it.
        let min_cache_tokens = match (
            cfg.num_gpu_blocks_override,
            cfg.kv_cache_memory,
            cfg.max_model_len,
        ) {
            (Some(blocks), _, _) => blocks.saturating_mul(cfg.block_size).max(1),
            (None, Some(_), _) | (None, None, MaxModelLen::Auto) => 0,
            (None, None, MaxModelLen::Model) => usize::MAX,
            (None, None, MaxModelLen::Tokens(n)) => n,
        };
        let cache_bytes = match cfg.num_gpu_blocks_override {
            Some(_) => 0,
            None => cfg.kv_cache_memory.unwrap_or(DEFAULT_KV_CACHE_BYTES),
        };
        if cfg.data_parallel_size == 0 {
            return Err(ServingError::Load(
                "--data-parallel-size must be at least 1".into(),
            ));
        }
        // `auto` resolved once, so every engine lands where the first did.
        let devices = cfg
            .device
            .per_engine(cfg.data_parallel_size)
            .and_then(|list| {
                list.into_iter()
                    .map(crate::backend::resolve)
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e: crate::backend::DeviceError| ServingError::Load(e.to_string()))?;
        let dp = devices.len();
        let load = |device: Device| {
            load_runner(&ModelLoadConfig {
                model_path: model_path.clone(),
                dtype: cfg.dtype,
                cache_bytes,
                min_cache_tokens,
                block_size: cfg.block_size,
                quiet: false,
                device,
                kv_cache_dtype: cfg.kv_cache_dtype,
            })
            .map_err(|e| ServingError::Load(format!("loading {}: {e}", cfg.model)))
        };
        let runner = load(devices[0])?;
        let max_model_len = served_len(&cfg, runner.as_ref())?;
        // The tokenizer side: required for text mode; a tokens-only server still reads
        // generation_config defaults when it can.
        let spec = model_path.to_string_lossy().into_owned();
        let core_model = match Model::load(&spec) {
            Ok(mut m) => {
                m.apply_generation_config(&cfg.generation_config, &cfg.override_generation_config)
                    .map_err(|e| ServingError::Load(e.to_string()))?;
                Some(m)
            }
            Err(e) if !cfg.tokens_only && !cfg.skip_tokenizer_init => {
                return Err(ServingError::Load(format!(
                    "loading the tokenizer of {}: {e}",
                    cfg.model
                )))
            }
            Err(_) => None,
        };
        let runner_eos = runner.info().eos_token_ids.clone();
        // Data parallelism on the CPU: each engine on the CPU gets its share of the cores
        // (vLLM runs one engine per device; here the device is the core set). The host
        // side of an engine on a GPU needs little, so it keeps the shared pool.
        let cpu_engines = devices.iter().filter(|d| **d == Device::Cpu).count();
        let num_threads =
            (cpu_engines > 1).then(|| (rayon::current_num_threads() / cpu_engines).max(1));
        let mut replicas = Vec::with_capacity(dp);
        let mut runner = Some(runner);
        for (rank, &device) in devices.iter().enumerate() {
            let runner = match runner.take() {
                Some(r) => r,
                None => load(device)?,
            };
            let (kv_publisher, kv_events) = match &cfg.kv_events_config {
                Some(kc) if kc.publishes() => {
                    if !cfg.enable_prefix_caching && rank == 0 {
                        tracing::warn!(
                            "KV cache events are enabled but prefix caching is not: no blocks \
                             are cached, so only resets are reported"
                        );
                    }
                    let rank = u16::try_from(rank)
                        .map_err(|_| ServingError::Load("too many data-parallel ranks".into()))?;
                    let (p, sink) = crate::kv_publisher::KvEventPublisher::start(kc, rank)
                        .map_err(ServingError::Load)?;
                    (Some(p), Some(sink))
                }
                _ => (None, None),
            };
            let engine = Engine::new(
                runner,
                EngineConfig {
                    max_num_batched_tokens: cfg.max_num_batched_tokens,
                    max_num_seqs: cfg.max_num_seqs,
                    enable_prefix_caching: cfg.enable_prefix_caching,
                    max_model_len: Some(max_model_len),
                    max_logprobs: cfg.max_logprobs,
                    seed: cfg.seed,
                    long_prefill_token_threshold: cfg.long_prefill_token_threshold,
                    prefill_pacing_ratio: cfg.prefill_pacing_ratio,
                    prefix_caching_hash_algo: cfg.prefix_caching_hash_algo,
                    kv_events,
                    num_threads,
                },
            )?;
            replicas.push(Replica {
                engine,
                load: Arc::default(),
                sent: Mutex::default(),
                _kv_publisher: kv_publisher,
            });
        }
        let (tokenizer, defaults, extra_eos) = match &core_model {
            Some(m) => {
                let extra: Vec<u32> = m
                    .eos_token_ids
                    .iter()
                    .copied()
                    .filter(|e| !runner_eos.contains(e))
                    .collect();
                let tok = (!cfg.tokens_only && !cfg.skip_tokenizer_init)
                    .then(|| Arc::clone(&m.tokenizer));
                (tok, m.generation_defaults.clone(), extra)
            }
            None => (None, GenerationDefaults::default(), Vec::new()),
        };
        Ok(Self {
            replicas,
            sessions: Mutex::default(),
            model: core_model.map(Arc::new),
            tokenizer,
            defaults,
            extra_eos,
            served_model_name: cfg.served_model_name.unwrap_or(cfg.model),
            tokens_only: cfg.tokens_only,
            skip_tokenizer_init: cfg.skip_tokenizer_init,
            return_tokens_as_token_ids: cfg.return_tokens_as_token_ids,
            model_path,
            scheduling_policy: cfg.scheduling_policy,
            limits: cfg.limits,
            in_flight: Arc::default(),
            next_serial: Default::default(),
            grammar_compiler: std::sync::OnceLock::new(),
        })
    }

    /// The first engine (the only one without data parallelism).
    pub fn engine(&self) -> &Engine {
        &self.replicas[0].engine
    }

    /// Every engine, in rank order (`--data-parallel-size`).
    pub fn engines(&self) -> impl Iterator<Item = &Engine> {
        self.replicas.iter().map(|r| &r.engine)
    }

    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.as_ref()
    }

    /// The model's tokenizer side as this engine loaded it (generation config applied), when
    /// it could be loaded: build a [`aphro_core::Renderer`] and
    /// [`aphro_core::Derenderer`] on it instead of loading the model files a second time.
    pub fn model(&self) -> Option<&Arc<Model>> {
        self.model.as_ref()
    }

    pub fn served_model_name(&self) -> &str {
        &self.served_model_name
    }

    pub fn model_path(&self) -> &Path {
        &self.model_path
    }

    pub fn max_model_len(&self) -> usize {
        self.engine().max_model_len()
    }

    pub fn generation_defaults(&self) -> &GenerationDefaults {
        &self.defaults
    }

    /// Abort requests by their generate id (`generate-tokens-…`, §4.4): every running
    /// request under that id. Unknown ids are ignored. Their streams finish with
    /// `finish_reason: "abort"`.
    pub fn abort<S: AsRef<str>>(&self, request_ids: &[S]) {
        for id in request_ids {
            let engine_ids = self
                .in_flight
                .lock()
                .ok()
                .and_then(|t| t.get(id.as_ref()).cloned())
                .unwrap_or_default();
            for (replica, engine_id) in engine_ids {
                self.replicas[replica].engine.abort(&engine_id);
            }
        }
    }

    /// Requests running now (streams not yet finished or dropped).
    pub fn num_in_flight(&self) -> usize {
        self.in_flight
            .lock()
            .map(|t| t.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    /// Metrics as of the last engine step (for `/metrics`), of the first engine; see
    /// [`Self::metrics_per_engine`].
    pub fn metrics(&self) -> MetricsSnapshot {
        self.engine().metrics()
    }

    /// Each engine's metrics as of its last step, in rank order (vLLM's `engine` label).
    pub fn metrics_per_engine(&self) -> Vec<MetricsSnapshot> {
        self.engines().map(Engine::metrics).collect()
    }

    /// Metrics after every earlier call (aborts included) took effect.
    pub fn metrics_synced(&self) -> MetricsSnapshot {
        self.engine().metrics_synced()
    }

    /// False once no engine is left to serve: a model failure killed every one (`/health`
    /// → 503). With data parallelism the rest serve while at least one is healthy.
    pub fn is_healthy(&self) -> bool {
        self.engines().any(Engine::is_healthy)
    }

    /// Why the server cannot serve (every engine failed), for `/health` and 503 bodies.
    pub fn failure(&self) -> Option<String> {
        if self.is_healthy() {
            return None;
        }
        let reasons: Vec<String> = self.engines().filter_map(Engine::failure).collect();
        Some(match reasons.as_slice() {
            [one] => one.clone(),
            many => many
                .iter()
                .enumerate()
                .map(|(i, r)| format!("engine {i}: {r}"))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }

    /// Abort everything in flight and stop the engine threads.
    pub fn shutdown(&self) {
        for e in self.engines() {
            e.shutdown();
        }
    }

    /// Which engine serves a prompt (see [`ServingEngine`]): the session's engine when it
    /// has one and that engine is healthy; else the healthy engine with the longest
    /// previously sent prefix in common, ties to the least loaded (then the lowest rank).
    fn route(
        &self,
        tokens: &[u32],
        salt: Option<&str>,
        session: Option<&str>,
    ) -> Result<usize, ServingError> {
        use std::sync::atomic::Ordering;
        let healthy: Vec<usize> = (0..self.replicas.len())
            .filter(|&i| self.replicas[i].engine.is_healthy())
            .collect();
        if healthy.is_empty() {
            let reason = self
                .failure()
                .unwrap_or_else(|| "no engine is serving".into());
            return Err(ServingError::Engine(EngineError::Dead(reason)));
        }
        if self.replicas.len() == 1 {
            return Ok(0);
        }
        let keys = prefix_keys(tokens, salt);
        let by_prefix = || {
            let matched: Vec<(usize, usize)> = healthy
                .iter()
                .map(|&i| {
                    let m = self.replicas[i].sent.lock().map_or(0, |s| s.matched(&keys));
                    (i, m)
                })
                .collect();
            let best = matched.iter().map(|&(_, m)| m).max().unwrap_or(0);
            matched
                .into_iter()
                .filter(|&(_, m)| m == best)
                .map(|(i, _)| i)
                .min_by_key(|&i| (self.replicas[i].load.load(Ordering::Relaxed), i))
                .unwrap_or(healthy[0])
        };
        let pick = match session {
            Some(s) => {
                let mut table = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
                match table.home.get(s) {
                    Some(&i) if healthy.contains(&i) => i,
                    _ => {
                        let i = by_prefix();
                        table.pin(s, i);
                        i
                    }
                }
            }
            None => by_prefix(),
        };
        if let Ok(mut sent) = self.replicas[pick].sent.lock() {
            sent.record(&keys);
        }
        Ok(pick)
    }

    /// Decode a JSON body into a `GenerateRequest` (structural errors → 400 "Bad Request").
    /// Keys absent from `sampling_params` get the generation_config default (§10), and an
    /// absent `max_tokens` becomes `None` so [`Self::generate`] recomputes it.
    pub fn parse_request(&self, body: &Value) -> Result<GenerateRequest, ServingError> {
        let mut req = parse_generate_request(body)?;
        let keys: HashSet<&str> = body
            .get("sampling_params")
            .and_then(Value::as_object)
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let d = &self.defaults;
        let sp = &mut req.sampling_params;
        let set_f = |k: &str, v: Option<f64>, f: &mut f64| {
            if let (false, Some(v)) = (keys.contains(k), v) {
                *f = v;
            }
        };
        set_f(
            "repetition_penalty",
            d.repetition_penalty,
            &mut sp.repetition_penalty,
        );
        set_f(
            "presence_penalty",
            d.presence_penalty,
            &mut sp.presence_penalty,
        );
        set_f(
            "frequency_penalty",
            d.frequency_penalty,
            &mut sp.frequency_penalty,
        );
        set_f("temperature", d.temperature, &mut sp.temperature);
        set_f("top_p", d.top_p, &mut sp.top_p);
        set_f("min_p", d.min_p, &mut sp.min_p);
        if let (false, Some(v)) = (keys.contains("top_k"), d.top_k) {
            sp.top_k = v;
        }
        if let (false, Some(v)) = (keys.contains("skip_special_tokens"), d.skip_special_tokens) {
            sp.skip_special_tokens = v;
        }
        Ok(req)
    }

    /// [`Self::parse_request`] for a body read as a [`GenerateBody`].
    pub fn parse_request_body(&self, body: GenerateBody) -> Result<GenerateRequest, ServingError> {
        let GenerateBody {
            token_ids,
            mut rest,
        } = body;
        let Some(ids) = token_ids else {
            return Err(ServingError::validation(
                "1 validation error:\n  {'loc': 'body.token_ids', 'msg': 'Field required'}",
                "body.token_ids",
            ));
        };
        if let Some(m) = rest.as_object_mut() {
            m.insert("token_ids".into(), Value::Array(Vec::new()));
        }
        let mut req = self.parse_request(&rest)?;
        req.token_ids = ids;
        Ok(req)
    }

    /// Run the §4.1 handler checks in vLLM's order and submit the request. Errors here are
    /// the 400/404 answers a server sends before it commits to a response.
    ///
    /// `x_request_id` (the `X-Request-Id` header) replaces the body's `request_id` as the
    /// base of `generate-tokens-<base>`. `sampling_params.max_tokens == None` means the key
    /// was absent: it is recomputed to fill the context (capped by generation_config's
    /// `max_new_tokens`).
    pub fn generate(
        &self,
        req: GenerateRequest,
        x_request_id: Option<&str>,
    ) -> Result<ServingStream, ServingError> {
        self.generate_routed(req, x_request_id, None)
    }

    /// [`Self::generate`] with a session id (the body's `session_id` or the `X-Session-ID`
    /// header the vLLM router sends): with data parallelism, every request of a session runs
    /// on one engine.
    pub fn generate_routed(
        &self,
        req: GenerateRequest,
        x_request_id: Option<&str>,
        session: Option<&str>,
    ) -> Result<ServingStream, ServingError> {
        let mut req = req;
        // Request-model validation (pydantic + SamplingParams), before the handler.
        let mode = OutputMode::parse(&req.output_mode).ok_or_else(|| {
            ServingError::validation(
                format!(
                    "1 validation error:\n  output_mode: Input should be 'tokens', 'text' or \
                     'derender' (input: {:?})",
                    req.output_mode
                ),
                "body.output_mode",
            )
        })?;
        if req.token_ids.is_empty() {
            return Err(ServingError::validation(
                "1 validation error:\n  token_ids: List should have at least 1 item after \
                 validation, not 0",
                "body.token_ids",
            ));
        }
        if mode != OutputMode::Tokens && !req.sampling_params.detokenize {
            return Err(ServingError::validation(
                format!(
                    "1 validation error:\n  Value error, output_mode='{}' requires \
                     sampling_params.detokenize to be true",
                    mode.as_str()
                ),
                "body",
            ));
        }
        let absent_max_tokens = req.sampling_params.max_tokens.is_none();
        req.sampling_params.normalize_and_validate()?;
        self.limits.check_sampling(&req.sampling_params)?;
        let sp = &req.sampling_params;
        // Handler checks, in vLLM's order.
        if let Some(m) = &req.model {
            if m != &self.served_model_name {
                return Err(aphro_core::Error::ModelNotFound(m.clone()).into());
            }
        }
        if req.priority != 0 && self.scheduling_policy != SchedulingPolicy::Priority {
            return Err(ServingError::Request(aphro_core::Error::BadRequest {
                message: format!(
                    "Got priority {} but Priority scheduling is not enabled.",
                    req.priority
                ),
                param: Some("priority".into()),
            }));
        }
        let base = x_request_id.unwrap_or(&req.request_id);
        let request_id = wire_request_id(base);
        // The engine's own id is unique even when two clients send the same one.
        let serial = self
            .next_serial
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let engine_id = format!("{request_id}-{serial:x}");
        let max_num_seqs = self.engine().max_num_seqs();
        if sp.n > max_num_seqs as i64 {
            return Err(ServingError::bad_request(format!(
                "sampling_params.n must be at most the server's max_num_seqs ({max_num_seqs}), \
                 got {}.",
                sp.n
            )));
        }
        let stream = req.stream.unwrap_or(false);
        if stream && sp.prompt_logprob_token_ids.is_some() {
            return Err(ServingError::bad_request(
                "prompt_logprob_token_ids are not available when stream=true.",
            ));
        }
        if self.tokens_only && !sp.stop.is_empty() {
            return Err(ServingError::bad_request(
                "stop strings are not supported on a --tokens-only server because \
                 detokenization is disabled. Check stop strings on the coordinator, or use \
                 stop_token_ids.",
            ));
        }
        if self.skip_tokenizer_init && !sp.stop.is_empty() {
            // vLLM's SamplingParams check: without a tokenizer nothing is detokenized.
            return Err(ServingError::bad_request(
                "stop strings are only supported when detokenize is True. Set \
                 detokenize=True to use stop.",
            ));
        }
        if mode != OutputMode::Tokens && self.tokenizer.is_none() {
            return Err(ServingError::bad_request(format!(
                "output_mode='{}' requires a tokenizer, but this server does not load one \
                 (--tokens-only or --skip-tokenizer-init). Send the request to a server that \
                 loads a tokenizer, or use output_mode='tokens'.",
                mode.as_str()
            )));
        }
        if mode == OutputMode::Derender && stream {
            return Err(ServingError::bad_request(
                "output_mode='derender' does not support stream=true.",
            ));
        }
        let unsupported = [
            ("logprob_token_ids", sp.logprob_token_ids.is_some()),
            (
                "prompt_logprob_token_ids",
                sp.prompt_logprob_token_ids.is_some(),
            ),
            ("thinking_token_budget", sp.thinking_token_budget.is_some()),
            (
                "repetition_detection",
                sp.repetition_detection
                    .as_ref()
                    .is_some_and(|v| !v.is_null()),
            ),
            (
                "features",
                req.features
                    .as_ref()
                    .is_some_and(|v| !v.is_null() && v.as_object().is_none_or(|m| !m.is_empty())),
            ),
            (
                "content_parts",
                req.content_parts.as_ref().is_some_and(|p| !p.is_empty()),
            ),
        ];
        // Here rather than in a route, so every entry point (HTTP, `aphro generate`, Python)
        // refuses what the engine cannot do instead of ignoring it.
        if let Some((name, _)) = unsupported.iter().find(|(_, set)| *set) {
            return Err(ServingError::Request(aphro_core::Error::BadRequest {
                message: format!("{name} is not supported by this engine yet."),
                param: Some((*name).to_string()),
            }));
        }
        let prompt_len = req.token_ids.len();
        let max_model_len = self.engine().max_model_len();
        if prompt_len > max_model_len {
            return Err(aphro_core::Error::PromptTooLong {
                prompt_len,
                max_model_len,
            }
            .into());
        }
        let max_tokens = if absent_max_tokens {
            // §10: fill the context, capped by the generation_config default.
            let room = (max_model_len - prompt_len) as i64;
            Some(self.defaults.max_tokens.map_or(room, |d| d.min(room)))
        } else {
            sp.max_tokens
        };
        let sampling = self.sampling_config(sp, max_tokens)?;
        let ereq = EngineRequest {
            request_id: engine_id.clone(),
            prompt_token_ids: req.token_ids.clone(),
            sampling,
            priority: req.priority,
            cache_salt: req.cache_salt.clone(),
            mm_features: req.features.as_ref().map(mm_positions).unwrap_or_default(),
        };
        self.engine().validate(&ereq)?;

        // Stop strings end a request in every output mode that has a tokenizer: in tokens
        // mode (the integrated OpenAI routes, disaggregated generate) the text is decoded
        // only to find them, and the choice ends at the token that completes one.
        let text_spec = match (mode, &self.tokenizer) {
            (_, None) => None,
            (OutputMode::Tokens, _) if sp.stop.is_empty() => None,
            (_, Some(tok)) => Some(TextSpec {
                emit_text: mode != OutputMode::Tokens,
                tokenizer: Arc::clone(tok),
                options: DetokenizeOptions {
                    skip_special_tokens: sp.skip_special_tokens,
                    spaces_between_special_tokens: sp.spaces_between_special_tokens,
                },
                stop: sp.stop.clone(),
                include_stop_str_in_output: sp.include_stop_str_in_output,
                min_tokens: usize::try_from(sp.min_tokens).unwrap_or(0),
                tokens_as_ids: self.return_tokens_as_token_ids,
            }),
        };
        let n = usize::try_from(sp.n).unwrap_or(1).max(1);
        let choices = (0..n)
            .map(|_| ChoiceState::new(text_spec.clone(), &req.token_ids, sp.logprobs))
            .collect();
        let opts = req.stream_options.unwrap_or_default();
        let replica = self.route(&ereq.prompt_token_ids, ereq.cache_salt.as_deref(), session)?;
        let target = &self.replicas[replica];
        let inner = target.engine.generate(ereq);
        if let Ok(mut t) = self.in_flight.lock() {
            t.entry(request_id.clone())
                .or_default()
                .push((replica, engine_id.clone()));
        }
        target
            .load
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let registration = InFlightEntry {
            table: Arc::clone(&self.in_flight),
            wire_id: request_id.clone(),
            replica,
            engine_id,
            load: Arc::clone(&target.load),
        };
        Ok(ServingStream {
            _registration: registration,
            inner: Some(inner),
            request_id,
            output_mode: mode,
            model: self.served_model_name.clone(),
            prompt: req.token_ids,
            return_token_ids: req.return_token_ids.unwrap_or(false),
            include_usage: opts.include_usage,
            continuous_usage: opts.include_usage && opts.continuous_usage_stats,
            choices,
            first_event: true,
            usage_sent: false,
            prompt_logprobs: None,
            want_prompt_logprobs: sp.prompt_logprobs.is_some(),
            stream_interval: sp
                .stream_interval
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(1)
                .max(1),
            held: HashMap::new(),
            tokenizer: self.tokenizer.clone(),
            kv_transfer_params: req.kv_transfer_params.clone(),
            ec_transfer_params: req.ec_transfer_params.clone(),
        })
    }

    /// [`Self::generate`] and wait for the whole non-streaming response (§4.2).
    pub async fn generate_full(
        &self,
        req: GenerateRequest,
        x_request_id: Option<&str>,
    ) -> Result<GenerateResponse, ServingError> {
        self.generate(req, x_request_id)?.collect_response().await
    }

    /// Wire `SamplingParams` (already normalized and validated) → the engine's config.
    fn sampling_config(
        &self,
        sp: &aphro_core::protocol::SamplingParams,
        max_tokens: Option<i64>,
    ) -> Result<SamplingConfig, ServingError> {
        let ids = |name: &str, v: &[i64]| -> Result<Vec<u32>, ServingError> {
            v.iter()
                .map(|&i| {
                    u32::try_from(i).map_err(|_| {
                        ServingError::Request(aphro_core::Error::BadRequest {
                            message: format!(
                                "token_id(s) [{i}] in {name} contain out-of-vocab token ids."
                            ),
                            param: Some(name.to_string()),
                        })
                    })
                })
                .collect()
        };
        let mut stop_token_ids = ids("stop_token_ids", &sp.stop_token_ids)?;
        if !sp.ignore_eos {
            for &e in &self.extra_eos {
                if !stop_token_ids.contains(&e) {
                    stop_token_ids.push(e);
                }
            }
        }
        let mut logit_bias = Vec::new();
        for (k, v) in sp.logit_bias.iter().flatten() {
            let id: i64 = k.parse().map_err(|_| {
                ServingError::Request(aphro_core::Error::invalid_param(
                    format!("logit_bias keys must be integer token ids, got {k:?}."),
                    "logit_bias",
                    k,
                ))
            })?;
            let id = ids("logit_bias", &[id])?[0];
            let bias = v.as_f64().ok_or_else(|| {
                ServingError::Request(aphro_core::Error::invalid_param(
                    "logit_bias values must be numbers.",
                    "logit_bias",
                    v,
                ))
            })?;
            logit_bias.push((id, bias));
        }
        let allowed_token_ids = match &sp.allowed_token_ids {
            Some(v) => Some(ids("allowed_token_ids", v)?),
            None => None,
        };
        // vLLM tokenizes each bad word alone and with a leading space.
        let mut bad_words_token_ids: Vec<Vec<u32>> = Vec::new();
        if let Some(tok) = &self.tokenizer {
            for w in &sp.bad_words {
                for variant in [w.clone(), format!(" {}", w.trim_start())] {
                    if let Ok(ids) = tok.encode(&variant, false) {
                        if !ids.is_empty() && !bad_words_token_ids.contains(&ids) {
                            bad_words_token_ids.push(ids);
                        }
                    }
                }
            }
        }
        Ok(SamplingConfig {
            n: sp.n.min(MAX_N_SEQUENCES),
            presence_penalty: sp.presence_penalty,
            frequency_penalty: sp.frequency_penalty,
            repetition_penalty: sp.repetition_penalty,
            temperature: sp.temperature,
            top_p: sp.top_p,
            top_k: sp.top_k,
            min_p: sp.min_p,
            seed: sp.seed,
            stop_token_ids,
            bad_words_token_ids,
            ignore_eos: sp.ignore_eos,
            max_tokens,
            min_tokens: sp.min_tokens,
            logprobs: sp.logprobs,
            prompt_logprobs: sp.prompt_logprobs,
            logit_bias,
            allowed_token_ids,
            // The wire field stays refused above: only generative scoring sets it.
            logprob_token_ids: None,
            grammar: match &sp.structured_outputs {
                Some(so) => Some(self.compile_constraint(so)?),
                None => None,
            },
        })
    }

    /// A request's `structured_outputs` compiled for this model; a constraint that cannot
    /// compile is a 400 naming `structured_outputs`.
    fn compile_constraint(&self, so: &serde_json::Value) -> Result<GrammarMatcher, ServingError> {
        let constraint = Constraint::from_structured_outputs(so)?;
        let Some(tok) = &self.tokenizer else {
            return Err(ServingError::bad_request(
                "structured_outputs need the model's tokenizer, which this server does not load \
                 (--tokens-only or --skip-tokenizer-init).",
            ));
        };
        let compiler = self.grammar_compiler.get_or_init(|| {
            let info = self.engine().model_info();
            let mut eos = info.eos_token_ids.clone();
            eos.extend(
                self.extra_eos
                    .iter()
                    .copied()
                    .filter(|e| !info.eos_token_ids.contains(e)),
            );
            GrammarCompiler::new(Arc::clone(tok), info.vocab_size, &eos)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        let compiler = compiler
            .as_ref()
            .map_err(|e| ServingError::bad_request(e.clone()))?;
        Ok(compiler.compile(&constraint)?)
    }
}

/// A generate body read straight from its bytes: `token_ids` become a `Vec<u32>` directly
/// (a JSON value per id would cost ~8x the body), everything else a JSON object.
#[derive(Debug)]
pub struct GenerateBody {
    pub token_ids: Option<Vec<u32>>,
    /// The body without `token_ids`.
    pub rest: Value,
}

/// Reads the top-level object of a generate body into a [`GenerateBody`].
struct Split;
impl<'de> serde::de::Visitor<'de> for Split {
    type Value = GenerateBody;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a valid dictionary")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<GenerateBody, A::Error> {
        let mut token_ids = None;
        let mut rest = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "token_ids" {
                token_ids = Some(map.next_value::<Vec<u32>>()?);
            } else {
                let v: Value = map.next_value()?;
                rest.insert(key, v);
            }
        }
        Ok(GenerateBody {
            token_ids,
            rest: Value::Object(rest),
        })
    }
}

/// A front end parses a [`GenerateBody`] with its own path-aware, strict reader (the HTTP
/// server's `parse_json`).
impl<'de> serde::Deserialize<'de> for GenerateBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(Split)
    }
}

/// The placeholder runs of a generate request's `features` as the engine keys its blocks
/// on them (identifier = mm_hash: aphro has no LoRA on a vision tower).
fn mm_positions(features: &Value) -> Vec<crate::kv_hash::MmPosition> {
    aphro_core::multimodal::feature_items(features)
        .into_iter()
        .map(|(identifier, p)| crate::kv_hash::MmPosition {
            identifier,
            offset: p.offset,
            length: p.length,
        })
        .collect()
}

/// Decode a generate body without a model (structural errors → 400 "Bad Request"); an absent
/// `sampling_params.max_tokens` becomes `None`.
pub fn parse_generate_request(body: &Value) -> Result<GenerateRequest, ServingError> {
    use aphro_core::validation::{from_body, validation_error, FieldError, Loc};
    // serde reads a struct from a JSON array too (positionally); the wire says objects.
    let not_a_dict = |loc: &[Loc], input: &Value| {
        ServingError::Request(validation_error(&[FieldError::new(
            "dict_type",
            loc,
            "Input should be a valid dictionary",
            input,
        )]))
    };
    if !body.is_object() {
        return Err(not_a_dict(&[], body));
    }
    for key in ["sampling_params", "stream_options", "parse_context"] {
        if let Some(v) = body.get(key).filter(|v| !v.is_object() && !v.is_null()) {
            return Err(not_a_dict(&[Loc::Key(key.into())], v));
        }
    }
    // The one structural formatter (field path, pydantic's wording), from the borrowed value:
    // a clone of a large body would double its memory.
    let mut req: GenerateRequest = from_body(body)?;
    // vLLM's model validators of `features` (see `aphro_core::multimodal::validate`) answer before the
    // handler's own refusal of what this engine cannot run.
    if let Some(obj) = body.as_object() {
        aphro_core::multimodal::validate_generate_features(obj)?;
    }
    let has_max = body
        .get("sampling_params")
        .and_then(Value::as_object)
        .is_some_and(|m| m.contains_key("max_tokens"));
    if !has_max {
        req.sampling_params.max_tokens = None;
    }
    Ok(req)
}

/// The outputs of one generate call: §4.3 events ([`Self::next_event`],
/// [`Self::into_events`]) or the §4.2 response ([`Self::collect_response`]). Dropping it
/// before the end aborts the request.
pub struct ServingStream {
    _registration: InFlightEntry,
    inner: Option<GenerateStream>,
    request_id: String,
    output_mode: OutputMode,
    model: String,
    prompt: Vec<u32>,
    return_token_ids: bool,
    include_usage: bool,
    continuous_usage: bool,
    choices: Vec<ChoiceState>,
    first_event: bool,
    usage_sent: bool,
    want_prompt_logprobs: bool,
    prompt_logprobs: Option<Vec<Option<PositionLogprobs>>>,
    /// `stream_interval`: a choice's stream events carry this many tokens (its first token
    /// and its last event go out at once), as vLLM's output processor batches them.
    stream_interval: usize,
    /// Per choice, the deltas held back until `stream_interval` tokens gathered.
    held: HashMap<usize, ChoiceDelta>,
    tokenizer: Option<Arc<Tokenizer>>,
    kv_transfer_params: Option<Value>,
    ec_transfer_params: Option<Value>,
}

impl ServingStream {
    /// `generate-tokens-<base>`: the id to abort.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    pub fn output_mode(&self) -> OutputMode {
        self.output_mode
    }

    /// The next choice delta, or `None` when the request is over.
    async fn next_delta(&mut self) -> Option<Result<(usize, ChoiceDelta), ServingError>> {
        loop {
            let inner = self.inner.as_mut()?;
            match inner.next().await {
                None => {
                    self.inner = None;
                    return None;
                }
                Some(Err(e)) => {
                    self.inner = None;
                    return Some(Err(e.into()));
                }
                Some(Ok(mut out)) => {
                    if self.want_prompt_logprobs && self.prompt_logprobs.is_none() {
                        self.prompt_logprobs = out.prompt_logprobs.take();
                    }
                    let idx = out.index;
                    let engine_finished = out.finished();
                    let Some(delta) = self.choices.get_mut(idx).and_then(|c| c.process(out)) else {
                        continue;
                    };
                    if self.choices.iter().all(|c| c.finished) {
                        // A stop string ended every choice: end the engine's request
                        // (its blocks are freed before the next step) as finished by stop.
                        if let Some(inner) = self.inner.take() {
                            inner.stop();
                        }
                    } else if !engine_finished && self.choices[idx].finished {
                        // A stop string ended this choice alone: the engine stops
                        // generating it while the others go on.
                        if let Some(inner) = &self.inner {
                            inner.stop_choice(idx);
                        }
                    }
                    return Some(Ok((idx, delta)));
                }
            }
        }
    }

    /// The prompt logprobs in their wire shape, once they arrived with the first output.
    fn prompt_logprobs_json(&self) -> Option<Vec<Value>> {
        self.prompt_logprobs.as_ref().map(|v| {
            v.iter()
                .map(|p| {
                    p.as_ref().map_or(Value::Null, |p| {
                        prompt_logprob_entry(p, self.tokenizer.as_deref())
                    })
                })
                .collect()
        })
    }

    /// [`Self::next_delta`] in `stream_interval` batches: a choice's deltas are held until
    /// they hold `stream_interval` tokens, except its first token and its finishing delta.
    async fn next_batched_delta(&mut self) -> Option<Result<(usize, ChoiceDelta), ServingError>> {
        loop {
            let item = self.next_delta().await;
            if self.stream_interval <= 1 {
                return item;
            }
            let (idx, d) = match item {
                Some(Ok(x)) => x,
                other => return other,
            };
            let first = self.choices[idx].completion_tokens == d.token_ids.len();
            let d = match self.held.remove(&idx) {
                Some(mut held) => {
                    held.append(d);
                    held
                }
                None => d,
            };
            if first || d.finish_reason.is_some() || d.token_ids.len() >= self.stream_interval {
                return Some(Ok((idx, d)));
            }
            self.held.insert(idx, d);
        }
    }

    /// The next §4.3 stream event, or `None` after the last one. An `Err` is the final item.
    pub async fn next_event(&mut self) -> Option<Result<GenerateStreamEvent, ServingError>> {
        loop {
            match self.next_batched_delta().await {
                Some(Err(e)) => {
                    self.usage_sent = true;
                    return Some(Err(e));
                }
                Some(Ok((idx, d))) => {
                    let is_text = self.choices[idx].is_text();
                    let has_text = d.text.as_deref().is_some_and(|t| !t.is_empty());
                    if d.token_ids.is_empty() && d.finish_reason.is_none() && !has_text {
                        continue;
                    }
                    let completion = self.choices[idx].completion_tokens;
                    let prompt_token_ids =
                        (self.first_event && self.return_token_ids).then(|| self.prompt.clone());
                    self.first_event = false;
                    let prompt_logprobs = if self.want_prompt_logprobs
                        && !std::mem::replace(&mut self.choices[idx].prompt_logprobs_sent, true)
                    {
                        self.prompt_logprobs_json()
                    } else {
                        None
                    };
                    let choice = GenerateChoice {
                        index: idx,
                        text: if is_text {
                            Some(d.text.unwrap_or_default())
                        } else {
                            None
                        },
                        message: None,
                        logprobs: d.logprobs,
                        finish_reason: d.finish_reason.map(str::to_string),
                        stop_reason: d.stop_reason,
                        token_ids: Some(d.token_ids),
                        routed_experts: None,
                        sampling_mask: None,
                        weight_versions: None,
                    };
                    return Some(Ok(GenerateStreamEvent::Chunk(Box::new(
                        GenerateStreamResponse {
                            request_id: self.request_id.clone(),
                            output_mode: Some(self.output_mode.as_str().into()),
                            choices: vec![choice],
                            usage: self.continuous_usage.then(|| {
                                UsageInfo::new(self.prompt.len() as u64, completion as u64)
                            }),
                            prompt_token_ids,
                            prompt_logprobs,
                            mm_placeholders: None,
                            metrics: None,
                        },
                    ))));
                }
                None => {
                    if self.include_usage && !self.usage_sent {
                        self.usage_sent = true;
                        let completion: usize =
                            self.choices.iter().map(|c| c.completion_tokens).sum();
                        let prompt = self.prompt.len() as u64;
                        return Some(Ok(GenerateStreamEvent::Usage(GenerateUsageEvent {
                            request_id: self.request_id.clone(),
                            output_mode: self.output_mode.as_str().into(),
                            choices: [],
                            usage: UsageInfoSparse {
                                prompt_tokens: prompt,
                                total_tokens: prompt + completion as u64,
                                completion_tokens: completion as u64,
                            },
                        })));
                    }
                    return None;
                }
            }
        }
    }

    /// The events as a `Stream` (for SSE).
    pub fn into_events(
        self,
    ) -> impl Stream<Item = Result<GenerateStreamEvent, ServingError>> + Send + 'static {
        futures::stream::unfold(self, |mut s| async move {
            let item = s.next_event().await?;
            Some((item, s))
        })
    }

    /// Wait for the end and build the §4.2 response.
    pub async fn collect_response(mut self) -> Result<GenerateResponse, ServingError> {
        struct Acc {
            token_ids: Vec<u32>,
            text: String,
            logprobs: Option<ChoiceLogProbs>,
            finish_reason: Option<&'static str>,
            stop_reason: Option<StopReason>,
        }
        let mut accs: Vec<Acc> = (0..self.choices.len())
            .map(|_| Acc {
                token_ids: Vec::new(),
                text: String::new(),
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            })
            .collect();
        while let Some(item) = self.next_delta().await {
            let (idx, d) = item?;
            let a = &mut accs[idx];
            a.token_ids.extend(d.token_ids);
            if let Some(t) = d.text {
                a.text.push_str(&t);
            }
            if let Some(l) = d.logprobs {
                match a.logprobs.as_mut() {
                    Some(acc) => acc.extend(l),
                    None => a.logprobs = Some(l),
                }
            }
            if d.finish_reason.is_some() {
                a.finish_reason = d.finish_reason;
                a.stop_reason = d.stop_reason;
            }
        }
        let mode = self.output_mode;
        let completion: usize = accs.iter().map(|a| a.token_ids.len()).sum();
        let choices = accs
            .into_iter()
            .enumerate()
            .map(|(index, a)| GenerateChoice {
                index,
                text: (mode == OutputMode::Text).then(|| a.text.clone()),
                message: (mode == OutputMode::Derender)
                    .then(|| ResponseMessage::assistant(Some(a.text.clone()))),
                logprobs: a.logprobs,
                finish_reason: Some(a.finish_reason.unwrap_or("stop").to_string()),
                stop_reason: a.stop_reason,
                token_ids: Some(a.token_ids),
                routed_experts: None,
                sampling_mask: None,
                weight_versions: None,
            })
            .collect();
        let prompt_logprobs = self.prompt_logprobs_json();
        Ok(GenerateResponse {
            request_id: self.request_id.clone(),
            model: Some(self.model.clone()),
            created: Some(unix_now()),
            output_mode: Some(mode.as_str().into()),
            choices,
            usage: Some(UsageInfo::new(self.prompt.len() as u64, completion as u64)),
            prompt_logprobs,
            prompt_token_id_logprobs: None,
            prompt_token_ids: self.return_token_ids.then(|| self.prompt.clone()),
            mm_placeholders: None,
            metrics: None,
            kv_transfer_params: self.kv_transfer_params.take(),
            ec_transfer_params: self.ec_transfer_params.take(),
        })
    }
}

/// One `prompt_logprobs` position: `{"<id>": {"logprob", "rank", "decoded_token"}}`, the
/// prompt token first, then the top candidates.
fn prompt_logprob_entry(p: &PositionLogprobs, tok: Option<&Tokenizer>) -> Value {
    let mut m = Map::new();
    for l in std::iter::once(&p.chosen).chain(p.top.iter()) {
        let key = l.token_id.to_string();
        if m.contains_key(&key) {
            continue;
        }
        m.insert(
            key,
            json!({
                "logprob": clamp_logprob(l.logprob),
                "rank": (l.rank != 0).then_some(l.rank),
                "decoded_token": tok.map(|t| token_text(t.hf(), l.token_id)),
            }),
        );
    }
    Value::Object(m)
}
