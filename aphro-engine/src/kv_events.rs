//! KV-cache events in vLLM's wire format (`endpoints.md §4.3`): what the block manager
//! reports (`BlockStored` when full blocks enter the prefix cache, `BlockRemoved` on
//! eviction, `AllBlocksCleared` on a reset), collected per engine step into a
//! `KVEventBatch` and encoded as msgspec encodes vLLM's `array_like=True, tag=True`
//! structs: every field present, the class name first.

use std::io::Write;

use crate::kv_hash::{hash_to_u64, BlockHash, ExtraKey};

/// One event, as the block manager records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    BlockStored {
        block_hashes: Vec<BlockHash>,
        /// The hash of the block before the first one, `None` if the run starts at block 0.
        parent_block_hash: Option<BlockHash>,
        /// The tokens of all blocks in the event, concatenated.
        token_ids: Vec<u32>,
        block_size: usize,
        lora_name: Option<String>,
        /// One entry per block: the extra keys used in its hash, or `None`.
        extra_keys: Vec<Option<Vec<ExtraKey>>>,
    },
    BlockRemoved {
        block_hashes: Vec<BlockHash>,
    },
    AllBlocksCleared,
}

/// The events of one engine step (vLLM's `KVEventBatch`).
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventBatch {
    /// Seconds since the Unix epoch (`time.time()`).
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub data_parallel_rank: Option<i64>,
}

/// How block hashes go on the wire (`endpoints.md §4.3`, `Hash`): vLLM's default
/// (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`) is the low 64 bits as an unsigned int.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashWire {
    #[default]
    Int,
    Bytes,
}

impl HashWire {
    /// From `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` ("0" selects bytes), as vLLM reads it.
    pub fn from_env() -> Self {
        match std::env::var("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES").as_deref() {
            Ok("0") => Self::Bytes,
            _ => Self::Int,
        }
    }
}

type W = Vec<u8>;

// Writing into a Vec cannot fail; the `rmp` writers only return errors of the writer.
fn arr(w: &mut W, n: usize) {
    let _ = rmp::encode::write_array_len(w, n as u32);
}
fn s(w: &mut W, v: &str) {
    let _ = rmp::encode::write_str(w, v);
}
fn nil(w: &mut W) {
    let _ = rmp::encode::write_nil(w);
}
fn uint(w: &mut W, v: u64) {
    let _ = rmp::encode::write_uint(w, v);
}
fn sint(w: &mut W, v: i64) {
    if v >= 0 {
        uint(w, v as u64);
    } else {
        let _ = rmp::encode::write_sint(w, v);
    }
}
fn bin(w: &mut W, v: &[u8]) {
    let _ = rmp::encode::write_bin(w, v);
}
fn opt_str(w: &mut W, v: Option<&str>) {
    match v {
        Some(v) => s(w, v),
        None => nil(w),
    }
}

fn hash(w: &mut W, h: &BlockHash, wire: HashWire) {
    match wire {
        HashWire::Int => uint(w, hash_to_u64(h)),
        HashWire::Bytes => bin(w, h),
    }
}

fn hashes(w: &mut W, hs: &[BlockHash], wire: HashWire) {
    arr(w, hs.len());
    for h in hs {
        hash(w, h, wire);
    }
}

/// The medium of the engine's own KV cache.
const MEDIUM: &str = "GPU";
/// aphro has one KV cache group of full attention.
const GROUP_IDX: u64 = 0;
const SPEC_KIND: &str = "full_attention";

fn event(w: &mut W, e: &KvEvent, wire: HashWire) {
    match e {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_name,
            extra_keys,
        } => {
            arr(w, 12);
            s(w, "BlockStored");
            hashes(w, block_hashes, wire);
            match parent_block_hash {
                Some(h) => hash(w, h, wire),
                None => nil(w),
            }
            arr(w, token_ids.len());
            for &t in token_ids {
                uint(w, t.into());
            }
            uint(w, *block_size as u64);
            nil(w); // lora_id: aphro has no numeric adapter ids.
            s(w, MEDIUM);
            opt_str(w, lora_name.as_deref());
            arr(w, extra_keys.len());
            for keys in extra_keys {
                match keys {
                    None => nil(w),
                    Some(keys) => {
                        arr(w, keys.len());
                        for k in keys {
                            match k {
                                ExtraKey::Str(v) => s(w, v),
                                ExtraKey::Mm(id, off) => {
                                    arr(w, 2);
                                    s(w, id);
                                    sint(w, *off);
                                }
                                ExtraKey::Bytes(b) => bin(w, b),
                            }
                        }
                    }
                }
            }
            uint(w, GROUP_IDX);
            s(w, SPEC_KIND);
            nil(w); // kv_cache_spec_sliding_window
        }
        KvEvent::BlockRemoved { block_hashes } => {
            arr(w, 4);
            s(w, "BlockRemoved");
            hashes(w, block_hashes, wire);
            s(w, MEDIUM);
            uint(w, GROUP_IDX);
        }
        KvEvent::AllBlocksCleared => {
            arr(w, 1);
            s(w, "AllBlocksCleared");
        }
    }
}

impl KvEventBatch {
    /// The msgpack payload (`endpoints.md §4.3`).
    pub fn encode(&self, wire: HashWire) -> Vec<u8> {
        let mut w = Vec::with_capacity(64 + 64 * self.events.len());
        arr(&mut w, 3);
        let _ = rmp::encode::write_f64(&mut w, self.ts);
        arr(&mut w, self.events.len());
        for e in &self.events {
            event(&mut w, e, wire);
        }
        match self.data_parallel_rank {
            Some(r) => sint(&mut w, r),
            None => nil(&mut w),
        }
        w
    }
}

/// Seconds since the Unix epoch as a float, like Python's `time.time()`.
pub fn now_ts() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Where the engine hands its per-step batches: a bounded queue, never blocking the step
/// (vLLM's `max_queue_size`); when full the batch is dropped and counted.
#[derive(Debug, Clone)]
pub struct KvEventSink {
    tx: tokio::sync::mpsc::Sender<KvEventBatch>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    rank: i64,
}

/// Two sinks are equal when they feed the same queue.
impl PartialEq for KvEventSink {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.dropped, &other.dropped) && self.rank == other.rank
    }
}

impl KvEventSink {
    /// A queue of at most `capacity` batches; the batches carry `data_parallel_rank`.
    pub fn bounded(
        capacity: usize,
        data_parallel_rank: i64,
    ) -> (Self, tokio::sync::mpsc::Receiver<KvEventBatch>) {
        let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
        (
            Self {
                tx,
                dropped: Default::default(),
                rank: data_parallel_rank,
            },
            rx,
        )
    }

    pub fn data_parallel_rank(&self) -> i64 {
        self.rank
    }

    pub fn send(&self, batch: KvEventBatch) {
        if self.tx.try_send(batch).is_err() {
            let n = self
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n == 0 {
                tracing::warn!("KV event queue full or closed: dropping event batches");
            }
        }
    }

    /// Batches dropped because the queue was full or its reader gone.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// For tests and tools: write `bytes` as lowercase hex.
pub fn write_hex(out: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    for b in bytes {
        write!(out, "{b:02x}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        let mut v = Vec::new();
        write_hex(&mut v, b).expect("vec");
        String::from_utf8(v).expect("ascii")
    }

    fn h_with_low(low: u64) -> BlockHash {
        let mut h = [0xaau8; 32];
        h[24..].copy_from_slice(&low.to_be_bytes());
        h
    }

    fn text(s: &str) -> String {
        hex(s.as_bytes())
    }

    // The example bytes of `endpoints.md §4.3`.
    #[test]
    fn block_stored_batch_matches_the_spec_example() {
        let b = KvEventBatch {
            ts: 1.5,
            events: vec![KvEvent::BlockStored {
                block_hashes: vec![h_with_low(0x8000_0000_0000_0005)],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3],
                block_size: 16,
                lora_name: None,
                extra_keys: vec![None],
            }],
            data_parallel_rank: None,
        };
        // The spec's example shows a nil `extra_keys`; vLLM's cache_full_blocks fills one
        // entry per block (nil for text), which is what aphro sends.
        let got = hex(&b.encode(HashWire::Int));
        let expect = format!(
            "93cb3ff8000000000000919cab{}91cf8000000000000005c0930102 0310c0a3{}c091c000ae{}c0c0",
            text("BlockStored"),
            text("GPU"),
            text("full_attention"),
        )
        .replace(' ', "");
        assert_eq!(got, expect);
    }

    #[test]
    fn removed_cleared_and_rank_encode_as_msgspec_does() {
        let h = h_with_low(7);
        let b = KvEventBatch {
            ts: 0.0,
            events: vec![
                KvEvent::BlockRemoved {
                    block_hashes: vec![h],
                },
                KvEvent::AllBlocksCleared,
            ],
            data_parallel_rank: Some(1),
        };
        assert_eq!(
            hex(&b.encode(HashWire::Int)),
            format!(
                "93cb0000000000000000 92 94ac{}9107a3{}00 91b0{} 01",
                text("BlockRemoved"),
                text("GPU"),
                text("AllBlocksCleared")
            )
            .replace(' ', "")
        );
        // Bytes form: bin8 of the whole digest.
        let bytes = hex(&b.encode(HashWire::Bytes));
        assert!(bytes.contains(&format!("91c420{}", hex(&h))), "{bytes}");
    }

    #[test]
    fn extra_keys_encode_as_tuples() {
        let b = KvEventBatch {
            ts: 0.0,
            events: vec![KvEvent::BlockStored {
                block_hashes: vec![h_with_low(1), h_with_low(2)],
                parent_block_hash: Some(h_with_low(300)),
                token_ids: vec![],
                block_size: 0,
                lora_name: Some("ad".into()),
                extra_keys: vec![
                    Some(vec![
                        ExtraKey::Str("ad".into()),
                        ExtraKey::Mm("m".into(), -2),
                        ExtraKey::Str("s".into()),
                    ]),
                    Some(vec![ExtraKey::Str("ad".into())]),
                ],
            }],
            data_parallel_rank: Some(0),
        };
        let got = hex(&b.encode(HashWire::Int));
        let expect = format!(
            "93cb0000000000000000 91 9cab{} 920102 cd012c 90 00 c0 a3{} a2{} 92 93a2{}92a1{}fea1{} 91a2{} 00ae{}c0 00",
            text("BlockStored"),
            text("GPU"),
            text("ad"),
            text("ad"),
            text("m"),
            text("s"),
            text("ad"),
            text("full_attention"),
        )
        .replace(' ', "");
        assert_eq!(got, expect);
    }

    #[test]
    fn a_full_sink_drops_instead_of_blocking() {
        let (sink, mut rx) = KvEventSink::bounded(1, 0);
        let batch = KvEventBatch {
            ts: 0.0,
            events: vec![KvEvent::AllBlocksCleared],
            data_parallel_rank: None,
        };
        sink.send(batch.clone());
        sink.send(batch.clone());
        assert_eq!(sink.dropped(), 1);
        assert_eq!(rx.try_recv().ok(), Some(batch));
    }
}
