//! Block-quantized weights (ggml layouts): exact dequantization and fused CPU matmul kernels.
//!
//! Dequantization reproduces ggml / gguf-py bit for bit (`d * q + m` in f32, no FMA), which
//! is what the HF float32 reference used. The fused kernels multiply f32 activations by the
//! quantized blocks directly, so decode reads 4.5–8.5 bits per weight instead of 32.

use half::f16;
use rayon::prelude::*;

/// The ggml block formats this crate understands, plus plain 16-bit floats (`--dtype
/// float16|bfloat16`: weights stored in 16 bits, widened to f32 inside the matmul).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q8_0,
    Q4_0,
    Q4_1,
    Q4K,
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
            QuantType::Q4K => (256, 144),
            QuantType::Q6K => (256, 210),
            QuantType::F16 | QuantType::BF16 => (1, 2),
        }
    }

    /// Whether this is a plain 16-bit float format rather than a block quantization.
    pub fn is_half(self) -> bool {
        matches!(self, QuantType::F16 | QuantType::BF16)
    }

    /// Whether the fused kernels handle it (the K-quants are dequantized at load).
    pub fn has_fused_kernel(self) -> bool {
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

/// A row-major `[rows, cols]` matrix stored in ggml blocks; each row is whole blocks.
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

    pub fn new(ty: QuantType, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self, QuantError> {
        let (block, _) = ty.block_layout();
        if cols % block != 0 {
            return Err(QuantError::RowNotBlockAligned { ty, cols, block });
        }
        let want = rows * Self::row_bytes_for(ty, cols);
        if data.len() != want {
            return Err(QuantError::WrongSize {
                ty,
                rows,
                cols,
                want,
                got: data.len(),
            });
        }
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

    pub fn row_bytes(&self) -> usize {
        Self::row_bytes_for(self.ty, self.cols)
    }

    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    pub fn size_bytes(&self) -> usize {
        self.data.len()
    }

    /// Dequantize one row into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        dequantize_into(self.ty, self.row(r), out);
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
    /// Rows are split across the rayon pool; every output element is computed by the same
    /// code regardless of `tokens`, so results do not depend on batch composition.
    pub fn matmul(&self, x: &[f32], tokens: usize) -> Vec<f32> {
        let cols = self.cols;
        debug_assert_eq!(x.len(), tokens * cols);
        let mut out_t = vec![0f32; self.rows * tokens];
        // Block sums of x are shared by every row (Q4_1's `m` term).
        let block_sums: Vec<f32> = x.chunks(32).map(|c| c.iter().sum()).collect();
        let rows_per_task = (self.rows / (rayon::current_num_threads() * 8)).clamp(1, 64);
        out_t
            .par_chunks_mut(tokens * rows_per_task)
            .enumerate()
            .for_each(|(chunk, out)| {
                let r0 = chunk * rows_per_task;
                let mut buf = Vec::new();
                for (i, o) in out.chunks_mut(tokens).enumerate() {
                    let row = self.row(r0 + i);
                    if !self.ty.has_fused_kernel() {
                        buf.resize(cols, 0.0);
                        dequantize_into(self.ty, row, &mut buf);
                        for (t, y) in o.iter_mut().enumerate() {
                            *y = dot_f32(&buf, &x[t * cols..(t + 1) * cols]);
                        }
                    } else if tokens >= 4 {
                        // Prefill: unpack the row's quants once, reuse them for every token.
                        // `decoded_dot` does the same arithmetic in the same order as
                        // `fused_dot`, so a row's result never depends on the batch size.
                        buf.resize(cols, 0.0);
                        unpack_quants(self.ty, row, &mut buf);
                        for (t, y) in o.iter_mut().enumerate() {
                            let xs = &x[t * cols..(t + 1) * cols];
                            let bs = &block_sums[t * cols / 32..(t + 1) * cols / 32];
                            *y = decoded_dot(self.ty, row, &buf, xs, bs);
                        }
                    } else {
                        for (t, y) in o.iter_mut().enumerate() {
                            let xs = &x[t * cols..(t + 1) * cols];
                            let bs = &block_sums[t * cols / 32..(t + 1) * cols / 32];
                            *y = fused_dot(self.ty, row, xs, bs);
                        }
                    }
                }
            });
        transpose(&out_t, self.rows, tokens)
    }
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
            QuantType::Q6K => dequant_q6k(b, o),
            QuantType::F16 | QuantType::BF16 => {}
        }
    }
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

/// One row of quantized blocks against one activation row (`bsums`: per-32 sums of `x`).
#[inline(always)]
fn fused_dot_generic(ty: QuantType, row: &[u8], x: &[f32], bsums: &[f32]) -> f32 {
    let mut total = [0f32; 8];
    match ty {
        QuantType::Q8_0 => {
            for (b, xs) in row.chunks_exact(34).zip(x.chunks_exact(32)) {
                let d = f16_at(b, 0);
                let mut acc = [0f32; 8];
                for k in 0..4 {
                    for l in 0..8 {
                        acc[l] += (b[2 + k * 8 + l] as i8) as f32 * xs[k * 8 + l];
                    }
                }
                for l in 0..8 {
                    total[l] += acc[l] * d;
                }
            }
        }
        QuantType::Q4_0 | QuantType::Q4_1 => {
            let (bytes, qoff) = if ty == QuantType::Q4_0 {
                (18, 2)
            } else {
                (20, 4)
            };
            for ((b, xs), &bs) in row.chunks_exact(bytes).zip(x.chunks_exact(32)).zip(bsums) {
                let d = f16_at(b, 0);
                let q = &b[qoff..qoff + 16];
                let mut acc = [0f32; 8];
                for k in 0..2 {
                    for l in 0..8 {
                        let v = q[k * 8 + l];
                        acc[l] += (v & 0xF) as f32 * xs[k * 8 + l];
                        acc[l] += (v >> 4) as f32 * xs[16 + k * 8 + l];
                    }
                }
                // Q4_0: w = d (q - 8); Q4_1: w = d q + m.
                let off = if ty == QuantType::Q4_0 {
                    -8.0 * d * bs
                } else {
                    f16_at(b, 2) * bs
                };
                for l in 0..8 {
                    total[l] += acc[l] * d;
                }
                total[0] += off;
            }
        }
        QuantType::Q4K | QuantType::Q6K | QuantType::F16 | QuantType::BF16 => {
            let (block, _) = ty.block_layout();
            let mut buf = vec![0f32; block];
            let (_, bytes) = ty.block_layout();
            let mut s = 0f32;
            for (b, xs) in row.chunks_exact(bytes).zip(x.chunks_exact(block)) {
                dequantize_into(ty, b, &mut buf);
                s += dot_f32_generic(&buf, xs);
            }
            total[0] += s;
        }
    }
    ((total[0] + total[4]) + (total[1] + total[5]))
        + ((total[2] + total[6]) + (total[3] + total[7]))
}

/// The raw quants of 32-blocks as f32 (`i8` for Q8_0, `0..16` nibbles for Q4_0/Q4_1), in
/// element order; scales stay in the row bytes.
fn unpack_quants(ty: QuantType, row: &[u8], out: &mut [f32]) {
    match ty {
        QuantType::Q8_0 => {
            for (b, o) in row.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
                for j in 0..32 {
                    o[j] = (b[2 + j] as i8) as f32;
                }
            }
        }
        QuantType::Q4_0 | QuantType::Q4_1 => {
            let (bytes, qoff) = if ty == QuantType::Q4_0 {
                (18, 2)
            } else {
                (20, 4)
            };
            for (b, o) in row.chunks_exact(bytes).zip(out.chunks_exact_mut(32)) {
                for j in 0..16 {
                    o[j] = (b[qoff + j] & 0xF) as f32;
                    o[j + 16] = (b[qoff + j] >> 4) as f32;
                }
            }
        }
        QuantType::Q4K | QuantType::Q6K | QuantType::F16 | QuantType::BF16 => {}
    }
}

/// [`fused_dot_generic`] on quants already unpacked by [`unpack_quants`] (bit-identical).
#[inline(always)]
fn decoded_dot_generic(ty: QuantType, row: &[u8], qf: &[f32], x: &[f32], bsums: &[f32]) -> f32 {
    let mut total = [0f32; 8];
    match ty {
        QuantType::Q8_0 => {
            for ((b, q), xs) in row
                .chunks_exact(34)
                .zip(qf.chunks_exact(32))
                .zip(x.chunks_exact(32))
            {
                let d = f16_at(b, 0);
                let mut acc = [0f32; 8];
                for k in 0..4 {
                    for l in 0..8 {
                        acc[l] += q[k * 8 + l] * xs[k * 8 + l];
                    }
                }
                for l in 0..8 {
                    total[l] += acc[l] * d;
                }
            }
        }
        QuantType::Q4_0 | QuantType::Q4_1 => {
            let bytes = if ty == QuantType::Q4_0 { 18 } else { 20 };
            for (((b, q), xs), &bs) in row
                .chunks_exact(bytes)
                .zip(qf.chunks_exact(32))
                .zip(x.chunks_exact(32))
                .zip(bsums)
            {
                let d = f16_at(b, 0);
                let mut acc = [0f32; 8];
                for k in 0..2 {
                    for l in 0..8 {
                        acc[l] += q[k * 8 + l] * xs[k * 8 + l];
                        acc[l] += q[16 + k * 8 + l] * xs[16 + k * 8 + l];
                    }
                }
                let off = if ty == QuantType::Q4_0 {
                    -8.0 * d * bs
                } else {
                    f16_at(b, 2) * bs
                };
                for l in 0..8 {
                    total[l] += acc[l] * d;
                }
                total[0] += off;
            }
        }
        QuantType::Q4K | QuantType::Q6K | QuantType::F16 | QuantType::BF16 => {}
    }
    ((total[0] + total[4]) + (total[1] + total[5]))
        + ((total[2] + total[6]) + (total[3] + total[7]))
}

/// AVX2+FMA kernels. `fused_dot` and `decoded_dot` run the same FMA chain on the same
/// quant values, so prefill (decoded) and decode (fused) give bit-identical rows.
#[cfg(target_arch = "x86_64")]
mod x86 {
    #![allow(unsafe_code)]
    use super::QuantType;
    use std::arch::x86_64::*;

    /// f16 → f32 with the F16C instruction (the `half` crate re-detects it per call).
    #[inline(always)]
    unsafe fn f16_at(b: &[u8], i: usize) -> f32 {
        let bits = u16::from_le_bytes([b[i], b[i + 1]]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

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

    /// 32 quants of one block as four 8-lane f32 vectors (element order).
    #[inline(always)]
    unsafe fn unpack_block(ty: QuantType, b: &[u8]) -> [__m256; 4] {
        match ty {
            QuantType::Q8_0 => {
                let p = b.as_ptr().add(2);
                let mut out = [_mm256_setzero_ps(); 4];
                for (k, o) in out.iter_mut().enumerate() {
                    let v = _mm_loadl_epi64(p.add(8 * k) as *const __m128i);
                    *o = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
                }
                out
            }
            _ => {
                let off = if ty == QuantType::Q4_0 { 2 } else { 4 };
                let q = _mm_loadu_si128(b.as_ptr().add(off) as *const __m128i);
                let mask = _mm_set1_epi8(0x0F);
                let lo = _mm_and_si128(q, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
                let cvt = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                [
                    cvt(lo),
                    cvt(_mm_srli_si128(lo, 8)),
                    cvt(hi),
                    cvt(_mm_srli_si128(hi, 8)),
                ]
            }
        }
    }

    #[inline(always)]
    unsafe fn block_dot(q: [__m256; 4], xs: *const f32) -> __m256 {
        let mut acc = _mm256_mul_ps(q[0], _mm256_loadu_ps(xs));
        acc = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xs.add(8)), acc);
        acc = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xs.add(16)), acc);
        _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xs.add(24)), acc)
    }

    /// Shared tail of both kernels: scale each block's dot and add its offset term.
    #[inline(always)]
    unsafe fn finish(
        ty: QuantType,
        row: &[u8],
        x: &[f32],
        bsums: &[f32],
        qf: Option<&[f32]>,
    ) -> f32 {
        let (_, bytes) = ty.block_layout();
        let mut total = _mm256_setzero_ps();
        let mut off = 0f32;
        for (i, b) in row.chunks_exact(bytes).enumerate() {
            if (i + 1) * 32 > x.len() {
                break;
            }
            let d = f16_at(b, 0);
            let q = match qf {
                // Quants unpacked once per row by `unpack_quants` (prefill).
                Some(qf) if qf.len() >= (i + 1) * 32 => {
                    let p = qf.as_ptr().add(i * 32);
                    [
                        _mm256_loadu_ps(p),
                        _mm256_loadu_ps(p.add(8)),
                        _mm256_loadu_ps(p.add(16)),
                        _mm256_loadu_ps(p.add(24)),
                    ]
                }
                Some(_) => break,
                None => unpack_block(ty, b),
            };
            let acc = block_dot(q, x.as_ptr().add(i * 32));
            total = _mm256_fmadd_ps(acc, _mm256_set1_ps(d), total);
            let bs = bsums.get(i).copied().unwrap_or(0.0);
            off += match ty {
                QuantType::Q4_0 => -8.0 * d * bs,
                QuantType::Q4_1 => f16_at(b, 2) * bs,
                _ => 0.0,
            };
        }
        hsum(total) + off
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn fused_dot(ty: QuantType, row: &[u8], x: &[f32], bs: &[f32]) -> f32 {
        if !ty.has_fused_kernel() {
            return super::fused_dot_generic(ty, row, x, bs);
        }
        finish(ty, row, x, bs, None)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn decoded_dot(
        ty: QuantType,
        row: &[u8],
        qf: &[f32],
        x: &[f32],
        bs: &[f32],
    ) -> f32 {
        finish(ty, row, x, bs, Some(qf))
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
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

#[allow(unsafe_code)]
fn fused_dot(ty: QuantType, row: &[u8], x: &[f32], bs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked at run time above).
        return unsafe { x86::fused_dot(ty, row, x, bs) };
    }
    fused_dot_generic(ty, row, x, bs)
}

#[allow(unsafe_code)]
fn decoded_dot(ty: QuantType, row: &[u8], qf: &[f32], x: &[f32], bs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked at run time above).
        return unsafe { x86::decoded_dot(ty, row, qf, x, bs) };
    }
    decoded_dot_generic(ty, row, qf, x, bs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    fn random_matrix(ty: QuantType, rows: usize, cols: usize, seed: &mut u64) -> QuantMatrix {
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
                    if matches!(ty, QuantType::Q4_1 | QuantType::Q4K) {
                        let m = f16::from_f32(-0.05).to_le_bytes();
                        data[start + 2..start + 4].copy_from_slice(&m);
                    }
                }
            }
        }
        QuantMatrix::new(ty, rows, cols, data).expect("consistent sizes")
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

    /// The fused kernels must equal the dequantize-then-multiply reference.
    #[test]
    fn fused_matmul_matches_dequantized() {
        let mut seed = 7u64;
        for ty in [
            QuantType::Q8_0,
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q4K,
            QuantType::Q6K,
        ] {
            let (rows, cols) = (37, 512);
            let m = random_matrix(ty, rows, cols, &mut seed);
            let w = m.dequantize();
            for tokens in [1, 3, 5] {
                let x: Vec<f32> = (0..tokens * cols)
                    .map(|_| (lcg(&mut seed) % 2000) as f32 / 1000.0 - 1.0)
                    .collect();
                let got = m.matmul(&x, tokens);
                for t in 0..tokens {
                    for r in 0..rows {
                        let want: f64 = (0..cols)
                            .map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64)
                            .sum();
                        let g = got[t * rows + r] as f64;
                        assert!(
                            (g - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{ty:?} t={t} r={r}: {g} vs {want}"
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
                let dense = dense_matmul(&w, rows, cols, &x, tokens);
                for (a, b) in dense.iter().zip(&got) {
                    assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()));
                }
            }
        }
    }
}
