//! Dynamic batching of concurrent pooling calls: every call's sequences join one queue, and
//! whichever caller finds no forward pass running becomes the leader. It drains the queue up
//! to a token budget, runs one forward over all the calls it took (the encoder batches
//! sequences of different lengths with a key mask, so a result does not depend on its
//! batch), hands every call its hidden states, and repeats until the queue is empty. Like the
//! decoder's scheduler, but without KV: a pooling call is one forward and leaves nothing behind.
//!
//! No thread of its own: the callers (the server's blocking pool) take turns as the leader.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;

use super::bert::{EncoderInput, HiddenStates};
use super::PoolingError;

/// Tokens one drained batch may hold (the sum over its sequences; the forward pass splits it
/// further by its own padded budget).
pub const DEFAULT_TOKEN_BUDGET: usize = 8192;

type Reply = mpsc::Sender<Result<HiddenStates, String>>;

struct Job {
    seqs: Vec<EncoderInput>,
    tokens: usize,
    reply: Reply,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    leading: bool,
}

/// The queue and its counters.
pub struct Batcher {
    queue: Mutex<Queue>,
    token_budget: usize,
    calls: AtomicU64,
    forwards: AtomicU64,
}

/// How many calls were submitted and how many batched forwards served them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchStats {
    pub calls: u64,
    pub forwards: u64,
}

impl Batcher {
    pub fn new(token_budget: usize) -> Self {
        Batcher {
            queue: Mutex::new(Queue::default()),
            token_budget: token_budget.max(1),
            calls: AtomicU64::new(0),
            forwards: AtomicU64::new(0),
        }
    }

    pub fn stats(&self) -> BatchStats {
        BatchStats {
            calls: self.calls.load(Ordering::Relaxed),
            forwards: self.forwards.load(Ordering::Relaxed),
        }
    }

    /// The hidden states of `seqs` (in order), computed by `forward` in one batch with the
    /// other calls queued at the same time.
    pub fn submit<F>(
        &self,
        seqs: Vec<EncoderInput>,
        forward: F,
    ) -> Result<HiddenStates, PoolingError>
    where
        F: Fn(Vec<EncoderInput>) -> Result<HiddenStates, PoolingError>,
    {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        let tokens = seqs.iter().map(|s| s.token_ids.len()).sum();
        let lead = {
            let mut q = self.lock();
            q.jobs.push_back(Job {
                seqs,
                tokens,
                reply: tx,
            });
            !std::mem::replace(&mut q.leading, true)
        };
        if lead {
            self.lead(&forward);
        }
        rx.recv()
            .map_err(|_| PoolingError::Backend("the batch leader stopped".into()))?
            .map_err(PoolingError::Backend)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs batches until the queue is empty, then gives up the lead.
    fn lead<F>(&self, forward: &F)
    where
        F: Fn(Vec<EncoderInput>) -> Result<HiddenStates, PoolingError>,
    {
        loop {
            let jobs: Vec<Job> = {
                let mut q = self.lock();
                let mut taken = Vec::new();
                let mut tokens = 0;
                while let Some(j) = q.jobs.front() {
                    if !taken.is_empty() && tokens + j.tokens > self.token_budget {
                        break;
                    }
                    tokens += j.tokens;
                    taken.extend(q.jobs.pop_front());
                }
                if taken.is_empty() {
                    q.leading = false;
                    return;
                }
                taken
            };
            self.forwards.fetch_add(1, Ordering::Relaxed);
            let mut all = Vec::new();
            let mut replies = Vec::with_capacity(jobs.len());
            for j in jobs {
                replies.push((j.seqs.len(), j.reply));
                all.extend(j.seqs);
            }
            // A panicking forward must not leave the queue without a leader.
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| forward(all)))
                .unwrap_or_else(|_| Err(PoolingError::Backend("forward pass panicked".into())));
            match out {
                Ok(hidden) => {
                    let mut rest = hidden.into_iter();
                    for (n, reply) in replies {
                        let _ = reply.send(Ok(rest.by_ref().take(n).collect()));
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    for (_, reply) in replies {
                        let _ = reply.send(Err(msg.clone()));
                    }
                }
            }
        }
    }
}
