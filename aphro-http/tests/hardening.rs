//! Hostile and heavy traffic against the real binary on loopback: stalled and surplus
//! connections, oversized and malformed bodies, made-up methods, forged log lines, and a
//! SIGTERM in the middle of streams.
mod common;

use common::{assets, json, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn gguf() -> String {
    assets()
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        .to_string_lossy()
        .into_owned()
}

/// Read until the server closes the socket (or `within` passes); what it sent.
fn read_until_closed(sock: &mut TcpStream, within: Duration) -> Option<String> {
    sock.set_read_timeout(Some(within)).expect("timeout");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&out).into_owned()),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            // A reset is a close too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(String::from_utf8_lossy(&out).into_owned())
            }
            Err(_) if Instant::now() >= deadline => return None,
            Err(_) => {}
        }
    }
}

fn timed_health(s: &Server) -> Duration {
    let t = Instant::now();
    let (status, _) = s.get("/health", &[]);
    assert_eq!(status, 200);
    t.elapsed()
}

/// The series lines of `/metrics` (names and labels, without values).
fn metric_series(s: &Server) -> Vec<String> {
    let (_, text) = s.get("/metrics", &[]);
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').map(|(k, _)| k.to_owned()))
        .collect()
}

#[test]
fn render_server_survives_stalled_surplus_and_malformed_clients() {
    let model = gguf();
    let s = Server::start(&[
        "launch",
        "render",
        &model,
        // Longer than the surplus check below takes on a loaded machine: with 1 s, the 64
        // idle sockets could time out before the 65th connected, and it was then served
        // (and closed idle) instead of refused.
        "--timeout-keep-alive",
        "3",
        "--request-body-timeout",
        "2",
        "--max-connections",
        "64",
        "--max-request-body-bytes",
        "2000000",
    ]);
    let addr = s.addr();

    // One body limit on every route family of the role, answered with the JSON envelope.
    let big = json!({"prompt": "x".repeat(2_100_000)});
    for path in [
        "/tokenize",
        "/v1/completions/render",
        "/v1/chat/completions/render",
        "/v1/chat/completions/derender",
    ] {
        let (status, body) = s.post(path, &big, &[]);
        assert_eq!(status, 413, "{path}: {body}");
        assert_eq!(json(&body)["error"]["code"], 413, "{path}");
    }

    // Stalled clients: half a request line, or headers and half a body.
    let mut stalled = Vec::new();
    for i in 0..40 {
        let mut sock = TcpStream::connect(&addr).expect("connect");
        if i % 2 == 0 {
            sock.write_all(b"POST /tokenize HTTP/1.1\r\nHost: x\r\n")
                .expect("write");
        } else {
            sock.write_all(
                b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":",
            )
            .expect("write");
        }
        stalled.push(sock);
    }
    assert!(timed_health(&s) < Duration::from_secs(1));
    for (i, sock) in stalled.iter_mut().enumerate() {
        let sent = read_until_closed(sock, Duration::from_secs(8))
            .unwrap_or_else(|| panic!("stalled connection {i} was never closed"));
        if i % 2 == 1 {
            // A stalled body gets the JSON 408 before the close.
            assert!(sent.starts_with("HTTP/1.1 408"), "{sent}");
            assert!(sent.contains("\"code\":408"), "{sent}");
        }
    }

    // Surplus connections: the cap's worth of idle sockets, then one more is refused.
    let idle: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(&addr).expect("connect");
    let refused = read_until_closed(&mut extra, Duration::from_secs(3)).expect("closed");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert_eq!(
        json(refused.split("\r\n\r\n").nth(1).expect("body"))["error"]["code"],
        503
    );
    drop(idle);
    // Idle sockets are closed by the keep-alive timeout; the slots come back.
    std::thread::sleep(Duration::from_millis(3500));
    assert!(timed_health(&s) < Duration::from_secs(1));

    // Made-up methods and paths add no series to /metrics.
    let before = {
        // One request per label value that can appear, so `before` has them all.
        for m in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            let _ = ureq::request(m, &s.url("/nope")).call();
        }
        let _ = ureq::request("MADEUP", &s.url("/nope")).call();
        // The first scrape counts itself only in the next one.
        metric_series(&s);
        metric_series(&s)
    };
    for i in 0..300 {
        let method = format!("M{i}X");
        let _ = ureq::request(&method, &s.url(&format!("/p{i}/{}", i * 7))).call();
    }
    assert_eq!(metric_series(&s), before);

    // Bodies: trailing bytes, too many prompts, n, and a prompt too long to tokenize.
    let (status, body) = s.post_raw("/tokenize", "application/json", r#"{"prompt":"hi"} x"#);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("trailing characters"), "{body}");
    let prompts: Vec<String> = (0..1025).map(|i| format!("p{i}")).collect();
    let (status, body) = s.post(
        "/v1/completions/render",
        &json!({"prompt": prompts, "max_tokens": 1}),
        &[],
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(json(&body)["error"]["param"], "prompt");
    let (status, body) = s.post(
        "/v1/chat/completions/render",
        &json!({"messages": [{"role": "user", "content": "hi"}], "n": 129}),
        &[],
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(json(&body)["error"]["param"], "n");
    let huge = "a".repeat(1_900_000);
    let t = Instant::now();
    let (status, body) = s.post("/tokenize", &json!({ "prompt": huge }), &[]);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("--max-prompt-chars"), "{body}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // Out-of-vocabulary ids are refused by derender as by /detokenize.
    let (status, body) = s.post(
        "/v1/completions/derender",
        &json!({"generate_responses": [{"request_id": "x", "choices": [{"index": 0, "token_ids": [4_000_000], "finish_reason": "length"}]}]}),
        &[],
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("out of vocabulary"), "{body}");
    assert!(timed_health(&s) < Duration::from_secs(1));
}

fn engine_server(extra: &[&str], log: Option<&std::path::Path>) -> Server {
    let model = gguf();
    let mut args = vec![
        "serve",
        model.as_str(),
        "--tokens-only",
        "--served-model-name",
        "smol",
        "--kv-cache-memory",
        "134217728",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "16",
    ];
    args.extend_from_slice(extra);
    Server::start_logging_to(&args, log)
}

fn gen_body(id: &str, max_tokens: u64, stream: bool) -> Value {
    json!({"request_id": id, "token_ids": [1, 9690, 198, 2683, 359, 253, 5356, 2, 198],
           "sampling_params": {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": true},
           "stream": stream})
}

/// A streaming POST on a raw socket; returns the socket to read the SSE from.
fn open_stream(addr: &str, body: &Value) -> TcpStream {
    let mut sock = TcpStream::connect(addr).expect("connect");
    let body = body.to_string();
    let req = format!(
        "POST /inference/v1/generate HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).expect("write");
    sock
}

/// The `data:` payloads of a finished SSE response (chunked framing tolerated: payload
/// lines are whole JSON objects or `[DONE]`).
fn sse_payloads(raw: &str) -> Vec<String> {
    raw.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn engine_server_limits_ids_logs_and_graceful_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("server.log");
    let mut s = engine_server(
        &[
            "--max-request-body-bytes",
            "100000",
            "--shutdown-timeout",
            "3",
        ],
        Some(&log),
    );
    let addr = s.addr();

    // One body limit on every route, answered with the JSON envelope.
    let big = json!({"token_ids": vec![1; 60_000], "sampling_params": {}});
    for path in [
        "/inference/v1/generate",
        "/inference/v1/abort_requests",
        "/abort_requests",
    ] {
        let (status, body) = s.post(path, &big, &[]);
        assert_eq!(status, 413, "{path}: {body}");
        assert_eq!(json(&body)["error"]["code"], 413, "{path}");
    }
    // Chunked (no Content-Length) is cut at the limit too.
    let mut sock = TcpStream::connect(&addr).expect("connect");
    sock.write_all(b"POST /inference/v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        .expect("write");
    let chunk = vec![b' '; 50_000];
    for _ in 0..3 {
        let _ = sock.write_all(format!("{:x}\r\n", chunk.len()).as_bytes());
        let _ = sock.write_all(&chunk);
        let _ = sock.write_all(b"\r\n");
    }
    let _ = sock.write_all(b"0\r\n\r\n");
    let resp = read_until_closed(&mut sock, Duration::from_secs(5)).expect("closed");
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");

    // Meaningless or unsupported inputs are 400s.
    let mut b = gen_body("a", 2, false);
    b["sampling_params"] = json!([]);
    let (status, body) = s.post("/inference/v1/generate", &b, &[]);
    assert_eq!(status, 400, "{body}");
    assert_eq!(json(&body)["error"]["param"], "body.sampling_params");
    let mut b = gen_body("a", 2, false);
    b["output_mode"] = json!("derender");
    let (status, body) = s.post("/inference/v1/generate", &b, &[]);
    assert_eq!(status, 400, "{body}");
    let mut b = gen_body("a", 2, false);
    b["priority"] = json!(-5);
    let (status, body) = s.post("/inference/v1/generate", &b, &[]);
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        json(&body)["error"]["message"],
        "Got priority -5 but Priority scheduling is not enabled."
    );
    let (status, body) = s.post(
        "/inference/v1/abort_requests",
        &json!({"request_ids": ["a", 7]}),
        &[],
    );
    assert_eq!(status, 400, "{body}");

    // A request id that tries to forge a log line is logged escaped.
    let (status, body) = s.post(
        "/inference/v1/generate",
        &gen_body("evil\nFORGED line\r\u{0}", 2, false),
        &[],
    );
    assert_eq!(status, 200, "{body}");

    // Two clients with the same id both succeed, concurrently.
    let dup: Vec<TcpStream> = (0..2)
        .map(|_| open_stream(&addr, &gen_body("same", 8, true)))
        .collect();
    for mut sock in dup {
        let raw = read_until_closed(&mut sock, Duration::from_secs(60)).expect("done");
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
        let events = sse_payloads(&raw);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{raw}");
        assert!(!raw.contains("\"error\""), "{raw}");
    }

    // SIGTERM with streams in flight: short ones finish, long ones are aborted after
    // --shutdown-timeout; every client gets its final event and [DONE]; exit code 0.
    let mut streams: Vec<(u64, TcpStream)> = Vec::new();
    for i in 0..8 {
        let max_tokens = if i % 2 == 0 { 6 } else { 400 };
        streams.push((
            max_tokens,
            open_stream(&addr, &gen_body(&format!("s{i}"), max_tokens, true)),
        ));
    }
    // Let every stream start producing.
    std::thread::sleep(Duration::from_millis(500));
    let killer = std::thread::spawn(move || {
        let code = s.terminate(Duration::from_secs(30));
        (code, s)
    });
    for (max_tokens, mut sock) in streams {
        let raw = read_until_closed(&mut sock, Duration::from_secs(30)).expect("stream ended");
        let events = sse_payloads(&raw);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{raw}");
        let last = json(&events[events.len() - 2]);
        let reason = last["choices"][0]["finish_reason"].as_str().unwrap_or("");
        if max_tokens == 6 {
            assert_eq!(reason, "length", "{raw}");
        } else {
            assert!(reason == "abort" || reason == "length", "{raw}");
        }
    }
    let (code, _s) = killer.join().expect("join");
    assert_eq!(code, Some(0));
    assert!(
        TcpStream::connect_timeout(&addr.parse().expect("addr"), Duration::from_secs(1)).is_err(),
        "the listener is closed"
    );
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("evil\\nFORGED line\\r\\x00"), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("FORGED")),
        "a forged log line: {text}"
    );
}
