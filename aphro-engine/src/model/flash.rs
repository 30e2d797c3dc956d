//! Tiled causal attention for prefill rows on the CPU (flash-attention style).
//!
//! The per-row kernel in [`super::cpu`] reads every key and value of the context once per
//! query row: a 4k-token prefill streams the cache 4k times per layer and spends as long in
//! `exp` as in the dot products. Here a *block* of query rows (all query heads of one KV
//! head) walks the context one key block at a time: the block's keys and values are gathered
//! once into small transposed tiles that stay in L1, scores come from a register-blocked
//! kernel, and softmax is computed online (running max and sum per query, the output
//! rescaled when the max grows), with a vectorised `exp`. The result equals softmax(QKᵀ)V
//! within float rounding; `tests` hold it to the per-row kernel.
use super::ops::{AttnSeq, AttnShape};
use rayon::prelude::*;

/// Query rows per task. With a GQA group of `g` heads a task holds `QUERY_ROWS * g` queries.
const QUERY_ROWS: usize = 16;
/// Keys per tile: 64 scores of one query fit in 8 AVX registers.
const KEY_TILE: usize = 64;
/// Sequences with at least this many query rows in a step take the tiled path.
pub const MIN_TILED_ROWS: usize = 8;

/// Attention of every query row of `seqs` (each with `q_len >= MIN_TILED_ROWS`), written into
/// `out` (`[tokens, heads * d]`, rows of other sequences untouched).
pub fn prefill_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[&AttnSeq<'_>],
    shape: &AttnShape,
    out: &mut [f32],
) {
    let (h, kvh, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    if h == 0 || kvh == 0 || d == 0 {
        return;
    }
    let qdim = h * d;
    // Tasks: (sequence, first row of its query block, KV head); each owns disjoint output.
    let mut tasks = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        for r0 in (0..s.q_len).step_by(QUERY_ROWS) {
            for kv in 0..kvh {
                tasks.push((si, r0, kv));
            }
        }
    }
    // Longest contexts first, so the causal triangle's expensive blocks do not straggle.
    tasks.sort_by_key(|&(si, r0, _)| std::cmp::Reverse(seqs[si].start_pos + r0));
    let results: Vec<(usize, usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(si, r0, kv)| {
            let s = seqs[si];
            let rows = QUERY_ROWS.min(s.q_len - r0);
            let block = QueryBlock {
                q,
                qdim,
                seq: s,
                first_row: r0,
                rows,
                kv_head: kv,
                shape,
            };
            (si, r0, kv, block.attend(k_cache, v_cache))
        })
        .collect();
    let group = h / kvh;
    for (si, r0, kv, o) in results {
        let s = seqs[si];
        let rows = QUERY_ROWS.min(s.q_len - r0);
        for r in 0..rows {
            let dst = (s.q_offset + r0 + r) * qdim + kv * group * d;
            out[dst..dst + group * d].copy_from_slice(&o[r * group * d..(r + 1) * group * d]);
        }
    }
}

/// `rows` query rows of one sequence, the query heads of one KV head.
struct QueryBlock<'a> {
    q: &'a [f32],
    qdim: usize,
    seq: &'a AttnSeq<'a>,
    first_row: usize,
    rows: usize,
    kv_head: usize,
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

    /// Output `[rows, group * d]` of this block, query-row major.
    #[inline(always)]
    fn body(&self, k_cache: &[f32], v_cache: &[f32]) -> Vec<f32> {
        let shape = self.shape;
        let d = shape.head_dim;
        let group = shape.num_heads / shape.num_kv_heads;
        let kv_w = shape.num_kv_heads * d;
        let bs = shape.block_size.max(1);
        let m = self.rows * group;
        // Queries, pre-scaled, one per (row, head): query i = row i / group, head i % group.
        let mut qs = vec![0f32; m * d];
        for r in 0..self.rows {
            let base =
                (self.seq.q_offset + self.first_row + r) * self.qdim + self.kv_head * group * d;
            for j in 0..group {
                let src = &self.q[base + j * d..base + (j + 1) * d];
                let dst = &mut qs[(r * group + j) * d..(r * group + j + 1) * d];
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
                let pos = pos0 + i / group;
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
        5.000_000_1e-1,
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

    /// The tiled kernel equals the per-row kernel: prompts longer and shorter than a tile,
    /// a chunk over cached blocks (start_pos > 0) with a scattered block table, GQA groups.
    #[test]
    fn tiled_prefill_matches_per_row_attention() {
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
                let want =
                    super::super::cpu::paged_attention_rows(&q, &kc, &vc, &[seq, decode], &shape);
                let got = super::super::cpu::paged_attention(&q, &kc, &vc, &[seq, decode], &shape);
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
}
