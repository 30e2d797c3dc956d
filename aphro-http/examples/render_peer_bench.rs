//! Side-by-side chat-render load: the same request bodies against two or more render servers
//! (`aphro launch render` and `vllm-rs render`, say) over loopback.
//!
//! `scripts/bench_render.sh` starts the servers and calls this once per model; run by hand:
//!
//! ```text
//! cargo run --release -p aphro-http --example render_peer_bench -- \
//!     --target aphro=http://127.0.0.1:8001 --target vllm-rs=http://127.0.0.1:8002 \
//!     --model MODEL_NAME --family qwen3 [--sizes 2000,9000] [--concurrency 1,8,64] \
//!     [--duration 3] [--tools both|yes|no] [--modes fresh-turn,distinct] \
//!     [--endpoints render,tokenize] [--reference NAME=URL]
//! ```
//!
//! Every request is new to the servers: the body has a nonce (a counter) either in the last
//! user turn only (`fresh-turn`: shared history, new question, the common multi-turn shape) or
//! in every message (`distinct`: nothing repeats, not even a system prompt), so no cache of
//! whole requests or of earlier turns' text can answer it. The conversation's length is sized
//! against the first target's token counts to about each `--sizes` value. Before timing, a few
//! nonces go to every target and their `token_ids` are compared with the first target's.
//!
//! Prints one JSON object per (scenario, concurrency, target) on stdout; the script turns
//! them into the README table.
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Marks where each request's nonce goes in a body template.
const NONCE: &str = "@@NONCE@@";
/// Requests per scenario whose `token_ids` are compared across the targets.
const ID_CHECKS: u64 = 4;

struct Options {
    targets: Vec<(String, String)>,
    /// A server whose chat render ids every target's answers are checked against, without
    /// measuring it (for a route the peer does not have, e.g. vllm-rs has no `/tokenize`).
    reference: Option<(String, String)>,
    model: String,
    family: String,
    sizes: Vec<usize>,
    concurrency: Vec<usize>,
    duration: Duration,
    tools: Vec<bool>,
    modes: Vec<Mode>,
    endpoints: Vec<Endpoint>,
}

/// The route under test: chat render (`token_ids` in a `GenerateRequest`) or chat
/// `/tokenize` (`tokens`), which run the same template and encoder.
#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Render,
    Tokenize,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Endpoint::Render => "render",
            Endpoint::Tokenize => "tokenize",
        }
    }

    fn url(self, base: &str) -> String {
        match self {
            Endpoint::Render => format!("{base}/v1/chat/completions/render"),
            Endpoint::Tokenize => format!("{base}/tokenize"),
        }
    }

    /// The response key holding the ids.
    fn ids_key(self) -> &'static str {
        match self {
            Endpoint::Render => "token_ids",
            Endpoint::Tokenize => "tokens",
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    FreshTurn,
    Distinct,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::FreshTurn => "fresh-turn",
            Mode::Distinct => "distinct",
        }
    }
}

fn list<T: std::str::FromStr>(s: &str) -> anyhow::Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|e| anyhow::anyhow!("{x}: {e}"))
        })
        .collect()
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        targets: vec![],
        reference: None,
        model: String::new(),
        family: "generic".into(),
        sizes: vec![2000, 9000],
        concurrency: vec![1, 8, 64],
        duration: Duration::from_secs(3),
        tools: vec![false, true],
        modes: vec![Mode::FreshTurn, Mode::Distinct],
        endpoints: vec![Endpoint::Render],
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--target" => {
                let v = val()?;
                let (name, url) = v.split_once('=').context("--target NAME=URL")?;
                o.targets
                    .push((name.to_owned(), url.trim_end_matches('/').to_owned()));
            }
            "--reference" => {
                let v = val()?;
                let (name, url) = v.split_once('=').context("--reference NAME=URL")?;
                o.reference = Some((name.to_owned(), url.trim_end_matches('/').to_owned()));
            }
            "--model" => o.model = val()?,
            "--family" => o.family = val()?,
            "--sizes" => o.sizes = list(&val()?)?,
            "--concurrency" => o.concurrency = list(&val()?)?,
            "--duration" => o.duration = Duration::from_secs_f64(val()?.parse()?),
            "--tools" => {
                o.tools = match val()?.as_str() {
                    "both" => vec![false, true],
                    "yes" => vec![true],
                    "no" => vec![false],
                    other => bail!("--tools both|yes|no, not {other}"),
                }
            }
            "--modes" => {
                o.modes = val()?
                    .split(',')
                    .map(|m| match m {
                        "fresh-turn" => Ok(Mode::FreshTurn),
                        "distinct" => Ok(Mode::Distinct),
                        other => bail!("unknown mode {other}"),
                    })
                    .collect::<anyhow::Result<_>>()?
            }
            "--endpoints" => {
                o.endpoints = val()?
                    .split(',')
                    .map(|e| match e {
                        "render" => Ok(Endpoint::Render),
                        "tokenize" => Ok(Endpoint::Tokenize),
                        other => bail!("unknown endpoint {other}"),
                    })
                    .collect::<anyhow::Result<_>>()?
            }
            other => bail!("unknown argument {other}"),
        }
    }
    if o.targets.is_empty() || o.model.is_empty() {
        bail!("need --model and at least one --target NAME=URL");
    }
    Ok(o)
}

/// Eight tools of the shapes agents offer (nested objects, enums, arrays, descriptions).
fn tools() -> Value {
    let t = |name: &str, desc: &str, props: Value, req: &[&str]| {
        json!({"type": "function", "function": {"name": name, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": req}}})
    };
    json!([
        t(
            "get_weather",
            "Get the current weather for a city.",
            json!({"city": {"type": "string", "description": "City name"},
                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}),
            &["city"]
        ),
        t(
            "search_web",
            "Search the web and return the top results.",
            json!({"query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}}),
            &["query"]
        ),
        t(
            "read_file",
            "Read a file from the workspace and return its text.",
            json!({"path": {"type": "string", "description": "Path relative to the workspace root"},
                 "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}),
            &["path"]
        ),
        t(
            "write_file",
            "Write text to a file, creating parent folders.",
            json!({"path": {"type": "string"}, "content": {"type": "string"}, "append": {"type": "boolean"}}),
            &["path", "content"]
        ),
        t(
            "run_command",
            "Run a shell command and return its output and exit status.",
            json!({"command": {"type": "string"}, "timeout_s": {"type": "number"},
                 "env": {"type": "object", "additionalProperties": {"type": "string"}}}),
            &["command"]
        ),
        t(
            "send_email",
            "Send an email on the user's behalf.",
            json!({"to": {"type": "array", "items": {"type": "string", "format": "email"}},
                 "subject": {"type": "string"}, "body": {"type": "string"},
                 "priority": {"type": "string", "enum": ["low", "normal", "high"]}}),
            &["to", "subject", "body"]
        ),
        t(
            "create_event",
            "Create a calendar event.",
            json!({"title": {"type": "string"}, "start": {"type": "string", "format": "date-time"},
                 "duration_minutes": {"type": "integer"},
                 "attendees": {"type": "array", "items": {"type": "object", "properties": {
                     "name": {"type": "string"}, "email": {"type": "string"}}}}}),
            &["title", "start"]
        ),
        t(
            "query_database",
            "Run a read-only SQL query against the analytics database.",
            json!({"sql": {"type": "string"}, "limit": {"type": "integer", "default": 100},
                 "params": {"type": "array", "items": {"type": ["string", "number", "null"]}}}),
            &["sql"]
        ),
    ])
}

/// A chat body template with `rounds` user/assistant exchanges. `tag` is put at the start of
/// every message (`distinct`) or is empty; the last user turn always carries the nonce.
fn chat_body(model: &str, rounds: usize, with_tools: bool, mode: Mode) -> String {
    let tag = if mode == Mode::Distinct {
        format!("[{NONCE}] ")
    } else {
        String::new()
    };
    let mut messages = vec![json!({"role": "system", "content": format!(
        "{tag}You are a careful assistant for a logistics company. Answer precisely, show your \
         reasoning briefly, and prefer tables when comparing options.")})];
    for i in 0..rounds {
        messages.push(json!({"role": "user", "content": format!(
            "{tag}Shipment {i} left warehouse {} on day {} with {} pallets of item SKU-{:05}. \
             The customer in region {} asks whether it can arrive before the weekend, and what \
             happens if the truck is delayed by {} hours at the border crossing.",
            i % 7, i % 30 + 1, 3 + i % 11, 1000 + i * 37, i % 5, 2 + i % 9)}));
        messages.push(json!({"role": "assistant", "content": format!(
            "{tag}For shipment {i}: the planned transit is {} days, so it arrives on day {} if \
             nothing slips. A {}-hour border delay moves it to day {}; the weekend cutoff is \
             {}. I would notify the customer in region {} and book the early slot at the \
             receiving dock to keep the margin.",
            2 + i % 4, i % 30 + 3 + i % 4, 2 + i % 9, i % 30 + 4 + i % 4,
            if i % 3 == 0 { "at risk" } else { "still met" }, i % 5)}));
    }
    messages.push(json!({"role": "user", "content": format!(
        "Request {NONCE}: summarize the open risks across all shipments above in three bullet points.")}));
    let mut body = json!({"model": model, "messages": messages, "max_tokens": 256});
    if with_tools {
        body["tools"] = tools();
    }
    body.to_string()
}

fn post(agent: &ureq::Agent, url: &str, body: &str) -> anyhow::Result<String> {
    let resp = agent
        .post(url)
        .set("content-type", "application/json")
        .send_string(body);
    match resp {
        Ok(r) => Ok(r.into_string()?),
        Err(ureq::Error::Status(code, r)) => {
            bail!(
                "{url}: HTTP {code}: {}",
                r.into_string().unwrap_or_default()
            )
        }
        Err(e) => Err(e.into()),
    }
}

fn token_ids(text: &str, key: &str) -> anyhow::Result<Vec<u64>> {
    let v: Value = serde_json::from_str(text)?;
    let ids = v
        .get(key)
        .and_then(Value::as_array)
        .with_context(|| format!("no {key} in {}", &text[..text.len().min(300)]))?;
    Ok(ids.iter().filter_map(Value::as_u64).collect())
}

/// The body for request `n`: every nonce marker replaced by a number no other request has.
fn instantiate(template: &str, n: u64) -> String {
    template.replace(NONCE, &format!("{n:08}"))
}

/// Rounds of history that bring the rendered prompt to about `target` tokens, measured on
/// the first server (two probes: the cost of the fixed part and of one round).
fn rounds_for(o: &Options, with_tools: bool, mode: Mode, target: usize) -> anyhow::Result<usize> {
    let agent = ureq::AgentBuilder::new().build();
    let url = Endpoint::Render.url(&o.targets[0].1);
    let len = |rounds| -> anyhow::Result<usize> {
        let body = instantiate(&chat_body(&o.model, rounds, with_tools, mode), 0);
        Ok(token_ids(&post(&agent, &url, &body)?, "token_ids")?.len())
    };
    let (a, b) = (len(1)?, len(11)?);
    let per_round = ((b - a) / 10).max(1);
    Ok((target.saturating_sub(a) / per_round + 1).max(1))
}

struct Measured {
    requests: usize,
    errors: usize,
    req_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

/// `concurrency` closed-loop clients for `duration` (after a short warm-up), each sending
/// the next unused nonce.
fn measure(
    url: &str,
    ids_key: &'static str,
    template: &Arc<String>,
    nonce: &Arc<AtomicU64>,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<Measured> {
    let warmup = Duration::from_millis(300);
    let stop = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let start = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (url, template, nonce, stop) = (
                url.to_owned(),
                template.clone(),
                nonce.clone(),
                stop.clone(),
            );
            let (latencies, errors, first_error) =
                (latencies.clone(), errors.clone(), first_error.clone());
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new().build();
                let marker = format!("\"{ids_key}\"");
                let mut mine = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let body = instantiate(&template, nonce.fetch_add(1, Ordering::Relaxed));
                    let t = Instant::now();
                    let r = post(&agent, &url, &body);
                    let done = Instant::now();
                    match r {
                        Ok(text) if text.contains(&marker) => {
                            if t >= start + warmup && !stop.load(Ordering::Relaxed) {
                                mine.push((done - t).as_secs_f64() * 1e3);
                            }
                        }
                        other => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            let msg = match other {
                                Ok(text) => format!("no {ids_key}: {text}"),
                                Err(e) => e.to_string(),
                            };
                            if let Ok(mut f) = first_error.lock() {
                                f.get_or_insert(msg);
                            }
                        }
                    }
                }
                if let Ok(mut l) = latencies.lock() {
                    l.extend(mine);
                }
            })
        })
        .collect();
    std::thread::sleep(warmup + duration);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))?;
    }
    let mut lat = std::mem::take(&mut *latencies.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    lat.sort_by(f64::total_cmp);
    let errors = errors.load(Ordering::Relaxed) as usize;
    if errors > 0 {
        let first = first_error.lock().ok().and_then(|f| f.clone());
        eprintln!(
            "{url}: {errors} failed requests, first: {}",
            first.unwrap_or_default()
        );
    }
    Ok(Measured {
        requests: lat.len(),
        errors,
        req_per_s: lat.len() as f64 / duration.as_secs_f64(),
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
    })
}

fn main() -> anyhow::Result<()> {
    let o = options()?;
    // Nonces never repeat across scenarios or targets: one counter for the whole run.
    let nonce = Arc::new(AtomicU64::new(1));
    for &mode in &o.modes {
        for &with_tools in &o.tools {
            for &size in &o.sizes {
                let rounds = rounds_for(&o, with_tools, mode, size)?;
                let template = Arc::new(chat_body(&o.model, rounds, with_tools, mode));
                for &endpoint in &o.endpoints {
                    // Equal ids on every target, for several fresh nonces.
                    let agent = ureq::AgentBuilder::new().build();
                    let key = endpoint.ids_key();
                    let mut tokens = 0;
                    let mut ids_equal = true;
                    // The reference: `--reference`'s render ids, else the first target's
                    // answer on this route.
                    let (ref_name, ref_url, ref_endpoint, checked) = match &o.reference {
                        Some((name, url)) => (name, url, Endpoint::Render, &o.targets[..]),
                        None => (&o.targets[0].0, &o.targets[0].1, endpoint, &o.targets[1..]),
                    };
                    for _ in 0..ID_CHECKS {
                        let body = instantiate(&template, nonce.fetch_add(1, Ordering::Relaxed));
                        let reference = token_ids(
                            &post(&agent, &ref_endpoint.url(ref_url), &body)?,
                            ref_endpoint.ids_key(),
                        )?;
                        tokens = reference.len();
                        for (name, url) in checked {
                            let ids = token_ids(&post(&agent, &endpoint.url(url), &body)?, key)?;
                            if ids != reference {
                                ids_equal = false;
                                let at = ids.iter().zip(&reference).position(|(a, b)| a != b);
                                eprintln!(
                                    "{name}: {key} differ from {ref_name}'s ({} vs {} ids, first difference at {at:?})",
                                    ids.len(),
                                    reference.len()
                                );
                            }
                        }
                    }
                    for &c in &o.concurrency {
                        for (name, url) in &o.targets {
                            let m =
                                measure(&endpoint.url(url), key, &template, &nonce, c, o.duration)?;
                            println!(
                                "{}",
                                json!({
                                    "family": o.family, "endpoint": endpoint.name(),
                                    "tools": with_tools, "mode": mode.name(),
                                    "size": size, "tokens": tokens, "concurrency": c,
                                    "target": name, "requests": m.requests, "errors": m.errors,
                                    "req_per_s": m.req_per_s, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms,
                                    "ids_equal": ids_equal,
                                })
                            );
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
