//! KV-cache events in vLLM's wire format (`endpoints.md §4.3`): what the block manager
//! reports (`BlockStored` when full blocks enter the prefix cache, `BlockRemoved` on
//! eviction, `AllBlocksCleared` on a reset), collected per engine step into a
//! `KVEventBatch` and encoded as msgspec encodes vLLM 0.33.0's structs: the batch as an
//! array `[ts, events, data_parallel_rank]`, each event as a tagged map (`"type"` = the
//! class name first, then the fields in declaration order, optional fields left out while
//! they hold their default `None`). `testdata/kv_events/vllm_0.33.0.json` holds payloads
//! msgspec made from vLLM's own struct definitions; the tests compare byte for byte.

use std::io::Write;

use crate::kv_hash::{hash_to_u64, BlockHash, EventKey, ExtraKey};

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

/// A struct's map header as msgspec writes it: the width is chosen from the most entries
/// the struct can have (tag included), the count is what was written. `BlockStored` has 16
/// possible entries, so even its usual 10 go under a map16 header.
fn map_header(w: &mut W, entries: usize, max_entries: usize) {
    if max_entries <= 15 {
        w.push(0x80 | entries as u8);
    } else {
        w.push(0xde);
        w.extend_from_slice(&(entries as u16).to_be_bytes());
    }
}

/// vLLM 0.33.0's `BlockStored` fields: 15, plus the tag.
const BLOCK_STORED_MAX_ENTRIES: usize = 16;
/// vLLM 0.33.0's `BlockRemoved` fields: 5, plus the tag.
const BLOCK_REMOVED_MAX_ENTRIES: usize = 6;

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
            // type, the seven required fields, extra_keys, group_idx (vLLM sets both; the
            // cache-spec, locality, ownership, session and lookahead fields stay unset).
            let has_extra = !extra_keys.is_empty();
            map_header(w, 9 + usize::from(has_extra), BLOCK_STORED_MAX_ENTRIES);
            s(w, "type");
            s(w, "BlockStored");
            s(w, "block_hashes");
            hashes(w, block_hashes, wire);
            s(w, "parent_block_hash");
            match parent_block_hash {
                Some(h) => hash(w, h, wire),
                None => nil(w),
            }
            s(w, "token_ids");
            arr(w, token_ids.len());
            for &t in token_ids {
                uint(w, t.into());
            }
            s(w, "block_size");
            uint(w, *block_size as u64);
            s(w, "lora_id");
            nil(w); // aphro has no numeric adapter ids (vLLM deprecates them too).
            s(w, "medium");
            s(w, MEDIUM);
            s(w, "lora_name");
            opt_str(w, lora_name.as_deref());
            if has_extra {
                s(w, "extra_keys");
                arr(w, extra_keys.len());
                for keys in extra_keys {
                    match keys {
                        None => nil(w),
                        Some(keys) => {
                            arr(w, keys.len());
                            for k in keys {
                                match k.event_form() {
                                    EventKey::Str(v) => s(w, v),
                                    EventKey::Mm(id, off) => {
                                        arr(w, 2);
                                        s(w, id);
                                        sint(w, off);
                                    }
                                    EventKey::Bytes(b) => bin(w, b),
                                }
                            }
                        }
                    }
                }
            }
            s(w, "group_idx");
            uint(w, GROUP_IDX);
        }
        KvEvent::BlockRemoved { block_hashes } => {
            map_header(w, 4, BLOCK_REMOVED_MAX_ENTRIES);
            s(w, "type");
            s(w, "BlockRemoved");
            s(w, "block_hashes");
            hashes(w, block_hashes, wire);
            s(w, "medium");
            s(w, MEDIUM);
            s(w, "group_idx");
            uint(w, GROUP_IDX);
        }
        KvEvent::AllBlocksCleared => {
            map_header(w, 1, 1);
            s(w, "type");
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
pub(crate) mod tests {
    use super::*;
    use crate::kv_hash::HashAlgo;

    fn hex(b: &[u8]) -> String {
        let mut v = Vec::new();
        write_hex(&mut v, b).expect("vec");
        String::from_utf8(v).expect("ascii")
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// One case of `testdata/kv_events/vllm_0.33.0.json` (`scripts/make_kv_event_goldens.py`).
    pub(crate) struct Golden {
        pub name: String,
        pub algo: HashAlgo,
        pub seed: Option<String>,
        pub block_size: usize,
        pub tokens: Vec<u32>,
        pub none_hash: String,
        pub block_hashes: Vec<String>,
        lora: Option<(String, String)>,
        salt: Option<String>,
        mm: Vec<crate::kv_hash::MmPosition>,
        payload_int: String,
        payload_bytes: String,
    }

    impl Golden {
        /// The case's extra keys of block `i`, as vLLM made them: LoRA, the images in the
        /// block, then the salt on block 0.
        pub fn extra_keys(&self, i: usize) -> Option<Vec<ExtraKey>> {
            let mut keys = Vec::new();
            if let Some((name, path)) = &self.lora {
                keys.push(ExtraKey::Lora {
                    name: name.clone(),
                    path: path.clone(),
                });
            }
            let bs = self.block_size;
            keys.extend(crate::kv_hash::mm_extra_keys(
                &self.mm,
                i * bs,
                (i + 1) * bs,
            ));
            if let (Some(salt), 0) = (&self.salt, i) {
                keys.push(ExtraKey::CacheSalt(salt.clone()));
            }
            (!keys.is_empty()).then_some(keys)
        }
    }

    pub(crate) fn goldens() -> Vec<Golden> {
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../../testdata/kv_events/vllm_0.33.0.json"))
                .expect("golden json");
        let str_of = |c: &serde_json::Value, k: &str| c[k].as_str().map(str::to_owned);
        v["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .map(|c| Golden {
                name: str_of(c, "name").expect("name"),
                algo: c["algo"].as_str().expect("algo").parse().expect("algo"),
                seed: str_of(c, "seed"),
                block_size: c["block_size"].as_u64().expect("bs") as usize,
                tokens: c["tokens"]
                    .as_array()
                    .expect("tokens")
                    .iter()
                    .map(|t| t.as_u64().expect("token") as u32)
                    .collect(),
                none_hash: str_of(c, "none_hash").expect("none"),
                block_hashes: c["block_hashes"]
                    .as_array()
                    .expect("hashes")
                    .iter()
                    .map(|h| h.as_str().expect("hash").to_owned())
                    .collect(),
                lora: c["lora"].as_array().map(|l| {
                    (
                        l[0].as_str().expect("name").to_owned(),
                        l[1].as_str().expect("path").to_owned(),
                    )
                }),
                salt: str_of(c, "salt"),
                mm: c["mm"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|m| crate::kv_hash::MmPosition {
                        identifier: m[0].as_str().expect("id").to_owned(),
                        offset: m[1].as_u64().expect("offset") as usize,
                        length: m[2].as_u64().expect("length") as usize,
                    })
                    .collect(),
                payload_int: str_of(&c["payload"], "int").expect("int"),
                payload_bytes: str_of(&c["payload"], "bytes").expect("bytes"),
            })
            .collect()
    }

    /// The generator's batch: blocks 1.. stored with block 0 as their parent (or block 0
    /// alone), block 0 removed, then a reset.
    fn golden_batch(c: &Golden, rank: Option<i64>) -> KvEventBatch {
        let hashes: Vec<BlockHash> = c
            .block_hashes
            .iter()
            .map(|h| unhex(h).try_into().expect("32 bytes"))
            .collect();
        let bs = c.block_size;
        let first = usize::from(hashes.len() > 1);
        KvEventBatch {
            ts: 1764950400.5,
            events: vec![
                KvEvent::BlockStored {
                    block_hashes: hashes[first..].to_vec(),
                    parent_block_hash: (first == 1).then_some(hashes[0]),
                    token_ids: c.tokens[first * bs..].to_vec(),
                    block_size: bs,
                    lora_name: c.lora.as_ref().map(|l| l.0.clone()),
                    extra_keys: (first..hashes.len()).map(|i| c.extra_keys(i)).collect(),
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![hashes[0]],
                },
                KvEvent::AllBlocksCleared,
            ],
            data_parallel_rank: rank,
        }
    }

    #[test]
    fn batches_equal_vllm_msgspec_bytes() {
        for c in goldens() {
            let int = golden_batch(&c, None).encode(HashWire::Int);
            assert_eq!(hex(&int), c.payload_int, "{} (int hashes)", c.name);
            let bytes = golden_batch(&c, Some(1)).encode(HashWire::Bytes);
            assert_eq!(hex(&bytes), c.payload_bytes, "{} (bytes hashes)", c.name);
        }
    }

    #[test]
    fn a_multimodal_key_is_published_as_identifier_and_offset() {
        let b = KvEventBatch {
            ts: 0.0,
            events: vec![KvEvent::BlockStored {
                block_hashes: vec![[1; 32]],
                parent_block_hash: None,
                token_ids: vec![],
                block_size: 0,
                lora_name: None,
                extra_keys: vec![Some(vec![ExtraKey::Mm("m".into(), -2)])],
            }],
            data_parallel_rank: None,
        };
        let got = hex(&b.encode(HashWire::Int));
        // extra_keys = [[["m", -2]]]
        assert!(
            got.contains(
                "aa65787472615f6b657973 91 91 92a16dfe"
                    .replace(' ', "")
                    .as_str()
            ),
            "{got}"
        );
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
