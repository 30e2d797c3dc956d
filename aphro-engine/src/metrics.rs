//! Engine counters and latency histograms, kept by the step loop and copied out as a
//! [`MetricsSnapshot`] for `/metrics` (names in `spec/api.md` §9).

use std::collections::BTreeMap;

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

/// A Prometheus-style histogram: `counts[i]` observations `<= bounds[i]` (non-cumulative),
/// plus an overflow bucket at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub bounds: &'static [f64],
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
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
    pub generation_tokens_total: u64,
    /// `vllm:request_success_total{finished_reason}` by "stop" / "length" / "abort".
    pub request_success: BTreeMap<&'static str, u64>,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_request_latency: Histogram,
    pub request_queue_time: Histogram,
    pub steps: u64,
    /// False once a runner error killed the engine (`/health` → 503).
    pub healthy: bool,
}

impl Default for MetricsSnapshot {
    fn default() -> Self {
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
            steps: 0,
            healthy: true,
        }
    }
}
