//! Block-quantized weights (ggml layouts): exact dequantization and fused CPU matmul kernels.
//!
//! Dequantization reproduces ggml / gguf-py bit for bit (`d * q + m` in f32, no FMA), which
//! is what the HF float32 reference used. The fused kernels work like llama.cpp's: the
//! activations are quantized to 8 bits per 32-block once per matmul ([`Q8Acts`]) and
//! multiplied with the weight quants in integer arithmetic, so decode reads 4.5–8.5 bits
//! per weight and does no per-weight float work.

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
        let acts = self
            .ty
            .has_fused_kernel()
            .then(|| Q8Acts::quantize(x, tokens, cols));
        let mut out_t = vec![0f32; self.rows * tokens];
        let rows_per_task = (self.rows / (rayon::current_num_threads() * 8)).clamp(4, 64);
        out_t
            .par_chunks_mut(tokens * rows_per_task)
            .enumerate()
            .for_each(|(chunk, out)| {
                let r0 = chunk * rows_per_task;
                let n = out.len() / tokens;
                if let Some(acts) = &acts {
                    // Four weight rows per pass share each activation block load; a task's
                    // rows (a few KiB) stay in L1 across the batch's tokens.
                    for t in 0..tokens {
                        let a = acts.row(t);
                        let mut i = 0;
                        while i + 4 <= n {
                            let rows = [0, 1, 2, 3].map(|k| self.row(r0 + i + k));
                            let mut o = [0f32; 4];
                            vec_dot_rows(self.ty, rows, a, &mut o);
                            for (k, v) in o.into_iter().enumerate() {
                                out[(i + k) * tokens + t] = v;
                            }
                            i += 4;
                        }
                        for i in i..n {
                            let mut o = [0f32; 1];
                            vec_dot_rows(self.ty, [self.row(r0 + i)], a, &mut o);
                            out[i * tokens + t] = o[0];
                        }
                    }
                    return;
                }
                let mut buf = vec![0f32; cols];
                for (i, o) in out.chunks_mut(tokens).enumerate() {
                    dequantize_into(self.ty, self.row(r0 + i), &mut buf);
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

/// Activations quantized to 8 bits per 32-block, once per matmul input (ggml's `Q8_0` /
/// `Q8_1`): `x ≈ d * q`, and `s = d * sum(q)` for the `m` term of Q4_1. The integer dot of
/// weight quants and activation quants is exact, so only the per-block scaling is float.
#[derive(Debug, Clone, Default)]
pub struct Q8Acts {
    cols: usize,
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

/// One token's row of [`Q8Acts`].
#[derive(Debug, Clone, Copy)]
pub struct Q8Row<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
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
        };
        type Row<'a> = ((&'a [f32], &'a mut [i8]), (&'a mut [f32], &'a mut [f32]));
        let work = |((xr, qs), (d, s)): Row<'_>| quantize_row_q8(xr, qs, d, s);
        if tokens >= 8 {
            x.par_chunks(cols)
                .zip(a.qs.par_chunks_mut(cols))
                .zip(a.d.par_chunks_mut(nb).zip(a.s.par_chunks_mut(nb)))
                .for_each(work);
        } else {
            x.chunks(cols)
                .zip(a.qs.chunks_mut(cols))
                .zip(a.d.chunks_mut(nb).zip(a.s.chunks_mut(nb)))
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
        }
    }
}

/// ggml's x86 `quantize_row_q8_1`: `d = amax / 127` (stored as f16), `q = round(x * 127 /
/// amax)` to nearest even, `s = d * sum(q)` (f16). Same values as llama.cpp's activations.
fn quantize_row_q8(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((xb, qb), d), s) in x
        .chunks_exact(32)
        .zip(qs.chunks_exact_mut(32))
        .zip(d.iter_mut())
        .zip(s.iter_mut())
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
    }
}

/// One row of weight blocks against one quantized activation row (scalar reference of
/// the AVX2 kernel: exact integer dots, then `d_w * d_x * dot (+ m * s)` per block).
fn vec_dot_q8_generic(ty: QuantType, row: &[u8], a: Q8Row<'_>) -> f32 {
    let mut sum = 0f32;
    match ty {
        QuantType::Q8_0 => {
            for ((b, q), &d) in row.chunks_exact(34).zip(a.qs.chunks_exact(32)).zip(a.d) {
                let dot: i32 = (0..32).map(|j| (b[2 + j] as i8) as i32 * q[j] as i32).sum();
                sum += f16_at(b, 0) * d * dot as f32;
            }
        }
        QuantType::Q4_0 => {
            for ((b, q), &d) in row.chunks_exact(18).zip(a.qs.chunks_exact(32)).zip(a.d) {
                let dot: i32 = (0..16)
                    .map(|j| {
                        ((b[2 + j] & 0xF) as i32 - 8) * q[j] as i32
                            + ((b[2 + j] >> 4) as i32 - 8) * q[j + 16] as i32
                    })
                    .sum();
                sum += f16_at(b, 0) * d * dot as f32;
            }
        }
        QuantType::Q4_1 => {
            for (((b, q), &d), &s) in row
                .chunks_exact(20)
                .zip(a.qs.chunks_exact(32))
                .zip(a.d)
                .zip(a.s)
            {
                let dot: i32 = (0..16)
                    .map(|j| {
                        (b[4 + j] & 0xF) as i32 * q[j] as i32
                            + (b[4 + j] >> 4) as i32 * q[j + 16] as i32
                    })
                    .sum();
                sum += f16_at(b, 0) * d * dot as f32 + f16_at(b, 2) * s;
            }
        }
        QuantType::Q4K | QuantType::Q6K | QuantType::F16 | QuantType::BF16 => {}
    }
    sum
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

    /// Eight i32 partial sums of `w · x` for one 32-block (exact). `K`: 0 = Q8_0, 1 = Q4_0,
    /// 2 = Q4_1; `b` points at the block.
    #[inline(always)]
    unsafe fn block_idot<const K: u8>(b: *const u8, x: __m256i) -> __m256i {
        let w = if K == 0 {
            _mm256_loadu_si256(b.add(2) as *const __m256i)
        } else {
            let q = _mm_loadu_si128(b.add(if K == 1 { 2 } else { 4 }) as *const __m128i);
            // Low nibbles are elements 0..16, high nibbles 16..32.
            let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
            let nib = _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
            if K == 1 {
                _mm256_sub_epi8(nib, _mm256_set1_epi8(8))
            } else {
                nib
            }
        };
        let p16 = if K == 2 {
            // Unsigned nibbles times signed activations: maddubs directly.
            _mm256_maddubs_epi16(w, x)
        } else {
            // Signed × signed: move the sign of w onto x (ggml's trick).
            _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
        };
        _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
    }

    /// The block's f16 scale (and, for Q4_1, its f16 `m`) as f32.
    #[inline(always)]
    unsafe fn block_dm(b: *const u8) -> (f32, f32) {
        let bits = std::ptr::read_unaligned(b as *const u32);
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    #[inline(always)]
    unsafe fn dot_rows<const ROWS: usize, const K: u8>(
        rows: [&[u8]; ROWS],
        a: super::Q8Row<'_>,
        out: &mut [f32; ROWS],
    ) {
        let bytes = [34usize, 18, 20][K as usize];
        let nb = a.d.len().min(a.s.len()).min(a.qs.len() / 32);
        for r in rows.iter() {
            assert!(
                r.len() >= nb * bytes,
                "weight row shorter than the activations"
            );
        }
        let ptrs = rows.map(|r| r.as_ptr());
        let mut acc = [_mm256_setzero_ps(); ROWS];
        let mut summs = [0f32; ROWS];
        for i in 0..nb {
            // SAFETY: i < nb bounds the 32-byte activation load and each row's block
            // (every row holds at least nb blocks, asserted above).
            let x = _mm256_loadu_si256(a.qs.as_ptr().add(32 * i) as *const __m256i);
            let dx = *a.d.get_unchecked(i);
            for ((acc, summ), p) in acc.iter_mut().zip(summs.iter_mut()).zip(ptrs) {
                let b = p.add(i * bytes);
                let dot = _mm256_cvtepi32_ps(block_idot::<K>(b, x));
                let (dw, m) = block_dm(b);
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), dot, *acc);
                if K == 2 {
                    *summ += m * *a.s.get_unchecked(i);
                }
            }
        }
        for ((o, acc), summ) in out.iter_mut().zip(acc).zip(summs) {
            *o = hsum(acc) + summ;
        }
    }

    /// `ROWS` weight rows against one activation row: each loaded activation block is used
    /// `ROWS` times. Every row's arithmetic is identical to the single-row case.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn vec_dot_q8<const ROWS: usize>(
        ty: QuantType,
        rows: [&[u8]; ROWS],
        a: super::Q8Row<'_>,
        out: &mut [f32; ROWS],
    ) {
        match ty {
            QuantType::Q8_0 => dot_rows::<ROWS, 0>(rows, a, out),
            QuantType::Q4_0 => dot_rows::<ROWS, 1>(rows, a, out),
            QuantType::Q4_1 => dot_rows::<ROWS, 2>(rows, a, out),
            _ => {
                for (o, row) in out.iter_mut().zip(rows) {
                    *o = super::vec_dot_q8_generic(ty, row, a);
                }
            }
        }
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
fn vec_dot_rows<const R: usize>(ty: QuantType, rows: [&[u8]; R], a: Q8Row<'_>, out: &mut [f32; R]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked at run time above); the
        // kernel checks that every row covers the activation row.
        unsafe { x86::vec_dot_q8::<R>(ty, rows, a, out) };
        return;
    }
    for (o, row) in out.iter_mut().zip(rows) {
        *o = vec_dot_q8_generic(ty, row, a);
    }
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

    fn random_x(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| (lcg(seed) % 2000) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// `y[t, r]` from the dequantized weights and the dequantized Q8 activations in f64,
    /// with Q4_1's offset through the stored `s` (what the integer kernels compute).
    fn q8_reference(m: &QuantMatrix, acts: &Q8Acts, t: usize, r: usize) -> (f64, f64) {
        let a = acts.row(t);
        let (_, bytes) = m.ty.block_layout();
        let mut w = vec![0f32; m.cols];
        m.dequantize_row(r, &mut w);
        let (mut sum, mut mag) = (0f64, 0f64);
        for (i, b) in m.row(r).chunks_exact(bytes).enumerate() {
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
        for ty in [
            QuantType::Q8_0,
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q4K,
            QuantType::Q6K,
        ] {
            let shapes: &[(usize, usize)] = if ty.has_fused_kernel() {
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
                            if ty.has_fused_kernel() {
                                let (want, qmag) = q8_reference(&m, &acts, t, r);
                                assert!(
                                    (g - want).abs() <= 1e-5 * (1.0 + qmag),
                                    "{ty:?} {rows}x{cols} t={t} r={r}: {g} vs {want}"
                                );
                                assert!(
                                    (g - exact).abs() <= 1e-2 * (1.0 + mag),
                                    "{ty:?} {rows}x{cols} t={t} r={r}: {g} vs exact {exact}"
                                );
                            } else {
                                assert!(
                                    (g - exact).abs() <= 1e-4 * (1.0 + exact.abs()),
                                    "{ty:?} t={t} r={r}: {g} vs {exact}"
                                );
                            }
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

    /// The SIMD dot (whatever this CPU dispatches to) agrees with the scalar reference,
    /// for single rows and 4-row tiles.
    #[test]
    fn simd_dot_matches_scalar() {
        let mut seed = 19u64;
        for ty in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1] {
            for cols in [32, 64, 288, 576] {
                let m = random_matrix(ty, 4, cols, &mut seed);
                let x = random_x(cols, &mut seed);
                let acts = Q8Acts::quantize(&x, 1, cols);
                let a = acts.row(0);
                let want: Vec<f32> = (0..4)
                    .map(|r| vec_dot_q8_generic(ty, m.row(r), a))
                    .collect();
                let mut four = [0f32; 4];
                vec_dot_rows(ty, [0, 1, 2, 3].map(|r| m.row(r)), a, &mut four);
                for (r, &tiled) in four.iter().enumerate() {
                    let mut one = [0f32; 1];
                    vec_dot_rows(ty, [m.row(r)], a, &mut one);
                    assert_eq!(one[0], tiled, "{ty:?} tile differs from single row");
                    let mag: f32 = want.iter().map(|v| v.abs()).sum();
                    assert!(
                        (one[0] - want[r]).abs() <= 1e-5 * (1.0 + mag),
                        "{ty:?} cols={cols} r={r}: {} vs {}",
                        one[0],
                        want[r]
                    );
                }
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
