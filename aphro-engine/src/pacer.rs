//! Prefill pacing: how many prefill tokens one engine step may carry while decodes run.
//!
//! Every step holds all running decodes, so a step's wall time is a running stream's
//! inter-token latency. A long prompt chunked to the whole token budget (2048 tokens) makes
//! that step seconds long on a CPU; the pacer instead sizes the prefill part of a step so the
//! step takes at most `ratio` times a decode-only step. It learns both costs from the steps
//! the engine runs — a decode-only step's seconds and the extra seconds per prefill token —
//! because they depend on the model, the machine, the batch and the context length reached.
//!
//! Without a fresh decode-only measurement (none yet, the decode batch changed size, or many
//! mixed steps since the last one) the pacer asks for one step without prefill (a probe).
//!
//! The allowance is a budget per step, and what a step leaves unspent carries over (up to
//! one token's cost): deep in a long prompt a single token's attention can cost more than a
//! step's allowance (SmolLM2 at 8k context on two cores: about a decode step at 8k), so such
//! a token runs every few steps, with decode-only steps between, and the decodes' *average*
//! step stays within `ratio`, most of their steps at the idle latency. The prompt always
//! progresses: each step adds to the budget.
/// The first paced chunk, before the per-token cost is known: large enough that its cost
/// stands out of a step's timing noise (a one-token step's extra time can read as zero).
pub const MEASURE_TOKENS: usize = 16;
/// A paced chunk is at most this many times the previous one, so one noisy reading (a
/// mixed step that happened to run faster than the decode-only probe) cannot turn into a
/// chunk of the whole budget.
const MAX_GROWTH: usize = 2;
/// Mixed steps between two decode-only probes (decode costs drift as contexts grow).
const PROBE_EVERY: u32 = 64;
/// Weight of the newest observation in the running averages.
const EMA_WEIGHT: f64 = 0.3;

#[derive(Debug, Clone)]
pub struct PrefillPacer {
    /// Allowed step time as a multiple of a decode-only step; `<= 1` turns pacing off.
    ratio: f64,
    /// Seconds of a decode-only step, and how many decodes it carried.
    decode_step: Option<(f64, usize)>,
    /// Extra seconds per prefill token on top of the decode-only step.
    prefill_token_s: Option<f64>,
    /// Prefill tokens of the last mixed step (the growth limit's base).
    last_chunk: usize,
    mixed_since_probe: u32,
    /// Seconds of allowance earlier steps left unspent, at most one prefill token's cost.
    credit_s: f64,
}

fn ema(old: Option<f64>, new: f64) -> f64 {
    match old {
        Some(o) => o + EMA_WEIGHT * (new - o),
        None => new,
    }
}

impl PrefillPacer {
    pub fn new(ratio: f64) -> Self {
        PrefillPacer {
            ratio,
            decode_step: None,
            prefill_token_s: None,
            last_chunk: MEASURE_TOKENS,
            mixed_since_probe: 0,
            credit_s: 0.0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.ratio > 1.0
    }

    /// The most prefill tokens a step with `decodes` decodes may carry; `None`: no limit
    /// (pacing off, or nothing decoding to protect). `Some(0)` asks for a probe step.
    pub fn prefill_cap(&self, decodes: usize) -> Option<usize> {
        if !self.enabled() || decodes == 0 {
            return None;
        }
        let Some((base, measured_with)) = self.decode_step else {
            return Some(0);
        };
        let batch_changed =
            decodes > measured_with.saturating_mul(2) || decodes * 2 < measured_with;
        if batch_changed || self.mixed_since_probe >= PROBE_EVERY {
            return Some(0);
        }
        let Some(per_token) = self.prefill_token_s else {
            return Some(MEASURE_TOKENS);
        };
        let allowed = (self.credit_s + (self.ratio - 1.0) * base) / per_token.max(1e-12);
        let growth = self
            .last_chunk
            .max(MEASURE_TOKENS)
            .saturating_mul(MAX_GROWTH);
        // Zero while the budget builds up to one token: a decode-only step.
        Some((allowed.min(usize::MAX as f64 / 2.0) as usize).min(growth))
    }

    /// Record a finished step: its decode count, prefill tokens and wall seconds.
    pub fn observe(&mut self, decodes: usize, prefill_tokens: usize, seconds: f64) {
        if !self.enabled() || !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        if prefill_tokens == 0 {
            if decodes > 0 {
                let same_batch = self.decode_step.map(|(s, n)| (s, n == decodes));
                // Down at once, up slowly: a step is only ever slowed by the machine (other
                // processes, page faults), so the fastest recent reading is the cost, while a
                // growing context still lifts it over a few probes.
                let base = match same_batch {
                    Some((old, true)) if seconds < old => seconds,
                    Some((old, true)) => ema(Some(old), seconds),
                    _ => seconds,
                };
                self.decode_step = Some((base, decodes));
                self.mixed_since_probe = 0;
                self.carry(0);
            }
            return;
        }
        if decodes > 0 {
            self.mixed_since_probe = self.mixed_since_probe.saturating_add(1);
            self.last_chunk = prefill_tokens;
        }
        // A prefill-only step pays the same weight reads as a decode-only one, so the
        // decode-only time is the fixed part of both.
        if let Some((base, _)) = self.decode_step {
            let extra = (seconds - base).max(0.0) / prefill_tokens as f64;
            self.prefill_token_s = Some(ema(self.prefill_token_s, extra));
        }
        if decodes > 0 {
            self.carry(prefill_tokens);
        }
    }

    /// After a step beside decodes that ran `prefill_tokens`: keep what its allowance left
    /// (none is kept before both costs are known).
    fn carry(&mut self, prefill_tokens: usize) {
        let (Some((base, _)), Some(per_token)) = (self.decode_step, self.prefill_token_s) else {
            return;
        };
        let allowance = (self.ratio - 1.0) * base;
        let spent = prefill_tokens as f64 * per_token;
        self.credit_s = (self.credit_s + allowance - spent).clamp(0.0, per_token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_or_without_decodes_there_is_no_cap() {
        let off = PrefillPacer::new(0.0);
        assert_eq!(off.prefill_cap(4), None);
        let on = PrefillPacer::new(2.0);
        assert_eq!(on.prefill_cap(0), None);
    }

    #[test]
    fn probes_first_then_sizes_chunks_to_the_allowance() {
        let mut p = PrefillPacer::new(2.0);
        // No decode-only measurement yet: a probe step.
        assert_eq!(p.prefill_cap(1), Some(0));
        p.observe(1, 0, 0.010);
        // Decode cost known, prefill cost not: a measuring chunk.
        assert_eq!(p.prefill_cap(1), Some(MEASURE_TOKENS));
        // 16 tokens took 10 ms on top of the 10 ms decode: 0.625 ms per token, so a
        // 10 ms allowance (ratio 2) is 16 tokens.
        p.observe(1, 16, 0.020);
        assert_eq!(p.prefill_cap(1), Some(16));
        // Cheaper tokens (5 µs, e.g. a bigger machine): the chunk grows step by step, at
        // most doubling, toward the 2000-token allowance.
        let mut caps = Vec::new();
        for _ in 0..40 {
            let cap = p.prefill_cap(1).expect("a cap once both costs are known");
            caps.push(cap);
            p.observe(1, cap, 0.010 + cap as f64 * 5e-6);
        }
        assert!(
            caps.windows(2)
                .all(|w| w[1] <= 2 * w[0].max(MEASURE_TOKENS)),
            "{caps:?}"
        );
        let cap = p.prefill_cap(1).expect("a cap");
        assert!((1900..=2100).contains(&cap), "{cap}");
    }

    /// A mixed step that ran faster than the decode-only probe (timing noise) reads as free
    /// prefill tokens; the chunk still only doubles.
    #[test]
    fn a_noisy_reading_does_not_open_the_whole_budget() {
        let mut p = PrefillPacer::new(2.0);
        p.observe(1, 0, 0.010);
        p.observe(1, 16, 0.009);
        assert_eq!(p.prefill_cap(1), Some(2 * MEASURE_TOKENS));
    }

    /// A token that costs more than a step's allowance runs every few steps, with
    /// decode-only steps between: the decodes' average step stays at `ratio` times a
    /// decode-only step, and the prompt still progresses.
    #[test]
    fn expensive_tokens_run_every_few_steps() {
        let mut p = PrefillPacer::new(2.0);
        p.observe(1, 0, 0.010);
        // 16 tokens in 640 ms on top of 10 ms: 40 ms per token, four steps' allowance.
        p.observe(1, 16, 0.650);
        let mut total = 0.0;
        let mut tokens = 0;
        let steps = 40;
        for _ in 0..steps {
            let cap = p.prefill_cap(1).expect("a cap");
            assert!(cap <= 1, "{cap}");
            let secs = 0.010 + cap as f64 * 0.040;
            p.observe(1, cap, secs);
            total += secs;
            tokens += cap;
        }
        // About one token every four steps (the probes every 64 steps aside).
        assert!((8..=11).contains(&tokens), "{tokens}");
        let mean = total / steps as f64;
        assert!(mean <= 0.020 * 1.1, "mean step {mean}");
    }

    /// One slow probe (another process took the cores) moves the decode cost only part of
    /// the way; a fast one resets it.
    #[test]
    fn the_decode_cost_drops_at_once_and_rises_slowly() {
        let mut p = PrefillPacer::new(2.0);
        p.observe(1, 0, 0.010);
        p.observe(1, 0, 0.050);
        let base = p.decode_step.expect("measured").0;
        assert!((0.021..0.023).contains(&base), "{base}");
        p.observe(1, 0, 0.008);
        assert_eq!(p.decode_step.expect("measured").0, 0.008);
    }

    #[test]
    fn reprobes_when_the_decode_batch_changes_or_after_many_mixed_steps() {
        let mut p = PrefillPacer::new(2.0);
        p.observe(2, 0, 0.010);
        p.observe(2, 16, 0.020);
        assert!(p.prefill_cap(2).is_some_and(|cap| cap > 0));
        assert_eq!(p.prefill_cap(8), Some(0));
        for _ in 0..PROBE_EVERY {
            p.observe(2, 16, 0.020);
        }
        assert_eq!(p.prefill_cap(2), Some(0));
        p.observe(2, 0, 0.011);
        assert!(p.prefill_cap(2).is_some_and(|cap| cap > 0));
    }
}
