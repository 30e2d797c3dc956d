//! Portable kernels: the scalar reference of the group kernels (the same float operations
//! in the same order as the SIMD ones, which are tested bit for bit against it) and the
//! f32 dot that LLVM vectorizes.

use super::super::activation::Q8Row;
use super::super::format::{f16_at, QuantType};
use super::super::packed::{self, GROUP};

/// Scalar reference of the group kernels, with the same float operations in the same
/// order (exact integer block dots, then `acc = fma(dw * dx, dot, acc)` and, for Q4_1,
/// `acc = fma(m, s, acc)` per block).
pub(super) fn group_dot_scalar(
    ty: QuantType,
    group: &[u8],
    nb: usize,
    a: Q8Row<'_>,
) -> [f32; GROUP] {
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

// ---------------------------------------------------------------------------------------
// Kernels. Written as plain loops over fixed 8-lane accumulators so LLVM vectorizes them;
// compiled twice, once with AVX2+FMA enabled, and picked at run time.

#[inline(always)]
pub(super) fn dot_f32_generic(a: &[f32], b: &[f32]) -> f32 {
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
