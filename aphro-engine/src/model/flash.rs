//! Causal paged attention on the CPU, tiled flash-attention style.
//!
//! A naive kernel reads every key and value of the context once per query row: a 4k-token
//! prefill streams the cache 4k times per layer and spends as long in `exp` as in the dot
//! products. Here a *block* of query rows (the query heads of one KV head) walks the context
//! one key tile at a time: the tile's keys and values are gathered once into small transposed
//! tiles that stay in L1, scores come from a register-blocked kernel, and softmax is computed
//! online (running max and sum per query, the output rescaled when the max grows), with a
//! vectorised `exp`. The result equals softmax(QKᵀ)V within float rounding; `tests` hold it to
//! the two-pass reference kernel.
//!
//! **Invariant: a query's result does not depend on how its sequence was chunked or batched.**
//! Key tiles start at absolute positions (0, 64, 128, ...) and each query's running max, sum
//! and output see them in that order with the same operations, whatever rows share its block.
//! So a prompt prefilled in one step, in paced chunks, or over prefix-cached blocks, and then
//! decoded, gives bit-identical logits; seeded sampling repeats across those paths. Decode
//! rows take this kernel too, for that reason (and it is as fast: one pass, no score buffer).
use super::ops::{AttnSeq, AttnShape};
use rayon::prelude::*;

/// Query rows per task. With a GQA group of `g` heads a task holds `QUERY_ROWS * g` queries.
const QUERY_ROWS: usize = 16;
/// Keys per tile: 64 scores of one query fit in 8 AVX registers.
const KEY_TILE: usize = 64;

/// Attention of every query row of `seqs`: `[tokens, heads * d]` for the `tokens = q.len() /
/// (heads * d)` rows of `q`; rows no sequence owns stay zero.
pub fn paged_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[AttnSeq<'_>],
    shape: &AttnShape,
) -> Vec<f32> {
    let (h, kvh, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let qdim = h * d;
    if qdim == 0 || kvh == 0 {
        return Vec::new();
    }
    let mut out = vec![0f32; q.len() / qdim * qdim];
    let group = h / kvh;
    // Tasks: (sequence, first row of its query block, KV head, first query head of the
    // group, heads); each owns disjoint output.
    let mut blocks = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        for r0 in (0..s.q_len).step_by(QUERY_ROWS) {
            for kv in 0..kvh {
                blocks.push((si, r0, kv));
            }
        }
    }
    // Few blocks (batch-1 decode) would leave threads idle: then one task per query head. A
    // query's arithmetic is the same either way (see the invariant above).
    let heads_per_task = if blocks.len() < 2 * rayon::current_num_threads() {
        1
    } else {
        group
    };
    let mut tasks = Vec::with_capacity(blocks.len() * group / heads_per_task);
    for &(si, r0, kv) in &blocks {
        for h0 in (0..group).step_by(heads_per_task) {
            tasks.push((si, r0, kv, h0));
        }
    }
    // Longest contexts first, so the causal triangle's expensive blocks do not straggle.
    tasks.sort_by_key(|&(si, r0, _, _)| std::cmp::Reverse(seqs[si].start_pos + r0));
    let results: Vec<(usize, usize, usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(si, r0, kv, h0)| {
            let s = &seqs[si];
            let block = QueryBlock {
                q,
                qdim,
                seq: s,
                first_row: r0,
                rows: QUERY_ROWS.min(s.q_len - r0),
                kv_head: kv,
                first_head: h0,
                heads: heads_per_task,
                shape,
            };
            (si, r0, kv, h0, block.attend(k_cache, v_cache))
        })
        .collect();
    let w = heads_per_task * d;
    for (si, r0, kv, h0, o) in results {
        let s = &seqs[si];
        for r in 0..QUERY_ROWS.min(s.q_len - r0) {
            let dst = (s.q_offset + r0 + r) * qdim + (kv * group + h0) * d;
            if let Some(dst) = out.get_mut(dst..dst + w) {
                dst.copy_from_slice(&o[r * w..(r + 1) * w]);
            }
        }
    }
    out
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
    shape: &'a AttnShape,
}

impl QueryBlock<'_> {
    #[allow(unsafe_code)]
    fn attend(&self, k_cache: &[f32], v_cache: &[f32]) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        if super::quant::has_avx2() {
            // SAFETY: AVX2 and FMA are present (checked at run time); the body is safe code.
            return unsafe { self.attend_avx2(k_cache, v_cache) };
        }
        self.body(k_cache, v_cache)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn attend_avx2(&self, k_cache: &[f32], v_cache: &[f32]) -> Vec<f32> {
        self.body(k_cache, v_cache)
    }

    /// Output `[rows, heads * d]` of this block, query-row major.
    #[inline(always)]
    fn body(&self, k_cache: &[f32], v_cache: &[f32]) -> Vec<f32> {
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
        // Absolute position of each row; row r sees keys 0..=pos(r).
        let pos0 = self.seq.start_pos + self.first_row;
        let ctx = pos0 + self.rows;
        let mut out = vec![0f32; m * d];
        let mut max = vec![f32::NEG_INFINITY; m];
        let mut sum = vec![0f32; m];
        let mut kt = vec![0f32; d * KEY_TILE];
        let mut vt = vec![0f32; KEY_TILE * d];
        let mut scores = [0f32; KEY_TILE];
        let slot = |p: usize| {
            (self.seq.block_table[p / bs] as usize * bs + p % bs) * kv_w + self.kv_head * d
        };
        for k0 in (0..ctx).step_by(KEY_TILE) {
            let n = KEY_TILE.min(ctx - k0);
            // Keys transposed ([d][KEY_TILE]) so a query's 64 scores accumulate in lanes;
            // values row-major. A short last tile is zero-padded (its scores are masked).
            for t in 0..KEY_TILE {
                if t < n {
                    let off = slot(k0 + t);
                    let k = &k_cache[off..off + d];
                    for c in 0..d {
                        kt[c * KEY_TILE + t] = k[c];
                    }
                    vt[t * d..(t + 1) * d].copy_from_slice(&v_cache[off..off + d]);
                } else {
                    for c in 0..d {
                        kt[c * KEY_TILE + t] = 0.0;
                    }
                    vt[t * d..(t + 1) * d].fill(0.0);
                }
            }
            for i in 0..m {
                let pos = pos0 + i / heads;
                if k0 > pos {
                    continue;
                }
                // Keys past this row's position (or past the tile) do not count.
                let visible = n.min(pos + 1 - k0);
                tile_scores(&qs[i * d..(i + 1) * d], &kt, &mut scores);
                let tile_max = scores[..visible]
                    .iter()
                    .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let new_max = max[i].max(tile_max);
                let correction = exp_scalar(max[i] - new_max);
                max[i] = new_max;
                for s in scores[..visible].iter_mut() {
                    *s -= new_max;
                }
                exp_in_place(&mut scores[..visible]);
                scores[visible..].fill(0.0);
                sum[i] = sum[i] * correction + scores[..visible].iter().sum::<f32>();
                let o = &mut out[i * d..(i + 1) * d];
                if correction != 1.0 {
                    o.iter_mut().for_each(|x| *x *= correction);
                }
                for (t, &p) in scores[..visible].iter().enumerate() {
                    let v = &vt[t * d..(t + 1) * d];
                    for (a, &x) in o.iter_mut().zip(v) {
                        *a = p.mul_add(x, *a);
                    }
                }
            }
        }
        for i in 0..m {
            let inv = 1.0 / sum[i];
            out[i * d..(i + 1) * d].iter_mut().for_each(|x| *x *= inv);
        }
        out
    }
}

/// `scores[t] = q · key t` for the `KEY_TILE` keys of a transposed tile.
#[inline(always)]
fn tile_scores(q: &[f32], kt: &[f32], scores: &mut [f32; KEY_TILE]) {
    let mut acc = [0f32; KEY_TILE];
    for (c, &qc) in q.iter().enumerate() {
        let row: &[f32; KEY_TILE] = kt[c * KEY_TILE..(c + 1) * KEY_TILE]
            .try_into()
            .expect("tile row");
        for t in 0..KEY_TILE {
            acc[t] = qc.mul_add(row[t], acc[t]);
        }
    }
    *scores = acc;
}

/// `e^x`, the same function as [`exp_in_place`] lane by lane.
#[inline(always)]
fn exp_scalar(x: f32) -> f32 {
    let mut v = [x];
    exp_in_place(&mut v);
    v[0]
}

/// `e^x` in place: Cephes' `expf` (range reduction by ln 2 in two parts, a degree-5
/// polynomial, scaling by 2^n through the exponent bits), written so it vectorises.
/// Within 2 ulp of `f32::exp` over the inputs softmax gives it (`x <= 0`); `-inf` → 0.
#[inline(always)]
fn exp_in_place(xs: &mut [f32]) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    for x in xs.iter_mut() {
        let v = x.clamp(-87.336_55, 88.376_26);
        // Round to nearest by the 1.5 * 2^23 trick (vectorises, unlike `round`).
        let n = (v * LOG2E + 12_582_912.0) - 12_582_912.0;
        let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, v));
        let mut p = P[0];
        for &c in &P[1..] {
            p = p.mul_add(r, c);
        }
        let e = (p * r * r + r) + 1.0;
        let bits = ((n as i32 + 127) as u32) << 23;
        let y = e * f32::from_bits(bits);
        // Below the clamp the true value underflows to 0 (and -inf must give 0).
        *x = if *x < -87.336_55 { 0.0 } else { y };
    }
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

    #[test]
    fn exp_matches_std_within_two_ulp() {
        let mut worst = 0u32;
        let mut x = -87.0f32;
        while x <= 10.0 {
            let got = exp_scalar(x);
            let want = x.exp();
            let ulp = (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs() as u32;
            worst = worst.max(ulp);
            x += 0.001_37;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
        assert_eq!(exp_scalar(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_scalar(-100.0), 0.0);
        assert_eq!(exp_scalar(0.0), 1.0);
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
        for (heads, kv_heads, d, bs) in [(9, 3, 64, 16), (4, 4, 8, 4), (8, 2, 16, 16)] {
            let shape = AttnShape {
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: d,
                block_size: bs,
                scale: 1.0 / (d as f32).sqrt(),
            };
            let blocks = 40;
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
            ];
            for &(start, len, table) in &cases {
                let table: &[u32] = if table == 0 { &t1 } else { &t2 };
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
                let got = paged_attention(&q, &kc, &vc, &[seq, decode], &shape);
                let worst = want
                    .iter()
                    .zip(&got)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst < 2e-5,
                    "heads {heads}/{kv_heads} d {d} start {start} len {len}: {worst}"
                );
            }
        }
    }

    /// A prompt's attention is bit-identical however it is chunked and whatever shares the
    /// step: one 150-token chunk alone, or chunks of 37, 1 and 112 rows beside other
    /// sequences (which also changes how tasks split the query heads).
    #[test]
    fn results_do_not_depend_on_chunking_or_batching() {
        let mut seed = 5;
        let shape = AttnShape {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            block_size: 16,
            scale: 0.125,
        };
        let kv_w = 3 * 64;
        let qdim = 9 * 64;
        let blocks = 32;
        let kc = rand(blocks * 16 * kv_w, &mut seed);
        let vc = rand(blocks * 16 * kv_w, &mut seed);
        let table: Vec<u32> = (0..blocks as u32).rev().collect();
        let other: Vec<u32> = (0..blocks as u32).collect();
        let len = 150;
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
        for chunk in [37, 1, 112] {
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
}
