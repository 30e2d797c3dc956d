//! Loopback load benchmark of the HTTP servers.
//!
//! Starts `aphro launch render` and `aphro serve` in-process (the same `router(...)` the
//! binary serves) on 127.0.0.1 ephemeral ports, then measures with real HTTP clients:
//!
//! * chat render (`POST /v1/chat/completions/render`, a short two-message chat) at
//!   concurrency 1, 8 and 64: requests/s and latency percentiles;
//! * end-to-end streaming chat (`POST /v1/chat/completions`, `stream: true`) with 16
//!   concurrent clients, 64 tokens each: generated tokens/s and time to first chunk.
//!
//! ```text
//! cargo run --release -p aphro-http --example load [-- MODEL] [--requests N] [--chat-rounds R]
//! ```
//!
//! MODEL defaults to the embedded SmolLM2-135M-Instruct. Every request goes to 127.0.0.1;
//! request counts and each phase's duration are bounded.
use anyhow::{bail, Context};
use aphro_http::cli::{launch::LaunchCommand, Cli, Command};
use aphro_http::server::{router, AppState};
use clap::Parser;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// No phase runs longer than this, whatever the request count.
const PHASE_DEADLINE: Duration = Duration::from_secs(60);

struct Options {
    model: String,
    render_requests: usize,
    chat_rounds: usize,
}

fn options() -> anyhow::Result<Options> {
    let mut model = None;
    let mut render_requests = 400;
    let mut chat_rounds = 2;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--requests" => {
                render_requests = it.next().context("--requests N")?.parse()?;
            }
            "--chat-rounds" => {
                chat_rounds = it.next().context("--chat-rounds R")?.parse()?;
            }
            flag if flag.starts_with("--") => bail!("unknown flag {flag}"),
            m => model = Some(m.to_owned()),
        }
    }
    let model = match model {
        Some(m) => m,
        None => aphro_core::default_model::ensure_default_model()?
            .to_string_lossy()
            .into_owned(),
    };
    Ok(Options {
        model,
        render_requests,
        chat_rounds,
    })
}

/// Parses an `aphro` command line and builds the state that subcommand would serve.
fn state_for(argv: &[&str]) -> anyhow::Result<AppState> {
    let cli = Cli::try_parse_from(argv)?;
    match cli.command {
        Command::Launch(LaunchCommand::Render(args)) => {
            aphro_http::cli::launch::build_render_state(args)
        }
        Command::Serve(args) => aphro_http::cli::serve::build_state(args),
        _ => bail!("not a server command: {argv:?}"),
    }
}

fn spawn_server(rt: &tokio::runtime::Runtime, state: AppState) -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let app = router(state);
    rt.spawn(async move {
        match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => {
                if let Err(e) = axum::serve(l, app).await {
                    eprintln!("server on {addr} stopped: {e}");
                }
            }
            Err(e) => eprintln!("listener on {addr}: {e}"),
        }
    });
    Ok(addr)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct RenderResult {
    concurrency: usize,
    requests: usize,
    req_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn render_load(
    addr: SocketAddr,
    body: &Value,
    concurrency: usize,
    total: usize,
) -> anyhow::Result<RenderResult> {
    let url = format!("http://{addr}/v1/chat/completions/render");
    let body = body.to_string();
    let next = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let start = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (url, body, next, latencies) =
                (url.clone(), body.clone(), next.clone(), latencies.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                let agent = ureq::AgentBuilder::new().build();
                while next.fetch_add(1, Ordering::Relaxed) < total
                    && start.elapsed() < PHASE_DEADLINE
                {
                    let t = Instant::now();
                    let resp = agent
                        .post(&url)
                        .set("content-type", "application/json")
                        .send_string(&body)?;
                    let text = resp.into_string()?;
                    if !text.contains("\"token_ids\"") {
                        bail!("unexpected render response: {text}");
                    }
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    latencies
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .push(ms);
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    }
    let wall = start.elapsed().as_secs_f64();
    let mut lat = std::mem::take(&mut *latencies.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    lat.sort_by(f64::total_cmp);
    Ok(RenderResult {
        concurrency,
        requests: lat.len(),
        req_per_s: lat.len() as f64 / wall,
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
    })
}

struct ChatResult {
    requests: usize,
    tokens: u64,
    wall_s: f64,
    ttft_mean_ms: f64,
}

/// One streaming chat; returns (completion tokens, ms to the first chunk).
fn stream_chat(agent: &ureq::Agent, url: &str, body: &str) -> anyhow::Result<(u64, f64)> {
    let t = Instant::now();
    let resp = agent
        .post(url)
        .set("content-type", "application/json")
        .send_string(body)?;
    let mut first = None;
    let mut tokens = None;
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        first.get_or_insert_with(|| t.elapsed().as_secs_f64() * 1e3);
        let v: Value = serde_json::from_str(data)?;
        if v.get("error").is_some() {
            bail!("stream error: {data}");
        }
        if let Some(n) = v
            .pointer("/usage/completion_tokens")
            .and_then(Value::as_u64)
        {
            tokens = Some(n);
        }
    }
    Ok((
        tokens.context("no usage chunk in the stream")?,
        first.context("empty stream")?,
    ))
}

fn chat_load(addr: SocketAddr, concurrency: usize, rounds: usize) -> anyhow::Result<ChatResult> {
    let url = format!("http://{addr}/v1/chat/completions");
    let results = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|i| {
            let (url, results) = (url.clone(), results.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                let agent = ureq::AgentBuilder::new().build();
                for round in 0..rounds {
                    if start.elapsed() >= PHASE_DEADLINE {
                        break;
                    }
                    // Distinct prompts, so the prefix cache does not flatter prefill.
                    let body = json!({
                        "messages": [{"role": "user",
                                      "content": format!("Client {i}, round {round}: tell me a story about a lighthouse.")}],
                        "max_tokens": 64, "ignore_eos": true, "temperature": 0.8, "seed": i * 100 + round,
                        "stream": true, "stream_options": {"include_usage": true}
                    })
                    .to_string();
                    let r = stream_chat(&agent, &url, &body)?;
                    results.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(r);
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    }
    let wall_s = start.elapsed().as_secs_f64();
    let results = results.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let tokens = results.iter().map(|r| r.0).sum();
    let ttft = results.iter().map(|r| r.1).sum::<f64>() / results.len().max(1) as f64;
    Ok(ChatResult {
        requests: results.len(),
        tokens,
        wall_s,
        ttft_mean_ms: ttft,
    })
}

fn main() -> anyhow::Result<()> {
    let opts = options()?;
    let model = opts.model.as_str();
    eprintln!("model: {model}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let render = spawn_server(
        &rt,
        state_for(&[
            "aphro",
            "launch",
            "render",
            model,
            "--served-model-name",
            "m",
        ])?,
    )?;
    let full = spawn_server(
        &rt,
        state_for(&["aphro", "serve", model, "--served-model-name", "m"])?,
    )?;

    let chat = json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of France, and what river runs through it?"}
        ],
        "max_tokens": 64
    });
    // Warm-up: first-touch allocations, connection setup.
    render_load(render, &chat, 4, 40)?;

    let mut render_rows = Vec::new();
    for c in [1, 8, 64] {
        render_rows.push(render_load(render, &chat, c, opts.render_requests)?);
    }
    chat_load(full, 2, 1)?;
    let chat = chat_load(full, 16, opts.chat_rounds)?;

    println!("| benchmark | concurrency | requests | req/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &render_rows {
        println!(
            "| chat render | {} | {} | {:.0} | {:.2} | {:.2} |",
            r.concurrency, r.requests, r.req_per_s, r.p50_ms, r.p99_ms
        );
    }
    println!();
    println!("| benchmark | concurrency | requests | generated tokens | tokens/s | mean time to first chunk ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "| streaming chat, 64 tokens each | 16 | {} | {} | {:.1} | {:.0} |",
        chat.requests,
        chat.tokens,
        chat.tokens as f64 / chat.wall_s,
        chat.ttft_mean_ms
    );
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
