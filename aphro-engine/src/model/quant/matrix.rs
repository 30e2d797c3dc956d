//! [`QuantMatrix`]: a quantized (or 16-bit float) weight matrix, its construction from ggml
//! bytes, row read-back and dequantization, and the matmul drivers that split the work
//! into row groups over the rayon pool and hand each group to the kernels; plus the dense
//! f32 matmul with the same threading.

use half::f16;
use rayon::prelude::*;

use super::activation::{Q8Acts, Q8Tile};
use super::dequant::{dequantize_into, dequantize_packed};
use super::format::{QuantError, QuantType};
use super::kernels::{dot_f32, group_dot, tile_width, MAX_TILE};
use super::packed::{Packing, BLOCK, GROUP};
use super::repack::{pack, unpack_classic_row};

/// A row-major `[rows, cols]` matrix of ggml blocks.
///
/// Formats with a fused kernel (all but the 16-bit floats) are repacked at construction
/// into groups of [`GROUP`] rows interleaved block by block (see [`super::packed`]), so one
/// SIMD load serves eight output rows and their scales load as one vector; the 16-bit
/// floats keep their bytes.
#[derive(Clone)]
pub struct QuantMatrix {
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
    pub(super) data: Vec<u8>,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuantMatrix({:?}, {}x{})", self.ty, self.rows, self.cols)
    }
}

impl QuantMatrix {
    /// Store a row-major f32 `[rows, cols]` matrix as F16 or BF16 (round to nearest even).
    pub fn from_f32_half(
        ty: QuantType,
        rows: usize,
        cols: usize,
        values: &[f32],
    ) -> Result<Self, QuantError> {
        let want = rows * cols;
        if !ty.is_half() || values.len() != want {
            return Err(QuantError::WrongSize {
                ty,
                rows,
                cols,
                want: want * 2,
                got: values.len() * 2,
            });
        }
        let mut data = vec![0u8; want * 2];
        data.par_chunks_mut(2 * 4096)
            .zip(values.par_chunks(4096))
            .for_each(|(o, v)| {
                for (o, &x) in o.chunks_exact_mut(2).zip(v) {
                    let b = if ty == QuantType::BF16 {
                        half::bf16::from_f32(x).to_le_bytes()
                    } else {
                        f16::from_f32(x).to_le_bytes()
                    };
                    o.copy_from_slice(&b);
                }
            });
        Self::new(ty, rows, cols, data)
    }

    /// Check that `len` bytes of ggml blocks make a `[rows, cols]` matrix of `ty`.
    pub fn check_size(
        ty: QuantType,
        rows: usize,
        cols: usize,
        len: usize,
    ) -> Result<(), QuantError> {
        let (block, _) = ty.block_layout();
        if !cols.is_multiple_of(block) {
            return Err(QuantError::RowNotBlockAligned { ty, cols, block });
        }
        let want = rows * Self::row_bytes_for(ty, cols);
        if len != want {
            return Err(QuantError::WrongSize {
                ty,
                rows,
                cols,
                want,
                got: len,
            });
        }
        Ok(())
    }

    /// From ggml-layout bytes (rows of whole blocks, as in a GGUF file).
    pub fn new(ty: QuantType, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self, QuantError> {
        Self::check_size(ty, rows, cols, data.len())?;
        // The 16-bit floats are stored as they are, everything else is packed.
        let data = if ty.is_half() {
            data
        } else {
            pack(ty, rows, cols, &data)?
        };
        Ok(Self {
            ty,
            rows,
            cols,
            data,
        })
    }

    fn row_bytes_for(ty: QuantType, cols: usize) -> usize {
        let (block, bytes) = ty.block_layout();
        cols / block * bytes
    }

    /// Bytes of one row in ggml's layout.
    pub fn row_bytes(&self) -> usize {
        Self::row_bytes_for(self.ty, self.cols)
    }

    /// 32-column blocks per row of the packed layout.
    fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    /// Row `r` in ggml's layout (gathered from the interleaved groups), or `None` for the
    /// K-quants and Q5_1, whose packed form keeps values but not ggml's encoding of them.
    pub fn row(&self, r: usize) -> Option<std::borrow::Cow<'_, [u8]>> {
        let rb = self.row_bytes();
        let Ok(p) = Packing::of(self.ty) else {
            // The 16-bit floats are stored as they are.
            return Some(std::borrow::Cow::Borrowed(&self.data[r * rb..(r + 1) * rb]));
        };
        let fields = self.ty.classic_fields()?;
        let (_, bb) = self.ty.block_layout();
        let row = unpack_classic_row(p, fields, &self.data, r, self.blocks_per_row(), (bb, rb));
        Some(std::borrow::Cow::Owned(row))
    }

    pub fn size_bytes(&self) -> usize {
        self.data.len()
    }

    /// Dequantize one row into `out` (`cols` values): the same floats as ggml's
    /// dequantization of the original blocks.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let Ok(p) = Packing::of(self.ty) else {
            // The 16-bit floats are stored as they are.
            let rb = self.row_bytes();
            dequantize_into(self.ty, &self.data[r * rb..(r + 1) * rb], out);
            return;
        };
        let gbb = p.group_block_bytes();
        let (g, k) = (r / GROUP, r % GROUP);
        let nb = self.blocks_per_row();
        for (i, o) in out.chunks_exact_mut(BLOCK).take(nb).enumerate() {
            let b = &self.data[(g * nb + i) * gbb..(g * nb + i + 1) * gbb];
            dequantize_packed(p, b, k, o);
        }
    }

    /// The whole matrix as row-major f32.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        out.par_chunks_mut(self.cols.max(1))
            .enumerate()
            .for_each(|(r, o)| self.dequantize_row(r, o));
        out
    }

    /// `y[t, r] = sum_c x[t, c] * W[r, c]` for `x: [tokens, cols]`, returning `[tokens, rows]`.
    /// Row groups are split across the rayon pool; every output element is computed by the
    /// same arithmetic whatever `tokens` is, so results do not depend on batch composition.
    pub fn matmul(&self, x: &[f32], tokens: usize) -> Vec<f32> {
        assert_eq!(x.len(), tokens * self.cols);
        let Ok(p) = Packing::of(self.ty) else {
            // No fused kernel (the 16-bit floats): widen and use f32 dots.
            return self.matmul_dequantizing(x, tokens);
        };
        let acts = Q8Acts::quantize(x, tokens, self.cols);
        Self::fused_matmuls(&[(self, p)], &acts, tokens)
            .pop()
            .unwrap_or_default()
    }

    /// Several matrices applied to the same input (a layer's q/k/v, or gate/up): the input
    /// is quantized once and all their row groups share one parallel loop. Each result is
    /// exactly what [`Self::matmul`] gives.
    pub fn matmul_many(mats: &[&QuantMatrix], x: &[f32], tokens: usize) -> Vec<Vec<f32>> {
        let cols = mats.first().map_or(0, |m| m.cols);
        // Every matrix packed and of the same width, or each runs alone.
        let packed: Option<Vec<(&QuantMatrix, Packing)>> = mats
            .iter()
            .map(|&m| Some((m, Packing::of(m.ty).ok()?)).filter(|_| m.cols == cols))
            .collect();
        match packed {
            Some(packed) if x.len() == tokens * cols => {
                let acts = Q8Acts::quantize(x, tokens, cols);
                Self::fused_matmuls(&packed, &acts, tokens)
            }
            _ => mats.iter().map(|m| m.matmul(x, tokens)).collect(),
        }
    }

    /// `[tokens, rows]` results of packed matrices (each with its packing, which picks its
    /// kernel) against quantized activations.
    fn fused_matmuls(
        mats: &[(&QuantMatrix, Packing)],
        acts: &Q8Acts,
        tokens: usize,
    ) -> Vec<Vec<f32>> {
        let mut outs: Vec<Vec<f32>> = mats
            .iter()
            .map(|(m, _)| vec![0f32; m.rows * tokens])
            .collect();
        let total_groups: usize = mats.iter().map(|(m, _)| m.rows.div_ceil(GROUP)).sum();
        let groups_per_task = (total_groups / (rayon::current_num_threads() * 8)).clamp(1, 8);
        let rows_per_task = GROUP * groups_per_task;
        // (matrix, its packing, first group, per token the task's slice of that token's
        // output row), over every matrix. The tasks write straight into the `[tokens, rows]`
        // result: no `[rows, tokens]` buffer to transpose afterwards (for a large
        // vocabulary that transpose, serial and strided, cost as much as the logits matmul).
        type Task<'a> = (&'a QuantMatrix, Packing, usize, Vec<&'a mut [f32]>);
        let mut tasks: Vec<Task<'_>> = Vec::new();
        for (&(m, p), out) in mats.iter().zip(outs.iter_mut()) {
            let mut per_token: Vec<_> = out
                .chunks_mut(m.rows.max(1))
                .map(|row| row.chunks_mut(rows_per_task))
                .collect();
            for i in 0..m.rows.div_ceil(rows_per_task) {
                let slices = per_token.iter_mut().filter_map(Iterator::next).collect();
                tasks.push((m, p, i * groups_per_task, slices));
            }
        }
        // The activations in the kernels' tiles, once for every matrix and task.
        let tiles = Q8Tile::split(acts, tokens, tile_width());
        let run = |(m, p, g0, mut out): Task<'_>| m.fill_groups(p, &tiles, g0, &mut out);
        if tasks.len() > 1 {
            tasks.into_par_iter().for_each(run);
        } else {
            tasks.into_iter().for_each(run);
        }
        outs
    }

    /// Rows of groups `g0..` into `out` (per token, that token's output for those rows: as
    /// many groups as the slices hold); `p` is this matrix's packing, `tiles` the
    /// activations.
    fn fill_groups(&self, p: Packing, tiles: &[Q8Tile], g0: usize, out: &mut [&mut [f32]]) {
        let nb = self.blocks_per_row();
        let gbb = p.group_block_bytes();
        let rows = out.first().map_or(0, |o| o.len());
        // The kernel writes the first `tile.rows` rows of it every call.
        let mut res = [[0f32; GROUP]; MAX_TILE];
        for gi in 0..rows.div_ceil(GROUP) {
            let g = g0 + gi;
            let group = &self.data[g * nb * gbb..(g + 1) * nb * gbb];
            let r0 = gi * GROUP;
            let r1 = (r0 + GROUP).min(rows);
            // Each tile's rows share every unpacked weight vector; the group (a few KiB)
            // stays in L1 across the tiles.
            let mut t = 0;
            for tile in tiles {
                const { assert!(MAX_TILE == 8) };
                match tile.rows {
                    8 => group_dot::<8>(p, group, tile, &mut res),
                    7 => group_dot::<7>(p, group, tile, &mut res),
                    6 => group_dot::<6>(p, group, tile, &mut res),
                    5 => group_dot::<5>(p, group, tile, &mut res),
                    4 => group_dot::<4>(p, group, tile, &mut res),
                    3 => group_dot::<3>(p, group, tile, &mut res),
                    2 => group_dot::<2>(p, group, tile, &mut res),
                    _ => group_dot::<1>(p, group, tile, &mut res),
                }
                for (i, res) in res[..tile.rows].iter().enumerate() {
                    match <&mut [f32; GROUP]>::try_from(&mut out[t + i][r0..r1]) {
                        // A whole group: a fixed-size copy (two stores, not a memmove call
                        // per group and row).
                        Ok(whole) => *whole = *res,
                        Err(_) => out[t + i][r0..r1].copy_from_slice(&res[..r1 - r0]),
                    }
                }
                t += tile.rows;
            }
        }
    }

    /// The 16-bit floats: widen a row at a time and use f32 dots.
    fn matmul_dequantizing(&self, x: &[f32], tokens: usize) -> Vec<f32> {
        let cols = self.cols;
        let mut out_t = vec![0f32; self.rows * tokens];
        let rows_per_task = (self.rows / (rayon::current_num_threads() * 8)).clamp(4, 64);
        out_t
            .par_chunks_mut(tokens * rows_per_task)
            .enumerate()
            .for_each(|(chunk, out)| {
                let r0 = chunk * rows_per_task;
                let mut buf = vec![0f32; cols];
                for (i, o) in out.chunks_mut(tokens).enumerate() {
                    self.dequantize_row(r0 + i, &mut buf);
                    for (t, y) in o.iter_mut().enumerate() {
                        *y = dot_f32(&buf, &x[t * cols..(t + 1) * cols]);
                    }
                }
            });
        if tokens == 1 {
            return out_t;
        }
        transpose(&out_t, self.rows, tokens)
    }
}

/// `[a, b]` row-major → `[b, a]`.
pub(crate) fn transpose(m: &[f32], a: usize, b: usize) -> Vec<f32> {
    let mut out = vec![0f32; m.len()];
    for i in 0..a {
        for j in 0..b {
            out[j * a + i] = m[i * b + j];
        }
    }
    out
}

/// Dense `y = x W^T` for row-major `w: [rows, cols]`, same threading as [`QuantMatrix::matmul`].
pub fn dense_matmul(w: &[f32], rows: usize, cols: usize, x: &[f32], tokens: usize) -> Vec<f32> {
    let mut out_t = vec![0f32; rows * tokens];
    let rows_per_task = (rows / (rayon::current_num_threads() * 8)).clamp(1, 64);
    out_t
        .par_chunks_mut(tokens * rows_per_task)
        .enumerate()
        .for_each(|(chunk, out)| {
            let r0 = chunk * rows_per_task;
            for (i, o) in out.chunks_mut(tokens).enumerate() {
                let row = &w[(r0 + i) * cols..(r0 + i + 1) * cols];
                for (t, y) in o.iter_mut().enumerate() {
                    *y = dot_f32(row, &x[t * cols..(t + 1) * cols]);
                }
            }
        });
    transpose(&out_t, rows, tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::format::f16_at;
    use crate::model::quant::test_util::*;

    #[test]
    fn wrong_sizes_are_errors() {
        assert!(QuantMatrix::new(QuantType::Q8_0, 2, 31, vec![0; 68]).is_err());
        assert!(QuantMatrix::new(QuantType::Q8_0, 2, 32, vec![0; 67]).is_err());
    }

    /// `y[t, r]` from the dequantized weights and the dequantized Q8 activations in f64,
    /// with Q4_1's offset through the stored `s` (what the integer kernels compute).
    fn q8_reference(m: &QuantMatrix, acts: &Q8Acts, t: usize, r: usize) -> (f64, f64) {
        let a = acts.row(t);
        let mut w = vec![0f32; m.cols];
        m.dequantize_row(r, &mut w);
        let (mut sum, mut mag) = (0f64, 0f64);
        if m.ty != QuantType::Q4_1 {
            // Every other format: dequantized weights times the exact Q8 activations (Q4_K's
            // offset term uses the exact activation sum).
            for (c, &wc) in w.iter().enumerate() {
                let v = wc as f64 * a.qs[c] as f64 * a.d[c / 32] as f64;
                sum += v;
                mag += v.abs();
            }
            return (sum, mag);
        }
        let (_, bytes) = m.ty.block_layout();
        let row = m.row(r).expect("Q4_1 rows read back");
        for (i, b) in row.chunks_exact(bytes).enumerate() {
            for j in 0..32 {
                let wq = if m.ty == QuantType::Q4_1 {
                    (w[i * 32 + j] - f16_at(b, 2)) as f64
                } else {
                    w[i * 32 + j] as f64
                };
                let v = wq * a.qs[i * 32 + j] as f64 * a.d[i] as f64;
                sum += v;
                mag += v.abs();
            }
            if m.ty == QuantType::Q4_1 {
                sum += f16_at(b, 2) as f64 * a.s[i] as f64;
                mag += (f16_at(b, 2) as f64 * a.s[i] as f64).abs();
            }
        }
        (sum, mag)
    }

    /// The kernels equal the reference arithmetic on shapes with odd row counts, short
    /// rows and rows that are not a multiple of the 4-row tile.
    #[test]
    fn fused_matmul_matches_reference() {
        let mut seed = 7u64;
        for ty in BLOCK_FORMATS {
            let shapes: &[(usize, usize)] = if ty.packs_losslessly() {
                &[(37, 512), (5, 32), (130, 96), (3, 544)]
            } else {
                &[(37, 512), (9, 256)]
            };
            for &(rows, cols) in shapes {
                let m = random_matrix(ty, rows, cols, &mut seed);
                let w = m.dequantize();
                for tokens in [1, 3, 5, 9, 17] {
                    let x = random_x(tokens * cols, &mut seed);
                    let got = m.matmul(&x, tokens);
                    let acts = Q8Acts::quantize(&x, tokens, cols);
                    for t in 0..tokens {
                        for r in 0..rows {
                            let g = got[t * rows + r] as f64;
                            // Exact weights times exact activations: the Q8 rounding of
                            // the activations bounds the error (about 1/254 of each term).
                            let (exact, mag): (f64, f64) = (0..cols)
                                .map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64)
                                .fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
                            let (want, qmag) = q8_reference(&m, &acts, t, r);
                            assert!(
                                (g - want).abs() <= 1e-5 * (1.0 + qmag),
                                "{ty:?} {rows}x{cols} t={t} r={r}: {g} vs {want}"
                            );
                            assert!(
                                (g - exact).abs() <= 1e-2 * (1.0 + mag),
                                "{ty:?} {rows}x{cols} t={t} r={r}: {g} vs exact {exact}"
                            );
                        }
                    }
                    // A row's result must not depend on how many tokens share the call.
                    let single = m.matmul(&x[(tokens - 1) * cols..], 1);
                    assert_eq!(
                        &got[(tokens - 1) * rows..],
                        &single[..],
                        "{ty:?} batch-variant"
                    );
                }
            }
        }
    }

    /// Matrices sharing an input in one parallel loop give exactly the separate results,
    /// also when one of them has no fused kernel (then each runs alone).
    #[test]
    fn matmul_many_equals_separate_matmuls() {
        let mut seed = 41u64;
        let cols = 96;
        let q = random_matrix(QuantType::Q4_1, 19, cols, &mut seed);
        let k = random_matrix(QuantType::Q8_0, 8, cols, &mut seed);
        let v = random_matrix(QuantType::Q4_0, 3, cols, &mut seed);
        let kq = random_matrix(QuantType::Q4K, 4, 256, &mut seed);
        let f16m = QuantMatrix::from_f32_half(QuantType::F16, 5, 96, &random_x(5 * 96, &mut seed))
            .expect("valid");
        for tokens in [1, 2, 7] {
            let x = random_x(tokens * cols, &mut seed);
            let many = QuantMatrix::matmul_many(&[&q, &k, &v], &x, tokens);
            for (m, got) in [&q, &k, &v].into_iter().zip(&many) {
                assert_eq!(got, &m.matmul(&x, tokens), "{:?} tokens={tokens}", m.ty);
            }
            let mixed = QuantMatrix::matmul_many(&[&q, &f16m], &x, tokens);
            assert_eq!(mixed[0], q.matmul(&x, tokens));
            assert_eq!(mixed[1], f16m.matmul(&x, tokens));
            let x = random_x(tokens * 256, &mut seed);
            let kq_many = QuantMatrix::matmul_many(&[&kq], &x, tokens);
            assert_eq!(kq_many[0], kq.matmul(&x, tokens));
        }
    }

    #[test]
    fn dense_matmul_matches_f64() {
        let mut seed = 5u64;
        let (rows, cols, tokens) = (13, 70, 3);
        let w = random_x(rows * cols, &mut seed);
        let x = random_x(tokens * cols, &mut seed);
        let got = dense_matmul(&w, rows, cols, &x, tokens);
        for t in 0..tokens {
            for r in 0..rows {
                let want: f64 = (0..cols)
                    .map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64)
                    .sum();
                assert!((got[t * rows + r] as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()));
            }
        }
    }
}
