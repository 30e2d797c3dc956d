//! The engine facade: `generate(request) -> stream`, `abort(id)`, `shutdown()`, metrics.
//!
//! The step loop runs on its own thread and owns the [`EngineCore`]; callers talk to it over
//! a command channel and get their outputs on a per-request channel. The loop blocks on the
//! command channel whenever nothing is queued, so an idle engine uses no CPU.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use futures::Stream;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::kv::HashAlgo;
use crate::kv_events::KvEventSink;
use crate::metrics::MetricsSnapshot;
use crate::request::{
    EngineOutput, EngineRequest, FinishReason, ValidationError, ValidationLimits,
};
use crate::runner::{ModelInfo, ModelRunner};
use crate::scheduler::{validate_request, AddError, EngineCore, SchedulerConfig};

/// Engine-wide settings (vLLM's scheduler/cache flags).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Token budget per step (`--max-num-batched-tokens`); prefills are chunked to fit.
    pub max_num_batched_tokens: usize,
    /// Sequences per step (`--max-num-seqs`).
    pub max_num_seqs: usize,
    pub enable_prefix_caching: bool,
    /// Context cap (`--max-model-len`); `None` = the model's, clamped to what the cache holds.
    pub max_model_len: Option<usize>,
    /// `--max-logprobs` (vLLM default 20); -1 = the vocabulary size.
    pub max_logprobs: i64,
    /// Seeds the RNG streams of requests without a `seed`; `None` = from OS entropy.
    pub seed: Option<u64>,
    /// `--long-prefill-token-threshold`: most prompt tokens one sequence prefills per step
    /// (0 = no limit beyond the step budget).
    pub long_prefill_token_threshold: usize,
    /// `--prefill-pacing-ratio`: while decodes run, a step's prefill is sized so the step
    /// takes at most this multiple of a decode-only step (`<= 1`: off).
    pub prefill_pacing_ratio: f64,
    /// `--prefix-caching-hash-algo` (vLLM's default `sha256`).
    pub prefix_caching_hash_algo: HashAlgo,
    /// `--kv-events-config`: where the engine's KV-cache events go; `None` = not recorded.
    pub kv_events: Option<KvEventSink>,
    /// CPU threads of this engine's own pool (data parallelism splits the cores between
    /// engines); `None`: the process-wide pool.
    pub num_threads: Option<usize>,
}

/// Default `--prefill-pacing-ratio`: a stream's inter-token latency at most doubles while a
/// long prompt prefills beside it.
pub const DEFAULT_PREFILL_PACING_RATIO: f64 = 2.0;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
            enable_prefix_caching: true,
            max_model_len: None,
            max_logprobs: 20,
            seed: None,
            long_prefill_token_threshold: 0,
            prefill_pacing_ratio: DEFAULT_PREFILL_PACING_RATIO,
            prefix_caching_hash_algo: HashAlgo::default(),
            kv_events: None,
            num_threads: None,
        }
    }
}

/// Errors the engine reports (per request on the stream, or from `Engine::new`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The request is invalid (HTTP 400).
    #[error(transparent)]
    InvalidRequest(#[from] ValidationError),
    /// Another in-flight request already uses this id (HTTP 400).
    #[error("a request with id {0:?} is already in flight")]
    DuplicateRequestId(String),
    /// The model failed; the engine is dead (HTTP 500 for the request, 503 on `/health`).
    #[error("model execution failed: {0}")]
    Runner(String),
    /// The engine was shut down or died before it could serve this request.
    #[error("the engine is not running: {0}")]
    Dead(String),
    /// `Engine::new` rejected the configuration.
    #[error("invalid engine configuration: {0}")]
    Config(String),
}

type Item = Result<EngineOutput, EngineError>;

enum Command {
    Add {
        req: Box<EngineRequest>,
        tx: UnboundedSender<Item>,
        ticket: u64,
    },
    /// `ticket: None` aborts whatever request holds the id (the public `abort`); a ticket
    /// only aborts that `generate` call, so a late drop cannot kill a newer request that
    /// reused the id.
    Abort {
        request_id: String,
        ticket: Option<u64>,
        /// `Abort`, or `Stop` when the consumer ended it at a stop string.
        reason: FinishReason,
    },
    /// End one choice of a request (its consumer found a stop string in it).
    StopChoice {
        request_id: String,
        ticket: u64,
        index: usize,
    },
    /// Die as a runner failure would, with this reason ([`Engine::inject_failure`]).
    Fail(String),
    /// Reset the prefix cache; reply whether it was (refused while requests hold blocks).
    ResetPrefixCache(mpsc::SyncSender<bool>),
    /// Reply with the metrics once every earlier command has been applied.
    Snapshot(mpsc::SyncSender<MetricsSnapshot>),
    Shutdown,
}

struct Shared {
    metrics: Mutex<MetricsSnapshot>,
    /// Tokens the streams handed to their consumers: the reported
    /// `generation_tokens_total`. vLLM counts generated tokens in its frontend, for requests
    /// still live there; a stop string ends a request in the serving layer, and the abort
    /// reaches the engine a step later, so the core's count of sampled tokens can run one
    /// step past what the client got.
    delivered_tokens: AtomicU64,
    dead: AtomicBool,
    dead_reason: Mutex<Option<String>>,
}

/// The running engine. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Engine {
    cmd: Mutex<Sender<Command>>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    info: ModelInfo,
    limits: ValidationLimits,
    next_ticket: AtomicU64,
}

impl Engine {
    /// Start the step loop on its own thread.
    pub fn new(runner: Box<dyn ModelRunner>, config: EngineConfig) -> Result<Engine, EngineError> {
        let info = runner.info().clone();
        let (block_size, num_blocks) = (runner.block_size(), runner.num_blocks());
        let cfg_err = |m: String| Err(EngineError::Config(m));
        if block_size == 0 || num_blocks == 0 {
            return cfg_err(format!(
                "the runner has {num_blocks} KV blocks of {block_size} tokens"
            ));
        }
        if config.max_num_batched_tokens == 0 || config.max_num_seqs == 0 {
            return cfg_err("max_num_batched_tokens and max_num_seqs must be at least 1".into());
        }
        if !(config.prefill_pacing_ratio.is_finite() && config.prefill_pacing_ratio >= 0.0) {
            return cfg_err(format!(
                "prefill_pacing_ratio must be a finite number >= 0, got {}",
                config.prefill_pacing_ratio
            ));
        }
        if info.vocab_size == 0 {
            return cfg_err("the model reports an empty vocabulary".into());
        }
        let capacity = num_blocks.saturating_mul(block_size);
        let max_model_len = match config.max_model_len {
            Some(m) if m > info.max_position => {
                return cfg_err(format!(
                    "max_model_len {m} exceeds the model's maximum context length {}",
                    info.max_position
                ))
            }
            Some(m) if m > capacity => {
                return cfg_err(format!(
                    "max_model_len {m} needs more KV cache than allocated ({num_blocks} blocks of \
                     {block_size} tokens = {capacity} tokens)"
                ))
            }
            Some(0) => return cfg_err("max_model_len must be at least 1".into()),
            Some(m) => m,
            // A model's native context may exceed a small CPU cache: serve what fits.
            None => info.max_position.min(capacity),
        };
        let seed = config.seed.unwrap_or_else(entropy_seed);
        let sched = SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens,
            max_num_seqs: config.max_num_seqs,
            enable_prefix_caching: config.enable_prefix_caching,
            max_model_len,
            max_logprobs: config.max_logprobs,
            seed,
            long_prefill_token_threshold: config.long_prefill_token_threshold,
            prefill_pacing_ratio: config.prefill_pacing_ratio,
            prefix_caching_hash_algo: config.prefix_caching_hash_algo,
        };
        let mut core = EngineCore::new(runner, sched);
        if let Some(sink) = config.kv_events {
            core.set_kv_event_sink(sink);
        }
        let limits = core.validation_limits();
        let shared = Arc::new(Shared {
            metrics: Mutex::new(core.metrics().clone()),
            delivered_tokens: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            dead_reason: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel();
        let loop_shared = Arc::clone(&shared);
        // Kernels parallelise with rayon; an engine with its own pool runs every step inside
        // it, so engines of one process do not contend for the same threads.
        let pool = match config.num_threads {
            Some(n) => Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n.max(1))
                    .thread_name(|i| format!("aphro-engine-worker-{i}"))
                    .build()
                    .map_err(|e| {
                        EngineError::Config(format!("cannot start the thread pool: {e}"))
                    })?,
            )),
            None => None,
        };
        let thread = std::thread::Builder::new()
            .name("aphro-engine".into())
            .spawn(move || match pool {
                Some(pool) => pool.install(|| run_loop(core, rx, &loop_shared)),
                None => run_loop(core, rx, &loop_shared),
            })
            .map_err(|e| EngineError::Config(format!("cannot spawn the engine thread: {e}")))?;
        Ok(Engine {
            cmd: Mutex::new(tx),
            shared,
            thread: Mutex::new(Some(thread)),
            info,
            limits,
            next_ticket: AtomicU64::new(0),
        })
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    /// The effective context length.
    pub fn max_model_len(&self) -> usize {
        self.limits.max_model_len
    }

    pub fn max_num_seqs(&self) -> usize {
        self.limits.max_num_seqs
    }

    /// Check a request the way `generate` will, without submitting it (lets the HTTP layer
    /// answer 400 before it commits to a streaming response).
    pub fn validate(&self, req: &EngineRequest) -> Result<(), EngineError> {
        validate_request(req, &self.info.eos_token_ids, &self.limits)?;
        Ok(())
    }

    /// Submit a request. The stream yields one output per step per choice that produced a
    /// token or finished, and ends after every choice finished. Errors (invalid request,
    /// runner failure) arrive as an `Err` item, after which the stream ends. Dropping the
    /// stream before it ends aborts the request.
    pub fn generate(&self, req: EngineRequest) -> GenerateStream {
        let (tx, rx) = unbounded_channel();
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let n = usize::try_from(req.sampling.n).unwrap_or(1).max(1);
        let mut stream = GenerateStream {
            rx,
            request_id: req.request_id.clone(),
            ticket,
            cmd: self.sender(),
            remaining_choices: n,
            done: false,
            shared: Arc::clone(&self.shared),
        };
        let reject = |stream: &mut GenerateStream, tx: UnboundedSender<Item>, e: EngineError| {
            let _ = tx.send(Err(e));
            stream.done = true; // Never reached the engine: nothing to abort.
        };
        if self.shared.dead.load(Ordering::Acquire) {
            reject(&mut stream, tx, EngineError::Dead(self.dead_reason()));
            return stream;
        }
        if let Err(e) = self.validate(&req) {
            reject(&mut stream, tx, e);
            return stream;
        }
        let failed = match self.cmd.lock() {
            Ok(cmd) => cmd
                .send(Command::Add {
                    req: Box::new(req),
                    tx,
                    ticket,
                })
                .err(),
            Err(_) => None,
        };
        if let Some(mpsc::SendError(Command::Add { tx, .. })) = failed {
            reject(
                &mut stream,
                tx,
                EngineError::Dead("the engine has shut down".into()),
            );
        }
        stream
    }

    /// Abort a request by id (no-op if unknown or finished). Its blocks are freed before the
    /// next step, and its stream gets `finish_reason = abort`.
    pub fn abort(&self, request_id: &str) {
        if let Some(cmd) = self.sender() {
            let _ = cmd.send(Command::Abort {
                request_id: request_id.to_string(),
                ticket: None,
                reason: FinishReason::Abort,
            });
        }
    }

    /// A copy of the current metrics.
    pub fn metrics(&self) -> MetricsSnapshot {
        let m = self
            .shared
            .metrics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.with_delivered_tokens(m)
    }

    /// `generation_tokens_total` as vLLM reports it: the tokens streams delivered (see
    /// `Shared::delivered_tokens`), not every token the core sampled.
    fn with_delivered_tokens(&self, mut m: MetricsSnapshot) -> MetricsSnapshot {
        m.generation_tokens_total = self.shared.delivered_tokens.load(Ordering::Relaxed);
        m
    }

    /// Metrics after every command sent before this call (aborts included) took effect.
    /// Blocks for at most one engine step.
    pub fn metrics_synced(&self) -> MetricsSnapshot {
        let (tx, rx) = mpsc::sync_channel(1);
        if let Some(cmd) = self.sender() {
            if cmd.send(Command::Snapshot(tx)).is_ok() {
                if let Ok(m) = rx.recv() {
                    return self.with_delivered_tokens(m);
                }
            }
        }
        self.metrics()
    }

    /// Drop every cached prefix (vLLM's `/reset_prefix_cache`), after every command sent
    /// before this call took effect. `false` while requests hold blocks or the engine is dead.
    pub fn reset_prefix_cache(&self) -> bool {
        let (tx, rx) = mpsc::sync_channel(1);
        match self.sender() {
            Some(cmd) if cmd.send(Command::ResetPrefixCache(tx)).is_ok() => {
                rx.recv().unwrap_or(false)
            }
            _ => false,
        }
    }

    /// False once a runner failure killed the engine (`/health` → 503).
    pub fn is_healthy(&self) -> bool {
        !self.shared.dead.load(Ordering::Acquire)
    }

    /// Why the engine stopped serving, once it has (`None` while healthy).
    pub fn failure(&self) -> Option<String> {
        (!self.is_healthy()).then(|| self.dead_reason())
    }

    /// Fail the engine as a runner failure would: every request in flight ends with an
    /// error, later ones get `Dead(reason)`. For failure drills and tests of what serves
    /// around a dead engine (data-parallel failover, 503 semantics).
    pub fn inject_failure(&self, reason: impl Into<String>) {
        if let Some(cmd) = self.sender() {
            let _ = cmd.send(Command::Fail(reason.into()));
        }
    }

    fn dead_reason(&self) -> String {
        self.shared
            .dead_reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "the engine has shut down".into())
    }

    fn sender(&self) -> Option<Sender<Command>> {
        self.cmd.lock().ok().map(|c| c.clone())
    }

    /// Abort everything in flight and stop the step loop. Idempotent.
    pub fn shutdown(&self) {
        if let Some(cmd) = self.sender() {
            let _ = cmd.send(Command::Shutdown);
        }
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        self.shared.dead.store(true, Ordering::Release);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn entropy_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from OS randomness; no extra dependency needed.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish()
}

/// The output stream of one `generate` call.
pub struct GenerateStream {
    rx: UnboundedReceiver<Item>,
    request_id: String,
    ticket: u64,
    cmd: Option<Sender<Command>>,
    remaining_choices: usize,
    done: bool,
    shared: Arc<Shared>,
}

impl GenerateStream {
    pub fn request_id(&self) -> &str {
        &self.request_id
    }
}

impl Stream for GenerateStream {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let polled = self.rx.poll_recv(cx);
        match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.done = true,
            Poll::Ready(Some(Ok(out))) => {
                self.shared
                    .delivered_tokens
                    .fetch_add(out.token_ids.len() as u64, Ordering::Relaxed);
                if out.finished() {
                    self.remaining_choices = self.remaining_choices.saturating_sub(1);
                    if self.remaining_choices == 0 {
                        self.done = true;
                    }
                }
            }
            _ => {}
        }
        polled
    }
}

impl GenerateStream {
    /// End the request because its consumer found a stop string: its blocks are freed
    /// before the next step, as when the stream is dropped, but it counts as finished by
    /// `stop` rather than aborted.
    pub fn stop(mut self) {
        self.end(FinishReason::Stop);
    }

    /// End one choice of an `n > 1` request because its consumer found a stop string in
    /// it: its blocks are freed before the next step while the other choices go on.
    pub fn stop_choice(&self, index: usize) {
        if let (false, Some(cmd)) = (self.done, &self.cmd) {
            let _ = cmd.send(Command::StopChoice {
                request_id: self.request_id.clone(),
                ticket: self.ticket,
                index,
            });
        }
    }

    fn end(&mut self, reason: FinishReason) {
        if !self.done {
            self.done = true;
            if let Some(cmd) = &self.cmd {
                let _ = cmd.send(Command::Abort {
                    request_id: self.request_id.clone(),
                    ticket: Some(self.ticket),
                    reason,
                });
            }
        }
    }
}

impl Drop for GenerateStream {
    fn drop(&mut self) {
        // Unfinished: a disconnected client; free the request's blocks.
        self.end(FinishReason::Abort);
    }
}

struct Client {
    tx: UnboundedSender<Item>,
    ticket: u64,
}

fn run_loop(mut core: EngineCore, rx: Receiver<Command>, shared: &Shared) {
    let mut clients: HashMap<String, Client> = HashMap::new();
    loop {
        // Block while idle; otherwise take whatever arrived since the last step.
        let first = if core.has_work() {
            match rx.try_recv() {
                Ok(c) => Some(c),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Command::Shutdown),
            }
        } else {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(RecvError) => Some(Command::Shutdown),
            }
        };
        let mut pending: Vec<Command> = first.into_iter().collect();
        pending.extend(rx.try_iter());
        for cmd in pending {
            match cmd {
                Command::Add { req, tx, ticket } => {
                    let id = req.request_id.clone();
                    if clients.contains_key(&id) {
                        let _ = tx.send(Err(EngineError::DuplicateRequestId(id)));
                        continue;
                    }
                    match core.add_request(*req) {
                        Ok(()) => {
                            clients.insert(id, Client { tx, ticket });
                        }
                        Err(AddError::Invalid(e)) => {
                            let _ = tx.send(Err(e.into()));
                        }
                        Err(AddError::DuplicateId(id)) => {
                            let _ = tx.send(Err(EngineError::DuplicateRequestId(id)));
                        }
                    }
                }
                Command::Abort {
                    request_id,
                    ticket,
                    reason,
                } => {
                    let matches = clients
                        .get(&request_id)
                        .is_some_and(|c| ticket.is_none_or(|t| t == c.ticket));
                    if matches {
                        let outs = core.end_early(&request_id, reason);
                        route(&core, &mut clients, outs);
                    }
                }
                Command::StopChoice {
                    request_id,
                    ticket,
                    index,
                } => {
                    if clients.get(&request_id).is_some_and(|c| c.ticket == ticket) {
                        let outs = core.end_choice(&request_id, index);
                        route(&core, &mut clients, outs);
                    }
                }
                Command::Snapshot(reply) => {
                    let _ = reply.send(core.metrics().clone());
                }
                Command::ResetPrefixCache(reply) => {
                    let _ = reply.send(core.reset_prefix_cache());
                }
                Command::Shutdown => {
                    let outs = core.abort_all();
                    route(&core, &mut clients, outs);
                    publish(&core, shared);
                    return;
                }
                Command::Fail(reason) => {
                    die(&mut core, &mut clients, shared, reason, &rx);
                    return;
                }
            }
        }
        if core.has_work() {
            let result = catch_unwind(AssertUnwindSafe(|| core.step()));
            let failure = match result {
                Ok(Ok(outs)) => {
                    route(&core, &mut clients, outs);
                    None
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(panic) => Some(format!(
                    "the model runner panicked: {}",
                    panic_message(&panic)
                )),
            };
            if let Some(msg) = failure {
                die(&mut core, &mut clients, shared, msg, &rx);
                return;
            }
        }
        publish(&core, shared);
    }
}

/// A fatal runner failure: fail every in-flight request, mark the engine dead, and keep
/// answering commands with `Dead` until shutdown so callers never hang.
fn die(
    core: &mut EngineCore,
    clients: &mut HashMap<String, Client>,
    shared: &Shared,
    msg: String,
    rx: &Receiver<Command>,
) {
    *shared
        .dead_reason
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(msg.clone());
    shared.dead.store(true, Ordering::Release);
    for (_, c) in clients.drain() {
        let _ = c.tx.send(Err(EngineError::Runner(msg.clone())));
    }
    // Release the bookkeeping (the runner's memory is in an unknown state anyway).
    let _ = catch_unwind(AssertUnwindSafe(|| core.abort_all()));
    core.metrics_mut().healthy = false;
    publish(core, shared);
    for cmd in rx.iter() {
        match cmd {
            Command::Add { tx, .. } => {
                let _ = tx.send(Err(EngineError::Dead(msg.clone())));
            }
            Command::Abort { .. } | Command::StopChoice { .. } => {}
            Command::ResetPrefixCache(reply) => {
                let _ = reply.send(false);
            }
            Command::Snapshot(reply) => {
                let _ = reply.send(core.metrics().clone());
            }
            Command::Fail(_) => {}
            Command::Shutdown => return,
        }
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

fn route(core: &EngineCore, clients: &mut HashMap<String, Client>, outs: Vec<EngineOutput>) {
    let mut touched: Vec<String> = Vec::new();
    for out in outs {
        let id = out.request_id.clone();
        if let Some(c) = clients.get(&id) {
            let _ = c.tx.send(Ok(out));
            if !touched.contains(&id) {
                touched.push(id);
            }
        }
    }
    // A request the core no longer knows has finished: closing its channel ends the stream.
    for id in touched {
        if !core.has_request(&id) {
            clients.remove(&id);
        }
    }
}

fn publish(core: &EngineCore, shared: &Shared) {
    let mut m = shared
        .metrics
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    m.clone_from(core.metrics());
}
