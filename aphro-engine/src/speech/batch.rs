//! Decoding steps of concurrent transcriptions, run together.
//!
//! Decoding one Whisper token reads every decoder weight and the whole vocabulary
//! projection for one row of arithmetic, so a step is bound by memory traffic. When several
//! requests are inside a window's token loop at once, [`StepBatcher::step`] gathers their
//! next tokens and runs them as one [`WhisperNetwork::step_batch`]: each weight is read
//! once for all of them (on the host network or a burn backend alike).
//!
//! There is no scheduler thread. Each request thread submits its state and token; the first
//! submitter finding no step in progress leads: it waits (at most [`GATHER_WAIT`]) until
//! every transcription inside a token loop has submitted, takes the whole queue, runs it on
//! the transcriber's pool, and hands each state back. Whoever arrives while a step runs is
//! in the next one. A lone transcription runs the unbatched path unchanged, so its output
//! does not depend on whether batching exists.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::model::{BatchScratch, DecoderState, WhisperNetwork};

/// How long a leader waits for the other decoding transcriptions to submit their tokens
/// (they are picking their previous token: well under a millisecond).
pub(crate) const GATHER_WAIT: Duration = Duration::from_millis(2);

struct Entry {
    ticket: u64,
    state: DecoderState,
    token: u32,
}

#[derive(Default)]
struct Queue {
    /// Transcriptions inside a window's token loop: the ones a leader waits for.
    decoding: usize,
    pending: Vec<Entry>,
    done: Vec<(u64, DecoderState)>,
    leading: bool,
    /// Tickets of a step that panicked: their states are gone.
    lost: Vec<u64>,
    next_ticket: u64,
    scratch: BatchScratch,
}

/// Counters of the batched steps (for tests and the benchmark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Decoding steps run (a batch counts once).
    pub steps: usize,
    /// Tokens decoded by those steps.
    pub tokens: usize,
    /// The most tokens one step decoded.
    pub largest: usize,
}

#[derive(Default)]
pub(crate) struct StepBatcher {
    queue: Mutex<Queue>,
    changed: Condvar,
    steps: AtomicUsize,
    tokens: AtomicUsize,
    largest: AtomicUsize,
}

/// Membership in the batch while a transcription is in a window's token loop; dropping it
/// (the loop ended, or unwound) tells waiting leaders not to wait for it.
pub(crate) struct Decoding<'a> {
    batcher: &'a StepBatcher,
}

impl Drop for Decoding<'_> {
    fn drop(&mut self) {
        let mut q = self.batcher.lock();
        q.decoding -= 1;
        drop(q);
        self.batcher.changed.notify_all();
    }
}

impl StepBatcher {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock leaves the queue consistent (every update is a
        // single push/take), so a poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> BatchStats {
        BatchStats {
            steps: self.steps.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
            largest: self.largest.load(Ordering::Relaxed),
        }
    }

    /// Enter a token loop: from now on leaders wait for this transcription's tokens.
    pub fn join(&self) -> Decoding<'_> {
        self.lock().decoding += 1;
        Decoding { batcher: self }
    }

    /// Decode `token` into `state` and leave its logits in `state.logits`, batched with the
    /// other transcriptions' steps. The caller must hold a [`Decoding`] from [`Self::join`].
    pub fn step(
        &self,
        model: &dyn WhisperNetwork,
        pool: &rayon::ThreadPool,
        state: &mut DecoderState,
        token: u32,
    ) {
        let mut q = self.lock();
        if q.decoding <= 1 && q.pending.is_empty() && !q.leading {
            // Alone: the unbatched path, on the pool.
            drop(q);
            pool.install(|| {
                model.decode(state, &[token]);
                model.logits(state, 0);
            });
            self.record(1);
            return;
        }
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.pending.push(Entry {
            ticket,
            state: std::mem::take(state),
            token,
        });
        self.changed.notify_all();
        let deadline = Instant::now() + GATHER_WAIT;
        loop {
            if let Some(i) = q.done.iter().position(|(t, _)| *t == ticket) {
                *state = q.done.swap_remove(i).1;
                return;
            }
            if let Some(i) = q.lost.iter().position(|t| *t == ticket) {
                q.lost.swap_remove(i);
                drop(q);
                panic!("a batched Whisper decoding step panicked");
            }
            let mine_pending = q.pending.iter().any(|e| e.ticket == ticket);
            if q.leading || !mine_pending {
                q = self.changed.wait(q).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let now = Instant::now();
            if q.pending.len() < q.decoding && now < deadline {
                q = self
                    .changed
                    .wait_timeout(q, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            // Lead: run everything queued.
            q.leading = true;
            let batch = std::mem::take(&mut q.pending);
            let mut scratch = std::mem::take(&mut q.scratch);
            drop(q);
            let (tickets, mut states, tokens) = batch.into_iter().fold(
                (Vec::new(), Vec::new(), Vec::new()),
                |(mut t, mut s, mut k), e| {
                    t.push(e.ticket);
                    s.push(e.state);
                    k.push(e.token);
                    (t, s, k)
                },
            );
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.install(|| model.step_batch(&mut states, &tokens, &mut scratch))
            }));
            q = self.lock();
            q.leading = false;
            q.scratch = scratch;
            match ran {
                Ok(()) => {
                    self.record(tickets.len());
                    q.done.extend(tickets.into_iter().zip(states));
                    self.changed.notify_all();
                }
                Err(panic) => {
                    q.lost.extend(tickets.into_iter().filter(|t| *t != ticket));
                    drop(q);
                    self.changed.notify_all();
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }

    fn record(&self, rows: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.tokens.fetch_add(rows, Ordering::Relaxed);
        self.largest.fetch_max(rows, Ordering::Relaxed);
    }
}
