//! Activation quantization: each matmul input quantized once to 8 bits per 32-block
//! ([`Q8Acts`], ggml's `quantize_row_q8_1` rounding), which the integer kernels multiply
//! with the weight quants.

use half::f16;
use rayon::prelude::*;

use super::packed::{BLOCK, LANE_BYTES};

/// Activations quantized to 8 bits per 32-block, once per matmul input (ggml's `Q8_0` /
/// `Q8_1`): `x ≈ d * q`, and `s = d * sum(q)` for the `m` term of Q4_1. The integer dot of
/// weight quants and activation quants is exact, so only the per-block scaling is float.
#[derive(Debug, Clone, Default)]
pub struct Q8Acts {
    cols: usize,
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    sum: Vec<i32>,
}

/// One token's row of [`Q8Acts`].
#[derive(Debug, Clone, Copy)]
pub struct Q8Row<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
    /// `sum(q)` per block, exact (Q4_0's `-8` offset is applied through it).
    pub sum: &'a [i32],
}

impl Q8Acts {
    /// Quantize `x: [tokens, cols]` (`cols` a multiple of 32).
    pub fn quantize(x: &[f32], tokens: usize, cols: usize) -> Self {
        assert_eq!(x.len(), tokens * cols);
        assert_eq!(cols % 32, 0);
        let nb = cols / 32;
        let mut a = Self {
            cols,
            qs: vec![0; tokens * cols],
            d: vec![0.0; tokens * nb],
            s: vec![0.0; tokens * nb],
            sum: vec![0; tokens * nb],
        };
        type Row<'a> = (
            (&'a [f32], &'a mut [i8]),
            ((&'a mut [f32], &'a mut [f32]), &'a mut [i32]),
        );
        let work = |((xr, qs), ((d, s), sum)): Row<'_>| quantize_row_q8(xr, qs, d, s, sum);
        if tokens >= 8 {
            x.par_chunks(cols)
                .zip(a.qs.par_chunks_mut(cols))
                .zip(
                    a.d.par_chunks_mut(nb)
                        .zip(a.s.par_chunks_mut(nb))
                        .zip(a.sum.par_chunks_mut(nb)),
                )
                .for_each(work);
        } else {
            x.chunks(cols)
                .zip(a.qs.chunks_mut(cols))
                .zip(
                    a.d.chunks_mut(nb)
                        .zip(a.s.chunks_mut(nb))
                        .zip(a.sum.chunks_mut(nb)),
                )
                .for_each(work);
        }
        a
    }

    #[inline]
    pub fn row(&self, t: usize) -> Q8Row<'_> {
        let nb = self.cols / 32;
        Q8Row {
            qs: &self.qs[t * self.cols..(t + 1) * self.cols],
            d: &self.d[t * nb..(t + 1) * nb],
            s: &self.s[t * nb..(t + 1) * nb],
            sum: &self.sum[t * nb..(t + 1) * nb],
        }
    }
}

/// The most activation rows one group-kernel call takes (see [`Q8Tile`]).
pub(crate) const MAX_TILE: usize = 8;

/// 4-byte activation words per 32-column block.
pub(crate) const WORDS: usize = BLOCK / LANE_BYTES;

/// Up to [`MAX_TILE`] rows of [`Q8Acts`] interleaved for the group kernels, which multiply
/// every row of a tile by each weight vector they unpack: word `w` of block `i` of row `t`
/// at `words[(i * WORDS + w) * MAX_TILE + t]` and the per-block values at
/// `[i * MAX_TILE + t]`, so one pointer and constant offsets reach every row (with one
/// pointer per row, eight rows' pointers spill out of the registers). Rows past `rows` are
/// zero. Besides each block's `d`, `s` and exact `sum(q)`, it keeps the terms the kernels
/// would otherwise recompute per weight group: `d * sum` (the K-quants' `M` term) and the
/// biases `128 * sum` of the VNNI kernels' unsigned weight form, for the whole block and
/// for each 16-column half (Q6_K).
#[derive(Debug, Clone)]
pub(crate) struct Q8Tile {
    pub(crate) rows: usize,
    pub(crate) blocks: usize,
    pub(crate) words: Vec<i32>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) sum: Vec<i32>,
    pub(crate) d_sum: Vec<f32>,
    pub(crate) bias: Vec<i32>,
    pub(crate) bias_lo: Vec<i32>,
    pub(crate) bias_hi: Vec<i32>,
}

/// What the VNNI kernels add to a signed weight byte to read it as unsigned (an xor with
/// `0x80`); each product then carries `UNSIGNED_BIAS * x`, taken out once per block as
/// `UNSIGNED_BIAS * sum(x)`. Exact: `|w·x| + 128·|sum(x)|` stays far inside i32.
pub(crate) const UNSIGNED_BIAS: i32 = 128;

impl Q8Tile {
    /// Rows `t0..t0 + rows` of `acts` (`rows <= MAX_TILE`).
    pub(crate) fn new(acts: &Q8Acts, t0: usize, rows: usize) -> Self {
        assert!(rows <= MAX_TILE);
        let nb = acts.cols / BLOCK;
        let per_block = nb * MAX_TILE;
        let mut t = Self {
            rows,
            blocks: nb,
            words: vec![0; per_block * WORDS],
            d: vec![0.0; per_block],
            s: vec![0.0; per_block],
            sum: vec![0; per_block],
            d_sum: vec![0.0; per_block],
            bias: vec![0; per_block],
            bias_lo: vec![0; per_block],
            bias_hi: vec![0; per_block],
        };
        for r in 0..rows {
            let a = acts.row(t0 + r);
            for i in 0..nb {
                let at = i * MAX_TILE + r;
                let q = &a.qs[i * BLOCK..(i + 1) * BLOCK];
                for (w, word) in q.chunks_exact(LANE_BYTES).enumerate() {
                    let bytes = [word[0] as u8, word[1] as u8, word[2] as u8, word[3] as u8];
                    t.words[(i * WORDS + w) * MAX_TILE + r] = i32::from_le_bytes(bytes);
                }
                let lo: i32 = q[..BLOCK / 2].iter().map(|&v| v as i32).sum();
                t.d[at] = a.d[i];
                t.s[at] = a.s[i];
                t.sum[at] = a.sum[i];
                t.d_sum[at] = a.d[i] * a.sum[i] as f32;
                t.bias[at] = UNSIGNED_BIAS * a.sum[i];
                t.bias_lo[at] = UNSIGNED_BIAS * lo;
                t.bias_hi[at] = UNSIGNED_BIAS * (a.sum[i] - lo);
            }
        }
        t
    }

    /// Every row of `acts` in tiles of `width` rows.
    pub(crate) fn split(acts: &Q8Acts, tokens: usize, width: usize) -> Vec<Self> {
        (0..tokens)
            .step_by(width.max(1))
            .map(|t0| Self::new(acts, t0, width.min(tokens - t0)))
            .collect()
    }

    /// Activation byte `c` (of 32) of block `i` of row `t`.
    #[inline(always)]
    pub(crate) fn q(&self, t: usize, i: usize, c: usize) -> i8 {
        let word = self.words[(i * WORDS + c / LANE_BYTES) * MAX_TILE + t];
        word.to_le_bytes()[c % LANE_BYTES] as i8
    }
}

/// ggml's x86 `quantize_row_q8_1`: `d = amax / 127` (stored as f16), `q = round(x * 127 /
/// amax)` to nearest even, `s = d * sum(q)` (f16). Same values as llama.cpp's activations.
fn quantize_row_q8(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32], sums: &mut [i32]) {
    for ((((xb, qb), d), s), sums) in x
        .chunks_exact(32)
        .zip(qs.chunks_exact_mut(32))
        .zip(d.iter_mut())
        .zip(s.iter_mut())
        .zip(sums.iter_mut())
    {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let dd = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            // Round to nearest even, as `roundeven` but vectorizable: |v * id| <= 127, far
            // below 2^22, where adding 1.5 * 2^23 leaves exactly the rounded integer.
            const MAGIC: f32 = 12_582_912.0;
            let r = ((v * id + MAGIC) - MAGIC) as i32;
            *q = r as i8;
            sum += r;
        }
        *d = f16::from_f32(dd).to_f32();
        *s = f16::from_f32(dd * sum as f32).to_f32();
        *sums = sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::test_util::*;

    /// Q8 activations reconstruct the input within half a step, and `s = d * sum(q)`.
    #[test]
    fn q8_activations_round_trip() {
        let mut seed = 23u64;
        let mut x = random_x(3 * 96, &mut seed);
        x[32..64].iter_mut().for_each(|v| *v = 0.0);
        let acts = Q8Acts::quantize(&x, 3, 96);
        for t in 0..3 {
            let a = acts.row(t);
            for i in 0..3 {
                let d = a.d[i];
                let sum: i32 = a.qs[i * 32..(i + 1) * 32].iter().map(|&q| q as i32).sum();
                assert!((a.s[i] - d * sum as f32).abs() <= 1e-3 * (1.0 + a.s[i].abs()));
                for j in 0..32 {
                    let v = x[t * 96 + i * 32 + j];
                    let q = a.qs[i * 32 + j] as f32;
                    assert!(
                        (v - d * q).abs() <= 0.5 * d + 1e-3 * v.abs() + 1e-7,
                        "{v} vs {q}*{d}"
                    );
                }
            }
        }
        assert!(acts.row(0).qs[32..64].iter().all(|&q| q == 0));
    }
}
