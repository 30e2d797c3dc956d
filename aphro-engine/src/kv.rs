//! Paged KV block manager: reference-counted fixed-size blocks, per-sequence block tables,
//! automatic prefix caching by chained block hashes with LRU eviction, and copy-on-write
//! for partially filled blocks shared after an `n > 1` fork.
//!
//! The manager only does bookkeeping on block ids; the runner owns the memory. A block is
//! in exactly one of three states: in use (`ref_count > 0`), free-cached (`ref_count == 0`
//! with a hash, reusable by a later prefix hit until evicted, oldest first), or free.

use std::collections::{BTreeMap, HashMap};

use crate::kv_events::KvEvent;
pub use crate::kv_hash::{BlockHash, BlockHasher, ExtraKey, HashAlgo, MmPosition};
use std::sync::Arc;

#[derive(Debug, Clone, Default)]
struct BlockMeta {
    ref_count: u32,
    /// Set once the block is full, its K/V written and it is registered in the cache.
    hash: Option<BlockHash>,
    /// Parent hash and tokens, kept to rule out hash collisions on lookup.
    parent: Option<BlockHash>,
    tokens: Vec<u32>,
    /// Position in the eviction LRU while free-cached.
    lru_tick: Option<u64>,
}

/// The blocks of one sequence.
#[derive(Debug, Clone, Default)]
pub struct SeqBlocks {
    pub table: Vec<u32>,
    /// Leading blocks already registered in (or checked against) the prefix cache.
    hashed: usize,
    /// Hash of the last block counted in `hashed` (`None` while none is).
    last_hash: Option<BlockHash>,
    /// The request's `cache_salt`: an extra hash key of the first block only.
    salt: Option<String>,
    /// The request's LoRA adapter (name, path): an extra hash key of every block.
    lora: Option<(String, String)>,
    /// The prompt's multimodal items, by position: extra hash keys of the blocks they touch.
    mm: Arc<[MmPosition]>,
}

impl SeqBlocks {
    /// An empty sequence whose first block's hash includes `salt` (vLLM's `cache_salt`,
    /// `endpoints.md §4.5`): blocks are shared only under the same salt.
    pub fn salted(salt: Option<&str>) -> Self {
        Self::with_keys(salt, None)
    }

    /// An empty sequence with its request's `cache_salt` and LoRA adapter (name, path), the
    /// extra keys vLLM mixes into block hashes.
    pub fn with_keys(salt: Option<&str>, lora: Option<(&str, &str)>) -> Self {
        Self {
            salt: salt.map(str::to_owned),
            lora: lora.map(|(n, p)| (n.to_owned(), p.to_owned())),
            ..Self::default()
        }
    }

    /// The same sequence with its prompt's multimodal items (sorted by offset), so blocks
    /// holding placeholders of different images never share a hash (vLLM's `mm_features`).
    pub fn with_mm(mut self, mm: Arc<[MmPosition]>) -> Self {
        self.mm = mm;
        self
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// vLLM's `generate_block_hash_extra_keys` for block `i` of `block_size` tokens: LoRA,
    /// the multimodal items in the block, then the salt on the first block only; `None`
    /// when empty.
    fn extra_keys(&self, i: usize, block_size: usize) -> Option<Vec<ExtraKey>> {
        let mut keys = Vec::new();
        if let Some((name, path)) = &self.lora {
            keys.push(ExtraKey::Lora {
                name: name.clone(),
                path: path.clone(),
            });
        }
        if !self.mm.is_empty() {
            keys.extend(crate::kv_hash::mm_extra_keys(
                &self.mm,
                i * block_size,
                (i + 1) * block_size,
            ));
        }
        if i == 0 {
            if let Some(s) = &self.salt {
                keys.push(ExtraKey::CacheSalt(s.clone()));
            }
        }
        (!keys.is_empty()).then_some(keys)
    }
}

/// Blocks one `commit` adds to the cache in a row: one `BlockStored` event.
#[derive(Default)]
struct StoredRun {
    parent: Option<BlockHash>,
    hashes: Vec<BlockHash>,
    tokens: Vec<u32>,
    extra: Vec<Option<Vec<ExtraKey>>>,
}

/// Not enough free blocks for an allocation; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBlocks;

/// Prefix-cache counters, in tokens (vLLM's `prefix_cache_queries/hits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub queries: u64,
    pub hits: u64,
}

#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    blocks: Vec<BlockMeta>,
    free: Vec<u32>,
    /// Free-cached blocks by last use (oldest first).
    evictable: BTreeMap<u64, u32>,
    cached: HashMap<BlockHash, u32>,
    tick: u64,
    caching: bool,
    stats: PrefixCacheStats,
    /// Copy-on-write copies the runner must perform before the next step.
    pending_copies: Vec<(u32, u32)>,
    hasher: BlockHasher,
    /// KV-cache events since the last `take_events`, when events are enabled.
    events: Option<Vec<KvEvent>>,
}

impl BlockManager {
    /// A manager hashing blocks with vLLM's default algorithm and `NONE_HASH` from
    /// `PYTHONHASHSEED`.
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        Self::with_hasher(
            num_blocks,
            block_size,
            enable_prefix_caching,
            BlockHasher::from_env(HashAlgo::default()),
        )
    }

    pub fn with_hasher(
        num_blocks: usize,
        block_size: usize,
        enable_prefix_caching: bool,
        hasher: BlockHasher,
    ) -> Self {
        Self {
            hasher,
            events: None,
            block_size,
            blocks: vec![BlockMeta::default(); num_blocks],
            // Pop from the end: hand out low ids first.
            free: (0..num_blocks as u32).rev().collect(),
            evictable: BTreeMap::new(),
            cached: HashMap::new(),
            tick: 0,
            caching: enable_prefix_caching,
            stats: PrefixCacheStats::default(),
            pending_copies: Vec::new(),
        }
    }

    /// Record KV-cache events (`endpoints.md §4.3`) from now on; `take_events` drains them.
    pub fn enable_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The events since the last call (empty when events are off).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub fn hasher(&self) -> &BlockHasher {
        &self.hasher
    }

    /// Drop every cached prefix (vLLM's `reset_prefix_cache`). Refused (`false`) while any
    /// block is in use, as in vLLM, since running sequences still reference their hashes.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_in_use() > 0 {
            return false;
        }
        for (_, b) in std::mem::take(&mut self.evictable) {
            let meta = &mut self.blocks[b as usize];
            meta.hash = None;
            meta.lru_tick = None;
            meta.parent = None;
            meta.tokens.clear();
            self.free.push(b);
        }
        self.cached.clear();
        // Hand out low ids first again.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
        if let Some(ev) = &mut self.events {
            ev.push(KvEvent::AllBlocksCleared);
        }
        true
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be handed out now (free + free-cached).
    pub fn num_available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn num_in_use(&self) -> usize {
        self.num_blocks() - self.num_available()
    }

    /// Free blocks still holding cached prefixes.
    pub fn num_cached_free(&self) -> usize {
        self.evictable.len()
    }

    /// Fraction of blocks in use (vLLM `kv_cache_usage_perc`, 0..1).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            0.0
        } else {
            self.num_in_use() as f64 / self.num_blocks() as f64
        }
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    pub fn take_pending_copies(&mut self) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.pending_copies)
    }

    /// Reference count of a block (for tests and assertions).
    pub fn ref_count(&self, block: u32) -> u32 {
        self.blocks.get(block as usize).map_or(0, |b| b.ref_count)
    }

    fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size)
    }

    /// Reuse cached full blocks for a sequence that owns no blocks yet. Returns the number of
    /// leading tokens whose K/V are already in the cache. At least one token is always left
    /// to compute, since the step needs the last position's logits.
    pub fn match_prefix(&mut self, seq: &mut SeqBlocks, tokens: &[u32]) -> usize {
        assert!(seq.is_empty());
        if !self.caching || tokens.is_empty() {
            return 0;
        }
        self.stats.queries += tokens.len() as u64;
        let max_blocks = (tokens.len() - 1) / self.block_size;
        let mut parent = seq.last_hash;
        for (i, chunk) in tokens
            .chunks_exact(self.block_size)
            .take(max_blocks)
            .enumerate()
        {
            let h = self.hasher.hash_block(
                parent.as_ref(),
                chunk,
                seq.extra_keys(i, self.block_size).as_deref(),
            );
            let Some(&b) = self.cached.get(&h) else { break };
            let meta = &self.blocks[b as usize];
            if meta.parent != parent || meta.tokens != chunk {
                break; // A hash collision: treat as a miss.
            }
            self.acquire(b);
            seq.table.push(b);
            parent = Some(h);
        }
        seq.hashed = seq.table.len();
        seq.last_hash = parent;
        let hit = seq.table.len() * self.block_size;
        self.stats.hits += hit as u64;
        hit
    }

    fn acquire(&mut self, b: u32) {
        let meta = &mut self.blocks[b as usize];
        if meta.ref_count == 0 {
            if let Some(t) = meta.lru_tick.take() {
                self.evictable.remove(&t);
            }
        }
        meta.ref_count += 1;
    }

    /// A fresh block with `ref_count == 1`, evicting the oldest free-cached block if needed.
    fn pop_block(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first()?;
                let meta = &mut self.blocks[b as usize];
                if let Some(h) = meta.hash.take() {
                    if self.cached.get(&h) == Some(&b) {
                        self.cached.remove(&h);
                        if let Some(ev) = &mut self.events {
                            ev.push(KvEvent::BlockRemoved {
                                block_hashes: vec![h],
                            });
                        }
                    }
                }
                meta.lru_tick = None;
                meta.parent = None;
                meta.tokens.clear();
                b
            }
        };
        self.blocks[b as usize].ref_count = 1;
        Some(b)
    }

    /// Make `seq` able to hold K/V for positions `0..new_len`, where positions
    /// `0..num_computed` are already written. Copies a shared partial block first (COW) if
    /// the step writes into it. All-or-nothing.
    pub fn allocate(
        &mut self,
        seq: &mut SeqBlocks,
        num_computed: usize,
        new_len: usize,
    ) -> Result<(), OutOfBlocks> {
        let needed_total = self.blocks_for(new_len);
        let grow = needed_total.saturating_sub(seq.table.len());
        // Writing into a partially filled block that another sequence also references.
        let cow_idx = (!num_computed.is_multiple_of(self.block_size) && new_len > num_computed)
            .then_some(num_computed / self.block_size)
            .filter(|&i| {
                seq.table
                    .get(i)
                    .is_some_and(|&b| self.blocks[b as usize].ref_count > 1)
            });
        let want = grow + usize::from(cow_idx.is_some());
        if want > self.num_available() {
            return Err(OutOfBlocks);
        }
        if let Some(i) = cow_idx {
            let src = seq.table[i];
            let dst = self.pop_block().ok_or(OutOfBlocks)?;
            self.blocks[src as usize].ref_count -= 1;
            seq.table[i] = dst;
            self.pending_copies.push((src, dst));
        }
        for _ in 0..grow {
            let b = self.pop_block().ok_or(OutOfBlocks)?;
            seq.table.push(b);
        }
        Ok(())
    }

    /// Register the sequence's newly completed full blocks in the prefix cache. `tokens` are
    /// the sequence's tokens and `num_computed` how many of them now have K/V written.
    pub fn commit(&mut self, seq: &mut SeqBlocks, tokens: &[u32], num_computed: usize) {
        if !self.caching {
            return;
        }
        let full = (num_computed.min(tokens.len()) / self.block_size).min(seq.table.len());
        // One BlockStored per run of blocks this call adds to the cache, as vLLM's
        // `cache_full_blocks` reports them (`endpoints.md §4.3`).
        let mut run: Option<StoredRun> = None;
        while seq.hashed < full {
            let i = seq.hashed;
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let extra = seq.extra_keys(i, self.block_size);
            let h = self
                .hasher
                .hash_block(seq.last_hash.as_ref(), chunk, extra.as_deref());
            let b = seq.table[i];
            if !self.cached.contains_key(&h) && self.blocks[b as usize].hash.is_none() {
                let meta = &mut self.blocks[b as usize];
                meta.hash = Some(h);
                meta.parent = seq.last_hash;
                meta.tokens.clear();
                meta.tokens.extend_from_slice(chunk);
                self.cached.insert(h, b);
                if self.events.is_some() {
                    let r = run.get_or_insert_with(|| StoredRun {
                        parent: seq.last_hash,
                        ..StoredRun::default()
                    });
                    r.hashes.push(h);
                    r.tokens.extend_from_slice(chunk);
                    r.extra.push(extra);
                }
            } else if let Some(r) = run.take() {
                // Otherwise an identical block was computed concurrently: ours stays
                // private, and the run of newly stored blocks ends here.
                self.push_stored(r, seq);
            }
            seq.last_hash = Some(h);
            seq.hashed += 1;
        }
        if let Some(r) = run {
            self.push_stored(r, seq);
        }
    }

    fn push_stored(&mut self, r: StoredRun, seq: &SeqBlocks) {
        if let Some(ev) = &mut self.events {
            ev.push(KvEvent::BlockStored {
                block_hashes: r.hashes,
                parent_block_hash: r.parent,
                token_ids: r.tokens,
                block_size: self.block_size,
                lora_name: seq.lora.as_ref().map(|l| l.0.clone()),
                extra_keys: r.extra,
            });
        }
    }

    /// Share all of `parent`'s blocks with a new sequence (n > 1 fork).
    pub fn fork(&mut self, parent: &SeqBlocks) -> SeqBlocks {
        for &b in &parent.table {
            self.blocks[b as usize].ref_count += 1;
        }
        parent.clone()
    }

    /// Release a sequence's blocks. Tail blocks are freed first so they are evicted first.
    pub fn free(&mut self, seq: &mut SeqBlocks) {
        for &b in seq.table.iter().rev() {
            let meta = &mut self.blocks[b as usize];
            assert!(meta.ref_count > 0, "double free of block {b}");
            meta.ref_count = meta.ref_count.saturating_sub(1);
            if meta.ref_count == 0 {
                if meta.hash.is_some() {
                    self.tick += 1;
                    meta.lru_tick = Some(self.tick);
                    self.evictable.insert(self.tick, b);
                } else {
                    self.free.push(b);
                }
            }
        }
        // A preempted sequence is computed again under its own salt, LoRA and images.
        *seq = SeqBlocks {
            salt: seq.salt.take(),
            lora: seq.lora.take(),
            mm: std::mem::take(&mut seq.mm),
            ..SeqBlocks::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_salt_separates_prefix_hits() {
        let mut m = BlockManager::new(16, 4, true);
        let toks: Vec<u32> = (0..10).collect();
        let fill = |m: &mut BlockManager, salt: Option<&str>| {
            let mut s = SeqBlocks::salted(salt);
            let hit = m.match_prefix(&mut s, &toks);
            m.allocate(&mut s, hit, 10).expect("room");
            m.commit(&mut s, &toks, 10);
            (hit, s)
        };
        let (hit, mut a) = fill(&mut m, Some("tenant-a"));
        assert_eq!(hit, 0);
        // Same prompt, other salt or none: nothing shared.
        let (hit, mut b) = fill(&mut m, Some("tenant-b"));
        assert_eq!(hit, 0);
        let (hit, mut c) = fill(&mut m, None);
        assert_eq!(hit, 0);
        // Same salt: both full blocks hit.
        let (hit, mut d) = fill(&mut m, Some("tenant-a"));
        assert_eq!(hit, 8);
        for s in [&mut a, &mut b, &mut c, &mut d] {
            m.free(s);
        }
        // A freed (preempted) sequence keeps its salt.
        assert_eq!(m.match_prefix(&mut a, &toks), 8);
    }

    #[test]
    fn prefix_hits_reuse_full_blocks_and_lru_evicts_oldest() {
        let mut m = BlockManager::new(6, 4, true);
        let toks: Vec<u32> = (0..10).collect();
        let mut a = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut a, &toks), 0);
        m.allocate(&mut a, 0, 10).expect("room");
        m.commit(&mut a, &toks, 10);
        let a_table = a.table.clone();
        // A second sequence with the same prompt shares the two full blocks.
        let mut b = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut b, &toks), 8);
        assert_eq!(b.table, a_table[..2]);
        assert_eq!(m.ref_count(a_table[0]), 2);
        m.free(&mut a);
        m.free(&mut b);
        assert_eq!(m.num_in_use(), 0);
        assert_eq!(m.num_cached_free(), 2);
        // Prompt of exactly 8 tokens: only the first block may hit (one token left to run).
        let mut c = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut c, &toks[..8]), 4);
        m.free(&mut c);
        // Filling the cache evicts the cached blocks; the old prefix then misses.
        let mut d = SeqBlocks::default();
        m.allocate(&mut d, 0, 24).expect("all six blocks");
        assert_eq!(m.num_available(), 0);
        assert_eq!(
            m.allocate(&mut SeqBlocks::default(), 0, 1),
            Err(OutOfBlocks)
        );
        m.free(&mut d);
        let mut e = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut e, &toks), 0);
        let s = m.prefix_cache_stats();
        assert_eq!((s.queries, s.hits), (38, 12));
    }

    #[test]
    fn eviction_takes_the_least_recently_freed_block() {
        let mut m = BlockManager::new(4, 2, true);
        let (a, b) = ([1, 2, 3], [5, 6, 7]);
        for toks in [&a, &b] {
            let mut s = SeqBlocks::default();
            m.allocate(&mut s, 0, 3).expect("room");
            m.commit(&mut s, toks, 3);
            m.free(&mut s);
        }
        assert_eq!(m.num_cached_free(), 2);
        // Three fresh blocks: two free ones, then one eviction, which must hit A (older).
        let mut d = SeqBlocks::default();
        m.allocate(&mut d, 0, 6).expect("room");
        m.free(&mut d);
        let mut s = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut s, &a), 0);
        assert_eq!(m.match_prefix(&mut s, &b), 2);
    }

    #[test]
    fn fork_then_write_copies_the_shared_partial_block() {
        let mut m = BlockManager::new(8, 4, false);
        let mut a = SeqBlocks::default();
        m.allocate(&mut a, 0, 6).expect("room");
        let mut b = m.fork(&a);
        assert_eq!(m.ref_count(a.table[1]), 2);
        // `a` writes position 6 into the shared partial block 1: copy first.
        m.allocate(&mut a, 6, 7).expect("room");
        let copies = m.take_pending_copies();
        assert_eq!(copies, vec![(b.table[1], a.table[1])]);
        assert_ne!(a.table[1], b.table[1]);
        assert_eq!(a.table[0], b.table[0]);
        // `b` is now the only owner: writes in place.
        m.allocate(&mut b, 6, 7).expect("room");
        assert!(m.take_pending_copies().is_empty());
        m.free(&mut a);
        m.free(&mut b);
        assert_eq!(m.num_in_use(), 0);
    }

    fn events_manager(blocks: usize, bs: usize) -> BlockManager {
        let mut m = BlockManager::with_hasher(
            blocks,
            bs,
            true,
            BlockHasher::new(HashAlgo::Sha256Cbor, Some("0")),
        );
        m.enable_events();
        m
    }

    #[test]
    fn events_report_stores_evictions_and_resets_with_the_cache_hashes() {
        let mut m = events_manager(3, 16);
        let h = BlockHasher::new(HashAlgo::Sha256Cbor, Some("0"));
        let toks: Vec<u32> = (1..=40).collect();
        let mut a = SeqBlocks::default();
        m.allocate(&mut a, 0, 40).expect("room");
        // Prefill in two chunks: block 0, then block 1 with block 0 as its parent.
        m.commit(&mut a, &toks, 20);
        m.commit(&mut a, &toks, 40);
        let b0 = h.hash_block(None, &toks[..16], None);
        let b1 = h.hash_block(Some(&b0), &toks[16..32], None);
        assert_eq!(
            m.take_events(),
            vec![
                KvEvent::BlockStored {
                    block_hashes: vec![b0],
                    parent_block_hash: None,
                    token_ids: toks[..16].to_vec(),
                    block_size: 16,
                    lora_name: None,
                    extra_keys: vec![None],
                },
                KvEvent::BlockStored {
                    block_hashes: vec![b1],
                    parent_block_hash: Some(b0),
                    token_ids: toks[16..32].to_vec(),
                    block_size: 16,
                    lora_name: None,
                    extra_keys: vec![None],
                },
            ]
        );
        // The vLLM test vectors: the event hashes are the cache's own keys.
        assert_eq!(crate::kv_hash::hash_to_u64(&b0), 3236607068019569386);
        assert_eq!(crate::kv_hash::hash_to_u64(&b1), 2758186210834249151);
        assert!(m.cached.contains_key(&b0) && m.cached.contains_key(&b1));
        // A hit stores nothing new.
        m.free(&mut a);
        let mut b = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut b, &toks), 32);
        m.commit(&mut b, &toks, 32);
        assert!(m.take_events().is_empty());
        m.free(&mut b);
        // A reset is refused while blocks are in use, and reported once done.
        let mut c = SeqBlocks::default();
        m.allocate(&mut c, 0, 1).expect("room");
        assert!(!m.reset_prefix_cache());
        m.free(&mut c);
        // Needing all three blocks evicts the two cached ones, oldest (tail-first) first.
        let mut d = SeqBlocks::default();
        m.allocate(&mut d, 0, 48).expect("room");
        assert_eq!(
            m.take_events(),
            vec![
                KvEvent::BlockRemoved {
                    block_hashes: vec![b1]
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![b0]
                },
            ]
        );
        m.free(&mut d);
        assert!(m.reset_prefix_cache());
        assert_eq!(m.take_events(), vec![KvEvent::AllBlocksCleared]);
        assert_eq!(m.num_available(), 3);
    }

    #[test]
    fn salt_and_lora_are_extra_keys_of_the_hash_and_the_event() {
        let mut m = events_manager(4, 4);
        let h = BlockHasher::new(HashAlgo::Sha256Cbor, Some("0"));
        let toks: Vec<u32> = (0..9).collect();
        let mut s = SeqBlocks::with_keys(Some("salt"), Some(("my-lora", "/lora")));
        m.allocate(&mut s, 0, 9).expect("room");
        m.commit(&mut s, &toks, 9);
        let lora = ExtraKey::Lora {
            name: "my-lora".into(),
            path: "/lora".into(),
        };
        let k0 = vec![lora.clone(), ExtraKey::CacheSalt("salt".into())];
        let k1 = vec![lora];
        let b0 = h.hash_block(None, &toks[..4], Some(&k0));
        let b1 = h.hash_block(Some(&b0), &toks[4..8], Some(&k1));
        assert_eq!(
            m.take_events(),
            vec![KvEvent::BlockStored {
                block_hashes: vec![b0, b1],
                parent_block_hash: None,
                token_ids: toks[..8].to_vec(),
                block_size: 4,
                lora_name: Some("my-lora".into()),
                extra_keys: vec![Some(k0), Some(k1)],
            }]
        );
        // Without events enabled nothing is recorded.
        let mut quiet = BlockManager::new(4, 4, true);
        let mut q = SeqBlocks::default();
        quiet.allocate(&mut q, 0, 9).expect("room");
        quiet.commit(&mut q, &toks, 9);
        assert!(quiet.take_events().is_empty());
    }

    /// The same placeholder tokens behind two different images: the blocks they touch hash
    /// (and so cache) apart, the text before them is shared, and the same image hits.
    #[test]
    fn images_behind_the_same_placeholders_never_share_blocks() {
        let mut m = events_manager(16, 4);
        // Text 0..3, then an image's 6 pads (offset 3, blocks 0 and 1), then text.
        let toks: Vec<u32> = [1, 2, 3, 9, 9, 9, 9, 9, 9, 4, 5, 6, 7].to_vec();
        let image = |id: &str| -> Arc<[MmPosition]> {
            vec![MmPosition {
                identifier: id.into(),
                offset: 3,
                length: 6,
            }]
            .into()
        };
        let run = |m: &mut BlockManager, id: &str| {
            let mut s = SeqBlocks::default().with_mm(image(id));
            let hit = m.match_prefix(&mut s, &toks);
            let have = s.table.len() * 4;
            m.allocate(&mut s, have, toks.len()).expect("room");
            m.commit(&mut s, &toks, toks.len());
            let events = m.take_events();
            m.free(&mut s);
            (hit, events)
        };
        let (hit, events) = run(&mut m, "hash-a");
        assert_eq!(hit, 0);
        let KvEvent::BlockStored {
            block_hashes,
            extra_keys,
            ..
        } = &events[0]
        else {
            panic!("stored first: {events:?}")
        };
        // vLLM's keys: the image's offset relative to each block's start.
        assert_eq!(
            extra_keys,
            &vec![
                Some(vec![ExtraKey::Mm("hash-a".into(), 3)]),
                Some(vec![ExtraKey::Mm("hash-a".into(), -1)]),
                Some(vec![ExtraKey::Mm("hash-a".into(), -5)]),
            ]
        );
        let h = BlockHasher::new(HashAlgo::Sha256Cbor, Some("0"));
        let a0 = h.hash_block(None, &toks[..4], extra_keys[0].as_deref());
        assert_eq!(block_hashes[0], a0);
        assert_ne!(a0, h.hash_block(None, &toks[..4], None));
        // The same image: a hit on all three full blocks but the last token's.
        assert_eq!(run(&mut m, "hash-a").0, 12);
        // Another image with identical tokens: nothing is shared, its blocks are new.
        let (hit, events) = run(&mut m, "hash-b");
        assert_eq!(hit, 0);
        let KvEvent::BlockStored {
            block_hashes: b, ..
        } = &events[0]
        else {
            panic!("stored: {events:?}")
        };
        assert!(b.iter().all(|x| !block_hashes.contains(x)));
        // Text-only blocks before an image are shared: the image starts in block 1 here.
        let later = |id: &str| -> Arc<[MmPosition]> {
            vec![MmPosition {
                identifier: id.into(),
                offset: 5,
                length: 4,
            }]
            .into()
        };
        let toks2: Vec<u32> = [1, 2, 3, 4, 9, 9, 9, 9, 9, 7].to_vec();
        let mut a = SeqBlocks::default().with_mm(later("x"));
        m.allocate(&mut a, 0, toks2.len()).expect("room");
        m.commit(&mut a, &toks2, toks2.len());
        m.free(&mut a);
        let mut b = SeqBlocks::default().with_mm(later("y"));
        assert_eq!(m.match_prefix(&mut b, &toks2), 4);
        m.free(&mut b);
    }
}
