//! `--kv-events-config` and the ZMQ publisher of KV-cache events (`endpoints.md §4.1`,
//! `§4.2`, `§4.4`): a PUB socket sending `[topic, seq u64 BE, msgpack KVEventBatch]` per
//! engine step, and a ROUTER replay socket answering a start sequence number with the
//! buffered batches from there and an end marker.
//!
//! The publisher runs on its own thread (a current-thread tokio runtime). The engine hands
//! it batches through a bounded queue that never blocks the step ([`KvEventSink`]), so a slow
//! or absent subscriber cannot stall generation.

use std::collections::VecDeque;

use bytes::Bytes;
use serde::Deserialize;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::kv_events::{HashWire, KvEventBatch, KvEventSink};

/// vLLM's `KVEventsConfig` (`endpoints.md §4.1`): same field names and defaults.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvEventsConfig {
    pub enable_kv_cache_events: bool,
    /// `null` → `"zmq"` when enabled, else `"null"`.
    pub publisher: Option<String>,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub buffer_steps: usize,
    pub hwm: usize,
    pub max_queue_size: usize,
    pub topic: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

impl std::str::FromStr for KvEventsConfig {
    type Err = String;

    /// The JSON of `--kv-events-config`.
    fn from_str(s: &str) -> Result<Self, String> {
        let c: Self =
            serde_json::from_str(s).map_err(|e| format!("invalid --kv-events-config: {e}"))?;
        match c.publisher.as_deref() {
            None | Some("zmq") | Some("null") => {}
            Some(p) => {
                return Err(format!(
                    "invalid --kv-events-config: unknown publisher {p:?} (expected \"zmq\" or \"null\")"
                ))
            }
        }
        if c.buffer_steps == 0 {
            return Err("invalid --kv-events-config: buffer_steps must be at least 1".into());
        }
        Ok(c)
    }
}

impl KvEventsConfig {
    /// The publisher in effect: `"zmq"`, or `"null"` (no events).
    pub fn effective_publisher(&self) -> &str {
        match self.publisher.as_deref() {
            Some(p) => p,
            None if self.enable_kv_cache_events => "zmq",
            None => "null",
        }
    }

    /// Whether events are recorded and published.
    pub fn publishes(&self) -> bool {
        if !self.enable_kv_cache_events {
            if self.publisher.as_deref().is_some_and(|p| p != "null") {
                tracing::warn!(
                    "--kv-events-config names a publisher but enable_kv_cache_events is false: \
                     no KV events are published"
                );
            }
            return false;
        }
        self.effective_publisher() == "zmq"
    }
}

/// vLLM's rule (`endpoints.md §4.1`): the PUB socket binds when the endpoint has a
/// wildcard host (`*`, `::`) or is `ipc://` / `inproc://`, and connects otherwise.
pub fn pub_binds(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// The endpoint of data-parallel rank `rank` (`endpoints.md §4.1`): a tcp port gets `+rank`,
/// inproc the suffix `_dp{rank}`.
pub fn endpoint_for_rank(endpoint: &str, rank: u16) -> Result<String, String> {
    if rank == 0 {
        return Ok(endpoint.to_owned());
    }
    if endpoint.starts_with("inproc://") {
        return Ok(format!("{endpoint}_dp{rank}"));
    }
    if endpoint.starts_with("tcp://") {
        let (head, port) = endpoint
            .rsplit_once(':')
            .ok_or_else(|| format!("KV events endpoint {endpoint:?} has no port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("KV events endpoint {endpoint:?} has no valid port"))?;
        let p = port
            .checked_add(rank)
            .ok_or_else(|| format!("KV events port {port} + rank {rank} overflows"))?;
        return Ok(format!("{head}:{p}"));
    }
    Ok(endpoint.to_owned())
}

/// What the `zeromq` crate accepts: it parses `*` as a host name, so the wildcard becomes
/// `0.0.0.0` (`[::]` for `::`). `inproc://` is not supported by the crate.
fn socket_endpoint(endpoint: &str) -> Result<String, String> {
    if endpoint.starts_with("inproc://") {
        return Err(format!(
            "KV events endpoint {endpoint:?}: inproc:// is not supported; use tcp:// or ipc://"
        ));
    }
    if !(endpoint.starts_with("tcp://") || endpoint.starts_with("ipc://")) {
        return Err(format!(
            "KV events endpoint {endpoint:?}: expected tcp://host:port or ipc://path"
        ));
    }
    Ok(endpoint
        .replacen("tcp://*:", "tcp://0.0.0.0:", 1)
        .replacen("tcp://:::", "tcp://[::]:", 1))
}

/// The running publisher. Dropping it stops the thread; batches still queued are dropped.
#[derive(Debug)]
pub struct KvEventPublisher {
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The replay end marker's sequence number: `(-1).to_bytes(8, "big", signed=True)`.
const END_SEQ: [u8; 8] = [0xff; 8];

impl KvEventPublisher {
    /// Open the sockets (errors here are start-up errors) and start publishing. Returns the
    /// sink the engine sends its batches to.
    pub fn start(
        cfg: &KvEventsConfig,
        data_parallel_rank: u16,
    ) -> Result<(Self, KvEventSink), String> {
        if cfg.hwm != KvEventsConfig::default().hwm {
            // The pure-Rust ZMQ sockets have no high-water-mark setting: say so rather than
            // accept the value silently. Slow subscribers are bounded by the queue instead.
            tracing::warn!(
                "--kv-events-config hwm={} is not applied (the PUB socket has no high-water \
                 mark here); max_queue_size={} bounds the batches waiting to be sent",
                cfg.hwm,
                cfg.max_queue_size
            );
        }
        let endpoint = endpoint_for_rank(&cfg.endpoint, data_parallel_rank)?;
        let binds = pub_binds(&endpoint);
        let endpoint = socket_endpoint(&endpoint)?;
        let replay = cfg
            .replay_endpoint
            .as_deref()
            .map(|e| endpoint_for_rank(e, data_parallel_rank).and_then(|e| socket_endpoint(&e)))
            .transpose()?;
        let (sink, rx) = KvEventSink::bounded(cfg.max_queue_size, data_parallel_rank.into());
        let topic = Bytes::from(cfg.topic.clone().into_bytes());
        let buffer_steps = cfg.buffer_steps;
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<(), String>>(1);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("aphro-kv-events".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("KV events runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let mut publ = zeromq::PubSocket::new();
                    let opened = if binds {
                        publ.bind(&endpoint).await.map(|_| ())
                    } else {
                        publ.connect(&endpoint).await
                    };
                    if let Err(e) = opened {
                        let verb = if binds { "bind" } else { "connect" };
                        let _ = ready_tx.send(Err(format!(
                            "KV events: cannot {verb} the PUB socket to {endpoint}: {e}"
                        )));
                        return;
                    }
                    let mut router = match &replay {
                        Some(ep) => {
                            let mut r = zeromq::RouterSocket::new();
                            if let Err(e) = r.bind(ep).await {
                                let _ = ready_tx.send(Err(format!(
                                    "KV events: cannot bind the replay socket to {ep}: {e}"
                                )));
                                return;
                            }
                            Some(r)
                        }
                        None => None,
                    };
                    let _ = ready_tx.send(Ok(()));
                    run(publ, router.as_mut(), rx, stop_rx, topic, buffer_steps).await;
                });
            })
            .map_err(|e| format!("cannot spawn the KV events thread: {e}"))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok((
                Self {
                    thread: Some(thread),
                    stop: Some(stop_tx),
                },
                sink,
            )),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err("the KV events thread ended during start-up".into())
            }
        }
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn run(
    mut publ: zeromq::PubSocket,
    mut router: Option<&mut zeromq::RouterSocket>,
    mut rx: tokio::sync::mpsc::Receiver<KvEventBatch>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    topic: Bytes,
    buffer_steps: usize,
) {
    let wire = HashWire::from_env();
    let mut seq: u64 = 0;
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
    // Once the engine is gone the buffer still answers replays until the publisher drops.
    let mut engine_open = true;
    loop {
        let replay_req = async {
            match router.as_deref_mut() {
                Some(r) => r.recv().await,
                None => std::future::pending().await,
            }
        };
        // Batches before replays: a replay sees every batch the engine queued before it.
        tokio::select! {
            biased;
            _ = &mut stop => break,
            batch = rx.recv(), if engine_open => {
                let Some(batch) = batch else {
                    engine_open = false;
                    if router.is_none() {
                        break;
                    }
                    continue;
                };
                let payload = Bytes::from(batch.encode(wire));
                let seq_b = Bytes::copy_from_slice(&seq.to_be_bytes());
                if let Ok(m) = ZmqMessage::try_from(vec![topic.clone(), seq_b, payload.clone()]) {
                    if let Err(e) = publ.send(m).await {
                        tracing::warn!("KV events: publishing batch {seq} failed: {e}");
                    }
                }
                if buffer.len() == buffer_steps {
                    buffer.pop_front();
                }
                buffer.push_back((seq, payload));
                seq += 1;
            }
            msg = replay_req => {
                let Ok(msg) = msg else { continue };
                let Some(r) = router.as_deref_mut() else { continue };
                replay(r, msg, &buffer, &topic).await;
            }
        }
    }
}

/// Answer one replay request `[identity, _, start_seq]` as vLLM 0.33.0's
/// `_service_replay` does (`endpoints.md §4.4`): `[identity, "", topic, seq, payload]` per
/// buffered batch from `start_seq` on, then `[identity, "", "", ff×8, ""]`.
async fn replay(
    r: &mut zeromq::RouterSocket,
    msg: ZmqMessage,
    buffer: &VecDeque<(u64, Bytes)>,
    topic: &Bytes,
) {
    let frames = msg.into_vec();
    // vLLM checks only the frame count; the middle frame is the REQ/DEALER delimiter.
    let [identity, _, start] = frames.as_slice() else {
        tracing::warn!(
            "KV events replay: ignoring a request of {} frames",
            frames.len()
        );
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
        tracing::warn!("KV events replay: the start sequence must be 8 bytes");
        return;
    };
    let start = u64::from_be_bytes(start);
    let reply = |topic: Bytes, seq: [u8; 8], payload: Bytes| {
        ZmqMessage::try_from(vec![
            identity.clone(),
            Bytes::new(),
            topic,
            Bytes::copy_from_slice(&seq),
            payload,
        ])
    };
    for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
        if let Ok(m) = reply(topic.clone(), seq.to_be_bytes(), payload.clone()) {
            if r.send(m).await.is_err() {
                return;
            }
        }
    }
    if let Ok(m) = reply(Bytes::new(), END_SEQ, Bytes::new()) {
        let _ = r.send(m).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_vllms_fields_and_defaults() {
        let c: KvEventsConfig = "{}".parse().expect("empty is valid");
        assert_eq!(c, KvEventsConfig::default());
        assert_eq!(c.endpoint, "tcp://*:5557");
        assert_eq!(
            (c.buffer_steps, c.hwm, c.max_queue_size),
            (10000, 100000, 100000)
        );
        assert!(!c.publishes());
        let c: KvEventsConfig = r#"{"enable_kv_cache_events":true,"topic":"kv@p@m"}"#
            .parse()
            .expect("valid");
        assert_eq!(c.effective_publisher(), "zmq");
        assert!(c.publishes());
        let c: KvEventsConfig = r#"{"enable_kv_cache_events":true,"publisher":"null"}"#
            .parse()
            .expect("valid");
        assert!(!c.publishes());
        for bad in [
            "{",
            r#"{"enable_kv_cache_events":1}"#,
            r#"{"endpiont":"tcp://*:1"}"#,
            r#"{"publisher":"kafka"}"#,
            r#"{"buffer_steps":0}"#,
        ] {
            let e = bad.parse::<KvEventsConfig>().expect_err(bad);
            assert!(e.starts_with("invalid --kv-events-config"), "{e}");
        }
    }

    #[test]
    fn bind_or_connect_and_rank_offsets_follow_vllm() {
        assert!(pub_binds("tcp://*:5557"));
        assert!(pub_binds("tcp://[::]:5557"));
        assert!(pub_binds("ipc:///tmp/kv"));
        assert!(!pub_binds("tcp://10.0.0.5:5557"));
        assert!(!pub_binds("tcp://indexer:5557"));
        assert_eq!(
            endpoint_for_rank("tcp://*:5557", 2).as_deref(),
            Ok("tcp://*:5559")
        );
        assert_eq!(
            endpoint_for_rank("inproc://kv", 1).as_deref(),
            Ok("inproc://kv_dp1")
        );
        assert_eq!(
            endpoint_for_rank("tcp://h:5557", 0).as_deref(),
            Ok("tcp://h:5557")
        );
        assert_eq!(
            socket_endpoint("tcp://*:5557").as_deref(),
            Ok("tcp://0.0.0.0:5557")
        );
        assert!(socket_endpoint("inproc://kv").is_err());
        assert!(socket_endpoint("udp://x:1").is_err());
    }

    #[test]
    fn a_port_in_use_is_a_start_up_error() {
        let held = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
        let port = held.local_addr().expect("addr").port();
        let cfg = KvEventsConfig {
            enable_kv_cache_events: true,
            endpoint: format!("tcp://*:{port}"),
            ..KvEventsConfig::default()
        };
        let e = KvEventPublisher::start(&cfg, 0).expect_err("port taken");
        assert!(e.contains("cannot bind"), "{e}");
    }
}
