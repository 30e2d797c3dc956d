//! Prometheus metrics under vLLM's names and labels (`api.md` §9), so vLLM's routers,
//! autoscalers and Grafana dashboards read aphro unchanged.
//!
//! Gauges that mirror engine state (running/waiting, KV usage) are set from the engine's
//! snapshot at scrape time; counters and histograms are fed as requests finish.
use prometheus::{Encoder, IntCounterVec, Opts, Registry, TextEncoder};

pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// HTTP-level counters. Engine metrics are not duplicated here: they are rendered from the
/// engine's own snapshot at scrape time ([`engine_exposition`]), so there is one source of
/// truth and nothing to keep in sync.
pub struct Metrics {
    registry: Registry,
    http_requests: IntCounterVec,
}

impl Metrics {
    pub fn new(_model_name: &str) -> Self {
        let registry = Registry::new();
        let http_requests = IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "Total number of requests by method, status and handler.",
            ),
            &["method", "status", "handler"],
        )
        .unwrap_or_else(|e| panic!("static metric is malformed: {e}"));
        let _ = registry.register(Box::new(http_requests.clone()));
        Metrics {
            registry,
            http_requests,
        }
    }

    /// `method` comes from [`method_label`] and `handler` from the matched route (or
    /// `"none"`), so the label set is closed whatever clients send.
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

/// The `method` label: one of the standard methods, everything else `"other"` (a client can
/// send any token as a method; one label value each would grow `/metrics` without bound).
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

fn labels(engine: usize, model: &str) -> String {
    format!(
        "engine=\"{engine}\",model_name=\"{}\"",
        model.replace('\\', "\\\\").replace('"', "\\\"")
    )
}

/// One histogram family: its HELP/TYPE once, then every engine's series.
fn write_histogram(
    out: &mut String,
    name: &str,
    help: &str,
    series: &[(String, &aphro_engine::metrics::Histogram)],
) {
    use std::fmt::Write;
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (l, h) in series {
        let mut cum = 0u64;
        for (i, b) in h.bounds.iter().enumerate() {
            cum += h.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{l},le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(
            out,
            "{name}_sum{{{l}}} {}\n{name}_count{{{l}}} {}",
            h.sum, h.count
        );
    }
}

/// Prometheus text for the engines' snapshots (index = vLLM's `engine` label, one per
/// data-parallel engine), under vLLM's metric names and labels: each family's HELP/TYPE once,
/// then a series per engine.
pub fn engine_exposition(
    engines: &[aphro_engine::metrics::MetricsSnapshot],
    model: &str,
) -> String {
    use aphro_engine::metrics::{Histogram, MetricsSnapshot};
    use std::fmt::Write;
    let labeled: Vec<(String, &MetricsSnapshot)> = engines
        .iter()
        .enumerate()
        .map(|(i, m)| (labels(i, model), m))
        .collect();
    let mut out = String::new();
    let mut scalar =
        |name: &str, kind: &str, help: &str, value: &dyn Fn(&MetricsSnapshot) -> String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (l, m) in &labeled {
                let _ = writeln!(out, "{name}{{{l}}} {}", value(m));
            }
        };
    scalar(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        &|m| m.num_running.to_string(),
    );
    scalar(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        &|m| m.num_waiting.to_string(),
    );
    scalar(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        &|m| m.kv_cache_usage.to_string(),
    );
    scalar(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        &|m| m.prompt_tokens_total.to_string(),
    );
    scalar(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        &|m| m.generation_tokens_total.to_string(),
    );
    scalar(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemptions from the engine.",
        &|m| m.num_preemptions.to_string(),
    );
    scalar(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        &|m| m.prefix_cache_queries.to_string(),
    );
    scalar(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        &|m| m.prefix_cache_hits.to_string(),
    );
    let _ = writeln!(out, "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter");
    // Every label value exists from the start, at 0, as vLLM creates one child per
    // `FinishReason` up front: a rate() over a reason that has not happened yet still works.
    const FINISH_REASONS: [&str; 5] = ["stop", "length", "abort", "error", "repetition"];
    for (l, m) in &labeled {
        let extra = m
            .request_success
            .keys()
            .filter(|k| !FINISH_REASONS.contains(k))
            .copied();
        for reason in FINISH_REASONS.into_iter().chain(extra) {
            let n = m.request_success.get(reason).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{l},finished_reason=\"{reason}\"}} {n}"
            );
        }
    }
    type Pick = fn(&MetricsSnapshot) -> &Histogram;
    let histograms: [(&str, &str, Pick); 14] = [
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            |m| &m.time_to_first_token,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            |m| &m.inter_token_latency,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            |m| &m.e2e_request_latency,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            |m| &m.request_queue_time,
        ),
        (
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            |m| &m.request_inference_time,
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            |m| &m.request_prefill_time,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            |m| &m.request_decode_time,
        ),
        (
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            |m| &m.request_time_per_output_token,
        ),
        (
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            |m| &m.iteration_tokens,
        ),
        (
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            |m| &m.request_prompt_tokens,
        ),
        (
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            |m| &m.request_generation_tokens,
        ),
        (
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            |m| &m.request_max_num_generation_tokens,
        ),
        (
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            |m| &m.request_params_max_tokens,
        ),
        (
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            |m| &m.request_params_n,
        ),
    ];
    for (name, help, pick) in histograms {
        let series: Vec<(String, &Histogram)> =
            labeled.iter().map(|(l, m)| (l.clone(), pick(m))).collect();
        write_histogram(&mut out, name, help, &series);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use aphro_engine::metrics::MetricsSnapshot;

    #[test]
    fn engine_snapshot_renders_vllm_names_with_labels() {
        let mut m = MetricsSnapshot {
            num_running: 2,
            num_waiting: 1,
            kv_cache_usage: 0.25,
            prompt_tokens_total: 10,
            ..MetricsSnapshot::default()
        };
        m.request_success.insert("stop", 3);
        m.time_to_first_token.observe(0.03);
        m.time_to_first_token.observe(0.5);
        let text = engine_exposition(std::slice::from_ref(&m), "smollm2");
        assert!(
            text.contains("vllm:num_requests_running{engine=\"0\",model_name=\"smollm2\"} 2"),
            "{text}"
        );
        assert!(text.contains("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"smollm2\"} 0.25"));
        assert!(text.contains("vllm:prompt_tokens_total{engine=\"0\",model_name=\"smollm2\"} 10"));
        assert!(text.contains("vllm:request_success_total{engine=\"0\",model_name=\"smollm2\",finished_reason=\"stop\"} 3"));
        for reason in ["length", "abort", "error", "repetition"] {
            assert!(text.contains(&format!(
                "vllm:request_success_total{{engine=\"0\",model_name=\"smollm2\",finished_reason=\"{reason}\"}} 0"
            )));
        }
        // Buckets are cumulative.
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"smollm2\",le=\"0.04\"} 1"), "{text}");
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"smollm2\",le=\"+Inf\"} 2"));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"smollm2\"} 2"
        ));
    }

    /// Two data-parallel engines: one HELP/TYPE per family (a second one is invalid
    /// exposition), a series per engine under its own `engine` label.
    #[test]
    fn each_engine_has_its_series_under_one_family_header() {
        let a = MetricsSnapshot {
            num_running: 1,
            ..MetricsSnapshot::default()
        };
        let b = MetricsSnapshot {
            num_running: 4,
            ..MetricsSnapshot::default()
        };
        let text = engine_exposition(&[a, b], "m");
        assert_eq!(
            text.matches("# TYPE vllm:num_requests_running gauge")
                .count(),
            1
        );
        assert_eq!(
            text.matches("# TYPE vllm:time_to_first_token_seconds histogram")
                .count(),
            1
        );
        assert!(text.contains("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1"));
        assert!(text.contains("vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 4"));
        assert!(text.contains(
            "vllm:request_success_total{engine=\"1\",model_name=\"m\",finished_reason=\"stop\"} 0"
        ));
        assert!(text
            .contains("vllm:e2e_request_latency_seconds_count{engine=\"1\",model_name=\"m\"} 0"));
    }

    #[test]
    fn made_up_methods_share_one_label() {
        use axum::http::Method;
        let m = Metrics::new("x");
        for i in 0..500 {
            let method = Method::from_bytes(format!("M{i}").as_bytes()).expect("token");
            m.observe_http(method_label(&method), 404, "none");
        }
        let text = m.render();
        assert_eq!(text.matches("method=\"other\"").count(), 1, "{text}");
        assert_eq!(method_label(&Method::POST), "POST");
    }

    #[test]
    fn http_counter_renders() {
        let m = Metrics::new("x");
        m.observe_http("POST", 200, "/v1/chat/completions");
        assert!(m.render().contains("http_requests_total{handler=\"/v1/chat/completions\",method=\"POST\",status=\"200\"} 1"));
    }
}
