//! Portable kernels: the scalar reference of the group kernels (the same float operations
//! in the same order as the SIMD ones, which are tested bit for bit against it) and the
//! f32 dot that LLVM vectorizes.

use super::super::activation::Q8Row;
use super::super::format::f16_at;
use super::super::format::ggml::{q4_0, NIBBLE_BITS, NIBBLE_MASK};
use super::super::packed::{Packing, BLOCK, GROUP, HIGH_NIBBLE_COLS, LANE_BYTES};

/// Scalar reference of the group kernels, with the same float operations in the same
/// order (exact integer block dots, then `acc = fma(dw * dx, dot, acc)` and, for Q4_1,
/// `acc = fma(m, s, acc)` per block).
pub(super) fn group_dot_scalar(p: Packing, group: &[u8], nb: usize, a: Q8Row<'_>) -> [f32; GROUP] {
    let gbb = p.group_block_bytes();
    let mut acc = [0f32; GROUP];
    for i in 0..nb {
        let b = &group[i * gbb..(i + 1) * gbb];
        let x = &a.qs[BLOCK * i..BLOCK * i + BLOCK];
        let f32_at = |at: usize| f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        for (k, acc) in acc.iter_mut().enumerate() {
            // Row `k`'s byte `j` of quant vector `w`, and the activation of its column.
            let byte = |w: usize, j: usize| b[p.quant_at(w, k) + j];
            let xi = |c: usize| x[c] as i32;
            // Bytes times activations over vectors `ws`, the bytes read as i8 or as u8.
            let byte_dot = |ws: std::ops::Range<usize>, signed: bool| {
                let mut dot = 0i32;
                for w in ws {
                    for j in 0..LANE_BYTES {
                        let q = if signed {
                            byte(w, j) as i8 as i32
                        } else {
                            byte(w, j) as i32
                        };
                        dot += q * xi(LANE_BYTES * w + j);
                    }
                }
                dot
            };
            let nibble_dot = || {
                let mut dot = 0i32;
                for w in 0..p.vectors() {
                    for j in 0..LANE_BYTES {
                        let (q, c) = (byte(w, j), LANE_BYTES * w + j);
                        dot += (q & NIBBLE_MASK) as i32 * xi(c)
                            + (q >> NIBBLE_BITS) as i32 * xi(c + HIGH_NIBBLE_COLS);
                    }
                }
                dot
            };
            // f16 `d` (ggml's) times the activation scale.
            let classic = |acc: &mut f32, dot: i32| {
                let dw = f16_at(b, p.d_at(k));
                *acc = (dw * a.d[i]).mul_add(dot as f32, *acc);
            };
            // f32 `D` and `M`, the offset term with the exact activation sum.
            let expanded = |acc: &mut f32, dot: i32| {
                *acc = (f32_at(p.d_at(k)) * a.d[i]).mul_add(dot as f32, *acc);
                *acc = f32_at(p.m_at(k)).mul_add(a.d[i] * a.sum[i] as f32, *acc);
            };
            match p {
                Packing::Q8_0 => classic(acc, byte_dot(0..p.vectors(), true)),
                Packing::Q4_0 => classic(acc, nibble_dot() - q4_0::OFFSET * a.sum[i]),
                Packing::Q4_1 => {
                    classic(acc, nibble_dot());
                    *acc = f16_at(b, p.m_at(k)).mul_add(a.s[i], *acc);
                }
                Packing::Q4K => expanded(acc, nibble_dot()),
                Packing::U8 => expanded(acc, byte_dot(0..p.vectors(), false)),
                // Two 16-column halves, each with its own scale.
                Packing::Q6K => {
                    let half = p.vectors() / 2;
                    for (ws, at) in [(0..half, p.d_at(k)), (half..2 * half, p.m_at(k))] {
                        let dot = byte_dot(ws, true);
                        *acc = (f32_at(at) * a.d[i]).mul_add(dot as f32, *acc);
                    }
                }
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
