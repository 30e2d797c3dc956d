//! A deterministic fake model that reads its "K/V" through the block table.
//!
//! Like a real model's K/V, the value it caches at position `p` depends on the whole prefix:
//! it mixes the token at `p` with the value read (through the block table) at `p - 1`. The
//! logits for `p` hash every cached value at `0..=p`, again read through the block table.
//! Any paging, prefix-cache (including a wrongly chained hash), copy-on-write or preemption
//! bug therefore changes the output, and [`oracle_greedy`] gives the right answer without
//! any of that machinery.
#![allow(dead_code)]

use std::sync::{Arc, Condvar, Mutex};

use aphro_engine::runner::{
    BatchInput, LogitsWanted, ModelInfo, ModelRunner, RunnerError, SeqLogits,
};

pub const VOCAB: usize = 64;

/// Per-step observations, shared with the test.
#[derive(Debug, Default, Clone)]
pub struct RunLog {
    pub steps: usize,
    pub max_tokens_in_step: usize,
    pub max_seqs_in_step: usize,
    pub copies: usize,
    /// Tokens of every step, in order.
    pub step_tokens: Vec<usize>,
}

pub struct FakeRunner {
    info: ModelInfo,
    block_size: usize,
    num_blocks: usize,
    slots: Vec<Option<u64>>,
    pub log: Arc<Mutex<RunLog>>,
    /// Fail `execute` on this step (0-based) to test fatal errors.
    pub fail_at_step: Option<usize>,
    /// When set, every `execute` waits for a permit: lets threaded tests pin down what the
    /// engine does between their calls without sleeping.
    pub gate: Option<Arc<Gate>>,
    /// Each `execute` sleeps `fixed + per_token × tokens`, like a model whose step costs a
    /// weight read plus compute per token (for the wall-clock prefill pacer).
    pub step_cost: Option<(std::time::Duration, std::time::Duration)>,
}

/// Step permits for a gated [`FakeRunner`].
#[derive(Default)]
pub struct Gate {
    permits: Mutex<u64>,
    cv: Condvar,
}

impl Gate {
    pub fn allow(&self, n: u64) {
        let mut p = self.permits.lock().expect("gate");
        *p = p.saturating_add(n);
        self.cv.notify_all();
    }
    pub fn open(&self) {
        self.allow(u64::MAX);
    }
    fn pass(&self) {
        let mut p = self.permits.lock().expect("gate");
        while *p == 0 {
            p = self.cv.wait(p).expect("gate");
        }
        if *p != u64::MAX {
            *p -= 1;
        }
    }
}

/// Opens the gate when dropped, so a failing test never leaves the engine thread blocked.
pub struct OpenOnDrop(pub Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl FakeRunner {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self::with_eos(num_blocks, block_size, vec![VOCAB as u32 - 1])
    }

    pub fn with_eos(num_blocks: usize, block_size: usize, eos: Vec<u32>) -> Self {
        Self {
            info: ModelInfo {
                architecture: "fake".into(),
                vocab_size: VOCAB,
                num_layers: 1,
                num_kv_heads: 1,
                head_dim: 1,
                max_position: 4096,
                eos_token_ids: eos,
                kv_bytes_per_token: 4,
            },
            block_size,
            num_blocks,
            slots: vec![None; num_blocks * block_size],
            log: Arc::new(Mutex::new(RunLog::default())),
            fail_at_step: None,
            gate: None,
            step_cost: None,
        }
    }
}

fn mix(mut x: u64) -> u64 {
    // splitmix64 finalizer
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

const KV_SEED: u64 = 0x1234_5678;
/// What an unwritten slot reads as.
const GARBAGE: u64 = 0xDEAD_BEEF;

/// The "K/V" cached for a token, given the value cached at the previous position.
fn kv_value(prev: u64, token: u32) -> u64 {
    mix(prev ^ (token as u64 + 1))
}

fn logits_from_kv(values: impl Iterator<Item = u64>) -> Vec<f32> {
    let h = values.fold(0x9876_5432u64, |h, v| mix(h ^ v));
    (0..VOCAB as u64)
        .map(|v| ((mix(h ^ (v << 32)) >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0)
        .collect()
}

/// The fake model's logits after reading `tokens` (positions `0..=p`), computed directly.
pub fn logits_for(tokens: &[u32]) -> Vec<f32> {
    let mut prev = KV_SEED;
    logits_from_kv(tokens.iter().map(|&t| {
        prev = kv_value(prev, t);
        prev
    }))
}

/// Greedy continuation computed directly (ties → lowest id), ignoring EOS.
pub fn oracle_greedy(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut toks = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let l = logits_for(&toks);
        let t = argmax(&l);
        toks.push(t);
        out.push(t);
    }
    out
}

pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

impl ModelRunner for FakeRunner {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn execute(&mut self, batch: &BatchInput) -> Result<Vec<SeqLogits>, RunnerError> {
        if let Some(g) = &self.gate {
            g.pass();
        }
        let step = {
            let mut log = self.log.lock().expect("log");
            log.steps += 1;
            log.max_seqs_in_step = log.max_seqs_in_step.max(batch.seqs.len());
            let n: usize = batch.seqs.iter().map(|s| s.token_ids.len()).sum();
            log.max_tokens_in_step = log.max_tokens_in_step.max(n);
            log.step_tokens.push(n);
            if let Some((fixed, per_token)) = self.step_cost {
                std::thread::sleep(fixed + per_token * n as u32);
            }
            log.steps - 1
        };
        if self.fail_at_step == Some(step) {
            return Err(RunnerError::Backend("injected failure".into()));
        }
        let bs = self.block_size;
        let slot = |table: &[u32], p: usize| -> Result<usize, RunnerError> {
            let b = *table.get(p / bs).ok_or(RunnerError::ShortBlockTable {
                positions: p + 1,
                block_size: bs,
            })?;
            if b as usize >= self.num_blocks {
                return Err(RunnerError::BadBlock {
                    block: b,
                    num_blocks: self.num_blocks,
                });
            }
            Ok(b as usize * bs + p % bs)
        };
        if let Some(s) = batch.seqs.iter().find(|s| s.token_ids.is_empty()) {
            return Err(RunnerError::Backend(format!(
                "seq {} has no tokens to run",
                s.seq_id
            )));
        }
        // Write every sequence's K/V first, as a real batched forward would.
        for s in &batch.seqs {
            for (j, &t) in s.token_ids.iter().enumerate() {
                let p = s.start_pos + j;
                let prev = if p == 0 {
                    KV_SEED
                } else {
                    self.slots[slot(&s.block_table, p - 1)?].unwrap_or(GARBAGE)
                };
                let at = slot(&s.block_table, p)?;
                self.slots[at] = Some(kv_value(prev, t));
            }
        }
        let mut out = Vec::with_capacity(batch.seqs.len());
        for s in &batch.seqs {
            let end = s.start_pos + s.token_ids.len();
            let positions: Vec<usize> = match s.logits {
                LogitsWanted::None => vec![],
                LogitsWanted::Last => vec![end - 1],
                LogitsWanted::All => (s.start_pos..end).collect(),
            };
            let mut data = Vec::with_capacity(positions.len() * VOCAB);
            for &p in &positions {
                let mut seen = Vec::with_capacity(p + 1);
                for q in 0..=p {
                    seen.push(self.slots[slot(&s.block_table, q)?].unwrap_or(GARBAGE));
                }
                data.extend(logits_from_kv(seen.into_iter()));
            }
            out.push(SeqLogits {
                seq_id: s.seq_id,
                rows: positions.len(),
                data: data.into(),
            });
        }
        Ok(out)
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), RunnerError> {
        let bs = self.block_size;
        for &(src, dst) in pairs {
            for i in 0..bs {
                self.slots[dst as usize * bs + i] = self.slots[src as usize * bs + i];
            }
        }
        self.log.lock().expect("log").copies += pairs.len();
        Ok(())
    }
}

/// Deterministic pseudo-random numbers for tests.
pub struct TestRng(pub u64);

impl TestRng {
    pub fn next(&mut self) -> u64 {
        self.0 = mix(self.0);
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A prompt of `len` tokens (never the EOS id 63).
pub fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut r = TestRng(seed);
    (0..len)
        .map(|_| (r.next() % (VOCAB as u64 - 1)) as u32)
        .collect()
}
