//! KV-cache events end to end on the real model (SmolLM2-135M-Instruct Q4_1): a scripted
//! workload (shared prefixes, evictions forced by a small KV pool, a prefix-cache reset)
//! publishes over ZMQ on loopback; a SUB socket and a replay DEALER decode the batches as
//! vLLM's structs (`endpoints.md §4.3`) and the test checks they agree with the cache:
//! hashes recomputed as vLLM's `sha256_cbor` from the event's own tokens, parents chain to
//! stored blocks, every removal follows its store, and the reset clears everything.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use aphro_engine::engine::{Engine, EngineConfig};
use aphro_engine::kv::{BlockHasher, HashAlgo};
use aphro_engine::kv_hash::hash_to_u64;
use aphro_engine::kv_publisher::{KvEventPublisher, KvEventsConfig};
use aphro_engine::model::{load_flex_runner, ModelDType, ModelLoadConfig};
use aphro_engine::request::{EngineRequest, SamplingConfig};
use aphro_engine::runner::ModelRunner;
use bytes::Bytes;
use futures::executor::block_on;
use futures::StreamExt;
use serde_json::Value;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

fn gguf() -> PathBuf {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let p = assets.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing (set APHRO_ASSETS)", p.display());
    p
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn run(engine: &Engine, id: &str, prompt: Vec<u32>) {
    let req = EngineRequest::new(
        id,
        prompt,
        SamplingConfig {
            ignore_eos: true,
            ..SamplingConfig::greedy(2)
        },
    );
    let outs: Vec<_> = block_on(engine.generate(req).collect::<Vec<_>>());
    assert!(outs.iter().all(|o| o.is_ok()), "{id}: {outs:?}");
}

#[test]
fn scripted_workload_publishes_events_that_agree_with_the_cache() {
    // NONE_HASH from PYTHONHASHSEED, as vLLM: the test vectors' seed. This binary has no
    // other test, so no thread reads the environment concurrently.
    std::env::set_var("PYTHONHASHSEED", "0");
    let (pub_port, replay_port) = (free_port(), free_port());
    let cfg: KvEventsConfig = format!(
        r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{pub_port}",
            "replay_endpoint":"tcp://*:{replay_port}","topic":"kv@pod-0@smol","buffer_steps":1000}}"#
    )
    .parse()
    .expect("config");
    let (publisher, sink) = KvEventPublisher::start(&cfg, 0).expect("publisher");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let mut sub = zeromq::SubSocket::new();
    rt.block_on(async {
        sub.connect(&format!("tcp://127.0.0.1:{pub_port}"))
            .await
            .expect("sub connect");
        sub.subscribe("kv@").await.expect("subscribe");
        // Let the subscription reach the PUB before anything is published.
        tokio::time::sleep(Duration::from_millis(500)).await;
    });

    // A small pool: 10 blocks of 16 tokens, so the workload has to evict.
    let runner = load_flex_runner(&ModelLoadConfig {
        model_path: gguf(),
        dtype: ModelDType::Auto,
        cache_bytes: 0,
        min_cache_tokens: 160,
        block_size: 16,
        quiet: true,
        device: aphro_engine::backend::Device::Cpu,
        kv_cache_dtype: Default::default(),
    })
    .expect("model loads");
    let blocks = runner.num_blocks();
    assert!((10..=16).contains(&blocks), "{blocks} blocks");
    let engine = Engine::new(
        Box::new(runner),
        EngineConfig {
            max_num_batched_tokens: 64,
            max_num_seqs: 4,
            seed: Some(1),
            prefix_caching_hash_algo: HashAlgo::Sha256Cbor,
            kv_events: Some(sink),
            ..Default::default()
        },
    )
    .expect("engine");

    let shared: Vec<u32> = (100..164).collect(); // 4 full blocks
    let with_tail = |tail: u32| {
        let mut p = shared.clone();
        p.extend(tail..tail + 10);
        p
    };
    run(&engine, "a", with_tail(1000));
    let hits_before = engine.metrics_synced().prefix_cache_hits;
    run(&engine, "b", with_tail(2000)); // the shared 4 blocks hit
    assert_eq!(engine.metrics_synced().prefix_cache_hits - hits_before, 64);
    // A long unrelated prompt needs (almost) the whole pool: cached blocks are evicted.
    run(
        &engine,
        "c",
        (5000..5000 + (blocks as u32 - 2) * 16).collect(),
    );
    assert!(engine.reset_prefix_cache(), "idle engine resets");
    run(&engine, "d", with_tail(3000)); // stored again after the reset
    drop(engine);

    // Replay everything from seq 0 over a DEALER: exactly the buffered batches, then the
    // end marker.
    let replayed: Vec<(u64, Bytes)> = rt.block_on(async {
        let mut dealer = zeromq::DealerSocket::new();
        dealer
            .connect(&format!("tcp://127.0.0.1:{replay_port}"))
            .await
            .expect("dealer connect");
        let req =
            ZmqMessage::try_from(vec![Bytes::new(), Bytes::from(0u64.to_be_bytes().to_vec())])
                .expect("frames");
        dealer.send(req).await.expect("send");
        let mut got = Vec::new();
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
                .await
                .expect("replay answers in time")
                .expect("recv");
            // vLLM 0.33.0: ["", topic, seq, payload]; the end marker has an empty topic and
            // payload.
            let f = m.into_vec();
            assert_eq!(f.len(), 4, "[\"\", topic, seq, payload]");
            assert!(f[0].is_empty());
            let seq: [u8; 8] = f[2].as_ref().try_into().expect("8-byte seq");
            if seq == [0xff; 8] {
                assert!(
                    f[1].is_empty() && f[3].is_empty(),
                    "end marker: empty topic, payload"
                );
                break;
            }
            assert_eq!(f[1].as_ref(), b"kv@pod-0@smol");
            got.push((u64::from_be_bytes(seq), f[3].clone()));
        }
        got
    });
    assert!(!replayed.is_empty());
    let seqs: Vec<u64> = replayed.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (0..replayed.len() as u64).collect::<Vec<_>>());
    // A later start returns only the tail.
    let tail_len = rt.block_on(async {
        let mut dealer = zeromq::DealerSocket::new();
        dealer
            .connect(&format!("tcp://127.0.0.1:{replay_port}"))
            .await
            .expect("connect");
        let start = replayed.len() as u64 - 1;
        let req = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::from(start.to_be_bytes().to_vec()),
        ])
        .expect("frames");
        dealer.send(req).await.expect("send");
        let mut n = 0;
        loop {
            let f = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
                .await
                .expect("in time")
                .expect("recv")
                .into_vec();
            if f[2].as_ref() == [0xff; 8] {
                break n;
            }
            n += 1;
        }
    });
    assert_eq!(tail_len, 1);

    // The live stream: 3 frames, the topic, the same seqs and payloads as the replay.
    let live: Vec<(u64, Bytes)> = rt.block_on(async {
        let mut got = Vec::new();
        while got.len() < replayed.len() {
            let f = tokio::time::timeout(Duration::from_secs(10), sub.recv())
                .await
                .expect("every batch arrives live")
                .expect("recv")
                .into_vec();
            assert_eq!(f.len(), 3);
            assert_eq!(f[0].as_ref(), b"kv@pod-0@smol");
            let seq: [u8; 8] = f[1].as_ref().try_into().expect("8-byte seq");
            got.push((u64::from_be_bytes(seq), f[2].clone()));
        }
        got
    });
    assert_eq!(live, replayed);
    drop(publisher);

    // Decode as vLLM's structs and check them against the cache's rules.
    let hasher = BlockHasher::new(HashAlgo::Sha256Cbor, Some("0"));
    let mut hash_of: std::collections::HashMap<u64, [u8; 32]> = Default::default();
    let mut live_set: HashSet<u64> = HashSet::new();
    let mut ever_stored: HashSet<u64> = HashSet::new();
    let (mut stored, mut removed, mut cleared) = (0, 0, 0);
    let mut prev_ts = 0.0;
    for (_, payload) in &replayed {
        let batch: Value = rmp_serde::from_slice(payload).expect("msgpack batch");
        let b = batch.as_array().expect("array_like batch");
        assert_eq!(b.len(), 3, "[ts, events, data_parallel_rank]");
        let ts = b[0].as_f64().expect("ts");
        assert!(ts >= prev_ts && ts > 1.6e9);
        prev_ts = ts;
        assert_eq!(b[2], 0, "rank 0");
        let events = b[1].as_array().expect("events");
        assert!(!events.is_empty(), "only non-empty batches are published");
        for e in events {
            // vLLM 0.33.0's events are tagged maps: "type" first, then the set fields.
            // (serde_json keeps the wire's key order here: `preserve_order`.)
            let pairs = e.as_object().expect("tagged map event");
            let keys: Vec<&str> = pairs.keys().map(String::as_str).collect();
            let field = |k: &str| -> &Value { pairs.get(k).expect(k) };
            match field("type").as_str().expect("tag") {
                "BlockStored" => {
                    assert_eq!(
                        keys,
                        [
                            "type",
                            "block_hashes",
                            "parent_block_hash",
                            "token_ids",
                            "block_size",
                            "lora_id",
                            "medium",
                            "lora_name",
                            "extra_keys",
                            "group_idx"
                        ]
                    );
                    let hashes: Vec<u64> = field("block_hashes")
                        .as_array()
                        .expect("hashes")
                        .iter()
                        .map(|h| h.as_u64().expect("int hash"))
                        .collect();
                    let tokens: Vec<u32> = field("token_ids")
                        .as_array()
                        .expect("tokens")
                        .iter()
                        .map(|t| t.as_u64().expect("token") as u32)
                        .collect();
                    assert_eq!(*field("block_size"), 16);
                    assert_eq!(tokens.len(), 16 * hashes.len());
                    assert!(field("lora_id").is_null() && field("lora_name").is_null());
                    assert_eq!(*field("medium"), "GPU");
                    assert_eq!(
                        *field("extra_keys"),
                        Value::Array(vec![Value::Null; hashes.len()]),
                        "text-only: one nil per block"
                    );
                    assert_eq!(*field("group_idx"), 0);
                    // The parent is a stored, still cached block (or nil at block 0).
                    let parent_field = field("parent_block_hash");
                    let mut parent = match parent_field.as_u64() {
                        None => {
                            assert!(parent_field.is_null());
                            None
                        }
                        Some(p) => {
                            assert!(live_set.contains(&p), "parent {p} is cached");
                            Some(hash_of[&p])
                        }
                    };
                    for (h, chunk) in hashes.iter().zip(tokens.chunks(16)) {
                        let full = hasher.hash_block(parent.as_ref(), chunk, None);
                        assert_eq!(hash_to_u64(&full), *h, "vLLM's sha256_cbor of the block");
                        assert!(live_set.insert(*h), "stored twice without removal");
                        ever_stored.insert(*h);
                        hash_of.insert(*h, full);
                        parent = Some(full);
                        stored += 1;
                    }
                }
                "BlockRemoved" => {
                    assert_eq!(keys, ["type", "block_hashes", "medium", "group_idx"]);
                    assert_eq!(
                        (field("medium"), field("group_idx")),
                        (&Value::from("GPU"), &Value::from(0))
                    );
                    for h in field("block_hashes").as_array().expect("hashes") {
                        let h = h.as_u64().expect("int hash");
                        assert!(live_set.remove(&h), "removed {h} before it was stored");
                        removed += 1;
                    }
                }
                "AllBlocksCleared" => {
                    assert_eq!(keys, ["type"]);
                    live_set.clear();
                    cleared += 1;
                }
                t => panic!("unknown event {t}"),
            }
        }
    }
    assert!(stored >= 4 + (blocks - 2) + 4, "{stored} stored");
    assert!(removed > 0, "the small pool evicted cached blocks");
    assert_eq!(cleared, 1);
    // After the reset only "d"'s blocks are cached: the shared prefix, stored again.
    let d_first = hasher.hash_block(None, &(100..116).collect::<Vec<u32>>(), None);
    assert!(live_set.contains(&hash_to_u64(&d_first)));
    assert!(ever_stored.len() >= live_set.len());
}
