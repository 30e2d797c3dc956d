//! Prometheus metrics under vLLM's names and labels (wire spec §9), so vLLM's routers,
//! autoscalers and Grafana dashboards read aphro unchanged.
//!
//! Gauges that mirror engine state (running/waiting, KV usage) are set from the engine's
//! snapshot at scrape time; counters and histograms are fed as requests finish.
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
    50000.0,
];

pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A point-in-time view of engine state, read at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineGauges {
    pub running: i64,
    pub waiting: i64,
    /// Fraction in [0, 1].
    pub kv_cache_usage: f64,
}

/// What one finished request contributes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestObservation {
    pub finished_reason: String,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub ttft_s: Option<f64>,
    pub inter_token_latencies_s: Vec<f64>,
    pub e2e_s: f64,
    pub queue_s: Option<f64>,
    pub max_tokens: Option<u64>,
    pub n: u64,
}

pub struct Metrics {
    registry: Registry,
    labels: [String; 2],
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    kv_usage: GaugeVec,
    prompt_tokens: IntCounterVec,
    generation_tokens: IntCounterVec,
    success: IntCounterVec,
    preemptions: IntCounterVec,
    prefix_queries: IntCounterVec,
    prefix_hits: IntCounterVec,
    ttft: HistogramVec,
    itl: HistogramVec,
    e2e: HistogramVec,
    queue: HistogramVec,
    prompt_hist: HistogramVec,
    gen_hist: HistogramVec,
    params_n: HistogramVec,
    params_max_tokens: HistogramVec,
    http_requests: IntCounterVec,
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .unwrap_or_else(|e| panic!("static metric {name} is malformed: {e}"));
    // Registration only fails on duplicate names, which would be a programming error here.
    let _ = registry.register(Box::new(h.clone()));
    h
}

macro_rules! metric {
    ($registry:expr, $ty:ty, $name:expr, $help:expr, $labels:expr) => {{
        let m = <$ty>::new(Opts::new($name, $help), $labels)
            .unwrap_or_else(|e| panic!("static metric {} is malformed: {e}", $name));
        let _ = $registry.register(Box::new(m.clone()));
        m
    }};
}

impl Metrics {
    pub fn new(model_name: &str) -> Self {
        let r = Registry::new();
        let base: &[&str] = &["model_name", "engine"];
        let with_reason: &[&str] = &["model_name", "engine", "finished_reason"];
        Metrics {
            running: metric!(
                r,
                IntGaugeVec,
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                base
            ),
            waiting: metric!(
                r,
                IntGaugeVec,
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                base
            ),
            kv_usage: metric!(
                r,
                GaugeVec,
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                base
            ),
            prompt_tokens: metric!(
                r,
                IntCounterVec,
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                base
            ),
            generation_tokens: metric!(
                r,
                IntCounterVec,
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                base
            ),
            success: metric!(
                r,
                IntCounterVec,
                "vllm:request_success_total",
                "Count of successfully processed requests.",
                with_reason
            ),
            preemptions: metric!(
                r,
                IntCounterVec,
                "vllm:num_preemptions_total",
                "Cumulative number of preemptions from the engine.",
                base
            ),
            prefix_queries: metric!(
                r,
                IntCounterVec,
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                base
            ),
            prefix_hits: metric!(
                r,
                IntCounterVec,
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                base
            ),
            ttft: histogram(
                &r,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
                base,
            ),
            itl: histogram(
                &r,
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                ITL_BUCKETS,
                base,
            ),
            e2e: histogram(
                &r,
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                E2E_BUCKETS,
                base,
            ),
            queue: histogram(
                &r,
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                E2E_BUCKETS,
                base,
            ),
            prompt_hist: histogram(
                &r,
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                TOKEN_BUCKETS,
                base,
            ),
            gen_hist: histogram(
                &r,
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                TOKEN_BUCKETS,
                base,
            ),
            params_n: histogram(
                &r,
                "vllm:request_params_n",
                "Histogram of the n request parameter.",
                &[1.0, 2.0, 5.0, 10.0, 20.0],
                base,
            ),
            params_max_tokens: histogram(
                &r,
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
                TOKEN_BUCKETS,
                base,
            ),
            http_requests: metric!(
                r,
                IntCounterVec,
                "http_requests_total",
                "Total number of requests by method, status and handler.",
                &["method", "status", "handler"]
            ),
            labels: [model_name.to_owned(), "0".to_owned()],
            registry: r,
        }
    }

    fn l(&self) -> [&str; 2] {
        [self.labels[0].as_str(), self.labels[1].as_str()]
    }

    pub fn set_engine_gauges(&self, g: EngineGauges) {
        self.running.with_label_values(&self.l()).set(g.running);
        self.waiting.with_label_values(&self.l()).set(g.waiting);
        self.kv_usage
            .with_label_values(&self.l())
            .set(g.kv_cache_usage);
    }

    /// Cumulative engine counters are absolute values; counters only move forward.
    pub fn set_engine_counters(&self, preemptions: u64, prefix_queries: u64, prefix_hits: u64) {
        for (c, v) in [
            (&self.preemptions, preemptions),
            (&self.prefix_queries, prefix_queries),
            (&self.prefix_hits, prefix_hits),
        ] {
            let m = c.with_label_values(&self.l());
            let cur = m.get();
            if v > cur {
                m.inc_by(v - cur);
            }
        }
    }

    pub fn observe_request(&self, o: &RequestObservation) {
        let l = self.l();
        self.prompt_tokens
            .with_label_values(&l)
            .inc_by(o.prompt_tokens);
        self.generation_tokens
            .with_label_values(&l)
            .inc_by(o.generation_tokens);
        self.success
            .with_label_values(&[l[0], l[1], o.finished_reason.as_str()])
            .inc();
        if let Some(t) = o.ttft_s {
            self.ttft.with_label_values(&l).observe(t);
        }
        let itl = self.itl.with_label_values(&l);
        for &t in &o.inter_token_latencies_s {
            itl.observe(t);
        }
        self.e2e.with_label_values(&l).observe(o.e2e_s);
        if let Some(q) = o.queue_s {
            self.queue.with_label_values(&l).observe(q);
        }
        self.prompt_hist
            .with_label_values(&l)
            .observe(o.prompt_tokens as f64);
        self.gen_hist
            .with_label_values(&l)
            .observe(o.generation_tokens as f64);
        self.params_n
            .with_label_values(&l)
            .observe(o.n.max(1) as f64);
        if let Some(m) = o.max_tokens {
            self.params_max_tokens
                .with_label_values(&l)
                .observe(m as f64);
        }
    }

    pub fn observe_http(&self, method: &str, status: u16, handler: &str) {
        self.http_requests
            .with_label_values(&[method, &status.to_string(), handler])
            .inc();
    }

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_names_with_labels() {
        let m = Metrics::new("smollm2");
        m.set_engine_gauges(EngineGauges {
            running: 2,
            waiting: 1,
            kv_cache_usage: 0.25,
        });
        m.observe_request(&RequestObservation {
            finished_reason: "stop".into(),
            prompt_tokens: 10,
            generation_tokens: 5,
            ttft_s: Some(0.03),
            inter_token_latencies_s: vec![0.01, 0.02],
            e2e_s: 0.1,
            n: 1,
            ..Default::default()
        });
        let text = m.render();
        assert!(
            text.contains("vllm:num_requests_running{engine=\"0\",model_name=\"smollm2\"} 2"),
            "{text}"
        );
        assert!(text.contains("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"smollm2\"} 0.25"));
        assert!(text.contains("vllm:prompt_tokens_total{engine=\"0\",model_name=\"smollm2\"} 10"));
        assert!(text.contains("vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"smollm2\"} 1"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"smollm2\",le=\"0.04\"} 1"));
        assert!(text.contains(
            "vllm:inter_token_latency_seconds_count{engine=\"0\",model_name=\"smollm2\"} 2"
        ));
    }

    #[test]
    fn engine_counters_only_move_forward() {
        let m = Metrics::new("x");
        m.set_engine_counters(5, 100, 40);
        m.set_engine_counters(3, 120, 40);
        let text = m.render();
        assert!(text.contains("vllm:num_preemptions_total{engine=\"0\",model_name=\"x\"} 5"));
        assert!(text.contains("vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"x\"} 120"));
    }
}
