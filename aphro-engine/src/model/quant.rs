//! Block-quantized weights (ggml layouts): exact dequantization and fused CPU matmul kernels.
//!
//! Dequantization reproduces ggml / gguf-py bit for bit (`d * q + m` in f32, no FMA), which
//! is what the HF float32 reference used. The fused kernels work like llama.cpp's: the
//! activations are quantized to 8 bits per 32-block once per matmul ([`Q8Acts`]) and
//! multiplied with the weight quants in integer arithmetic, so decode reads 4.5–8.5 bits
//! per weight (Q4_0/Q4_1/Q8_0; 6–10 for the K-quants and Q5_1, whose scales are expanded
//! to f32 per 32 values at load) and does no per-weight float work. `APHRO_NO_VNNI=1`
//! forces the AVX2 kernels on CPUs with AVX-512 VNNI (for comparisons).

use half::f16;
use rayon::prelude::*;

/// The ggml block formats this crate understands, plus plain 16-bit floats (`--dtype
/// float16|bfloat16`: weights stored in 16 bits, widened to f32 inside the matmul).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
    /// IEEE half, little-endian, one element per "block".
    F16,
    /// bfloat16, little-endian, one element per "block".
    BF16,
}

impl QuantType {
    /// (elements per block, bytes per block) — the same numbers as ggml.
    pub fn block_layout(self) -> (usize, usize) {
        match self {
            QuantType::Q8_0 => (32, 34),
            QuantType::Q4_0 => (32, 18),
            QuantType::Q4_1 => (32, 20),
            QuantType::Q5_1 => (32, 24),
            QuantType::Q4K => (256, 144),
            QuantType::Q5K => (256, 176),
            QuantType::Q6K => (256, 210),
            QuantType::F16 | QuantType::BF16 => (1, 2),
        }
    }

    /// Whether this is a plain 16-bit float format rather than a block quantization.
    pub fn is_half(self) -> bool {
        matches!(self, QuantType::F16 | QuantType::BF16)
    }

    /// Whether the fused integer kernels handle it (everything but the 16-bit floats).
    pub fn has_fused_kernel(self) -> bool {
        !self.is_half()
    }

    /// Whether the packed layout can be turned back into ggml's bytes (not the K-quants,
    /// whose super-block scales are expanded to one f32 scale per 16/32 values).
    fn packs_losslessly(self) -> bool {
        matches!(self, QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q4_1)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("{ty:?} needs the row length ({cols}) to be a multiple of {block}")]
    RowNotBlockAligned {
        ty: QuantType,
        cols: usize,
        block: usize,
    },
    #[error("{ty:?} matrix {rows}x{cols} needs {want} bytes, got {got}")]
    WrongSize {
        ty: QuantType,
        rows: usize,
        cols: usize,
        want: usize,
        got: usize,
    },
}

/// A row-major `[rows, cols]` matrix of ggml blocks.
///
/// Formats with a fused kernel (Q8_0, Q4_0, Q4_1) are repacked at construction into groups of
/// [`GROUP`] rows interleaved block by block (see [`packed`]), so one SIMD load serves eight
/// output rows and their scales load as one vector; the others keep ggml's layout.
#[derive(Clone)]
pub struct QuantMatrix {
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuantMatrix({:?}, {}x{})", self.ty, self.rows, self.cols)
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Rows per interleaved group of the packed layout.
pub const GROUP: usize = 8;

/// The row-interleaved layout of the fused formats. Group `g` holds rows `8g..8g+8` (the
/// last group zero-padded), its blocks in column order; one group-block is
/// the 8 rows' scales (see [`packed::header_bytes`]), then the quants as 32-byte vectors:
/// vector `w` holds, for row `k` in lane `k`, bytes `4w..4w+4` of that row's quants. For
/// the 8-bit forms those are columns `4w..4w+4`; for the 4-bit ones the low nibbles are
/// columns `4w..4w+4` and the high nibbles `16+4w..16+4w+4` (ggml's Q4_0 order; Q4_K
/// nibbles are reordered to it). Q8_0/Q4_0/Q4_1 keep ggml's bytes exactly; the K-quants'
/// per-super-block scales are multiplied out into f32 (`d * sc` exactly as ggml's
/// dequantization computes them), so they dequantize to the same floats.
pub mod packed {
    use super::QuantType;

    /// Bytes of the scale header of one group-block (32 columns of 8 rows): f16 `d` (and
    /// `m`) for the classic formats; for Q4_K eight f32 `d*sc` then eight f32 `-dmin*m`
    /// per 32 values (Q5_K alike; Q5_1: its `d` and `m` widened), for Q6_K eight f32
    /// `d*sc` for columns 0..16 then eight for 16..32.
    pub fn header_bytes(ty: QuantType) -> usize {
        match ty {
            QuantType::Q4_1 => 32,
            QuantType::Q4K | QuantType::Q5K | QuantType::Q5_1 | QuantType::Q6K => 64,
            _ => 16,
        }
    }

    /// Offset of the quants inside one ggml block.
    pub fn ggml_qs_offset(ty: QuantType) -> usize {
        if ty == QuantType::Q4_1 {
            4
        } else {
            2
        }
    }

    /// Quant bytes per row and 32 columns (32 for the 8-bit forms — Q8_0; Q6_K stored as
    /// `q - 32` in i8; Q5_1/Q5_K as their 5-bit `q` in u8 —, 16 nibble bytes for the 4-bit
    /// formats).
    pub fn qs_bytes(ty: QuantType) -> usize {
        if matches!(
            ty,
            QuantType::Q8_0 | QuantType::Q6K | QuantType::Q5K | QuantType::Q5_1
        ) {
            32
        } else {
            16
        }
    }

    /// Bytes of one group-block: 8 rows × 32 columns.
    pub fn group_block_bytes(ty: QuantType) -> usize {
        header_bytes(ty) + super::GROUP * qs_bytes(ty)
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
        let data = if ty.has_fused_kernel() {
            pack(ty, rows, cols, &data)
        } else {
            data
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
        self.cols / 32
    }

    /// Row `r` in ggml's layout (gathered from the interleaved groups), or `None` for the
    /// K-quants, whose packed form keeps values but not ggml's super-block encoding.
    pub fn row(&self, r: usize) -> Option<std::borrow::Cow<'_, [u8]>> {
        let rb = self.row_bytes();
        if !self.ty.has_fused_kernel() {
            return Some(std::borrow::Cow::Borrowed(&self.data[r * rb..(r + 1) * rb]));
        }
        if !self.ty.packs_losslessly() {
            return None;
        }
        let ty = self.ty;
        let (_, bb) = ty.block_layout();
        let (hdr, qoff, qsb) = (
            packed::header_bytes(ty),
            packed::ggml_qs_offset(ty),
            packed::qs_bytes(ty),
        );
        let gbb = packed::group_block_bytes(ty);
        let (g, k) = (r / GROUP, r % GROUP);
        let nb = self.blocks_per_row();
        let mut out = vec![0u8; rb];
        for (i, o) in out.chunks_exact_mut(bb).enumerate() {
            let src = &self.data[(g * nb + i) * gbb..(g * nb + i + 1) * gbb];
            o[..2].copy_from_slice(&src[2 * k..2 * k + 2]);
            if ty == QuantType::Q4_1 {
                o[2..4].copy_from_slice(&src[16 + 2 * k..16 + 2 * k + 2]);
            }
            for w in 0..qsb / 4 {
                let at = hdr + w * 32 + 4 * k;
                o[qoff + 4 * w..qoff + 4 * w + 4].copy_from_slice(&src[at..at + 4]);
            }
        }
        Some(std::borrow::Cow::Owned(out))
    }

    pub fn size_bytes(&self) -> usize {
        self.data.len()
    }

    /// Dequantize one row into `out` (`cols` values): the same floats as ggml's
    /// dequantization of the original blocks.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        if let Some(row) = self.row(r) {
            dequantize_into(self.ty, &row, out);
            return;
        }
        // `D * q + M` (Q4_K, Q5_K, Q5_1) or `D * q` (Q6_K) from the packed group.
        let ty = self.ty;
        let gbb = packed::group_block_bytes(ty);
        let (g, k) = (r / GROUP, r % GROUP);
        let nb = self.blocks_per_row();
        for (i, o) in out.chunks_exact_mut(32).take(nb).enumerate() {
            let b = &self.data[(g * nb + i) * gbb..(g * nb + i + 1) * gbb];
            let f = |at: usize| f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            if matches!(ty, QuantType::Q5K | QuantType::Q5_1) {
                let (dd, m) = (f(4 * k), f(32 + 4 * k));
                for w in 0..8 {
                    for j in 0..4 {
                        o[4 * w + j] = dd * b[64 + 32 * w + 4 * k + j] as f32 + m;
                    }
                }
            } else if ty == QuantType::Q4K {
                let (dd, m) = (f(4 * k), f(32 + 4 * k));
                for w in 0..4 {
                    for j in 0..4 {
                        let q = b[64 + 32 * w + 4 * k + j];
                        o[4 * w + j] = dd * (q & 0xF) as f32 + m;
                        o[16 + 4 * w + j] = dd * (q >> 4) as f32 + m;
                    }
                }
            } else {
                let (lo, hi) = (f(4 * k), f(32 + 4 * k));
                for w in 0..8 {
                    let dd = if w < 4 { lo } else { hi };
                    for j in 0..4 {
                        o[4 * w + j] = dd * (b[64 + 32 * w + 4 * k + j] as i8) as f32;
                    }
                }
            }
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
        debug_assert_eq!(x.len(), tokens * self.cols);
        if !self.ty.has_fused_kernel() {
            return self.matmul_dequantizing(x, tokens);
        }
        let acts = Q8Acts::quantize(x, tokens, self.cols);
        Self::fused_matmuls(&[self], &acts, tokens)
            .pop()
            .unwrap_or_default()
    }

    /// Several matrices applied to the same input (a layer's q/k/v, or gate/up): the input
    /// is quantized once and all their row groups share one parallel loop. Each result is
    /// exactly what [`Self::matmul`] gives.
    pub fn matmul_many(mats: &[&QuantMatrix], x: &[f32], tokens: usize) -> Vec<Vec<f32>> {
        let cols = mats.first().map_or(0, |m| m.cols);
        let fusable = mats
            .iter()
            .all(|m| m.ty.has_fused_kernel() && m.cols == cols);
        if !fusable || x.len() != tokens * cols {
            return mats.iter().map(|m| m.matmul(x, tokens)).collect();
        }
        let acts = Q8Acts::quantize(x, tokens, cols);
        Self::fused_matmuls(mats, &acts, tokens)
    }

    /// `[tokens, rows]` results of fused-format matrices against quantized activations.
    fn fused_matmuls(mats: &[&QuantMatrix], acts: &Q8Acts, tokens: usize) -> Vec<Vec<f32>> {
        let mut outs: Vec<Vec<f32>> = mats.iter().map(|m| vec![0f32; m.rows * tokens]).collect();
        let total_groups: usize = mats.iter().map(|m| m.rows.div_ceil(GROUP)).sum();
        let groups_per_task = (total_groups / (rayon::current_num_threads() * 8)).clamp(1, 8);
        // (matrix, first group, output rows of those groups), over every matrix.
        let mut tasks: Vec<(&QuantMatrix, usize, &mut [f32])> = Vec::new();
        for (m, out) in mats.iter().zip(outs.iter_mut()) {
            for (i, chunk) in out.chunks_mut(tokens * GROUP * groups_per_task).enumerate() {
                tasks.push((m, i * groups_per_task, chunk));
            }
        }
        let run =
            |(m, g0, out): (&QuantMatrix, usize, &mut [f32])| m.fill_groups(acts, g0, out, tokens);
        if tasks.len() > 1 {
            tasks.into_par_iter().for_each(run);
        } else {
            tasks.into_iter().for_each(run);
        }
        for (m, out) in mats.iter().zip(outs.iter_mut()) {
            if tokens > 1 {
                *out = transpose(out, m.rows, tokens);
            }
        }
        outs
    }

    /// Rows of groups `g0..` into `out` (`[rows, tokens]`, as many groups as it holds).
    fn fill_groups(&self, acts: &Q8Acts, g0: usize, out: &mut [f32], tokens: usize) {
        let nb = self.blocks_per_row();
        let gbb = packed::group_block_bytes(self.ty);
        for (gi, out) in out.chunks_mut(tokens * GROUP).enumerate() {
            let g = g0 + gi;
            let group = &self.data[g * nb * gbb..(g + 1) * nb * gbb];
            // Up to four tokens share each unpacked weight vector; the group (a few KiB)
            // stays in L1 across the batch's tokens.
            let mut t = 0;
            while t < tokens {
                let n = (tokens - t).min(4);
                let mut res = [[0f32; GROUP]; 4];
                let rows = [0, 1, 2, 3].map(|i| acts.row((t + i).min(tokens - 1)));
                match n {
                    4 => group_dot::<4>(self.ty, group, rows, &mut res),
                    3 => group_dot::<3>(self.ty, group, rows, &mut res),
                    2 => group_dot::<2>(self.ty, group, rows, &mut res),
                    _ => group_dot::<1>(self.ty, group, rows, &mut res),
                }
                for (i, res) in res[..n].iter().enumerate() {
                    for (k, &v) in res.iter().enumerate() {
                        if let Some(o) = out.get_mut(k * tokens + t + i) {
                            *o = v;
                        }
                    }
                }
                t += n;
            }
        }
    }

    /// K-quants and 16-bit floats: dequantize a row at a time and use f32 dots.
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

/// ggml rows → the interleaved groups of [`packed`].
fn pack(ty: QuantType, rows: usize, cols: usize, src: &[u8]) -> Vec<u8> {
    if !ty.packs_losslessly() {
        return pack_kquant(ty, rows, cols, src);
    }
    let (block, bb) = ty.block_layout();
    let nb = cols / block;
    let rb = nb * bb;
    let gbb = packed::group_block_bytes(ty);
    let (hdr, qoff, qsb) = (
        packed::header_bytes(ty),
        packed::ggml_qs_offset(ty),
        packed::qs_bytes(ty),
    );
    let groups = rows.div_ceil(GROUP);
    let mut out = vec![0u8; groups * nb * gbb];
    out.par_chunks_mut((nb * gbb).max(1))
        .enumerate()
        .for_each(|(g, dst)| {
            for k in 0..GROUP {
                let r = g * GROUP + k;
                if r >= rows {
                    break;
                }
                let row = &src[r * rb..(r + 1) * rb];
                for (i, b) in row.chunks_exact(bb).enumerate() {
                    let o = &mut dst[i * gbb..(i + 1) * gbb];
                    o[2 * k..2 * k + 2].copy_from_slice(&b[..2]);
                    if ty == QuantType::Q4_1 {
                        o[16 + 2 * k..16 + 2 * k + 2].copy_from_slice(&b[2..4]);
                    }
                    for w in 0..qsb / 4 {
                        let at = hdr + w * 32 + 4 * k;
                        o[at..at + 4].copy_from_slice(&b[qoff + 4 * w..qoff + 4 * w + 4]);
                    }
                }
            }
        });
    out
}

/// Q4_K/Q5_K/Q6_K/Q5_1 rows → packed groups: each 32 columns get their f32 scale(s) multiplied out
/// as ggml's dequantization does (`d * sc`, `dmin * m`) and their quants in the 8-bit or
/// Q4_0-nibble order of [`packed`].
fn pack_kquant(ty: QuantType, rows: usize, cols: usize, src: &[u8]) -> Vec<u8> {
    let (block, bb) = ty.block_layout();
    let nsb = cols / block;
    let rb = nsb * bb;
    let nb = cols / 32;
    let gbb = packed::group_block_bytes(ty);
    let groups = rows.div_ceil(GROUP);
    let mut out = vec![0u8; groups * nb * gbb];
    out.par_chunks_mut((nb * gbb).max(1))
        .enumerate()
        .for_each(|(g, dst)| {
            for k in 0..GROUP {
                let r = g * GROUP + k;
                if r >= rows {
                    break;
                }
                let row = &src[r * rb..(r + 1) * rb];
                let per = block / 32;
                for (si, sb) in row.chunks_exact(bb).enumerate() {
                    for j in 0..per {
                        let o = &mut dst[(si * per + j) * gbb..(si * per + j + 1) * gbb];
                        let (s0, s1, q) = kquant_block32(ty, sb, j);
                        o[4 * k..4 * k + 4].copy_from_slice(&s0.to_le_bytes());
                        o[32 + 4 * k..32 + 4 * k + 4].copy_from_slice(&s1.to_le_bytes());
                        let words = packed::qs_bytes(ty) / 4;
                        for w in 0..words {
                            let at = 64 + 32 * w + 4 * k;
                            if ty == QuantType::Q4K {
                                for jj in 0..4 {
                                    let c = 4 * w + jj;
                                    o[at + jj] = q[c] | (q[c + 16] << 4);
                                }
                            } else {
                                o[at..at + 4].copy_from_slice(&q[4 * w..4 * w + 4]);
                            }
                        }
                    }
                }
            }
        });
    out
}

/// Columns `32j..32j+32` of a K-quant super-block: Q4_K → (`d*sc`, `-dmin*m`, nibbles 0..16);
/// Q5_K → (`d*sc`, `-dmin*m`, 5-bit `q`); Q5_1 (j = 0) → (`d`, `m`, 5-bit `q`); Q6_K →
/// (`d*sc` of columns 0..16, of 16..32, `q - 32` as i8 bytes).
fn kquant_block32(ty: QuantType, b: &[u8], j: usize) -> (f32, f32, [u8; 32]) {
    let mut q = [0u8; 32];
    if ty == QuantType::Q5_1 {
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for l in 0..16 {
            q[l] = (b[8 + l] & 0xF) | ((((qh >> l) << 4) & 0x10) as u8);
            q[l + 16] = (b[8 + l] >> 4) | (((qh >> (l + 12)) & 0x10) as u8);
        }
        return (f16_at(b, 0), f16_at(b, 2), q);
    }
    if ty == QuantType::Q5K {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let (sc, m) = q4k_scale_min(j, &b[4..16]);
        let qh = &b[16..48];
        let ql = &b[48 + (j / 2) * 32..48 + (j / 2) * 32 + 32];
        for (l, q) in q.iter_mut().enumerate() {
            let low = if j.is_multiple_of(2) {
                ql[l] & 0xF
            } else {
                ql[l] >> 4
            };
            *q = low | if qh[l] & (1 << j) != 0 { 16 } else { 0 };
        }
        return (d * sc as f32, -(dmin * m as f32), q);
    }
    if ty == QuantType::Q4K {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let (sc, m) = q4k_scale_min(j, &b[4..16]);
        let qs = &b[16 + (j / 2) * 32..16 + (j / 2) * 32 + 32];
        for (l, q) in q.iter_mut().enumerate() {
            *q = if j.is_multiple_of(2) {
                qs[l] & 0xF
            } else {
                qs[l] >> 4
            };
        }
        return (d * sc as f32, -(dmin * m as f32), q);
    }
    // Q6_K: column e = 128n + 32 quarter + l (l < 32) sits in ql/qh by ggml's layout; its
    // scale is sc[8n + 2 quarter + l / 16].
    let d = f16_at(b, 208);
    let (n, quarter) = (j / 4, j % 4);
    let ql = &b[n * 64..n * 64 + 64];
    let qh = &b[128 + n * 32..128 + n * 32 + 32];
    let sc = &b[192 + n * 8..192 + n * 8 + 8];
    for (l, q) in q.iter_mut().enumerate() {
        let low = match quarter {
            0 => ql[l] & 0xF,
            1 => ql[l + 32] & 0xF,
            2 => ql[l] >> 4,
            _ => ql[l + 32] >> 4,
        };
        let high = (qh[l] >> (2 * quarter)) & 3;
        *q = ((low | (high << 4)) as i32 - 32) as i8 as u8;
    }
    let s = |i: usize| d * (sc[2 * quarter + i] as i8) as f32;
    (s(0), s(1), q)
}

/// One packed row group against `T` activation rows: `out[t][k]` for the group's 8 rows.
/// `rows` beyond `T` are ignored.
#[allow(unsafe_code)]
fn group_dot<const T: usize>(
    ty: QuantType,
    group: &[u8],
    rows: [Q8Row<'_>; 4],
    out: &mut [[f32; GROUP]; 4],
) {
    let nb = group.len() / packed::group_block_bytes(ty);
    for r in &rows[..T] {
        assert!(
            r.qs.len() >= nb * 32 && r.d.len() >= nb && r.s.len() >= nb && r.sum.len() >= nb,
            "activation row shorter than the weights"
        );
    }
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512_vnni() {
            // SAFETY: the CPU has AVX-512 VNNI/VL, AVX2, FMA and F16C (checked at run time);
            // every activation row covers `nb` blocks (asserted above) and the group is
            // `nb` whole group-blocks.
            unsafe { x86::group_dot_vnni::<T>(ty, group, nb, &rows, out) };
            return;
        }
        if has_avx2() {
            // SAFETY: as above, with AVX2, FMA and F16C.
            unsafe { x86::group_dot_avx2::<T>(ty, group, nb, &rows, out) };
            return;
        }
    }
    for t in 0..T {
        out[t] = group_dot_scalar(ty, group, nb, rows[t]);
    }
}

/// Scalar reference of the group kernels, with the same float operations in the same
/// order (exact integer block dots, then `acc = fma(dw * dx, dot, acc)` and, for Q4_1,
/// `acc = fma(m, s, acc)` per block).
fn group_dot_scalar(ty: QuantType, group: &[u8], nb: usize, a: Q8Row<'_>) -> [f32; GROUP] {
    let gbb = packed::group_block_bytes(ty);
    let hdr = packed::header_bytes(ty);
    let mut acc = [0f32; GROUP];
    for i in 0..nb {
        let b = &group[i * gbb..(i + 1) * gbb];
        let x = &a.qs[32 * i..32 * i + 32];
        for (k, acc) in acc.iter_mut().enumerate() {
            let mut dot = 0i32;
            match ty {
                QuantType::Q6K => {
                    let f =
                        |at: usize| f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                    for (half, at) in [(0, 4 * k), (1, 32 + 4 * k)] {
                        let mut dot = 0i32;
                        for w in 4 * half..4 * half + 4 {
                            for j in 0..4 {
                                let q = b[hdr + 32 * w + 4 * k + j] as i8 as i32;
                                dot += q * x[4 * w + j] as i32;
                            }
                        }
                        *acc = (f(at) * a.d[i]).mul_add(dot as f32, *acc);
                    }
                    continue;
                }
                QuantType::Q8_0 => {
                    for w in 0..8 {
                        for j in 0..4 {
                            let q = b[hdr + 32 * w + 4 * k + j] as i8 as i32;
                            dot += q * x[4 * w + j] as i32;
                        }
                    }
                }
                QuantType::Q5K | QuantType::Q5_1 => {
                    for w in 0..8 {
                        for j in 0..4 {
                            dot += b[hdr + 32 * w + 4 * k + j] as i32 * x[4 * w + j] as i32;
                        }
                    }
                }
                _ => {
                    for w in 0..4 {
                        for j in 0..4 {
                            let q = b[hdr + 32 * w + 4 * k + j];
                            dot += (q & 0xF) as i32 * x[4 * w + j] as i32
                                + (q >> 4) as i32 * x[16 + 4 * w + j] as i32;
                        }
                    }
                    if ty == QuantType::Q4_0 {
                        dot -= 8 * a.sum[i];
                    }
                }
            }
            if matches!(ty, QuantType::Q4K | QuantType::Q5K | QuantType::Q5_1) {
                let f = |at: usize| f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                *acc = (f(4 * k) * a.d[i]).mul_add(dot as f32, *acc);
                // The offset term with the exact activation sum.
                *acc = f(32 + 4 * k).mul_add(a.d[i] * a.sum[i] as f32, *acc);
                continue;
            }
            let dw = f16_at(b, 2 * k);
            *acc = (dw * a.d[i]).mul_add(dot as f32, *acc);
            if ty == QuantType::Q4_1 {
                *acc = f16_at(b, 16 + 2 * k).mul_add(a.s[i], *acc);
            }
        }
    }
    acc
}

/// Widen little-endian f16/bf16 values in `src` into `out` (`min(src/2, out)` values).
#[allow(unsafe_code)]
fn half_to_f32(bf16: bool, src: &[u8], out: &mut [f32]) {
    let n = (src.len() / 2).min(out.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked at run time above); the
        // kernel reads `2 * n` bytes of `src` and writes `n` values of `out`.
        unsafe { x86::half_to_f32(bf16, &src[..2 * n], &mut out[..n]) };
        return;
    }
    for (o, b) in out[..n].iter_mut().zip(src.chunks_exact(2)) {
        let bits = u16::from_le_bytes([b[0], b[1]]);
        *o = if bf16 {
            f32::from_bits((bits as u32) << 16)
        } else {
            f16::from_bits(bits).to_f32()
        };
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

/// Dequantize whole blocks of `ty` from `src` into `out`.
pub fn dequantize_into(ty: QuantType, src: &[u8], out: &mut [f32]) {
    if ty.is_half() {
        half_to_f32(ty == QuantType::BF16, src, out);
        return;
    }
    let (block, bytes) = ty.block_layout();
    for (b, o) in src.chunks_exact(bytes).zip(out.chunks_exact_mut(block)) {
        match ty {
            QuantType::Q8_0 => {
                let d = f16_at(b, 0);
                for j in 0..32 {
                    o[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
            QuantType::Q4_0 => {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    o[j] = ((q & 0xF) as i32 - 8) as f32 * d;
                    o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
            QuantType::Q4_1 => {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                for j in 0..16 {
                    let q = b[4 + j];
                    o[j] = (q & 0xF) as f32 * d + m;
                    o[j + 16] = (q >> 4) as f32 * d + m;
                }
            }
            QuantType::Q4K => dequant_q4k(b, o),
            QuantType::Q5K => dequant_q5k(b, o),
            QuantType::Q5_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                for j in 0..16 {
                    let x0 = (b[8 + j] & 0xF) as u32 | (((qh >> j) << 4) & 0x10);
                    let x1 = (b[8 + j] >> 4) as u32 | ((qh >> (j + 12)) & 0x10);
                    o[j] = x0 as f32 * d + m;
                    o[j + 16] = x1 as f32 * d + m;
                }
            }
            QuantType::Q6K => dequant_q6k(b, o),
            QuantType::F16 | QuantType::BF16 => {}
        }
    }
}

/// ggml Q5_0 blocks (f16 `d`, 32 high bits, 16 nibble bytes; value `(q - 16) * d`) as
/// Q8_0 blocks with the same `d` and `q - 16` in i8: the same values, so the Q8_0 kernels
/// and dequantization serve Q5_0 tensors (llama.cpp's fallback for rows not a multiple of
/// 256 in K-quant files). A trailing partial block is dropped (sizes are checked after).
pub fn q5_0_to_q8_0(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len() / 22 * 34);
    for b in src.chunks_exact(22) {
        out.extend_from_slice(&b[..2]);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[6..22];
        let mut q = [0u8; 32];
        for j in 0..16 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            q[j] = (((qs[j] & 0x0F) as u32 | h0) as i32 - 16) as i8 as u8;
            q[j + 16] = (((qs[j] >> 4) as u32 | h1) as i32 - 16) as i8 as u8;
        }
        out.extend_from_slice(&q);
    }
    out
}

fn q4k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn dequant_q4k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (n, o) in out.chunks_exact_mut(64).enumerate() {
        let q = &qs[n * 32..n * 32 + 32];
        let (s1, m1) = q4k_scale_min(2 * n, scales);
        let (s2, m2) = q4k_scale_min(2 * n + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            o[l] = d1 * (q[l] & 0xF) as f32 - m1;
            o[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// ggml's `dequantize_row_q5_K`: Q4_K's scales plus one high bit per value from `qh`.
fn dequant_q5k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (n, o) in out.chunks_exact_mut(64).enumerate() {
        let ql = &qs[n * 32..n * 32 + 32];
        let (s1, m1) = q4k_scale_min(2 * n, scales);
        let (s2, m2) = q4k_scale_min(2 * n + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * n), 1u8 << (2 * n + 1));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            o[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
            o[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
    }
}

fn dequant_q6k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for (n, o) in out.chunks_exact_mut(128).enumerate() {
        let ql = &b[n * 64..n * 64 + 64];
        let qh = &b[128 + n * 32..128 + n * 32 + 32];
        let sc = &b[192 + n * 8..192 + n * 8 + 8];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            o[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            o[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            o[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            o[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Kernels. Written as plain loops over fixed 8-lane accumulators so LLVM vectorizes them;
// compiled twice, once with AVX2+FMA enabled, and picked at run time.

#[inline(always)]
fn dot_f32_generic(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [[0f32; 8]; 4];
    let mut ca = a.chunks_exact(32);
    let mut cb = b.chunks_exact(32);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for k in 0..4 {
            for l in 0..8 {
                acc[k][l] += x[k * 8 + l] * y[k * 8 + l];
            }
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    let mut s = [0f32; 8];
    for l in 0..8 {
        s[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    }
    ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + tail
}

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
        debug_assert_eq!(x.len(), tokens * cols);
        debug_assert_eq!(cols % 32, 0);
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

/// AVX2+FMA kernels: f32 dot, half widening, and the integer weight × Q8-activation dot.
#[cfg(target_arch = "x86_64")]
mod x86 {
    #![allow(unsafe_code)]
    use super::QuantType;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// `out[i] = widen(src[2i..2i+2])`; `src.len() == 2 * out.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn half_to_f32(bf16: bool, src: &[u8], out: &mut [f32]) {
        let n = out.len().min(src.len() / 2);
        let (ps, po) = (src.as_ptr(), out.as_mut_ptr());
        let mut i = 0;
        // SAFETY (all loads/stores): i + 8 <= n bounds the 16-byte load and 8-lane store.
        while i + 8 <= n {
            let h = _mm_loadu_si128(ps.add(2 * i) as *const __m128i);
            let v = if bf16 {
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            } else {
                _mm256_cvtph_ps(h)
            };
            _mm256_storeu_ps(po.add(i), v);
            i += 8;
        }
        while i < n {
            let bits = u16::from_le_bytes([src[2 * i], src[2 * i + 1]]);
            out[i] = if bf16 {
                f32::from_bits((bits as u32) << 16)
            } else {
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
            };
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY (all loads): i + 32 <= n bounds every 8-lane load below.
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(pa.add(i + 8 * k));
                let y = _mm256_loadu_ps(pb.add(i + 8 * k));
                *a = _mm256_fmadd_ps(x, y, *a);
            }
            i += 32;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut total = hsum(s);
        while i < n {
            total += a[i] * b[i];
            i += 1;
        }
        total
    }

    /// `acc += u · s` per i32 lane over 4 byte pairs (u unsigned, s signed). Exact for the
    /// operands used here: 4/5-bit weights, or the sign trick (|u| <= 128, |s| <= 127), keep
    /// every pair sum inside i16 for the AVX2 `maddubs` form.
    #[inline(always)]
    unsafe fn dot4<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        if VNNI {
            _mm256_dpbusd_epi32(acc, u, s)
        } else {
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
            _mm256_add_epi32(acc, p)
        }
    }

    /// The 4 activation bytes at `p`, in every i32 lane.
    #[inline(always)]
    unsafe fn bcast4(p: *const i8) -> __m256i {
        _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
    }

    /// One packed row group (see `super::packed`) against `T` activation rows. `K`: 0 = Q8_0,
    /// 1 = Q4_0, 2 = Q4_1, 3 = Q4_K, 4 = Q6_K, 5 = Q5_K / Q5_1 (u8 quants, f32 `D`/`M`). Lane `k` of every vector is row `k` of the group, so the 8 rows'
    /// results come out as one vector with no horizontal sums.
    #[inline(always)]
    unsafe fn group_dot<const T: usize, const VNNI: bool, const K: u8>(
        group: *const u8,
        nb: usize,
        rows: &[super::Q8Row<'_>; 4],
        out: &mut [[f32; 8]; 4],
    ) {
        let gbb = [272usize, 144, 160, 192, 320, 320][K as usize];
        let hdr = [16usize, 16, 32, 64, 64, 64][K as usize];
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); T];
        for i in 0..nb {
            // SAFETY (loads below): the caller guarantees `nb` whole group-blocks and that
            // every activation row holds at least `nb` blocks.
            let b = group.add(i * gbb);
            let mut isum = [_mm256_setzero_si256(); T];
            if K == 4 {
                // Q6_K: two 16-column halves with their own f32 scales.
                let mut ihi = [_mm256_setzero_si256(); T];
                for w in 0..8 {
                    let wv = _mm256_loadu_si256(b.add(hdr + 32 * w) as *const __m256i);
                    let au = _mm256_sign_epi8(wv, wv);
                    for t in 0..T {
                        let x = bcast4(rows[t].qs.as_ptr().add(32 * i + 4 * w));
                        let sx = _mm256_sign_epi8(x, wv);
                        if w < 4 {
                            isum[t] = dot4::<VNNI>(isum[t], au, sx);
                        } else {
                            ihi[t] = dot4::<VNNI>(ihi[t], au, sx);
                        }
                    }
                }
                let dlo = _mm256_loadu_ps(b as *const f32);
                let dhi = _mm256_loadu_ps(b.add(32) as *const f32);
                for t in 0..T {
                    let dx = _mm256_set1_ps(*rows[t].d.get_unchecked(i));
                    let lo = _mm256_cvtepi32_ps(isum[t]);
                    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dlo, dx), lo, acc[t]);
                    let hi = _mm256_cvtepi32_ps(ihi[t]);
                    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dhi, dx), hi, acc[t]);
                }
                continue;
            }
            if K == 5 {
                for w in 0..8 {
                    let wv = _mm256_loadu_si256(b.add(hdr + 32 * w) as *const __m256i);
                    for t in 0..T {
                        let x = bcast4(rows[t].qs.as_ptr().add(32 * i + 4 * w));
                        isum[t] = dot4::<VNNI>(isum[t], wv, x);
                    }
                }
            } else if K == 0 {
                for w in 0..8 {
                    let wv = _mm256_loadu_si256(b.add(hdr + 32 * w) as *const __m256i);
                    let au = _mm256_sign_epi8(wv, wv);
                    for t in 0..T {
                        let x = bcast4(rows[t].qs.as_ptr().add(32 * i + 4 * w));
                        isum[t] = dot4::<VNNI>(isum[t], au, _mm256_sign_epi8(x, wv));
                    }
                }
            } else {
                for w in 0..4 {
                    let wv = _mm256_loadu_si256(b.add(hdr + 32 * w) as *const __m256i);
                    let lo = _mm256_and_si256(wv, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), mask);
                    for t in 0..T {
                        let p = rows[t].qs.as_ptr().add(32 * i);
                        isum[t] = dot4::<VNNI>(isum[t], lo, bcast4(p.add(4 * w)));
                        isum[t] = dot4::<VNNI>(isum[t], hi, bcast4(p.add(16 + 4 * w)));
                    }
                }
            }
            let (dw, m) = if K == 3 || K == 5 {
                (
                    _mm256_loadu_ps(b as *const f32),
                    _mm256_loadu_ps(b.add(32) as *const f32),
                )
            } else if K == 2 {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i)),
                    _mm256_cvtph_ps(_mm_loadu_si128(b.add(16) as *const __m128i)),
                )
            } else {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i)),
                    _mm256_setzero_ps(),
                )
            };
            for t in 0..T {
                let mut dot = isum[t];
                if K == 1 {
                    let off = 8 * *rows[t].sum.get_unchecked(i);
                    dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(off));
                }
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*rows[t].d.get_unchecked(i)));
                acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[t]);
                if K == 2 {
                    let s = _mm256_set1_ps(*rows[t].s.get_unchecked(i));
                    acc[t] = _mm256_fmadd_ps(m, s, acc[t]);
                } else if K == 3 || K == 5 {
                    let sum = *rows[t].sum.get_unchecked(i) as f32;
                    let s = _mm256_set1_ps(*rows[t].d.get_unchecked(i) * sum);
                    acc[t] = _mm256_fmadd_ps(m, s, acc[t]);
                }
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
        }
    }

    #[inline(always)]
    unsafe fn group_dot_any<const T: usize, const VNNI: bool>(
        ty: QuantType,
        group: &[u8],
        nb: usize,
        rows: &[super::Q8Row<'_>; 4],
        out: &mut [[f32; 8]; 4],
    ) {
        let p = group.as_ptr();
        match ty {
            QuantType::Q8_0 => group_dot::<T, VNNI, 0>(p, nb, rows, out),
            QuantType::Q4_0 => group_dot::<T, VNNI, 1>(p, nb, rows, out),
            QuantType::Q4_1 => group_dot::<T, VNNI, 2>(p, nb, rows, out),
            QuantType::Q4K => group_dot::<T, VNNI, 3>(p, nb, rows, out),
            QuantType::Q6K => group_dot::<T, VNNI, 4>(p, nb, rows, out),
            QuantType::Q5K | QuantType::Q5_1 => group_dot::<T, VNNI, 5>(p, nb, rows, out),
            _ => {}
        }
    }

    /// The group kernel with AVX-512 VNNI's `vpdpbusd` on 256-bit vectors.
    #[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn group_dot_vnni<const T: usize>(
        ty: QuantType,
        group: &[u8],
        nb: usize,
        rows: &[super::Q8Row<'_>; 4],
        out: &mut [[f32; 8]; 4],
    ) {
        group_dot_any::<T, true>(ty, group, nb, rows, out)
    }

    /// The group kernel with AVX2 `maddubs` + `madd`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn group_dot_avx2<const T: usize>(
        ty: QuantType,
        group: &[u8],
        nb: usize,
        rows: &[super::Q8Row<'_>; 4],
        out: &mut [[f32; 8]; 4],
    ) {
        group_dot_any::<T, false>(ty, group, nb, rows, out)
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx512_vnni() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        has_avx2()
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
            && std::env::var_os("APHRO_NO_VNNI").is_none()
    })
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// `sum_i a[i] * b[i]` (same summation order on every path that runs on this machine).
#[allow(unsafe_code)]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked at run time above).
        return unsafe { x86::dot_f32(a, b) };
    }
    dot_f32_generic(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::lcg;

    /// Every block format; all have fused kernels.
    const BLOCK_FORMATS: [QuantType; 7] = [
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
        QuantType::Q5_1,
    ];

    /// The formats whose scales are expanded to f32 when packed (no ggml read-back).
    const EXPANDED_SCALE_FORMATS: [QuantType; 4] = [
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
        QuantType::Q5_1,
    ];

    fn random_matrix(ty: QuantType, rows: usize, cols: usize, seed: &mut u64) -> QuantMatrix {
        let data = random_ggml(ty, rows, cols, seed);
        QuantMatrix::new(ty, rows, cols, data).expect("consistent sizes")
    }

    /// Random ggml-layout blocks with sane scales.
    fn random_ggml(ty: QuantType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
        let (block, bytes) = ty.block_layout();
        let n_blocks = rows * cols / block;
        let mut data = Vec::with_capacity(n_blocks * bytes);
        for _ in 0..n_blocks {
            let start = data.len();
            for _ in 0..bytes {
                data.push(lcg(seed) as u8);
            }
            // Sane f16 scales (random bytes could be inf/nan).
            let d = f16::from_f32(0.01 + (lcg(seed) % 100) as f32 * 1e-4).to_le_bytes();
            match ty {
                QuantType::Q6K => data[start + 208..start + 210].copy_from_slice(&d),
                _ => {
                    data[start..start + 2].copy_from_slice(&d);
                    if matches!(
                        ty,
                        QuantType::Q4_1 | QuantType::Q4K | QuantType::Q5K | QuantType::Q5_1
                    ) {
                        let m = f16::from_f32(-0.05).to_le_bytes();
                        data[start + 2..start + 4].copy_from_slice(&m);
                    }
                }
            }
        }
        data
    }

    #[test]
    fn q4_1_dequant_matches_formula() {
        let d = f16::from_f32(0.5);
        let m = f16::from_f32(-1.0);
        let mut b = Vec::new();
        b.extend_from_slice(&d.to_le_bytes());
        b.extend_from_slice(&m.to_le_bytes());
        b.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        let q = QuantMatrix::new(QuantType::Q4_1, 1, 32, b).expect("valid");
        let v = q.dequantize();
        assert_eq!(v[0], -1.0);
        assert_eq!(v[3], 0.5);
        assert_eq!(v[16], 6.5);
    }

    #[test]
    fn wrong_sizes_are_errors() {
        assert!(QuantMatrix::new(QuantType::Q8_0, 2, 31, vec![0; 68]).is_err());
        assert!(QuantMatrix::new(QuantType::Q8_0, 2, 32, vec![0; 67]).is_err());
    }

    fn random_x(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| (lcg(seed) % 2000) as f32 / 1000.0 - 1.0)
            .collect()
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
                for tokens in [1, 3, 5, 9] {
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

    /// Every SIMD group kernel this CPU can run (AVX2, AVX-512 VNNI) gives bit-for-bit the
    /// scalar reference's results, for every token-tile width and for row counts that
    /// leave a padded last group.
    #[test]
    #[allow(unsafe_code)]
    fn simd_group_kernels_equal_scalar() {
        let mut seed = 19u64;
        for ty in BLOCK_FORMATS {
            let shapes: &[(usize, usize)] = if ty.packs_losslessly() {
                &[(8, 32), (13, 64), (16, 288), (5, 576)]
            } else {
                &[(8, 256), (13, 512)]
            };
            for &(rows, cols) in shapes {
                let m = random_matrix(ty, rows, cols, &mut seed);
                let nb = cols / 32;
                let x = random_x(4 * cols, &mut seed);
                let acts = Q8Acts::quantize(&x, 4, cols);
                let a = [0, 1, 2, 3].map(|t| acts.row(t));
                let gbb = packed::group_block_bytes(ty);
                for g in 0..rows.div_ceil(GROUP) {
                    let group = &m.data[g * nb * gbb..(g + 1) * nb * gbb];
                    let want: Vec<[f32; GROUP]> = (0..4)
                        .map(|t| group_dot_scalar(ty, group, nb, a[t]))
                        .collect();
                    let check = |name: &str, got: &[[f32; GROUP]; 4], n: usize| {
                        for t in 0..n {
                            assert_eq!(got[t], want[t], "{ty:?} {name} T={n} g={g} t={t}");
                        }
                    };
                    let mut got = [[0f32; GROUP]; 4];
                    group_dot::<4>(ty, group, a, &mut got);
                    check("dispatch", &got, 4);
                    group_dot::<1>(ty, group, a, &mut got);
                    check("dispatch", &got, 1);
                    #[cfg(target_arch = "x86_64")]
                    {
                        if has_avx2() {
                            // SAFETY: AVX2/FMA/F16C present; shapes as in `group_dot`.
                            unsafe {
                                x86::group_dot_avx2::<3>(ty, group, nb, &a, &mut got);
                            }
                            check("avx2", &got, 3);
                        }
                        if has_avx512_vnni() {
                            // SAFETY: AVX-512 VNNI/VL present; shapes as in `group_dot`.
                            unsafe {
                                x86::group_dot_vnni::<2>(ty, group, nb, &a, &mut got);
                            }
                            check("vnni", &got, 2);
                        }
                    }
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

    /// Repacking into row groups loses nothing: every row reads back as its ggml bytes.
    #[test]
    fn packed_rows_read_back_as_ggml() {
        let mut seed = 3u64;
        for ty in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1] {
            let (rows, cols) = (11, 96);
            let raw = random_ggml(ty, rows, cols, &mut seed);
            let m = QuantMatrix::new(ty, rows, cols, raw.clone()).expect("valid");
            assert_ne!(m.data[..raw.len()], raw[..], "{ty:?} is repacked");
            let rb = m.row_bytes();
            for r in 0..rows {
                let back = m.row(r).expect("lossless format");
                assert_eq!(&raw[r * rb..(r + 1) * rb], &back[..], "{ty:?} row {r}");
            }
        }
    }

    /// Q5_0 → Q8_0 keeps every value: ggml's Q5_0 dequantization, written out here,
    /// equals the Q8_0 dequantization of the converted blocks.
    #[test]
    fn q5_0_converts_to_identical_q8_0() {
        let mut seed = 29u64;
        let mut src = Vec::new();
        for _ in 0..7 {
            src.extend_from_slice(&f16::from_f32(0.0123).to_le_bytes());
            src.extend((0..20).map(|_| lcg(&mut seed) as u8));
        }
        let q8 = q5_0_to_q8_0(&src);
        let mut got = vec![0f32; 7 * 32];
        dequantize_into(QuantType::Q8_0, &q8, &mut got);
        for (i, b) in src.chunks_exact(22).enumerate() {
            let d = f16_at(b, 0);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                let xh0 = ((qh >> j) << 4) & 0x10;
                let xh1 = (qh >> (j + 12)) & 0x10;
                let x0 = ((b[6 + j] as u32 & 0x0F) | xh0) as i32 - 16;
                let x1 = ((b[6 + j] as u32 >> 4) | xh1) as i32 - 16;
                assert_eq!(got[i * 32 + j], x0 as f32 * d);
                assert_eq!(got[i * 32 + j + 16], x1 as f32 * d);
            }
        }
    }

    /// The K-quants' packed form dequantizes to exactly ggml's floats.
    #[test]
    fn packed_kquants_dequantize_like_ggml() {
        let mut seed = 13u64;
        for ty in EXPANDED_SCALE_FORMATS {
            let (rows, cols) = (11, 512);
            let raw = random_ggml(ty, rows, cols, &mut seed);
            let m = QuantMatrix::new(ty, rows, cols, raw.clone()).expect("valid");
            assert!(m.row(0).is_none());
            let rb = raw.len() / rows;
            for r in 0..rows {
                let mut want = vec![0f32; cols];
                dequantize_into(ty, &raw[r * rb..(r + 1) * rb], &mut want);
                let mut got = vec![0f32; cols];
                m.dequantize_row(r, &mut got);
                assert_eq!(got, want, "{ty:?} row {r}");
            }
        }
    }

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
