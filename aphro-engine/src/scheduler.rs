//! The synchronous engine core: continuous-batching scheduler + KV block manager + sampler
//! around a [`ModelRunner`]. [`crate::engine::Engine`] drives it from its own thread; tests
//! can drive it directly, one `step()` at a time.
//!
//! Scheduling per step, within `max_num_batched_tokens` and `max_num_seqs`:
//! 1. running sequences that decode (one token each), best priority first;
//! 2. running sequences still prefilling, chunked to the remaining budget;
//! 3. if nothing was preempted this step, waiting sequences by (priority, arrival), each
//!    first matched against the prefix cache.
//!
//! Prefill chunks are further bounded so long prompts share steps fairly: by
//! `long_prefill_token_threshold` per sequence (vLLM's flag), to half the prefill budget for a
//! running prefill while an admissible request waits behind it, and — while decodes run — by
//! the [`PrefillPacer`], which keeps a step (a running stream's inter-token latency) within a
//! multiple of a decode-only step.
//!
//! When a running sequence cannot get a block, the worst running sequence (highest
//! priority value, latest arrival) is preempted by recompute: its blocks are freed, it keeps
//! its generated tokens and goes back to the waiting queue to re-prefill prompt + output.
//!
//! `n > 1`: the prompt is prefilled once by one sequence, which forks into `n` sequences
//! sharing every block when the first token is sampled; a shared partially filled block is
//! copied on the first write (copy-on-write).

use std::collections::HashMap;
use std::time::Instant;

use crate::kv::{BlockHasher, BlockManager, HashAlgo, SeqBlocks};
use crate::kv_events::{now_ts, KvEventBatch, KvEventSink};
use crate::metrics::MetricsSnapshot;
use crate::pacer::PrefillPacer;
use crate::request::{
    EngineOutput, EngineRequest, FinishReason, GrammarMatcher, PositionLogprobs, SamplingPlan,
    TokenMask, Usage, ValidationError, ValidationLimits,
};
use crate::runner::{BatchInput, LogitsWanted, ModelRunner, RunnerError, SeqInput};
use crate::sampler::{self, SampleInput, SamplerScratch, SeqRng};

/// Scheduler limits.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub enable_prefix_caching: bool,
    /// Context length cap (already clamped to the model and the cache size).
    pub max_model_len: usize,
    /// `--max-logprobs`; -1 = vocabulary size.
    pub max_logprobs: i64,
    /// Seeds the RNGs of requests that give no seed.
    pub seed: u64,
    /// `--long-prefill-token-threshold`: most prompt tokens one sequence prefills per step
    /// (0 = only the step budget limits it).
    pub long_prefill_token_threshold: usize,
    /// `--prefill-pacing-ratio`: while decodes run, a step's prefill is sized so the step
    /// takes at most this multiple of a decode-only step; `<= 1` turns pacing off (prefill
    /// chunks then fill the budget, and steps' lengths depend on nothing but the load).
    pub prefill_pacing_ratio: f64,
    /// `--prefix-caching-hash-algo`: how prefix-cache block hashes are computed (vLLM's).
    pub prefix_caching_hash_algo: HashAlgo,
}

/// Why `add_request` refused a request.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("a request with id {0:?} is already running")]
    DuplicateId(String),
}

#[derive(Debug)]
struct Request {
    plan: SamplingPlan,
    prompt_len: usize,
    priority: i64,
    arrival: u64,
    /// RNG seed per choice (vLLM gives child `i` of a seeded request `seed + i`).
    choice_seeds: Vec<u64>,
    /// Live sequences of this request.
    seqs: Vec<u64>,
    /// Choices not finished yet.
    unfinished: usize,
    cached_tokens: usize,
    prompt_logprobs: Option<Vec<Option<PositionLogprobs>>>,
    /// Set when the request is first scheduled (cached-token count, queue time).
    scheduled_once: bool,
    /// Set once the first output (which carries `prompt_logprobs`) went out.
    first_output_sent: bool,
    arrived_at: Instant,
    first_token_at: Option<Instant>,
    /// Phase timestamps and token counts for the per-request histograms.
    scheduled_at: Option<Instant>,
    last_token_at: Option<Instant>,
    generated_total: usize,
    generated_max: usize,
}

#[derive(Debug)]
struct Seq {
    request_id: String,
    /// Choice index; a pre-fork sequence of an `n > 1` request stands for all choices.
    choice: usize,
    /// False while this sequence still has to fork into `n` choices.
    forked: bool,
    /// Prompt followed by generated tokens.
    tokens: Vec<u32>,
    num_computed: usize,
    blocks: SeqBlocks,
    rng: SeqRng,
    /// Prompt logprobs still to compute (only on the first prefill, never after preemption).
    wants_prompt_logprobs: bool,
    last_token_at: Option<Instant>,
    /// Structured outputs: this choice's place in its grammar.
    grammar: Option<GrammarMatcher>,
}

impl Seq {
    fn output_len(&self, prompt_len: usize) -> usize {
        self.tokens.len() - prompt_len
    }
}

/// The output that ends `choice` of a request before the engine finished it (an abort, or
/// a stop string the consumer found): no new tokens, the usage so far.
fn ended_output(
    request_id: &str,
    req: &Request,
    seq: &Seq,
    choice: usize,
    reason: FinishReason,
) -> EngineOutput {
    EngineOutput {
        request_id: request_id.to_string(),
        index: choice,
        token_ids: Vec::new(),
        logprobs: req.plan.logprobs.map(|_| Vec::new()),
        prompt_logprobs: None,
        finish_reason: Some(reason),
        stop_reason: None,
        usage: Usage {
            prompt_tokens: req.prompt_len,
            completion_tokens: seq.output_len(req.prompt_len),
            cached_tokens: req.cached_tokens,
        },
    }
}

struct Scheduled {
    seq_id: u64,
    num_tokens: usize,
    logits: LogitsWanted,
    sample: bool,
    /// Scheduled in the decode pass. A one-token prefill chunk (the pacer's floor) has
    /// `num_tokens == 1` too, and must not count as a decode when the step is timed.
    decode: bool,
}

/// The engine's synchronous state machine.
pub struct EngineCore {
    runner: Box<dyn ModelRunner>,
    kv: BlockManager,
    cfg: SchedulerConfig,
    vocab_size: usize,
    eos_token_ids: Vec<u32>,
    requests: HashMap<String, Request>,
    seqs: HashMap<u64, Seq>,
    /// Sorted by [`EngineCore::key`] (best first).
    waiting: Vec<u64>,
    running: Vec<u64>,
    next_seq_id: u64,
    next_arrival: u64,
    seed_rng: SeqRng,
    scratch: SamplerScratch,
    lp_order: Vec<u32>,
    metrics: MetricsSnapshot,
    pacer: PrefillPacer,
    /// Where each step's KV-cache events go (`--kv-events-config`).
    kv_events: Option<KvEventSink>,
}

impl EngineCore {
    pub fn new(runner: Box<dyn ModelRunner>, cfg: SchedulerConfig) -> Self {
        let info = runner.info().clone();
        let kv = BlockManager::with_hasher(
            runner.num_blocks(),
            runner.block_size(),
            cfg.enable_prefix_caching,
            BlockHasher::from_env(cfg.prefix_caching_hash_algo),
        );
        let mut metrics = MetricsSnapshot {
            kv_blocks_total: kv.num_blocks(),
            ..MetricsSnapshot::with_max_model_len(cfg.max_model_len)
        };
        metrics.healthy = true;
        let cfg_ratio = cfg.prefill_pacing_ratio;
        Self {
            seed_rng: SeqRng::from_seed(cfg.seed),
            runner,
            kv,
            cfg,
            vocab_size: info.vocab_size,
            eos_token_ids: info.eos_token_ids,
            requests: HashMap::new(),
            seqs: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            next_seq_id: 0,
            next_arrival: 0,
            scratch: SamplerScratch::default(),
            lp_order: Vec::new(),
            metrics,
            pacer: PrefillPacer::new(cfg_ratio),
            kv_events: None,
        }
    }

    /// Send this engine's KV-cache events (`endpoints.md §4.3`), one batch per step that
    /// changed the prefix cache, to `sink`.
    pub fn set_kv_event_sink(&mut self, sink: KvEventSink) {
        self.kv.enable_events();
        self.kv_events = Some(sink);
    }

    /// Drop every cached prefix (vLLM's `reset_prefix_cache`); `false` while requests hold
    /// blocks. Reported as `AllBlocksCleared`.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let ok = self.kv.reset_prefix_cache();
        self.flush_kv_events();
        ok
    }

    /// Hand the events recorded since the last flush to the sink as one batch.
    fn flush_kv_events(&mut self) {
        if let Some(sink) = &self.kv_events {
            let events = self.kv.take_events();
            if !events.is_empty() {
                sink.send(KvEventBatch {
                    ts: now_ts(),
                    events,
                    data_parallel_rank: Some(sink.data_parallel_rank()),
                });
            }
        }
    }

    pub fn validation_limits(&self) -> ValidationLimits {
        ValidationLimits {
            vocab_size: self.vocab_size,
            max_model_len: self.cfg.max_model_len,
            max_num_seqs: self.cfg.max_num_seqs,
            max_logprobs: self.cfg.max_logprobs,
        }
    }

    /// Validate a request against the model and limits without queueing it.
    pub fn validate(&self, req: &EngineRequest) -> Result<SamplingPlan, ValidationError> {
        validate_request(req, &self.eos_token_ids, &self.validation_limits())
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn has_request(&self, request_id: &str) -> bool {
        self.requests.contains_key(request_id)
    }

    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    pub fn block_manager(&self) -> &BlockManager {
        &self.kv
    }

    pub fn metrics(&self) -> &MetricsSnapshot {
        &self.metrics
    }

    pub fn metrics_mut(&mut self) -> &mut MetricsSnapshot {
        &mut self.metrics
    }

    /// Queue a request; it joins the batch at the next step.
    pub fn add_request(&mut self, req: EngineRequest) -> Result<(), AddError> {
        if self.requests.contains_key(&req.request_id) {
            return Err(AddError::DuplicateId(req.request_id));
        }
        let plan = self.validate(&req)?;
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        let choice_seeds: Vec<u64> = (0..plan.n)
            .map(|i| match plan.seed {
                Some(s) => s.wrapping_add(i as u64),
                None => self.seed_rng_next(),
            })
            .collect();
        let seq_id = self.alloc_seq_id();
        let seq = Seq {
            request_id: req.request_id.clone(),
            choice: 0,
            forked: plan.n == 1,
            tokens: req.prompt_token_ids.clone(),
            num_computed: 0,
            blocks: SeqBlocks::salted(req.cache_salt.as_deref())
                .with_mm(req.mm_features.as_slice().into()),
            rng: SeqRng::from_seed(choice_seeds[0]),
            wants_prompt_logprobs: plan.prompt_logprobs.is_some(),
            last_token_at: None,
            grammar: req.sampling.grammar.clone(),
        };
        self.metrics.prompt_tokens_total += req.prompt_token_ids.len() as u64;
        let request = Request {
            prompt_len: req.prompt_token_ids.len(),
            priority: req.priority,
            arrival,
            choice_seeds,
            seqs: vec![seq_id],
            unfinished: plan.n,
            cached_tokens: 0,
            prompt_logprobs: plan.prompt_logprobs.map(|_| vec![None]),
            scheduled_once: false,
            first_output_sent: false,
            arrived_at: Instant::now(),
            first_token_at: None,
            scheduled_at: None,
            last_token_at: None,
            generated_total: 0,
            generated_max: 0,
            plan,
        };
        self.requests.insert(req.request_id, request);
        self.seqs.insert(seq_id, seq);
        self.insert_sorted(Queue::Waiting, seq_id);
        self.refresh_gauges();
        Ok(())
    }

    fn seed_rng_next(&mut self) -> u64 {
        self.seed_rng.next_u64()
    }

    fn alloc_seq_id(&mut self) -> u64 {
        let id = self.next_seq_id;
        self.next_seq_id += 1;
        id
    }

    /// Ordering key: lower priority value first, then arrival, then choice index.
    fn key(&self, seq_id: u64) -> (i64, u64, usize) {
        let seq = &self.seqs[&seq_id];
        let req = &self.requests[&seq.request_id];
        (req.priority, req.arrival, seq.choice)
    }

    fn insert_sorted(&mut self, q: Queue, seq_id: u64) {
        let k = self.key(seq_id);
        let list = match q {
            Queue::Waiting => &self.waiting,
            Queue::Running => &self.running,
        };
        let pos = list.partition_point(|&s| self.key(s) <= k);
        match q {
            Queue::Waiting => self.waiting.insert(pos, seq_id),
            Queue::Running => self.running.insert(pos, seq_id),
        }
    }

    /// Abort a request: free its blocks now and emit `finish_reason = abort` for every
    /// unfinished choice. Unknown or finished ids are ignored.
    pub fn abort(&mut self, request_id: &str) -> Vec<EngineOutput> {
        self.end_early(request_id, FinishReason::Abort)
    }

    /// End a request before the engine would, as [`Self::abort`] does, counting it in
    /// `request_success` under `reason`: `Stop` when the consumer found a stop string
    /// (vLLM's frontend finishes such a request as "stop"), `Abort` otherwise.
    pub fn end_early(&mut self, request_id: &str, reason: FinishReason) -> Vec<EngineOutput> {
        let Some(req) = self.requests.remove(request_id) else {
            return Vec::new();
        };
        let mut outs = Vec::new();
        for seq_id in &req.seqs {
            if let Some(mut seq) = self.seqs.remove(seq_id) {
                self.kv.free(&mut seq.blocks);
                self.waiting.retain(|s| s != seq_id);
                self.running.retain(|s| s != seq_id);
                let choices = if seq.forked {
                    seq.choice..seq.choice + 1
                } else {
                    0..req.plan.n
                };
                for choice in choices {
                    outs.push(ended_output(request_id, &req, &seq, choice, reason));
                }
            }
        }
        *self
            .metrics
            .request_success
            .entry(reason.as_str())
            .or_default() += 1;
        self.refresh_gauges();
        outs
    }

    /// End one choice of an `n > 1` request whose consumer found a stop string in it, as the
    /// engine ends a choice at EOS: its blocks are freed before the next step and the other
    /// choices go on. Emits the choice's `finish_reason = stop` (the consumer has already
    /// ended it and ignores this; it closes the stream when this was the last choice).
    /// Nothing happens for an unknown request or choice, a finished one, or one not yet
    /// forked from the shared prompt (it ends with its request).
    pub fn end_choice(&mut self, request_id: &str, index: usize) -> Vec<EngineOutput> {
        let Some(req) = self.requests.get(request_id) else {
            return Vec::new();
        };
        let found = req.seqs.iter().copied().find(|id| {
            self.seqs
                .get(id)
                .is_some_and(|seq| seq.forked && seq.choice == index)
        });
        let Some(seq_id) = found else {
            return Vec::new();
        };
        let out = ended_output(
            request_id,
            req,
            &self.seqs[&seq_id],
            index,
            FinishReason::Stop,
        );
        self.finish_seq(seq_id, FinishReason::Stop);
        self.refresh_gauges();
        vec![out]
    }

    /// Abort everything (shutdown, or a dead runner).
    pub fn abort_all(&mut self) -> Vec<EngineOutput> {
        let ids: Vec<String> = self.requests.keys().cloned().collect();
        ids.iter().flat_map(|id| self.abort(id)).collect()
    }

    /// Ids of all requests in flight.
    pub fn request_ids(&self) -> Vec<String> {
        self.requests.keys().cloned().collect()
    }

    fn preempt(&mut self, seq_id: u64) {
        self.running.retain(|&s| s != seq_id);
        if let Some(seq) = self.seqs.get_mut(&seq_id) {
            self.kv.free(&mut seq.blocks);
            seq.num_computed = 0;
            if seq.wants_prompt_logprobs {
                // Preempted mid-prompt: the re-prefill recomputes prompt logprobs from the start.
                if let Some(req) = self.requests.get_mut(&seq.request_id) {
                    req.prompt_logprobs = req.plan.prompt_logprobs.map(|_| vec![None]);
                }
            }
        }
        self.insert_sorted(Queue::Waiting, seq_id);
        self.metrics.num_preemptions += 1;
    }

    /// Try to allocate blocks for `k` more tokens of a running sequence, preempting the
    /// worst running sequences as needed. Returns false if `seq_id` itself was preempted.
    fn allocate_running(
        &mut self,
        seq_id: u64,
        k: usize,
        scheduled: &mut Vec<Scheduled>,
        budget: &mut usize,
    ) -> bool {
        loop {
            let seq = self.seqs.get_mut(&seq_id).expect("running seq exists");
            let (nc, new_len) = (seq.num_computed, seq.num_computed + k);
            if self.kv.allocate(&mut seq.blocks, nc, new_len).is_ok() {
                return true;
            }
            let victim = *self.running.last().expect("running holds seq_id");
            if let Some(pos) = scheduled.iter().position(|s| s.seq_id == victim) {
                *budget += scheduled.remove(pos).num_tokens;
            }
            self.preempt(victim);
            if victim == seq_id {
                return false;
            }
        }
    }

    fn plan_seq(&self, seq_id: u64, k: usize, decode: bool) -> Scheduled {
        let seq = &self.seqs[&seq_id];
        let sample = seq.num_computed + k == seq.tokens.len();
        let logits = if seq.wants_prompt_logprobs {
            LogitsWanted::All
        } else if sample {
            LogitsWanted::Last
        } else {
            LogitsWanted::None
        };
        Scheduled {
            seq_id,
            num_tokens: k,
            logits,
            sample,
            decode,
        }
    }

    fn schedule(&mut self) -> Vec<Scheduled> {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut scheduled: Vec<Scheduled> = Vec::new();
        let mut preempted = self.metrics.num_preemptions;
        for decode_pass in [true, false] {
            if !decode_pass {
                // Everything after the decodes is prefill: pace it against their latency.
                if let Some(cap) = self.pacer.prefill_cap(scheduled.len()) {
                    budget = budget.min(cap);
                }
            }
            // A waiting request that could be admitted gets at least half of the prefill
            // budget, so it is not queued behind a long prompt for that prompt's whole prefill.
            let admissible_waiting =
                !self.waiting.is_empty() && self.running.len() < self.cfg.max_num_seqs;
            let snapshot = self.running.clone();
            for seq_id in snapshot {
                if budget == 0 {
                    break;
                }
                // Preempted earlier in this pass, or already handled.
                if !self.running.contains(&seq_id) || scheduled.iter().any(|s| s.seq_id == seq_id) {
                    continue;
                }
                let seq = &self.seqs[&seq_id];
                let remaining = seq.tokens.len() - seq.num_computed;
                if (remaining == 1) != decode_pass {
                    continue;
                }
                let mut k = remaining.min(budget);
                if !decode_pass {
                    k = k.min(self.chunk_limit());
                    if admissible_waiting {
                        k = k.min(budget.div_ceil(2));
                    }
                }
                if self.allocate_running(seq_id, k, &mut scheduled, &mut budget) {
                    budget -= k;
                    scheduled.push(self.plan_seq(seq_id, k, decode_pass));
                }
            }
        }
        preempted = self.metrics.num_preemptions - preempted;
        let chunk_limit = self.chunk_limit();
        if preempted == 0 {
            while budget > 0 {
                let Some(&seq_id) = self.waiting.first() else {
                    break;
                };
                let seq = &self.seqs[&seq_id];
                let req = &self.requests[&seq.request_id];
                let width = if seq.forked { 1 } else { req.plan.n };
                if self.running.len() + width > self.cfg.max_num_seqs {
                    break;
                }
                let first_schedule = !req.scheduled_once;
                let seq = self.seqs.get_mut(&seq_id).expect("waiting seq exists");
                // Prompt logprobs need every prompt position computed, so no cache reads.
                let hit = if seq.wants_prompt_logprobs {
                    0
                } else {
                    self.kv.match_prefix(&mut seq.blocks, &seq.tokens)
                };
                seq.num_computed = hit;
                let k = (seq.tokens.len() - hit).min(budget).min(chunk_limit);
                if self.kv.allocate(&mut seq.blocks, hit, hit + k).is_err() {
                    self.kv.free(&mut seq.blocks);
                    seq.num_computed = 0;
                    break;
                }
                let request_id = seq.request_id.clone();
                self.waiting.remove(0);
                self.insert_sorted(Queue::Running, seq_id);
                if let Some(req) = self.requests.get_mut(&request_id) {
                    if first_schedule {
                        req.scheduled_once = true;
                        req.scheduled_at = Some(Instant::now());
                        req.cached_tokens = hit.min(req.prompt_len);
                        let queued = req.arrived_at.elapsed().as_secs_f64();
                        self.metrics.request_queue_time.observe(queued);
                    }
                }
                budget -= k;
                scheduled.push(self.plan_seq(seq_id, k, false));
            }
        }
        scheduled
    }

    /// Most tokens one sequence prefills per step (`long_prefill_token_threshold`).
    fn chunk_limit(&self) -> usize {
        match self.cfg.long_prefill_token_threshold {
            0 => usize::MAX,
            n => n,
        }
    }

    /// Run one step: schedule, execute, sample. Returns this step's outputs (one per choice
    /// that produced a token or finished). A runner error is fatal for the engine.
    pub fn step(&mut self) -> Result<Vec<EngineOutput>, RunnerError> {
        let outs = self.step_inner();
        // One KVEventBatch per step, as vLLM's scheduler publishes them.
        self.flush_kv_events();
        outs
    }

    fn step_inner(&mut self) -> Result<Vec<EngineOutput>, RunnerError> {
        let started = Instant::now();
        let scheduled = self.schedule();
        if scheduled.is_empty() {
            self.refresh_gauges();
            return Ok(Vec::new());
        }
        let mut batch = BatchInput {
            seqs: Vec::with_capacity(scheduled.len()),
        };
        for s in &scheduled {
            let seq = &self.seqs[&s.seq_id];
            batch.seqs.push(SeqInput {
                seq_id: s.seq_id,
                token_ids: seq.tokens[seq.num_computed..seq.num_computed + s.num_tokens].to_vec(),
                start_pos: seq.num_computed,
                block_table: seq.blocks.table.clone(),
                logits: s.logits,
            });
        }
        let copies = self.kv.take_pending_copies();
        if !copies.is_empty() {
            self.runner.copy_blocks(&copies)?;
        }
        // Grammar masks for the sequences that sample this step are computed on another
        // thread while the model runs (vLLM overlaps its bitmask with the forward pass too).
        let mut grammars: Vec<(u64, GrammarMatcher)> = scheduled
            .iter()
            .filter(|s| s.sample)
            .filter_map(|s| {
                let g = self.seqs.get_mut(&s.seq_id)?.grammar.take()?;
                Some((s.seq_id, g))
            })
            .collect();
        let runner = &mut self.runner;
        let (logits, masks) = std::thread::scope(|scope| {
            let masking = (!grammars.is_empty()).then(|| {
                scope.spawn(|| {
                    grammars
                        .iter_mut()
                        .map(|(id, g)| (*id, g.compute_mask()))
                        .collect::<Vec<_>>()
                })
            });
            let logits = runner.execute(&batch);
            let masks = masking.map(|h| h.join());
            (logits, masks)
        });
        for (id, g) in grammars {
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.grammar = Some(g);
            }
        }
        let masks: HashMap<u64, Option<TokenMask>> = match masks {
            None => HashMap::new(),
            Some(Ok(m)) => m.into_iter().map(|(id, r)| (id, r.ok())).collect(),
            Some(Err(_)) => {
                return Err(RunnerError::Backend(
                    "the grammar mask thread panicked".into(),
                ))
            }
        };
        let logits = logits?;
        self.check_logits(&scheduled, &logits)?;
        self.metrics.steps += 1;
        let step_tokens: usize = scheduled.iter().map(|s| s.num_tokens).sum();
        self.metrics.iteration_tokens.observe(step_tokens as f64);

        let mut outs = Vec::new();
        for (s, l) in scheduled.iter().zip(&logits) {
            let mask = masks.get(&s.seq_id);
            self.process(s, &l.data, mask, &mut outs);
        }
        self.refresh_gauges();
        let decodes = scheduled.iter().filter(|s| s.decode).count();
        let seconds = started.elapsed().as_secs_f64();
        tracing::trace!(
            target: "aphro_engine::pacer",
            decodes,
            prefill_tokens = step_tokens - decodes,
            ms = seconds * 1e3,
            "step"
        );
        self.pacer.observe(decodes, step_tokens - decodes, seconds);
        Ok(outs)
    }

    fn check_logits(
        &self,
        scheduled: &[Scheduled],
        logits: &[crate::runner::SeqLogits],
    ) -> Result<(), RunnerError> {
        let bad = |m: String| {
            Err(RunnerError::Backend(format!(
                "runner broke the execute contract: {m}"
            )))
        };
        if logits.len() != scheduled.len() {
            return bad(format!(
                "{} logit entries for {} sequences",
                logits.len(),
                scheduled.len()
            ));
        }
        for (s, l) in scheduled.iter().zip(logits) {
            let rows = match s.logits {
                LogitsWanted::None => 0,
                LogitsWanted::Last => 1,
                LogitsWanted::All => s.num_tokens,
            };
            if l.seq_id != s.seq_id || l.rows != rows || l.data.len() != rows * self.vocab_size {
                return bad(format!(
                    "seq {} wanted {rows} rows of {}, got seq {} with {} rows / {} values",
                    s.seq_id,
                    self.vocab_size,
                    l.seq_id,
                    l.rows,
                    l.data.len()
                ));
            }
        }
        Ok(())
    }

    /// `mask`: `Some` for a constrained sequence (`Some(None)` when its grammar failed).
    fn process(
        &mut self,
        s: &Scheduled,
        data: &[f32],
        mask: Option<&Option<TokenMask>>,
        outs: &mut Vec<EngineOutput>,
    ) {
        let vocab = self.vocab_size;
        let Some(seq) = self.seqs.get_mut(&s.seq_id) else {
            return;
        };
        let start = seq.num_computed;
        seq.num_computed += s.num_tokens;
        self.kv
            .commit(&mut seq.blocks, &seq.tokens, seq.num_computed);
        let Some(req) = self.requests.get_mut(&seq.request_id) else {
            return;
        };

        if seq.wants_prompt_logprobs {
            let k = req.plan.prompt_logprobs.unwrap_or(0);
            if let Some(pl) = req.prompt_logprobs.as_mut() {
                for (j, row) in data.chunks_exact(vocab).enumerate() {
                    let target = start + j + 1;
                    if target < req.prompt_len {
                        let tok = seq.tokens[target];
                        pl.push(Some(sampler::position_logprobs(
                            row,
                            tok,
                            k,
                            &mut self.lp_order,
                        )));
                    }
                }
            }
            if seq.num_computed >= req.prompt_len {
                seq.wants_prompt_logprobs = false;
            }
        }
        if !s.sample {
            return;
        }
        let row_start = data.len().saturating_sub(vocab);
        let row = &data[row_start..];

        // n > 1: the prefilled prompt forks into one sequence per choice, sharing blocks.
        let mut members = vec![s.seq_id];
        if !seq.forked {
            seq.forked = true;
            let request_id = seq.request_id.clone();
            let n = req.plan.n;
            for choice in 1..n {
                let seq = &self.seqs[&s.seq_id];
                let child = Seq {
                    request_id: request_id.clone(),
                    choice,
                    forked: true,
                    tokens: seq.tokens.clone(),
                    num_computed: seq.num_computed,
                    blocks: SeqBlocks::default(),
                    rng: SeqRng::from_seed(self.requests[&request_id].choice_seeds[choice]),
                    wants_prompt_logprobs: false,
                    last_token_at: None,
                    grammar: seq.grammar.clone(),
                };
                let id = self.alloc_seq_id();
                let blocks = self.kv.fork(&self.seqs[&s.seq_id].blocks);
                self.seqs.insert(id, Seq { blocks, ..child });
                if let Some(r) = self.requests.get_mut(&request_id) {
                    r.seqs.push(id);
                }
                self.insert_sorted(Queue::Running, id);
                members.push(id);
            }
        }
        for id in members {
            self.sample_and_emit(id, row, mask, outs);
        }
    }

    fn sample_and_emit(
        &mut self,
        seq_id: u64,
        row: &[f32],
        mask: Option<&Option<TokenMask>>,
        outs: &mut Vec<EngineOutput>,
    ) {
        let Some(seq) = self.seqs.get_mut(&seq_id) else {
            return;
        };
        let Some(req) = self.requests.get_mut(&seq.request_id) else {
            return;
        };
        let (prompt, output) = seq.tokens.split_at(req.prompt_len);
        // A grammar in an error state allows only EOS, as llguidance's own fallback does.
        let eos_only = mask.is_some_and(Option::is_none);
        let input = SampleInput {
            plan: &req.plan,
            prompt,
            output,
            grammar_mask: mask.and_then(Option::as_ref),
        };
        let mut sampled = sampler::sample(row, &input, &mut seq.rng, &mut self.scratch);
        if eos_only {
            if let Some(eos) =
                req.plan
                    .eos_token_id
                    .or(req.plan.all_stop_token_ids.first().copied())
            {
                sampled.token_id = eos;
            }
        }
        let tok = sampled.token_id;
        let mut grammar_broke = eos_only;
        if let Some(g) = seq.grammar.as_mut() {
            if !g.is_stopped() && g.consume(tok).is_err() {
                grammar_broke = true;
            }
        }
        seq.tokens.push(tok);
        let mut n_out = seq.output_len(req.prompt_len);
        self.metrics.generation_tokens_total += 1;

        let now = Instant::now();
        if req.first_token_at.is_none() {
            req.first_token_at = Some(now);
            self.metrics
                .time_to_first_token
                .observe((now - req.arrived_at).as_secs_f64());
        }
        if let Some(prev) = seq.last_token_at {
            self.metrics
                .inter_token_latency
                .observe((now - prev).as_secs_f64());
        }
        seq.last_token_at = Some(now);
        req.last_token_at = Some(now);

        // vLLM check_stop order: min_tokens, primary EOS, stop ids, then length.
        let plan = &req.plan;
        let (finish, stop_reason) = if n_out < plan.min_tokens {
            (None, None)
        } else if plan.eos_token_id == Some(tok) {
            (Some(FinishReason::Stop), None)
        } else if plan.stop_token_ids.contains(&tok) {
            (Some(FinishReason::Stop), Some(tok))
        } else if n_out >= plan.max_tokens || seq.tokens.len() >= self.cfg.max_model_len {
            (Some(FinishReason::Length), None)
        } else if grammar_broke {
            (Some(FinishReason::Stop), None)
        } else {
            (None, None)
        };
        // Fast-forward: tokens the grammar forces after this one are appended now and
        // computed together in the next step, instead of one forward pass each. Not where
        // logprobs are asked for (a forced token has no sampled distribution to report) or
        // where other rules could refuse a forced token (bias, allowed ids, bad words).
        let mut token_ids = vec![tok];
        let mut finish = finish;
        let fast_forward = finish.is_none()
            && plan.logprobs.is_none()
            && plan.logit_bias.is_empty()
            && plan.allowed_token_ids.is_none()
            && plan.bad_words_token_ids.is_empty();
        if let Some(g) = seq.grammar.as_mut().filter(|_| fast_forward) {
            let room = plan
                .max_tokens
                .saturating_sub(n_out)
                .min(self.cfg.max_model_len.saturating_sub(seq.tokens.len()));
            match g.consume_forced(room) {
                Ok(forced) => {
                    seq.tokens.extend_from_slice(&forced);
                    n_out += forced.len();
                    self.metrics.generation_tokens_total += forced.len() as u64;
                    self.metrics.grammar_forced_tokens += forced.len() as u64;
                    token_ids.extend(forced);
                    if n_out >= plan.max_tokens || seq.tokens.len() >= self.cfg.max_model_len {
                        finish = Some(FinishReason::Length);
                    }
                }
                Err(_) => finish = Some(FinishReason::Stop),
            }
        }
        let prompt_logprobs = if req.first_output_sent {
            None
        } else {
            req.prompt_logprobs.take()
        };
        req.first_output_sent = true;
        outs.push(EngineOutput {
            request_id: seq.request_id.clone(),
            index: seq.choice,
            token_ids,
            logprobs: sampled.logprobs.map(|l| vec![l]),
            prompt_logprobs,
            finish_reason: finish,
            stop_reason,
            usage: Usage {
                prompt_tokens: req.prompt_len,
                completion_tokens: n_out,
                cached_tokens: req.cached_tokens,
            },
        });
        if let Some(reason) = finish {
            self.finish_seq(seq_id, reason);
        }
    }

    fn finish_seq(&mut self, seq_id: u64, reason: FinishReason) {
        let Some(mut seq) = self.seqs.remove(&seq_id) else {
            return;
        };
        self.kv.free(&mut seq.blocks);
        self.running.retain(|&s| s != seq_id);
        self.waiting.retain(|&s| s != seq_id);
        let done = match self.requests.get_mut(&seq.request_id) {
            Some(req) => {
                let n_out = seq.output_len(req.prompt_len);
                req.generated_total += n_out;
                req.generated_max = req.generated_max.max(n_out);
                req.seqs.retain(|&s| s != seq_id);
                req.unfinished = req.unfinished.saturating_sub(1);
                req.unfinished == 0
            }
            None => false,
        };
        if done {
            if let Some(req) = self.requests.remove(&seq.request_id) {
                self.metrics
                    .e2e_request_latency
                    .observe(req.arrived_at.elapsed().as_secs_f64());
                observe_finished(&mut self.metrics, &req);
                *self
                    .metrics
                    .request_success
                    .entry(reason.as_str())
                    .or_default() += 1;
            }
        }
    }

    fn refresh_gauges(&mut self) {
        let m = &mut self.metrics;
        m.num_running = self.running.len();
        m.num_waiting = self.waiting.len();
        m.kv_cache_usage = self.kv.usage();
        m.kv_blocks_in_use = self.kv.num_in_use();
        m.kv_blocks_cached_free = self.kv.num_cached_free();
        let s = self.kv.prefix_cache_stats();
        m.prefix_cache_queries = s.queries;
        m.prefix_cache_hits = s.hits;
    }
}

/// vLLM's per-request histograms (phase times, token counts, request params).
fn observe_finished(m: &mut MetricsSnapshot, req: &Request) {
    let secs = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
        (Some(a), Some(b)) => Some(b.saturating_duration_since(a).as_secs_f64()),
        _ => None,
    };
    if let Some(t) = secs(req.scheduled_at, req.first_token_at) {
        m.request_prefill_time.observe(t);
    }
    if let Some(t) = secs(req.first_token_at, req.last_token_at) {
        m.request_decode_time.observe(t);
        if req.generated_max > 1 {
            m.request_time_per_output_token
                .observe(t / (req.generated_max - 1) as f64);
        }
    }
    if let Some(t) = secs(req.scheduled_at, req.last_token_at) {
        m.request_inference_time.observe(t);
    }
    m.request_prompt_tokens.observe(req.prompt_len as f64);
    m.request_generation_tokens
        .observe(req.generated_total as f64);
    m.request_max_num_generation_tokens
        .observe(req.generated_max as f64);
    m.request_params_max_tokens
        .observe(req.plan.max_tokens as f64);
    m.request_params_n.observe(req.plan.n as f64);
}

#[derive(Clone, Copy)]
enum Queue {
    Waiting,
    Running,
}

/// Validate a request (prompt + sampling) into a [`SamplingPlan`].
pub fn validate_request(
    req: &EngineRequest,
    eos_token_ids: &[u32],
    limits: &ValidationLimits,
) -> Result<SamplingPlan, ValidationError> {
    if req.prompt_token_ids.is_empty() {
        return Err(ValidationError::EmptyPrompt);
    }
    if let Some(&id) = req
        .prompt_token_ids
        .iter()
        .find(|&&t| t as usize >= limits.vocab_size)
    {
        return Err(ValidationError::PromptTokenOutOfVocab {
            id,
            vocab: limits.vocab_size,
        });
    }
    req.sampling
        .plan(req.prompt_token_ids.len(), eos_token_ids, limits)
}
