//! Engine counters and latency histograms, kept by the step loop and copied out as a
//! [`MetricsSnapshot`] for `/metrics` (names in `docs/spec/api.md` §9).

use std::collections::BTreeMap;
use std::sync::Arc;

/// vLLM `vllm:time_to_first_token_seconds` buckets.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM `vllm:inter_token_latency_seconds` buckets.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM e2e / phase buckets (`vllm:e2e_request_latency_seconds`, queue time, ...).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM `vllm:iteration_tokens_total` buckets (tokens scheduled in one engine step).
pub const ITERATION_TOKENS_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// vLLM `vllm:request_params_n` buckets.
pub const PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// `max_model_len` the token-count buckets assume when the engine has not said.
pub const DEFAULT_TOKEN_BUCKETS_MAX: usize = 8192;

/// vLLM's `build_1_2_5_buckets(max)`: 1, 2, 5, 10, 20, 50, ... up to `max` (token-count
/// histograms: prompt/generation tokens, `max_tokens`).
pub fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut exponent = 1usize;
    'outer: loop {
        for m in [1, 2, 5] {
            let v = m * exponent;
            if v > max {
                break 'outer;
            }
            out.push(v as f64);
        }
        exponent = match exponent.checked_mul(10) {
            Some(e) => e,
            None => break,
        };
    }
    out
}

/// A Prometheus-style histogram: `counts[i]` observations `<= bounds[i]` (non-cumulative),
/// plus an overflow bucket at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Shared, so the per-step snapshot copy does not reallocate them.
    pub bounds: Arc<[f64]>,
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self::with_bounds(bounds.to_vec())
    }

    pub fn with_bounds(bounds: Vec<f64>) -> Self {
        Self {
            counts: vec![0; bounds.len() + 1],
            bounds: bounds.into(),
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// Cumulative counts per bound, as Prometheus `_bucket{le=...}` wants them.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        self.bounds
            .iter()
            .chain(std::iter::once(&f64::INFINITY))
            .zip(&self.counts)
            .map(|(&b, &c)| {
                acc += c;
                (b, acc)
            })
            .collect()
    }
}

/// Everything `/metrics` needs from the engine, copied after every step.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSnapshot {
    /// `vllm:num_requests_running` (sequences being stepped).
    pub num_running: usize,
    /// `vllm:num_requests_waiting` (sequences queued, including preempted ones).
    pub num_waiting: usize,
    /// `vllm:kv_cache_usage_perc`, 0..1.
    pub kv_cache_usage: f64,
    pub kv_blocks_total: usize,
    /// Blocks referenced by a sequence (excludes free blocks that still hold a cached prefix).
    pub kv_blocks_in_use: usize,
    pub kv_blocks_cached_free: usize,
    /// `vllm:prefix_cache_queries_total` / `_hits_total`, in tokens.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    pub prompt_tokens_total: u64,
    /// Tokens sampled, as the core counts them; `Engine`'s snapshots report the tokens its
    /// streams delivered instead (vLLM's frontend count: nothing past a stop string).
    pub generation_tokens_total: u64,
    /// `vllm:request_success_total{finished_reason}` by "stop" / "length" / "abort".
    pub request_success: BTreeMap<&'static str, u64>,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_request_latency: Histogram,
    pub request_queue_time: Histogram,
    /// `vllm:request_prefill_time_seconds`: first scheduled → first token.
    pub request_prefill_time: Histogram,
    /// `vllm:request_decode_time_seconds`: first token → last token.
    pub request_decode_time: Histogram,
    /// `vllm:request_inference_time_seconds`: first scheduled → last token.
    pub request_inference_time: Histogram,
    /// `vllm:request_time_per_output_token_seconds`: decode time / (generated tokens - 1).
    pub request_time_per_output_token: Histogram,
    /// `vllm:iteration_tokens_total`: tokens (prefill + decode) computed per engine step.
    pub iteration_tokens: Histogram,
    /// `vllm:request_prompt_tokens` per finished request.
    pub request_prompt_tokens: Histogram,
    /// `vllm:request_generation_tokens`: tokens generated over all choices of a request.
    pub request_generation_tokens: Histogram,
    /// `vllm:request_max_num_generation_tokens`: the longest choice of a request.
    pub request_max_num_generation_tokens: Histogram,
    /// `vllm:request_params_max_tokens`.
    pub request_params_max_tokens: Histogram,
    /// `vllm:request_params_n`.
    pub request_params_n: Histogram,
    pub steps: u64,
    /// Output tokens a grammar forced and the engine appended without sampling them.
    pub grammar_forced_tokens: u64,
    /// False once a runner error killed the engine (`/health` → 503).
    pub healthy: bool,
}

impl Default for MetricsSnapshot {
    fn default() -> Self {
        Self::with_max_model_len(DEFAULT_TOKEN_BUCKETS_MAX)
    }
}

impl MetricsSnapshot {
    /// Token-count histograms get vLLM's 1-2-5 buckets up to `max_model_len`.
    pub fn with_max_model_len(max_model_len: usize) -> Self {
        let tokens = || Histogram::with_bounds(buckets_1_2_5(max_model_len));
        Self {
            num_running: 0,
            num_waiting: 0,
            kv_cache_usage: 0.0,
            kv_blocks_total: 0,
            kv_blocks_in_use: 0,
            kv_blocks_cached_free: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            num_preemptions: 0,
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
            request_success: BTreeMap::new(),
            time_to_first_token: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(ITL_BUCKETS),
            e2e_request_latency: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_prefill_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_decode_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_inference_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_time_per_output_token: Histogram::new(ITL_BUCKETS),
            iteration_tokens: Histogram::new(ITERATION_TOKENS_BUCKETS),
            request_prompt_tokens: tokens(),
            request_generation_tokens: tokens(),
            request_max_num_generation_tokens: tokens(),
            request_params_max_tokens: tokens(),
            request_params_n: Histogram::new(PARAMS_N_BUCKETS),
            steps: 0,
            grammar_forced_tokens: 0,
            healthy: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five_buckets_match_vllm() {
        assert_eq!(
            buckets_1_2_5(100),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(buckets_1_2_5(4096).last(), Some(&2000.0));
        assert!(buckets_1_2_5(0).is_empty());
        let m = MetricsSnapshot::with_max_model_len(8192);
        assert_eq!(m.request_prompt_tokens.bounds.last(), Some(&5000.0));
        assert_eq!(m.request_params_n.counts.len(), PARAMS_N_BUCKETS.len() + 1);
    }
}
