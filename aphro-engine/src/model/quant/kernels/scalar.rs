//! Portable kernels: the scalar reference of the group kernels (the same float operations
//! in the same order as the SIMD ones, which are tested bit for bit against it) and the
//! f32 dot that LLVM vectorizes.

use super::super::activation::Q8Tile;
use super::super::format::f16_at;
use super::super::format::ggml::{q4_0, NIBBLE_BITS, NIBBLE_MASK};
use super::super::packed::{Packing, BLOCK, GROUP, HIGH_NIBBLE_COLS, LANE_BYTES};

/// Scalar reference of the group kernels for row `t` of `tile`, with the same float
/// operations in the same order (exact integer block dots, then `acc = fma(dw * dx, dot,
/// acc)` and, for Q4_1, `acc = fma(m, s, acc)` per block).
pub(super) fn group_dot_scalar(
    p: Packing,
    group: &[u8],
    nb: usize,
    tile: &Q8Tile,
    t: usize,
) -> [f32; GROUP] {
    let gbb = p.group_block_bytes();
    let mut acc = [0f32; GROUP];
    for i in 0..nb {
        let b = &group[i * gbb..(i + 1) * gbb];
        let x: [i8; BLOCK] = std::array::from_fn(|c| tile.q(t, i, c));
        let at = i * super::MAX_TILE + t;
        let (d, sum) = (tile.d[at], tile.sum[at]);
        for (k, acc) in acc.iter_mut().enumerate() {
            match p {
                Packing::Q8_0 => {
                    let dot = byte_dot::<true>(p, b, k, &x, 0..p.vectors());
                    *acc = (f16_at(b, p.d_at(k)) * d).mul_add(dot as f32, *acc);
                }
                Packing::Q4_0 => {
                    let dot = nibble_dot(p, b, k, &x) - q4_0::OFFSET * sum;
                    *acc = (f16_at(b, p.d_at(k)) * d).mul_add(dot as f32, *acc);
                }
                Packing::Q4_1 => {
                    let dot = nibble_dot(p, b, k, &x);
                    *acc = (f16_at(b, p.d_at(k)) * d).mul_add(dot as f32, *acc);
                    *acc = f16_at(b, p.m_at(k)).mul_add(tile.s[at], *acc);
                }
                // f32 `D` and `M`, the offset term with the exact activation sum.
                Packing::Q4K | Packing::U8 => {
                    let dot = if p.is_nibbles() {
                        nibble_dot(p, b, k, &x)
                    } else {
                        byte_dot::<false>(p, b, k, &x, 0..p.vectors())
                    };
                    *acc = (f32_at(b, p.d_at(k)) * d).mul_add(dot as f32, *acc);
                    *acc = f32_at(b, p.m_at(k)).mul_add(tile.d_sum[at], *acc);
                }
                // Two 16-column halves, each with its own scale.
                Packing::Q6K => {
                    let half = p.vectors() / 2;
                    for (ws, at) in [(0..half, p.d_at(k)), (half..2 * half, p.m_at(k))] {
                        let dot = byte_dot::<true>(p, b, k, &x, ws);
                        *acc = (f32_at(b, at) * d).mul_add(dot as f32, *acc);
                    }
                }
            }
        }
    }
    acc
}

/// The little-endian f32 at byte `at` of `b`.
#[inline(always)]
fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Row `k`'s quant bytes in vectors `ws` of group-block `b` times the activations `x` of
/// their columns, the bytes read as i8 (`SIGNED`) or as u8.
#[inline(always)]
fn byte_dot<const SIGNED: bool>(
    p: Packing,
    b: &[u8],
    k: usize,
    x: &[i8],
    ws: std::ops::Range<usize>,
) -> i32 {
    let mut dot = 0i32;
    for w in ws {
        for j in 0..LANE_BYTES {
            let q = b[p.quant_at(w, k) + j];
            let q = if SIGNED { q as i8 as i32 } else { q as i32 };
            dot += q * x[LANE_BYTES * w + j] as i32;
        }
    }
    dot
}

/// Row `k`'s nibbles in group-block `b` times the activations `x` of their columns.
#[inline(always)]
fn nibble_dot(p: Packing, b: &[u8], k: usize, x: &[i8]) -> i32 {
    let mut dot = 0i32;
    for w in 0..p.vectors() {
        for j in 0..LANE_BYTES {
            let (q, c) = (b[p.quant_at(w, k) + j], LANE_BYTES * w + j);
            dot += (q & NIBBLE_MASK) as i32 * x[c] as i32
                + (q >> NIBBLE_BITS) as i32 * x[c + HIGH_NIBBLE_COLS] as i32;
        }
    }
    dot
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
