//! Causal paged attention on the CPU, tiled flash-attention style.
//!
//! A naive kernel reads every key and value of the context once per query row: a 4k-token
//! prefill streams the cache 4k times per layer and spends as long in `exp` as in the dot
//! products. Here a *block* of query rows (the query heads of one KV head) walks the context
//! one key tile at a time: scores come from a register-blocked kernel (eight queries by
//! 32 keys per step with AVX-512, four by sixteen with AVX2), softmax is computed online
//! (running max and sum per query, the output rescaled when the max grows) with a
//! vectorised `exp`, and the weighted values from a second register-blocked kernel. The
//! result equals softmax(QKᵀ)V within float rounding; `tests` hold it to the burn-op
//! reference. A bf16 cache on a CPU with AVX-512 BF16 takes `bf16_dot`'s kernels instead,
//! which multiply bf16 pairs (twice the multiply-adds per instruction) with the queries and
//! weights rounded to bf16.
//!
//! **The CPU key layout.** Each cache block keeps its keys transposed: the block's
//! `block_size * kv_dim` floats are `[kv_dim][block_size]` (dimension-major), written by
//! [`write_keys`]. Sixteen consecutive keys of a head are then sixteen contiguous floats per
//! dimension, exactly the operand of the score kernel, so neither prefill nor decode copies
//! or transposes keys on the hot path (a decode row used to spend most of its time doing
//! that). Values keep the token-major layout, which is what the value kernel reads. A block
//! stays one contiguous run of `block_size` cache rows, so copying whole blocks row by row
//! needs no layout knowledge.
//!
//! **Invariant: a query's result does not depend on how its sequence was chunked or batched.**
//! Key tiles start at absolute positions (0, 64, 128, ...) and each query's running max, sum
//! and output see them in that order with the same operations, whatever rows share its block.
//! So a prompt prefilled in one step, in paced chunks, or over prefix-cached blocks, and then
//! decoded, gives bit-identical logits; seeded sampling repeats across those paths. Decode
//! rows take this kernel too, for that reason.
use super::cpu::{exp_in_place, exp_scalar};
use super::ops::{AttnSeq, AttnShape};
use rayon::prelude::*;

/// Query rows per task. With a GQA group of `g` heads a task holds `QUERY_ROWS * g` queries.
const QUERY_ROWS: usize = 16;
/// Query rows per task on the bf16 dot-product path: twice as many queries share each
/// tile's repacking, which cost a sixth of that path's time at 16 rows.
const QUERY_ROWS_BF16_DOT: usize = 32;
/// Keys per tile: 64 scores of one query fit in 8 AVX registers.
const KEY_TILE: usize = 64;

/// Attention of every query row of `seqs`: `[tokens, heads * d]` for the `tokens = q.len() /
/// (heads * d)` rows of `q`; rows no sequence owns stay zero.
pub fn paged_attention<T: KvElement>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    seqs: &[AttnSeq<'_>],
    shape: &AttnShape,
) -> Vec<f32> {
    paged_attention_with_sinks(q, k_cache, v_cache, seqs, shape, None)
}

/// [`paged_attention`] with attention sinks (GPT-OSS): `sinks[h]` is one more logit in
/// every softmax denominator of query head `h`, with no value (the weights sum to < 1).
/// It joins each query's softmax state after all keys, as one more merged segment.
pub fn paged_attention_with_sinks<T: KvElement>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    seqs: &[AttnSeq<'_>],
    shape: &AttnShape,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let (h, kvh, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let qdim = h * d;
    if qdim == 0 || kvh == 0 {
        return Vec::new();
    }
    let mut out = vec![0f32; q.len() / qdim * qdim];
    let group = h / kvh;
    let threads = rayon::current_num_threads();
    let query_rows = if bf16_dot::usable::<T>(d) {
        QUERY_ROWS_BF16_DOT
    } else {
        QUERY_ROWS
    };
    // Query blocks: (sequence, first row, KV head).
    let mut blocks = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        for r0 in (0..s.q_len).step_by(query_rows) {
            for kv in 0..kvh {
                blocks.push((si, r0, kv));
            }
        }
    }
    // Few blocks (a decode or two, perhaps beside a one-row prefill chunk) would leave
    // threads idle or unbalanced on a long context: then each block's segments are separate
    // tasks, merged below in order. A query's arithmetic is the same either way (see the
    // invariant above).
    let split = blocks.len() < 4 * threads;
    let mut spans = Vec::new();
    for &(si, r0, kv) in &blocks {
        let s = &seqs[si];
        let ctx = s.start_pos + r0 + query_rows.min(s.q_len - r0);
        let segments = ctx.div_ceil(SEGMENT);
        if split {
            spans.extend((0..segments).map(|seg| (si, r0, kv, seg..seg + 1)));
        } else {
            spans.push((si, r0, kv, 0..segments));
        }
    }
    // Still too few (short contexts): one task per query head instead of per group.
    let heads_per_task = if spans.len() < 2 * threads { 1 } else { group };
    let mut tasks = Vec::with_capacity(spans.len() * group / heads_per_task);
    for (si, r0, kv, segs) in spans {
        for h0 in (0..group).step_by(heads_per_task) {
            tasks.push((si, r0, kv, h0, segs.clone()));
        }
    }
    // Longest contexts first, so the causal triangle's expensive blocks do not straggle.
    tasks.sort_by_key(|(si, r0, _, _, segs)| {
        std::cmp::Reverse((seqs[*si].start_pos + r0).min(segs.end * SEGMENT))
    });
    let mut results: Vec<(BlockKey, usize, Partial)> = tasks
        .into_par_iter()
        .map(|(si, r0, kv, h0, segs)| {
            let s = &seqs[si];
            let block = QueryBlock {
                q,
                qdim,
                seq: s,
                first_row: r0,
                rows: query_rows.min(s.q_len - r0),
                kv_head: kv,
                first_head: h0,
                heads: heads_per_task,
                segments: segs.clone(),
                shape,
            };
            ((si, r0, kv, h0), segs.start, block.attend(k_cache, v_cache))
        })
        .collect();
    // Each block's segments in order (a no-op sort unless the context was split).
    results.sort_by_key(|&(key, seg, _)| (key, seg));
    let w = heads_per_task * d;
    let mut at = 0;
    while at < results.len() {
        let key = results[at].0;
        let (total, rest) = results[at..].split_first_mut().expect("non-empty");
        let mut n = 1;
        for (_, _, part) in rest.iter().take_while(|(k, _, _)| *k == key) {
            total.2.merge(part, d);
            n += 1;
        }
        let (si, r0, kv, h0) = key;
        let s = &seqs[si];
        if let Some(sinks) = sinks {
            let zeros = vec![0f32; d];
            for i in 0..total.2.max.len() {
                let head = kv * group + h0 + i % heads_per_task;
                total.2.merge_query(i, sinks[head], 1.0, &zeros, d);
            }
        }
        let o = total.2.normalized(d);
        for r in 0..query_rows.min(s.q_len - r0) {
            let dst = (s.q_offset + r0 + r) * qdim + (kv * group + h0) * d;
            if let Some(dst) = out.get_mut(dst..dst + w) {
                dst.copy_from_slice(&o[r * w..(r + 1) * w]);
            }
        }
        at += n;
    }
    out
}

/// A task's query block: (sequence, first row, KV head, first query head).
type BlockKey = (usize, usize, usize, usize);

/// Keys per segment. Softmax state is kept per segment, and segments are merged in order
/// of position, in every path: so a long context can be split across threads (a decode
/// row) or walked by one task (a prefill block) with the same result to the bit.
const SEGMENT: usize = 8 * KEY_TILE;

/// The unnormalised softmax state of a block's queries over some segments: running max,
/// sum of weights and weighted values per query. A query that saw no key has max -inf.
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
}

impl Partial {
    fn empty(m: usize, d: usize) -> Self {
        Partial {
            max: vec![f32::NEG_INFINITY; m],
            sum: vec![0.0; m],
            out: vec![0.0; m * d],
        }
    }

    /// Fold query `i`'s state over a later segment into this one. Merging into an empty
    /// state copies exactly (e^-inf = 0, e^0 = 1).
    #[inline(always)]
    fn merge_query(&mut self, i: usize, max: f32, sum: f32, out: &[f32], d: usize) {
        let new_max = self.max[i].max(max);
        let a = exp_scalar(self.max[i] - new_max);
        let b = exp_scalar(max - new_max);
        self.max[i] = new_max;
        self.sum[i] = self.sum[i] * a + sum * b;
        for (o, &x) in self.out[i * d..(i + 1) * d].iter_mut().zip(out) {
            *o = x.mul_add(b, *o * a);
        }
    }

    /// Fold a later segment's partial state (same queries) into this one.
    fn merge(&mut self, later: &Partial, d: usize) {
        for i in 0..self.max.len() {
            // A query before the segment saw none of it.
            if later.max[i] != f32::NEG_INFINITY {
                self.merge_query(i, later.max[i], later.sum[i], &later.out[i * d..], d);
            }
        }
    }

    /// softmax(QKᵀ)V: the weighted values over the sum of weights.
    fn normalized(&self, d: usize) -> Vec<f32> {
        let mut out = self.out.clone();
        for (i, &sum) in self.sum.iter().enumerate() {
            let inv = 1.0 / sum;
            out[i * d..(i + 1) * d].iter_mut().for_each(|x| *x *= inv);
        }
        out
    }
}

/// Store the keys `new` (`[slots.len()][kv_dim]`) into `cache` at `slots`, in the transposed
/// block layout [`paged_attention`] reads (see the module doc).
pub fn write_keys<T: KvElement>(cache: &mut [T], new: &[f32], slots: &[usize], shape: &AttnShape) {
    let kv_w = shape.num_kv_heads * shape.head_dim;
    let bs = shape.block_size.max(1);
    if kv_w == 0 {
        return;
    }
    for (row, &slot) in new.chunks_exact(kv_w).zip(slots) {
        let (block, u) = (slot / bs, slot % bs);
        let dst = &mut cache[block * bs * kv_w..(block + 1) * bs * kv_w];
        for (j, &x) in row.iter().enumerate() {
            dst[j * bs + u] = T::from_f32(x);
        }
    }
}

/// `rows` query rows of one sequence, query heads `first_head..first_head + heads` of the
/// group of KV head `kv_head`.
struct QueryBlock<'a> {
    q: &'a [f32],
    qdim: usize,
    seq: &'a AttnSeq<'a>,
    first_row: usize,
    rows: usize,
    kv_head: usize,
    first_head: usize,
    heads: usize,
    /// The key segments this task covers (all of the block's, or one when split).
    segments: std::ops::Range<usize>,
    shape: &'a AttnShape,
}

impl QueryBlock<'_> {
    #[allow(unsafe_code)]
    fn attend<T: KvElement>(&self, k_cache: &[T], v_cache: &[T]) -> Partial {
        #[cfg(target_arch = "x86_64")]
        if super::quant::has_avx512f() {
            // SAFETY: AVX-512F, AVX2 and FMA are present (checked at run time); the body is
            // safe code.
            return unsafe { self.attend_avx512(k_cache, v_cache) };
        }
        #[cfg(target_arch = "x86_64")]
        if super::quant::has_avx2() {
            // SAFETY: AVX2 and FMA are present (checked at run time); the body is safe code.
            return unsafe { self.attend_avx2(k_cache, v_cache) };
        }
        self.body(k_cache, v_cache)
    }

    /// The body with the softmax loops (max, exp, sum) vectorised over 16 lanes. Their
    /// results do not change: each lane runs the same operations in the same order.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn attend_avx512<T: KvElement>(&self, k_cache: &[T], v_cache: &[T]) -> Partial {
        self.body(k_cache, v_cache)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn attend_avx2<T: KvElement>(&self, k_cache: &[T], v_cache: &[T]) -> Partial {
        self.body(k_cache, v_cache)
    }

    /// The block's unnormalised state over its segments (`[rows, heads * d]` outputs,
    /// query-row major).
    #[inline(always)]
    fn body<T: KvElement>(&self, k_cache: &[T], v_cache: &[T]) -> Partial {
        let shape = self.shape;
        let d = shape.head_dim;
        let group = shape.num_heads / shape.num_kv_heads;
        let kv_w = shape.num_kv_heads * d;
        let bs = shape.block_size.max(1);
        let heads = self.heads;
        let m = self.rows * heads;
        // Queries, pre-scaled, one per (row, head): query i = row i / heads, head i % heads.
        let mut qs = vec![0f32; m * d];
        for r in 0..self.rows {
            let base = (self.seq.q_offset + self.first_row + r) * self.qdim
                + (self.kv_head * group + self.first_head) * d;
            for j in 0..heads {
                let src = &self.q[base + j * d..base + (j + 1) * d];
                let dst = &mut qs[(r * heads + j) * d..(r * heads + j + 1) * d];
                for (o, &x) in dst.iter_mut().zip(src) {
                    *o = x * shape.scale;
                }
            }
        }
        // A bf16 cache on a CPU with AVX-512 BF16 takes the dot-product kernels (their
        // queries rounded to bf16 here).
        let mut dot = bf16_dot::Packed::new::<T>(&mut qs, d);
        // Absolute position of each row; row r sees keys 0..=pos(r).
        let pos0 = self.seq.start_pos + self.first_row;
        let ctx = pos0 + self.rows;
        let mut out = vec![0f32; m * d];
        let mut max = vec![f32::NEG_INFINITY; m];
        let mut sum = vec![0f32; m];
        let mut correction = vec![1f32; m];
        // Whether a row sees any key of the current tile.
        let mut seen = vec![false; m];
        let mut scores = vec![0f32; m * KEY_TILE];
        let table = self.seq.block_table;
        let head = self.kv_head * d;
        // Blocks whose size is a multiple of a key group are read in place; others are
        // gathered into tiles of the same shape first (same arithmetic either way).
        let in_place = bs.is_multiple_of(GROUP);
        let zero_keys = vec![T::ZERO; d * GROUP];
        let zero_values = vec![T::ZERO; GROUP * d];
        let (mut kt, mut vt) = if in_place {
            (Vec::new(), Vec::new())
        } else {
            (vec![T::ZERO; KEY_TILE * d], vec![T::ZERO; KEY_TILE * d])
        };
        let mut total = Partial::empty(m, d);
        for seg in self.segments.clone() {
            let seg_start = seg * SEGMENT;
            if seg_start >= ctx {
                break;
            }
            // Rows that see this segment (a suffix, as below); each starts it afresh.
            let seg_first = seg_start.saturating_sub(pos0) * heads;
            max[seg_first..].fill(f32::NEG_INFINITY);
            sum[seg_first..].fill(0.0);
            out[seg_first * d..].fill(0.0);
            for k0 in (seg_start..ctx.min(seg_start + SEGMENT)).step_by(KEY_TILE) {
                let n = KEY_TILE.min(ctx - k0);
                // A tile wholly before the first row's sliding window is before every
                // row's (later rows' windows start later).
                if shape.window.is_some_and(|w| k0 + n + w <= pos0 + 1) {
                    continue;
                }
                if !in_place {
                    for t in 0..KEY_TILE {
                        let (g, u) = (t / GROUP, t % GROUP);
                        let kg = &mut kt[g * d * GROUP..(g + 1) * d * GROUP];
                        if t >= n {
                            (0..d).for_each(|c| kg[c * GROUP + u] = T::ZERO);
                            continue;
                        }
                        let p = k0 + t;
                        let slot = table[p / bs] as usize * bs + p % bs;
                        let block = slot / bs * bs * kv_w;
                        for c in 0..d {
                            kg[c * GROUP + u] = k_cache[block + (head + c) * bs + slot % bs];
                        }
                        vt[t * d..(t + 1) * d]
                            .copy_from_slice(&v_cache[slot * kv_w + head..slot * kv_w + head + d]);
                    }
                }
                let groups: [KeyGroup<'_, T>; GROUPS] = std::array::from_fn(|g| {
                    let p = k0 + g * GROUP;
                    if p >= ctx {
                        KeyGroup {
                            k: &zero_keys,
                            k_stride: GROUP,
                            v: &zero_values,
                            v_stride: d,
                        }
                    } else if in_place {
                        let block = table[p / bs] as usize;
                        let u = p % bs;
                        KeyGroup {
                            k: &k_cache[block * bs * kv_w + head * bs + u..],
                            k_stride: bs,
                            v: &v_cache[(block * bs + u) * kv_w + head..],
                            v_stride: kv_w,
                        }
                    } else {
                        KeyGroup {
                            k: &kt[g * d * GROUP..],
                            k_stride: GROUP,
                            v: &vt[g * GROUP * d..],
                            v_stride: d,
                        }
                    }
                });
                // Rows before `k0` see none of this tile; queries are row-major, so the rows that
                // do are a suffix.
                let first = k0.saturating_sub(pos0) * heads;
                let live = m - first;
                if let Some(dot) = dot.as_mut() {
                    dot.pack_keys(&groups);
                    dot.scores(first, &mut scores[first * KEY_TILE..], live);
                } else {
                    tile_products::scores(
                        &qs[first * d..],
                        &groups,
                        &mut scores[first * KEY_TILE..],
                        live,
                        d,
                    );
                }
                // Three passes over the rows, so the per-row rescaling factors e^(old max -
                // new max) come from one vectorised `exp` rather than a scalar one per row
                // (a serial polynomial that stalled the loop). Same values either way.
                for i in first..m {
                    let pos = pos0 + i / heads;
                    // Keys past this row's position (or past the tile) do not count.
                    let visible = n.min(pos + 1 - k0);
                    // Nor keys before its sliding window, `pos - w < k`.
                    let hidden = shape
                        .window
                        .map_or(0, |w| (pos + 1).saturating_sub(w).saturating_sub(k0))
                        .min(visible);
                    let s: &mut [f32; KEY_TILE] = (&mut scores[i * KEY_TILE..(i + 1) * KEY_TILE])
                        .try_into()
                        .expect("score row");
                    if hidden == visible {
                        // Nothing of this tile is visible: leave the row's state as it is
                        // (zero weights, no rescaling: e^0 = 1).
                        s.fill(0.0);
                        seen[i] = false;
                        correction[i] = 0.0;
                        continue;
                    }
                    seen[i] = true;
                    s[visible..].fill(f32::NEG_INFINITY);
                    s[..hidden].fill(f32::NEG_INFINITY);
                    let new_max = max[i].max(max64(s));
                    // -inf (nothing seen yet) gives a factor of 0.
                    correction[i] = max[i] - new_max;
                    max[i] = new_max;
                }
                exp_in_place(&mut correction[first..]);
                for i in first..m {
                    if !seen[i] {
                        continue;
                    }
                    let s: &mut [f32; KEY_TILE] = (&mut scores[i * KEY_TILE..(i + 1) * KEY_TILE])
                        .try_into()
                        .expect("score row");
                    let new_max = max[i];
                    for x in s.iter_mut() {
                        *x -= new_max;
                    }
                    // Masked keys: e^-inf = 0, so they add nothing below.
                    exp_in_place(s);
                    if dot.is_some() {
                        // The weights the dot-product kernel multiplies, so the sum is
                        // theirs too.
                        s.iter_mut().for_each(|x| *x = bf16_dot::round(*x));
                    }
                    sum[i] = sum[i] * correction[i] + sum64(s);
                }
                if let Some(dot) = dot.as_mut() {
                    dot.pack_values(&groups, n);
                    dot.weighted_values(
                        &scores[first * KEY_TILE..],
                        &correction[first..],
                        &mut out[first * d..],
                        live,
                        n,
                    );
                } else {
                    tile_products::weighted_values(
                        &scores[first * KEY_TILE..],
                        &groups,
                        &correction[first..],
                        &mut out[first * d..],
                        live,
                        d,
                        n,
                    );
                }
            }
            for i in seg_first..m {
                // A row whose window starts past this segment saw none of it.
                if max[i] != f32::NEG_INFINITY {
                    total.merge_query(i, max[i], sum[i], &out[i * d..(i + 1) * d], d);
                }
            }
        }
        total
    }
}

/// Keys per group: the keys one register block of scores covers (two AVX registers).
const GROUP: usize = 16;
/// Key groups per tile.
const GROUPS: usize = KEY_TILE / GROUP;

/// Sixteen consecutive keys of one KV head: key `u`'s dimension `c` is
/// `k[c * k_stride + u]` (the cache's transposed block layout, or a gathered tile), its value
/// row is `v[u * v_stride..][..head_dim]`.
#[derive(Clone, Copy)]
struct KeyGroup<'a, T> {
    k: &'a [T],
    k_stride: usize,
    v: &'a [T],
    v_stride: usize,
}

/// A KV-cache element: `f32`, or a 16-bit float (`--kv-cache-dtype float16 | bfloat16`)
/// widened to `f32` on load, exactly, so the arithmetic after the load is the same.
#[allow(unsafe_code)]
pub trait KvElement: Copy + Send + Sync + 'static {
    const ZERO: Self;
    fn to_f32(self) -> f32;
    /// Round to nearest even (the cache write).
    fn from_f32(x: f32) -> Self;
    /// Eight consecutive elements widened to `f32` lanes.
    ///
    /// # Safety
    /// `p..p + 8` is readable, and the caller runs with AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Sixteen consecutive elements widened to `f32` lanes.
    ///
    /// # Safety
    /// `p..p + 16` is readable, and the caller runs with AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// The same elements as bf16, when they are (the dot-product path of `bf16_dot`).
    fn as_bf16(_: &[Self]) -> Option<&[half::bf16]> {
        None
    }
}

// The 8-lane loads are plain array reads: `_mm256_loadu_ps` and friends are a
// `copy_nonoverlapping`, whose precondition checks (on in the dev profile the tests and
// benchmarks use) spill the kernels' accumulators around every load.
#[allow(unsafe_code)]
impl KvElement for f32 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        std::mem::transmute::<[f32; 8], std::arch::x86_64::__m256>(*(p as *const [f32; 8]))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        std::mem::transmute::<[f32; 16], std::arch::x86_64::__m512>(*(p as *const [f32; 16]))
    }
}

#[allow(unsafe_code)]
impl KvElement for half::f16 {
    const ZERO: Self = half::f16::ZERO;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(std::mem::transmute::<[u16; 8], __m128i>(
            *(p as *const [u16; 8]),
        ))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(std::mem::transmute::<[u16; 16], __m256i>(
            *(p as *const [u16; 16]),
        ))
    }
}

#[allow(unsafe_code)]
impl KvElement for half::bf16 {
    const ZERO: Self = half::bf16::ZERO;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // bf16 is the top half of an f32: widen to 32 bits and shift into place.
        let h = std::mem::transmute::<[u16; 8], __m128i>(*(p as *const [u16; 8]));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let h = std::mem::transmute::<[u16; 16], __m256i>(*(p as *const [u16; 16]));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
    fn as_bf16(s: &[Self]) -> Option<&[half::bf16]> {
        Some(s)
    }
}

/// The two products of a tile, `S = Q Kᵀ` and `O = c ⊙ O + P V`, register-blocked over eight
/// (AVX-512) or four (AVX2) queries at a time. Every element is computed with the same
/// operations in the same order (a fused multiply-add chain over the head dimension, or over
/// the keys) whatever the blocking, so a query's result never depends on which queries share
/// its block; the AVX-512, AVX2 and portable paths agree bit for bit.
mod tile_products {
    use super::{KeyGroup, KvElement, GROUP, GROUPS, KEY_TILE};

    /// `scores[i][t] = q_i · key t` for `count` queries (`q`: `[count][d]`, `scores`:
    /// `[count][KEY_TILE]`).
    #[allow(unsafe_code)]
    pub(super) fn scores<T: KvElement>(
        q: &[f32],
        groups: &[KeyGroup<'_, T>; GROUPS],
        scores: &mut [f32],
        count: usize,
        d: usize,
    ) {
        assert!(q.len() >= count * d && scores.len() >= count * KEY_TILE);
        for g in groups {
            assert!(d == 0 || g.k.len() >= (d - 1) * g.k_stride + GROUP);
        }
        #[cfg(target_arch = "x86_64")]
        if d.is_multiple_of(16) && crate::model::quant::has_avx512f() {
            // SAFETY: AVX-512F is present (checked at run time); the lengths asserted above
            // bound every read and write.
            unsafe { avx512::scores(q, groups, scores, count, d) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if d.is_multiple_of(16) && crate::model::quant::has_avx2() {
            // SAFETY: AVX2 and FMA are present (checked at run time); the lengths asserted
            // above bound every read and write.
            unsafe { avx2::scores(q, groups, scores, count, d) };
            return;
        }
        for i in 0..count {
            let qi = &q[i * d..(i + 1) * d];
            for (g, kg) in groups.iter().enumerate() {
                let mut acc = [0f32; GROUP];
                for (c, &qc) in qi.iter().enumerate() {
                    let row = &kg.k[c * kg.k_stride..c * kg.k_stride + GROUP];
                    for u in 0..GROUP {
                        acc[u] = qc.mul_add(row[u].to_f32(), acc[u]);
                    }
                }
                let at = i * KEY_TILE + g * GROUP;
                scores[at..at + GROUP].copy_from_slice(&acc);
            }
        }
    }

    /// `out[i] = correction[i] * out[i] + Σ_{t < keys} p[i][t] * v[t]` for `count` queries
    /// (`p`: `[count][KEY_TILE]`, `out`: `[count][d]`). A weight of zero adds exactly
    /// nothing, so rows that see fewer than `keys` keys ride along.
    #[allow(unsafe_code)]
    pub(super) fn weighted_values<T: KvElement>(
        p: &[f32],
        groups: &[KeyGroup<'_, T>; GROUPS],
        correction: &[f32],
        out: &mut [f32],
        count: usize,
        d: usize,
        keys: usize,
    ) {
        assert!(p.len() >= count * KEY_TILE && correction.len() >= count);
        assert!(out.len() >= count * d && keys <= KEY_TILE);
        for (g, kg) in groups.iter().enumerate() {
            let rows = keys.saturating_sub(g * GROUP).min(GROUP);
            assert!(rows == 0 || kg.v.len() >= (rows - 1) * kg.v_stride + d);
        }
        #[cfg(target_arch = "x86_64")]
        if d.is_multiple_of(32) && crate::model::quant::has_avx512f() {
            // SAFETY: as in `scores`.
            unsafe { avx512::weighted_values(p, groups, correction, out, count, d, keys) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if d.is_multiple_of(16) && crate::model::quant::has_avx2() {
            // SAFETY: as in `scores`.
            unsafe { avx2::weighted_values(p, groups, correction, out, count, d, keys) };
            return;
        }
        for i in 0..count {
            let o = &mut out[i * d..(i + 1) * d];
            o.iter_mut().for_each(|x| *x *= correction[i]);
            for t in 0..keys {
                let w = p[i * KEY_TILE + t];
                let kg = &groups[t / GROUP];
                let v = &kg.v[(t % GROUP) * kg.v_stride..][..d];
                for (a, &x) in o.iter_mut().zip(v) {
                    *a = w.mul_add(x.to_f32(), *a);
                }
            }
        }
    }

    /// The value row of each of a tile's first `keys` keys (the rest null), for the SIMD
    /// value kernels. Callers have checked each group holds its rows.
    #[cfg(target_arch = "x86_64")]
    fn value_rows<T>(groups: &[KeyGroup<'_, T>; GROUPS], keys: usize) -> [*const T; KEY_TILE] {
        let mut rows = [std::ptr::null::<T>(); KEY_TILE];
        for (t, row) in rows.iter_mut().enumerate().take(keys) {
            let kg = &groups[t / GROUP];
            *row = kg.v[(t % GROUP) * kg.v_stride..].as_ptr();
        }
        rows
    }

    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    pub(super) mod avx2 {
        use super::{KeyGroup, KvElement, GROUP, GROUPS, KEY_TILE};
        use std::arch::x86_64::*;

        /// An unaligned 8-lane load of `f32`s (see [`KvElement`] on why not `loadu`).
        #[inline(always)]
        unsafe fn ld(p: *const f32) -> __m256 {
            f32::load8(p)
        }

        /// An unaligned 8-lane store (see [`KvElement`] on why not `storeu`).
        #[inline(always)]
        unsafe fn st(p: *mut f32, v: __m256) {
            *(p as *mut [f32; 8]) = std::mem::transmute::<__m256, [f32; 8]>(v);
        }

        /// Queries per register block: 4 queries × 16 lanes = 8 accumulators, with room
        /// for the two loads and a broadcast.
        const QB: usize = 4;

        /// Callers check the slice lengths (see `super::scores`).
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in super::super) unsafe fn scores<T: KvElement>(
            q: &[f32],
            groups: &[KeyGroup<'_, T>; GROUPS],
            scores: &mut [f32],
            count: usize,
            d: usize,
        ) {
            for (g, kg) in groups.iter().enumerate() {
                let (k, ks) = (kg.k.as_ptr(), kg.k_stride);
                let mut i = 0;
                while i < count {
                    let qp = q.as_ptr().add(i * d);
                    let sp = scores.as_mut_ptr().add(i * KEY_TILE + g * GROUP);
                    if count - i >= QB {
                        scores4(qp, k, ks, sp, d);
                        i += QB;
                    } else {
                        scores1(qp, k, ks, sp, d);
                        i += 1;
                    }
                }
            }
        }

        /// Sixteen scores of four queries: eight accumulators, two key loads and four
        /// broadcasts per dimension.
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn scores4<T: KvElement>(
            q: *const f32,
            k: *const T,
            k_stride: usize,
            s: *mut f32,
            d: usize,
        ) {
            let (q0, q1, q2, q3) = (q, q.add(d), q.add(2 * d), q.add(3 * d));
            let mut a0 = _mm256_setzero_ps();
            let mut b0 = _mm256_setzero_ps();
            let mut a1 = _mm256_setzero_ps();
            let mut b1 = _mm256_setzero_ps();
            let mut a2 = _mm256_setzero_ps();
            let mut b2 = _mm256_setzero_ps();
            let mut a3 = _mm256_setzero_ps();
            let mut b3 = _mm256_setzero_ps();
            let mut kp = k;
            for c in 0..d {
                let k0 = T::load8(kp);
                let k1 = T::load8(kp.add(8));
                kp = kp.add(k_stride);
                let x = _mm256_broadcast_ss(&*q0.add(c));
                a0 = _mm256_fmadd_ps(x, k0, a0);
                b0 = _mm256_fmadd_ps(x, k1, b0);
                let x = _mm256_broadcast_ss(&*q1.add(c));
                a1 = _mm256_fmadd_ps(x, k0, a1);
                b1 = _mm256_fmadd_ps(x, k1, b1);
                let x = _mm256_broadcast_ss(&*q2.add(c));
                a2 = _mm256_fmadd_ps(x, k0, a2);
                b2 = _mm256_fmadd_ps(x, k1, b2);
                let x = _mm256_broadcast_ss(&*q3.add(c));
                a3 = _mm256_fmadd_ps(x, k0, a3);
                b3 = _mm256_fmadd_ps(x, k1, b3);
            }
            for (j, (a, b)) in [(a0, b0), (a1, b1), (a2, b2), (a3, b3)]
                .into_iter()
                .enumerate()
            {
                let sp = s.add(j * KEY_TILE);
                st(sp, a);
                st(sp.add(8), b);
            }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn scores1<T: KvElement>(
            q: *const f32,
            k: *const T,
            k_stride: usize,
            s: *mut f32,
            d: usize,
        ) {
            let mut a = _mm256_setzero_ps();
            let mut b = _mm256_setzero_ps();
            let mut kp = k;
            for c in 0..d {
                let x = _mm256_broadcast_ss(&*q.add(c));
                a = _mm256_fmadd_ps(x, T::load8(kp), a);
                b = _mm256_fmadd_ps(x, T::load8(kp.add(8)), b);
                kp = kp.add(k_stride);
            }
            st(s, a);
            st(s.add(8), b);
        }

        /// Callers check the slice lengths (see `super::weighted_values`).
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in super::super) unsafe fn weighted_values<T: KvElement>(
            p: &[f32],
            groups: &[KeyGroup<'_, T>; GROUPS],
            correction: &[f32],
            out: &mut [f32],
            count: usize,
            d: usize,
            keys: usize,
        ) {
            let rows = super::value_rows(groups, keys);
            let rows = &rows[..keys];
            let mut i = 0;
            while i < count {
                let (pp, cp) = (p.as_ptr().add(i * KEY_TILE), correction.as_ptr().add(i));
                let op = out.as_mut_ptr().add(i * d);
                for c in (0..d).step_by(16) {
                    if count - i >= QB {
                        values4(pp, rows, c, cp, op.add(c), d);
                    } else {
                        values1(pp, rows, c, cp, op.add(c));
                    }
                }
                i += if count - i >= QB { QB } else { 1 };
            }
        }

        /// Output dimensions `c..c + 16` of four queries (`out` points at the first one's
        /// `c`; rows `d` apart), rescaled by their corrections, plus their weighted values.
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn values4<T: KvElement>(
            p: *const f32,
            rows: &[*const T],
            c: usize,
            correction: *const f32,
            out: *mut f32,
            d: usize,
        ) {
            let (o0, o1, o2, o3) = (out, out.add(d), out.add(2 * d), out.add(3 * d));
            let c0 = _mm256_broadcast_ss(&*correction);
            let c1 = _mm256_broadcast_ss(&*correction.add(1));
            let c2 = _mm256_broadcast_ss(&*correction.add(2));
            let c3 = _mm256_broadcast_ss(&*correction.add(3));
            let mut a0 = _mm256_mul_ps(ld(o0), c0);
            let mut b0 = _mm256_mul_ps(ld(o0.add(8)), c0);
            let mut a1 = _mm256_mul_ps(ld(o1), c1);
            let mut b1 = _mm256_mul_ps(ld(o1.add(8)), c1);
            let mut a2 = _mm256_mul_ps(ld(o2), c2);
            let mut b2 = _mm256_mul_ps(ld(o2.add(8)), c2);
            let mut a3 = _mm256_mul_ps(ld(o3), c3);
            let mut b3 = _mm256_mul_ps(ld(o3.add(8)), c3);
            let (p0, p1, p2, p3) = (p, p.add(KEY_TILE), p.add(2 * KEY_TILE), p.add(3 * KEY_TILE));
            for (t, &row) in rows.iter().enumerate() {
                let v0 = T::load8(row.add(c));
                let v1 = T::load8(row.add(c + 8));
                let w = _mm256_broadcast_ss(&*p0.add(t));
                a0 = _mm256_fmadd_ps(w, v0, a0);
                b0 = _mm256_fmadd_ps(w, v1, b0);
                let w = _mm256_broadcast_ss(&*p1.add(t));
                a1 = _mm256_fmadd_ps(w, v0, a1);
                b1 = _mm256_fmadd_ps(w, v1, b1);
                let w = _mm256_broadcast_ss(&*p2.add(t));
                a2 = _mm256_fmadd_ps(w, v0, a2);
                b2 = _mm256_fmadd_ps(w, v1, b2);
                let w = _mm256_broadcast_ss(&*p3.add(t));
                a3 = _mm256_fmadd_ps(w, v0, a3);
                b3 = _mm256_fmadd_ps(w, v1, b3);
            }
            st(o0, a0);
            st(o0.add(8), b0);
            st(o1, a1);
            st(o1.add(8), b1);
            st(o2, a2);
            st(o2.add(8), b2);
            st(o3, a3);
            st(o3.add(8), b3);
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn values1<T: KvElement>(
            p: *const f32,
            rows: &[*const T],
            c: usize,
            correction: *const f32,
            out: *mut f32,
        ) {
            let scale = _mm256_broadcast_ss(&*correction);
            let mut a = _mm256_mul_ps(ld(out), scale);
            let mut b = _mm256_mul_ps(ld(out.add(8)), scale);
            for (t, &row) in rows.iter().enumerate() {
                let w = _mm256_broadcast_ss(&*p.add(t));
                a = _mm256_fmadd_ps(w, T::load8(row.add(c)), a);
                b = _mm256_fmadd_ps(w, T::load8(row.add(c + 8)), b);
            }
            st(out, a);
            st(out.add(8), b);
        }
    }

    /// The same products over 16-lane registers. With 32 of them a block holds eight
    /// queries by 32 keys (or 32 output dimensions): half the loads and broadcasts per
    /// multiply-add of the AVX2 blocks, and a quarter of the 16-bit cache conversions. Every
    /// element is still one fused multiply-add chain in the same order, so the results equal
    /// the AVX2 path's bit for bit (`tests::avx512_tiles_equal_avx2_bit_for_bit`).
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    pub(super) mod avx512 {
        use super::{KeyGroup, KvElement, GROUP, GROUPS, KEY_TILE};
        use std::arch::x86_64::*;

        /// Queries per register block: 8 queries × 32 lanes = 16 accumulators.
        const QB: usize = 8;

        #[inline(always)]
        unsafe fn ld(p: *const f32) -> __m512 {
            f32::load16(p)
        }

        #[inline(always)]
        unsafe fn st(p: *mut f32, v: __m512) {
            *(p as *mut [f32; 16]) = std::mem::transmute::<__m512, [f32; 16]>(v);
        }

        /// Callers check the slice lengths (see `super::scores`).
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub(in super::super) unsafe fn scores<T: KvElement>(
            q: &[f32],
            groups: &[KeyGroup<'_, T>; GROUPS],
            scores: &mut [f32],
            count: usize,
            d: usize,
        ) {
            for pair in 0..GROUPS / 2 {
                let (ga, gb) = (&groups[2 * pair], &groups[2 * pair + 1]);
                let mut i = 0;
                while i < count {
                    let qp = q.as_ptr().add(i * d);
                    let sp = scores.as_mut_ptr().add(i * KEY_TILE + 2 * pair * GROUP);
                    if count - i >= QB {
                        scores8(qp, ga, gb, sp, d);
                        i += QB;
                    } else {
                        scores1(qp, ga, gb, sp, d);
                        i += 1;
                    }
                }
            }
        }

        /// 32 scores (two key groups) of eight queries.
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        #[inline]
        unsafe fn scores8<T: KvElement>(
            q: *const f32,
            ga: &KeyGroup<'_, T>,
            gb: &KeyGroup<'_, T>,
            s: *mut f32,
            d: usize,
        ) {
            let mut a = [_mm512_setzero_ps(); QB];
            let mut b = [_mm512_setzero_ps(); QB];
            let (mut ka, mut kb) = (ga.k.as_ptr(), gb.k.as_ptr());
            for c in 0..d {
                let k0 = T::load16(ka);
                let k1 = T::load16(kb);
                ka = ka.add(ga.k_stride);
                kb = kb.add(gb.k_stride);
                for j in 0..QB {
                    let x = _mm512_set1_ps(*q.add(j * d + c));
                    a[j] = _mm512_fmadd_ps(x, k0, a[j]);
                    b[j] = _mm512_fmadd_ps(x, k1, b[j]);
                }
            }
            for j in 0..QB {
                let sp = s.add(j * KEY_TILE);
                st(sp, a[j]);
                st(sp.add(GROUP), b[j]);
            }
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        #[inline]
        unsafe fn scores1<T: KvElement>(
            q: *const f32,
            ga: &KeyGroup<'_, T>,
            gb: &KeyGroup<'_, T>,
            s: *mut f32,
            d: usize,
        ) {
            let mut a = _mm512_setzero_ps();
            let mut b = _mm512_setzero_ps();
            let (mut ka, mut kb) = (ga.k.as_ptr(), gb.k.as_ptr());
            for c in 0..d {
                let x = _mm512_set1_ps(*q.add(c));
                a = _mm512_fmadd_ps(x, T::load16(ka), a);
                b = _mm512_fmadd_ps(x, T::load16(kb), b);
                ka = ka.add(ga.k_stride);
                kb = kb.add(gb.k_stride);
            }
            st(s, a);
            st(s.add(GROUP), b);
        }

        /// Callers check the slice lengths and that `d` is a multiple of 32 (see
        /// `super::weighted_values`).
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub(in super::super) unsafe fn weighted_values<T: KvElement>(
            p: &[f32],
            groups: &[KeyGroup<'_, T>; GROUPS],
            correction: &[f32],
            out: &mut [f32],
            count: usize,
            d: usize,
            keys: usize,
        ) {
            let rows = super::value_rows(groups, keys);
            let rows = &rows[..keys];
            let mut i = 0;
            while i < count {
                let (pp, cp) = (p.as_ptr().add(i * KEY_TILE), correction.as_ptr().add(i));
                let op = out.as_mut_ptr().add(i * d);
                let block = if count - i >= QB { QB } else { 1 };
                for c in (0..d).step_by(32) {
                    if block == QB {
                        values8(pp, rows, c, cp, op.add(c), d);
                    } else {
                        values1(pp, rows, c, cp, op.add(c));
                    }
                }
                i += block;
            }
        }

        /// Output dimensions `c..c + 32` of eight queries (`out` points at the first one's
        /// `c`; rows `d` apart), rescaled by their corrections, plus their weighted values.
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        #[inline]
        unsafe fn values8<T: KvElement>(
            p: *const f32,
            rows: &[*const T],
            c: usize,
            correction: *const f32,
            out: *mut f32,
            d: usize,
        ) {
            let mut a = [_mm512_setzero_ps(); QB];
            let mut b = [_mm512_setzero_ps(); QB];
            for j in 0..QB {
                let scale = _mm512_set1_ps(*correction.add(j));
                a[j] = _mm512_mul_ps(ld(out.add(j * d)), scale);
                b[j] = _mm512_mul_ps(ld(out.add(j * d + 16)), scale);
            }
            for (t, &row) in rows.iter().enumerate() {
                let v0 = T::load16(row.add(c));
                let v1 = T::load16(row.add(c + 16));
                for j in 0..QB {
                    let w = _mm512_set1_ps(*p.add(j * KEY_TILE + t));
                    a[j] = _mm512_fmadd_ps(w, v0, a[j]);
                    b[j] = _mm512_fmadd_ps(w, v1, b[j]);
                }
            }
            for j in 0..QB {
                st(out.add(j * d), a[j]);
                st(out.add(j * d + 16), b[j]);
            }
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        #[inline]
        unsafe fn values1<T: KvElement>(
            p: *const f32,
            rows: &[*const T],
            c: usize,
            correction: *const f32,
            out: *mut f32,
        ) {
            let scale = _mm512_set1_ps(*correction);
            let mut a = _mm512_mul_ps(ld(out), scale);
            let mut b = _mm512_mul_ps(ld(out.add(16)), scale);
            for (t, &row) in rows.iter().enumerate() {
                let w = _mm512_set1_ps(*p.add(t));
                a = _mm512_fmadd_ps(w, T::load16(row.add(c)), a);
                b = _mm512_fmadd_ps(w, T::load16(row.add(c + 16)), b);
            }
            st(out, a);
            st(out.add(16), b);
        }
    }
}

/// The tile products for a bfloat16 cache on a CPU with AVX-512 BF16. `vdpbf16ps` adds two
/// bf16 products to each f32 lane: twice the multiply-adds of an f32 FMA per instruction,
/// on the two products that are most of a long prefill's time.
///
/// Its operands are bf16, so the (pre-scaled) queries and the softmax weights are rounded to
/// bf16 first, as llama.cpp rounds queries to the cache's type; the softmax denominator sums
/// the rounded weights, so each output stays a convex combination of the values. Keys and
/// values are repacked once per tile into the pairs the instruction reads (dimensions
/// (2c, 2c+1) of a key; keys (2t, 2t+1) of a value dimension), which the block's queries
/// then share. Every output element is one chain of `vdpbf16ps` over the pairs in order,
/// the same in a block of eight queries and alone, so the chunking invariant holds on this
/// path too. Its results differ from the FMA paths' (and from a machine without AVX-512
/// BF16) by the rounding of queries and weights: the bf16 cache's documented divergence
/// (README, `tests/parity.rs`) is measured with it.
mod bf16_dot {
    use super::{KeyGroup, KvElement, GROUP, GROUPS, KEY_TILE};
    use half::bf16;

    /// `x` rounded to the nearest bf16 (ties to even), as an f32. For finite `x`.
    #[inline(always)]
    pub(super) fn round(x: f32) -> f32 {
        let b = x.to_bits();
        f32::from_bits(b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000)
    }

    /// Two bf16-exact floats as one pair, `lo` in the low half.
    #[inline(always)]
    fn pair(lo: f32, hi: f32) -> u32 {
        (lo.to_bits() >> 16) | (hi.to_bits() & 0xFFFF_0000)
    }

    /// Whether attention over a `T` cache with head dimension `d` takes this path: a bf16
    /// cache, a CPU with AVX-512 BF16, and `d` a multiple of 32.
    pub(super) fn usable<T: KvElement>(d: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        let cpu = crate::model::quant::has_avx512bf16();
        #[cfg(not(target_arch = "x86_64"))]
        let cpu = false;
        cpu && T::as_bf16(&[]).is_some() && d != 0 && d.is_multiple_of(32)
    }

    /// One task's operands in `vdpbf16ps` pairs.
    pub(super) struct Packed {
        d: usize,
        /// `[m][d / 2]`: dimensions (2c, 2c + 1) of each (rounded) query.
        queries: Vec<u32>,
        /// `[d / 2][KEY_TILE]`: dimensions (2c, 2c + 1) of key t of the current tile.
        keys: Vec<u32>,
        /// `[KEY_TILE / 2][d]`: dimension c of keys (2t, 2t + 1) of the current tile.
        values: Vec<u32>,
        /// `[m][KEY_TILE / 2]`: each query's weights of keys (2t, 2t + 1).
        weights: Vec<u32>,
        /// A value row of zeros, the partner of an odd tile's last key.
        zeros: Vec<bf16>,
    }

    impl Packed {
        /// The packed queries when the cache is bf16, the CPU has AVX-512 BF16 and the head
        /// dimension is a multiple of 32; `qs` (`[m][d]`) is rounded to bf16 in place then.
        pub(super) fn new<T: KvElement>(qs: &mut [f32], d: usize) -> Option<Self> {
            if !usable::<T>(d) {
                return None;
            }
            qs.iter_mut().for_each(|x| *x = round(*x));
            let m = qs.len() / d;
            Some(Self {
                d,
                queries: qs.chunks_exact(2).map(|p| pair(p[0], p[1])).collect(),
                keys: vec![0; d / 2 * KEY_TILE],
                values: vec![0; KEY_TILE / 2 * d],
                weights: vec![0; m * KEY_TILE / 2],
                zeros: vec![bf16::ZERO; d],
            })
        }

        /// Packs the tile's keys (all `KEY_TILE`; the ones past the context are masked later).
        #[inline(always)]
        #[allow(unsafe_code)]
        pub(super) fn pack_keys<T: KvElement>(&mut self, groups: &[KeyGroup<'_, T>; GROUPS]) {
            let d = self.d;
            assert!(self.keys.len() >= d / 2 * KEY_TILE);
            for (g, kg) in groups.iter().enumerate() {
                let k = T::as_bf16(kg.k).expect("a bf16 cache (checked in `new`)");
                assert!(k.len() >= (d - 1) * kg.k_stride + GROUP);
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX-512F is present (checked in `new`); the lengths asserted above
                // bound the reads (dimension rows `k_stride` apart) and the writes.
                unsafe {
                    simd::pack_key_group(
                        k.as_ptr(),
                        kg.k_stride,
                        d / 2,
                        self.keys[g * GROUP..].as_mut_ptr(),
                    )
                };
            }
        }

        /// Packs the value rows of the tile's first `keys` keys (an odd last one beside zeros).
        #[inline(always)]
        #[allow(unsafe_code)]
        pub(super) fn pack_values<T: KvElement>(
            &mut self,
            groups: &[KeyGroup<'_, T>; GROUPS],
            keys: usize,
        ) {
            let d = self.d;
            assert!(keys <= KEY_TILE && self.values.len() >= KEY_TILE / 2 * d);
            let row = |t: usize| -> &[bf16] {
                if t >= keys {
                    return &self.zeros;
                }
                let kg = &groups[t / GROUP];
                let v = T::as_bf16(kg.v).expect("a bf16 cache (checked in `new`)");
                &v[(t % GROUP) * kg.v_stride..][..d]
            };
            for t in 0..keys.div_ceil(2) {
                let (lo, hi) = (row(2 * t), row(2 * t + 1));
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX-512F is present (checked in `new`); both rows hold `d`
                // elements and the packed row `d` pairs.
                unsafe {
                    simd::pack_value_pair(
                        lo.as_ptr(),
                        hi.as_ptr(),
                        d,
                        self.values.as_mut_ptr().add(t * d),
                    )
                };
            }
        }

        /// `scores[i][t] = q · key t` for the `count` queries from query `first`.
        #[allow(unsafe_code)]
        pub(super) fn scores(&self, first: usize, scores: &mut [f32], count: usize) {
            let h = self.d / 2;
            assert!(self.queries.len() >= (first + count) * h);
            assert!(scores.len() >= count * KEY_TILE && self.keys.len() >= h * KEY_TILE);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512F and AVX-512 BF16 are present (checked in `new`); the lengths
            // asserted above bound every read and write.
            unsafe {
                simd::scores(
                    self.queries[first * h..].as_ptr(),
                    self.keys.as_ptr(),
                    scores.as_mut_ptr(),
                    count,
                    h,
                )
            };
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("`new` gives no packed state off x86_64");
        }

        /// `out[i] = correction[i] * out[i] + Σ_{t < keys} p[i][t] * v[t]` for `count`
        /// queries; `p` holds bf16-exact weights.
        #[allow(unsafe_code)]
        pub(super) fn weighted_values(
            &mut self,
            p: &[f32],
            correction: &[f32],
            out: &mut [f32],
            count: usize,
            keys: usize,
        ) {
            let d = self.d;
            let half = KEY_TILE / 2;
            assert!(p.len() >= count * KEY_TILE && correction.len() >= count);
            assert!(out.len() >= count * d && self.weights.len() >= count * half);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `scores`; `values` holds `KEY_TILE / 2` packed rows of `d`.
            unsafe {
                simd::pack_weights(p.as_ptr(), self.weights.as_mut_ptr(), count);
                simd::weighted_values(
                    self.weights.as_ptr(),
                    self.values.as_ptr(),
                    correction.as_ptr(),
                    out.as_mut_ptr(),
                    count,
                    d,
                    keys.div_ceil(2),
                )
            };
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("`new` gives no packed state off x86_64");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    mod simd {
        use super::KEY_TILE;
        use half::bf16;
        use std::arch::x86_64::*;

        /// Queries per register block: 8 queries × 32 lanes = 16 accumulators.
        const QB: usize = 8;

        /// Sixteen pairs (a plain array read; see the note on `KvElement`'s loads).
        #[inline(always)]
        unsafe fn ld(p: *const u32) -> __m512bh {
            std::mem::transmute::<[u32; 16], __m512bh>(*(p as *const [u32; 16]))
        }

        /// `lo[u] | hi[u] << 16` for sixteen `u`.
        #[inline(always)]
        unsafe fn interleave(lo: *const bf16, hi: *const bf16) -> __m512i {
            let widen = |p: *const bf16| {
                _mm512_cvtepu16_epi32(std::mem::transmute::<[u16; 16], __m256i>(
                    *(p as *const [u16; 16]),
                ))
            };
            _mm512_or_si512(widen(lo), _mm512_slli_epi32::<16>(widen(hi)))
        }

        #[inline(always)]
        unsafe fn store(p: *mut u32, v: __m512i) {
            *(p as *mut [u32; 16]) = std::mem::transmute::<__m512i, [u32; 16]>(v);
        }

        /// Sixteen keys' dimension pairs: `out[c * KEY_TILE + u]` = dimensions (2c, 2c + 1) of
        /// key `u`, whose dimension `c` is `k[c * stride + u]`; `pairs` = d / 2.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn pack_key_group(
            k: *const bf16,
            stride: usize,
            pairs: usize,
            out: *mut u32,
        ) {
            for c in 0..pairs {
                let v = interleave(k.add(2 * c * stride), k.add((2 * c + 1) * stride));
                store(out.add(c * KEY_TILE), v);
            }
        }

        /// Two value rows of `d` as `d` pairs.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn pack_value_pair(
            lo: *const bf16,
            hi: *const bf16,
            d: usize,
            out: *mut u32,
        ) {
            for c in (0..d).step_by(16) {
                store(out.add(c), interleave(lo.add(c), hi.add(c)));
            }
        }

        /// `count` rows of `KEY_TILE` bf16-exact weights as `KEY_TILE / 2` pairs each (the
        /// conversion is exact).
        #[target_feature(enable = "avx512f,avx512bf16")]
        pub(super) unsafe fn pack_weights(p: *const f32, out: *mut u32, count: usize) {
            for i in 0..count {
                for half in 0..KEY_TILE / 32 {
                    let at = p.add(i * KEY_TILE + half * 32);
                    // The second operand fills the low sixteen elements.
                    let v = _mm512_cvtne2ps_pbh(ldf(at.add(16)), ldf(at));
                    store(
                        out.add(i * KEY_TILE / 2 + half * 16),
                        std::mem::transmute::<__m512bh, __m512i>(v),
                    );
                }
            }
        }

        /// One pair in every lane.
        #[inline(always)]
        unsafe fn splat(p: *const u32) -> __m512bh {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*p as i32))
        }

        #[inline(always)]
        unsafe fn ldf(p: *const f32) -> __m512 {
            std::mem::transmute::<[f32; 16], __m512>(*(p as *const [f32; 16]))
        }

        #[inline(always)]
        unsafe fn st(p: *mut f32, v: __m512) {
            *(p as *mut [f32; 16]) = std::mem::transmute::<__m512, [f32; 16]>(v);
        }

        /// The register block both products are made of: for `N` queries `j` and 32 lanes,
        /// `acc[j] += Σ_s x[j][s] · y[s]` over `steps` pairs, where `x[j][s]` (one pair, in
        /// every lane) is at `x + j * x_row + s` and `y[s]` (32 lanes, two vectors) at
        /// `y + s * y_step`. The accumulators start at `acc` and end at `out + j * out_row`.
        /// Each lane is one chain of `vdpbf16ps` over the steps whatever `N`, so a query's
        /// result does not depend on the block it rode in.
        #[target_feature(enable = "avx512f,avx512bf16")]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn block<const N: usize>(
            mut acc: [[__m512; 2]; N],
            x: *const u32,
            x_row: usize,
            y: *const u32,
            y_step: usize,
            steps: usize,
            out: *mut f32,
            out_row: usize,
        ) {
            for s in 0..steps {
                let y0 = ld(y.add(s * y_step));
                let y1 = ld(y.add(s * y_step + 16));
                for (j, a) in acc.iter_mut().enumerate() {
                    let xs = splat(x.add(j * x_row + s));
                    a[0] = _mm512_dpbf16_ps(a[0], xs, y0);
                    a[1] = _mm512_dpbf16_ps(a[1], xs, y1);
                }
            }
            for (j, a) in acc.iter().enumerate() {
                st(out.add(j * out_row), a[0]);
                st(out.add(j * out_row + 16), a[1]);
            }
        }

        /// `q`: `[count][h]` query pairs; `k`: `[h][KEY_TILE]` key pairs; `s`:
        /// `[count][KEY_TILE]`. 32 keys at a time, over eight queries or one.
        #[target_feature(enable = "avx512f,avx512bf16")]
        pub(super) unsafe fn scores(
            q: *const u32,
            k: *const u32,
            s: *mut f32,
            count: usize,
            h: usize,
        ) {
            let zero = [_mm512_setzero_ps(); 2];
            for half in 0..2 {
                let k = k.add(half * 32);
                let mut i = 0;
                while i < count {
                    let (qp, sp) = (q.add(i * h), s.add(i * KEY_TILE + half * 32));
                    if count - i >= QB {
                        block([zero; QB], qp, h, k, KEY_TILE, h, sp, KEY_TILE);
                        i += QB;
                    } else {
                        block([zero; 1], qp, h, k, KEY_TILE, h, sp, KEY_TILE);
                        i += 1;
                    }
                }
            }
        }

        /// `N` queries' outputs `c..c + 32` (`out` points at the first one's `c`, rows `d`
        /// apart), each times its correction.
        #[target_feature(enable = "avx512f")]
        #[inline]
        unsafe fn rescaled<const N: usize>(
            out: *const f32,
            d: usize,
            correction: *const f32,
        ) -> [[__m512; 2]; N] {
            let mut acc = [[_mm512_setzero_ps(); 2]; N];
            for (j, a) in acc.iter_mut().enumerate() {
                let scale = _mm512_set1_ps(*correction.add(j));
                a[0] = _mm512_mul_ps(ldf(out.add(j * d)), scale);
                a[1] = _mm512_mul_ps(ldf(out.add(j * d + 16)), scale);
            }
            acc
        }

        /// `w`: `[count][KEY_TILE / 2]` weight pairs; `v`: `[pairs][d]` value pairs;
        /// `out`: `[count][d]`. 32 output dimensions at a time, over eight queries or one.
        #[target_feature(enable = "avx512f,avx512bf16")]
        pub(super) unsafe fn weighted_values(
            w: *const u32,
            v: *const u32,
            correction: *const f32,
            out: *mut f32,
            count: usize,
            d: usize,
            pairs: usize,
        ) {
            let row = KEY_TILE / 2;
            let mut i = 0;
            while i < count {
                let (wp, cp, op) = (w.add(i * row), correction.add(i), out.add(i * d));
                if count - i >= QB {
                    for c in (0..d).step_by(32) {
                        let acc = rescaled::<QB>(op.add(c), d, cp);
                        block(acc, wp, row, v.add(c), d, pairs, op.add(c), d);
                    }
                    i += QB;
                } else {
                    for c in (0..d).step_by(32) {
                        let acc = rescaled::<1>(op.add(c), d, cp);
                        block(acc, wp, row, v.add(c), d, pairs, op.add(c), d);
                    }
                    i += 1;
                }
            }
        }
    }
}

/// The largest of 64 scores: eight lanes, then a fixed tree (vectorises; max is exact, so
/// the order cannot change the result).
#[inline(always)]
fn max64(s: &[f32; KEY_TILE]) -> f32 {
    let mut l = [f32::NEG_INFINITY; 8];
    for v in 0..KEY_TILE / 8 {
        for j in 0..8 {
            l[j] = l[j].max(s[v * 8 + j]);
        }
    }
    (l[0].max(l[4]).max(l[2].max(l[6]))).max(l[1].max(l[5]).max(l[3].max(l[7])))
}

/// The sum of 64 weights in one fixed order (eight lane sums, then a fixed tree), the same
/// in every kernel path, so it vectorises without changing any result.
#[inline(always)]
fn sum64(s: &[f32; KEY_TILE]) -> f32 {
    let mut l = [0f32; 8];
    for v in 0..KEY_TILE / 8 {
        for j in 0..8 {
            l[j] += s[v * 8 + j];
        }
    }
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    /// The AVX-512 tile kernels give the AVX2 kernels' results bit for bit, for every cache
    /// element type, block remainder (1..=19 queries) and partial tile. On a CPU without
    /// AVX-512 there is no second path to compare (the other tests cover the AVX2 one).
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[allow(unsafe_code)]
    fn avx512_tiles_equal_avx2_bit_for_bit() {
        if !(crate::model::quant::has_avx512f() && crate::model::quant::has_avx2()) {
            eprintln!("no AVX-512F here: nothing to compare");
            return;
        }
        fn check<T: KvElement>(seed: &mut u64) {
            use super::tile_products::{avx2, avx512};
            for d in [64, 128] {
                // Two key groups in a 16-row block layout, two with a gathered tile's stride.
                let strides = [16, 32, GROUP, GROUP];
                let keys: Vec<Vec<T>> = strides
                    .iter()
                    .map(|&st| rand(d * st, seed).into_iter().map(T::from_f32).collect())
                    .collect();
                let values: Vec<Vec<T>> = (0..GROUPS)
                    .map(|_| rand(GROUP * d, seed).into_iter().map(T::from_f32).collect())
                    .collect();
                let groups: [KeyGroup<'_, T>; GROUPS] = std::array::from_fn(|g| KeyGroup {
                    k: &keys[g],
                    k_stride: strides[g],
                    v: &values[g],
                    v_stride: d,
                });
                for count in 1..20 {
                    let q = rand(count * d, seed);
                    let (mut s2, mut s5) =
                        (vec![0f32; count * KEY_TILE], vec![0f32; count * KEY_TILE]);
                    // SAFETY: both feature sets are present; the sizes are the callers'.
                    unsafe {
                        avx2::scores(&q, &groups, &mut s2, count, d);
                        avx512::scores(&q, &groups, &mut s5, count, d);
                    }
                    assert_eq!(bits(&s2), bits(&s5), "scores, d {d}, {count} queries");
                    let p = rand(count * KEY_TILE, seed);
                    let correction = rand(count, seed);
                    let start = rand(count * d, seed);
                    for n in [KEY_TILE, 37, 1] {
                        let (mut o2, mut o5) = (start.clone(), start.clone());
                        // SAFETY: as above.
                        unsafe {
                            avx2::weighted_values(&p, &groups, &correction, &mut o2, count, d, n);
                            avx512::weighted_values(&p, &groups, &correction, &mut o5, count, d, n);
                        }
                        assert_eq!(
                            bits(&o2),
                            bits(&o5),
                            "values, d {d}, {count} queries, {n} keys"
                        );
                    }
                }
            }
        }
        fn bits(x: &[f32]) -> Vec<u32> {
            x.iter().map(|v| v.to_bits()).collect()
        }
        let mut seed = 5;
        check::<f32>(&mut seed);
        check::<half::f16>(&mut seed);
        check::<half::bf16>(&mut seed);
    }

    /// A token-major key cache (the reference's layout) in the kernel's block layout.
    fn transposed(kc: &[f32], shape: &AttnShape) -> Vec<f32> {
        let kv_w = shape.num_kv_heads * shape.head_dim;
        let slots: Vec<usize> = (0..kc.len() / kv_w).collect();
        let mut out = vec![0f32; kc.len()];
        write_keys(&mut out, kc, &slots, shape);
        out
    }

    /// Softmax(QKᵀ)V by burn tensor ops, the reference the kernel is held to.
    fn reference(
        q: &[f32],
        kc: &[f32],
        vc: &[f32],
        seqs: &[AttnSeq<'_>],
        shape: &AttnShape,
    ) -> Vec<f32> {
        use super::super::ops::{f32_data, flex_from, reference};
        let qdim = shape.num_heads * shape.head_dim;
        let kv_w = shape.num_kv_heads * shape.head_dim;
        let out = reference::paged_attention::<burn::backend::flex::Flex>(
            flex_from(q.to_vec(), [q.len() / qdim, qdim]),
            &flex_from(kc.to_vec(), [kc.len() / kv_w, kv_w]),
            &flex_from(vc.to_vec(), [vc.len() / kv_w, kv_w]),
            seqs,
            shape,
        );
        f32_data(&out).into_owned()
    }

    /// The kernel equals the reference: prompts longer and shorter than a tile, a chunk over
    /// cached blocks (start_pos > 0) with a scattered block table, GQA groups, a decode row.
    #[test]
    fn tiled_attention_matches_the_reference() {
        let mut seed = 11;
        for (heads, kv_heads, d, bs) in [
            (9, 3, 64, 16),
            (4, 4, 8, 4),
            (8, 2, 16, 16),
            (9, 3, 64, 32),
            (6, 2, 32, 8),
        ] {
            // Sliding windows that cut inside a block, a tile and a segment (and one key).
            for window in [None, Some(1), Some(37), Some(600)] {
                let shape = AttnShape {
                    num_heads: heads,
                    num_kv_heads: kv_heads,
                    head_dim: d,
                    block_size: bs,
                    scale: 1.0 / (d as f32).sqrt(),
                    window,
                };
                let blocks = 160;
                let kv_w = kv_heads * d;
                let kc: Vec<f32> = rand(blocks * bs * kv_w, &mut seed)
                    .iter()
                    .map(|v| v * 6.0)
                    .collect();
                let vc = rand(blocks * bs * kv_w, &mut seed);
                // Scattered block tables.
                let t1: Vec<u32> = (0..blocks as u32).rev().step_by(2).collect();
                let t2: Vec<u32> = (0..blocks as u32).step_by(2).collect();
                let cases = [
                    (0usize, 77usize, 0usize), // a fresh prompt over one tile
                    (5 * bs, 23, 1),           // a chunk after cached blocks
                    (3, 9, 0),                 // a chunk cutting inside a block
                    (1100, 2, 1),              // rows past two segments (split across threads)
                ];
                for &(start, len, table) in &cases {
                    let table: &[u32] = if table == 0 { &t1 } else { &t2 };
                    if start + len > table.len() * bs {
                        continue; // small blocks: the table cannot hold this context
                    }
                    let decode = AttnSeq {
                        q_offset: len,
                        q_len: 1,
                        start_pos: 12,
                        block_table: &t2,
                    };
                    let seq = AttnSeq {
                        q_offset: 0,
                        q_len: len,
                        start_pos: start,
                        block_table: table,
                    };
                    let q = rand((len + 1) * heads * d, &mut seed);
                    let want = reference(&q, &kc, &vc, &[seq, decode], &shape);
                    let got =
                        paged_attention(&q, &transposed(&kc, &shape), &vc, &[seq, decode], &shape);
                    let worst = want
                        .iter()
                        .zip(&got)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(
                    worst < 2e-5,
                    "heads {heads}/{kv_heads} d {d} window {window:?} start {start} len {len}: {worst}"
                );
                }
            }
        }
    }

    /// A prompt's attention is bit-identical however it is chunked and whatever shares the
    /// step: one 1300-token chunk alone, or chunks of 600, 1, 37, 1 and 661 rows alone
    /// (single rows split their context across threads) or beside other sequences (which
    /// also changes how tasks split the query heads).
    #[test]
    fn results_do_not_depend_on_chunking_or_batching() {
        // f32, and bf16 (its dot-product path where the CPU has AVX-512 BF16).
        check_chunking_invariance(|x| x);
        check_chunking_invariance(half::bf16::from_f32);
    }

    fn check_chunking_invariance<T: KvElement>(cache: impl Fn(f32) -> T) {
        let mut seed = 5;
        let shape = AttnShape {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            block_size: 16,
            scale: 0.125,
            window: None,
        };
        let kv_w = 3 * 64;
        let qdim = 9 * 64;
        let blocks = 96;
        let kc: Vec<T> = rand(blocks * 16 * kv_w, &mut seed)
            .into_iter()
            .map(&cache)
            .collect();
        let vc: Vec<T> = rand(blocks * 16 * kv_w, &mut seed)
            .into_iter()
            .map(&cache)
            .collect();
        let table: Vec<u32> = (0..blocks as u32).rev().collect();
        let other: Vec<u32> = (0..blocks as u32).collect();
        let len = 1300;
        let q = rand(len * qdim, &mut seed);
        let whole = paged_attention(
            &q,
            &kc,
            &vc,
            &[AttnSeq {
                q_offset: 0,
                q_len: len,
                start_pos: 0,
                block_table: &table,
            }],
            &shape,
        );
        let mut start = 0;
        // Single rows past the first segment are split across threads; the whole prompt is
        // not.
        for chunk in [600, 1, 37, 1, 661] {
            // The chunk's rows after 40 rows of another sequence's prefill.
            let mut qq = rand(40 * qdim, &mut seed);
            qq.extend_from_slice(&q[start * qdim..(start + chunk) * qdim]);
            let seqs = [
                AttnSeq {
                    q_offset: 0,
                    q_len: 40,
                    start_pos: 100,
                    block_table: &other,
                },
                AttnSeq {
                    q_offset: 40,
                    q_len: chunk,
                    start_pos: start,
                    block_table: &table,
                },
            ];
            let batched = paged_attention(&qq, &kc, &vc, &seqs, &shape);
            let alone = paged_attention(
                &q[start * qdim..(start + chunk) * qdim],
                &kc,
                &vc,
                &[AttnSeq {
                    q_offset: 0,
                    q_len: chunk,
                    ..seqs[1]
                }],
                &shape,
            );
            let want = &whole[start * qdim..(start + chunk) * qdim];
            assert!(batched[40 * qdim..] == *want, "chunk at {start} batched");
            assert!(alone == want, "chunk at {start} alone");
            start += chunk;
        }
    }

    /// The vectorised `exp` (as the kernel runs it over a score row) equals the scalar one.
    #[test]
    fn exp_over_a_row_equals_exp_of_each() {
        let mut xs: Vec<f32> = (0..64).map(|i| -(i as f32) * 0.37).collect();
        xs[63] = f32::NEG_INFINITY;
        let want: Vec<f32> = xs.iter().map(|&x| exp_scalar(x)).collect();
        exp_in_place(&mut xs);
        assert_eq!(xs, want);
    }

    /// The register-blocked products (AVX2 where present) equal the plain fused
    /// multiply-add chains bit for bit, for every count of queries a block can leave over.
    #[test]
    fn tile_products_equal_the_plain_chains() {
        let d = 64;
        let mut seed = 3u64;
        let kd = rand(GROUPS * d * GROUP, &mut seed);
        let vd = rand(KEY_TILE * d, &mut seed);
        let groups: [KeyGroup<'_, f32>; GROUPS] = std::array::from_fn(|g| KeyGroup {
            k: &kd[g * d * GROUP..],
            k_stride: GROUP,
            v: &vd[g * GROUP * d..],
            v_stride: d,
        });
        for count in [1, 3, 4, 7, 9] {
            let q = rand(count * d, &mut seed);
            let mut s = vec![0f32; count * KEY_TILE];
            tile_products::scores(&q, &groups, &mut s, count, d);
            for i in 0..count {
                for t in 0..KEY_TILE {
                    let (g, u) = (t / GROUP, t % GROUP);
                    let want = (0..d).fold(0f32, |acc, c| {
                        q[i * d + c].mul_add(kd[g * d * GROUP + c * GROUP + u], acc)
                    });
                    assert_eq!(s[i * KEY_TILE + t], want, "score {i} {t}");
                }
            }
            let correction = rand(count, &mut seed);
            let mut out = rand(count * d, &mut seed);
            let keys = 50;
            let want: Vec<f32> = (0..count * d)
                .map(|at| {
                    let (i, c) = (at / d, at % d);
                    (0..keys).fold(out[at] * correction[i], |o, t| {
                        s[i * KEY_TILE + t].mul_add(vd[t * d + c], o)
                    })
                })
                .collect();
            tile_products::weighted_values(&s, &groups, &correction, &mut out, count, d, keys);
            assert_eq!(out, want, "{count} queries");
        }
    }

    /// The bf16 dot-product kernels, keys and values repacked from in-place (strided) and
    /// gathered groups, equal the FMA kernels fed the same bf16-rounded queries and weights
    /// up to summation order: any mistake in the pairing would be off by whole products.
    #[test]
    fn bf16_dot_products_equal_the_fma_products_on_rounded_inputs() {
        use half::bf16;
        let mut seed = 8;
        if !bf16_dot::usable::<bf16>(64) {
            eprintln!("no AVX-512 BF16 here: nothing to compare");
            return;
        }
        let close = |got: &[f32], want: &[f32], scale: &[f32], what: &str| {
            for (at, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
                assert!((g - w).abs() <= 1e-5 * s, "{what} [{at}]: {g} vs {w}");
            }
        };
        for d in [64, 128] {
            let strides = [16, 32, GROUP, GROUP];
            let keys: Vec<Vec<bf16>> = strides
                .iter()
                .map(|&st| {
                    rand(d * st, &mut seed)
                        .into_iter()
                        .map(bf16::from_f32)
                        .collect()
                })
                .collect();
            let values: Vec<Vec<bf16>> = (0..GROUPS)
                .map(|_| {
                    rand(GROUP * d, &mut seed)
                        .into_iter()
                        .map(bf16::from_f32)
                        .collect()
                })
                .collect();
            let groups: [KeyGroup<'_, bf16>; GROUPS] = std::array::from_fn(|g| KeyGroup {
                k: &keys[g],
                k_stride: strides[g],
                v: &values[g],
                v_stride: d,
            });
            for count in 1..20 {
                let mut q = rand(count * d, &mut seed);
                let mut dot = bf16_dot::Packed::new::<bf16>(&mut q, d).expect("checked above");
                assert!(
                    q.iter().all(|&x| bf16_dot::round(x) == x),
                    "queries rounded"
                );
                let (mut got, mut want) =
                    (vec![0f32; count * KEY_TILE], vec![0f32; count * KEY_TILE]);
                dot.pack_keys(&groups);
                dot.scores(0, &mut got, count);
                tile_products::scores(&q, &groups, &mut want, count, d);
                let scale: Vec<f32> = (0..count * KEY_TILE)
                    .map(|at| {
                        let (i, t) = (at / KEY_TILE, at % KEY_TILE);
                        let kg = &groups[t / GROUP];
                        (0..d)
                            .map(|c| {
                                (q[i * d + c] * kg.k[c * kg.k_stride + t % GROUP].to_f32()).abs()
                            })
                            .sum::<f32>()
                    })
                    .collect();
                close(
                    &got,
                    &want,
                    &scale,
                    &format!("scores, d {d}, {count} queries"),
                );
                let p: Vec<f32> = rand(count * KEY_TILE, &mut seed)
                    .into_iter()
                    .map(|x| bf16_dot::round(x.abs()))
                    .collect();
                let correction = rand(count, &mut seed);
                let start = rand(count * d, &mut seed);
                for n in [KEY_TILE, 37, 1] {
                    let (mut got, mut want) = (start.clone(), start.clone());
                    dot.pack_values(&groups, n);
                    dot.weighted_values(&p, &correction, &mut got, count, n);
                    tile_products::weighted_values(
                        &p,
                        &groups,
                        &correction,
                        &mut want,
                        count,
                        d,
                        n,
                    );
                    let scale: Vec<f32> = (0..count * d)
                        .map(|at| {
                            let (i, c) = (at / d, at % d);
                            (start[at] * correction[i]).abs()
                                + (0..n)
                                    .map(|t| {
                                        let kg = &groups[t / GROUP];
                                        (p[i * KEY_TILE + t] * kg.v[(t % GROUP) * d + c].to_f32())
                                            .abs()
                                    })
                                    .sum::<f32>()
                        })
                        .collect();
                    close(
                        &got,
                        &want,
                        &scale,
                        &format!("values, d {d}, {count} queries, {n} keys"),
                    );
                }
            }
        }
    }

    /// 16-bit caches (`--kv-cache-dtype float16 | bfloat16`): the kernel over the stored
    /// keys and values equals the reference over the same values widened to `f32`, on the
    /// in-place path and the gathered one.
    #[test]
    fn sixteen_bit_caches_match_the_reference_over_their_values() {
        fn check<T: KvElement>(name: &str) {
            let mut seed = 21;
            for (heads, kv_heads, d, bs) in [(9, 3, 64, 16), (4, 4, 8, 4)] {
                let shape = AttnShape {
                    num_heads: heads,
                    num_kv_heads: kv_heads,
                    head_dim: d,
                    block_size: bs,
                    scale: 1.0 / (d as f32).sqrt(),
                    window: None,
                };
                let kv_w = kv_heads * d;
                let slots = 64 * bs;
                let round = |v: Vec<f32>| -> Vec<f32> {
                    v.iter().map(|&x| T::from_f32(x).to_f32()).collect()
                };
                let kc = round(
                    rand(slots * kv_w, &mut seed)
                        .iter()
                        .map(|v| v * 6.0)
                        .collect(),
                );
                let vc = round(rand(slots * kv_w, &mut seed));
                let mut k16 = vec![T::ZERO; kc.len()];
                write_keys(&mut k16, &kc, &(0..slots).collect::<Vec<_>>(), &shape);
                let v16: Vec<T> = vc.iter().map(|&x| T::from_f32(x)).collect();
                let table: Vec<u32> = (0..64u32).rev().collect();
                let seqs = [
                    AttnSeq {
                        q_offset: 0,
                        q_len: 70,
                        start_pos: 9,
                        block_table: &table,
                    },
                    AttnSeq {
                        q_offset: 70,
                        q_len: 1,
                        start_pos: 600.min(slots - 1),
                        block_table: &table,
                    },
                ];
                let mut q = rand(71 * heads * d, &mut seed);
                // The bf16 dot-product path rounds the queries (a scale of 1/8 commutes with
                // that) and the softmax weights to bf16: the reference takes the same
                // queries, and the weights' rounding bounds the difference.
                let dot = bf16_dot::usable::<T>(d);
                if dot {
                    q.iter_mut().for_each(|x| *x = bf16_dot::round(*x));
                }
                let want = reference(&q, &kc, &vc, &seqs, &shape);
                let got = paged_attention(&q, &k16, &v16, &seqs, &shape);
                let worst = want
                    .iter()
                    .zip(&got)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                let bound = if dot { 4e-3 } else { 2e-5 };
                assert!(worst < bound, "{name} heads {heads} d {d} bs {bs}: {worst}");
            }
        }
        check::<half::f16>("float16");
        check::<half::bf16>("bfloat16");
    }
}
