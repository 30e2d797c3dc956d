//! The fused kernels and their run-time dispatch: one packed row group against up to four
//! activation rows ([`group_dot`]), the f32 dot and the f16/bf16 widening, each picking the
//! AVX-512 VNNI, AVX2 or scalar implementation once per call from the CPU's features.

use half::f16;

use super::activation::Q8Tile;
pub(super) use super::activation::MAX_TILE;
use super::packed::{Packing, BLOCK, GROUP};

mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use scalar::{dot_f32_generic, group_dot_scalar};

/// Activation rows per group-kernel call on this CPU: every row of a tile shares each
/// unpacked weight vector, and holds two accumulators. AVX-512's 32 vector registers hold
/// [`MAX_TILE`] rows' worth; AVX2's 16 hold four.
pub(super) fn tile_width() -> usize {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_vnni() {
        return MAX_TILE;
    }
    4
}

/// One packed row group of packing `p` against the first `T` rows of `tile`: `out[t][k]`
/// for the group's 8 rows.
#[inline]
#[allow(unsafe_code)]
pub(super) fn group_dot<const T: usize>(
    p: Packing,
    group: &[u8],
    tile: &Q8Tile,
    out: &mut [[f32; GROUP]; MAX_TILE],
) {
    let nb = group.len() / p.group_block_bytes();
    let per_block = nb * MAX_TILE;
    assert!(
        T <= tile.rows
            && tile.blocks >= nb
            && tile.words.len() >= per_block * BLOCK / 4
            && [tile.d.len(), tile.s.len(), tile.d_sum.len()]
                .into_iter()
                .chain([
                    tile.sum.len(),
                    tile.bias.len(),
                    tile.bias_lo.len(),
                    tile.bias_hi.len()
                ])
                .all(|n| n >= per_block),
        "activation tile shorter than the weights"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512_vnni() {
            // SAFETY: the CPU has AVX-512 VNNI/VL, AVX2, FMA and F16C (checked at run time);
            // the tile covers `nb` blocks (asserted above) and the group is `nb` whole
            // group-blocks.
            unsafe { x86::group_dot_vnni::<T>(p, group, nb, tile, out) };
            return;
        }
        if has_avx2() {
            // SAFETY: as above, with AVX2, FMA and F16C.
            unsafe { x86::group_dot_avx2::<T>(p, group, nb, tile, out) };
            return;
        }
    }
    for (t, out) in out.iter_mut().enumerate().take(T) {
        *out = group_dot_scalar(p, group, nb, tile, t);
    }
}

/// Widen little-endian f16/bf16 values in `src` into `out` (`min(src/2, out)` values).
#[inline]
#[allow(unsafe_code)]
pub(super) fn half_to_f32(bf16: bool, src: &[u8], out: &mut [f32]) {
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

#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx512_vnni() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        has_avx2()
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
            && std::env::var_os("APHRO_NO_VNNI").is_none()
    })
}

/// AVX-512F beside AVX2 (the attention tiles' wider kernels). `APHRO_NO_AVX512` turns
/// them off, to compare the two paths on one machine.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512f() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        has_avx2()
            && is_x86_feature_detected!("avx512f")
            && std::env::var_os("APHRO_NO_AVX512").is_none()
    })
}

/// AVX-512 BF16 (`vdpbf16ps`, two bf16 products per f32 lane) beside AVX-512F: the
/// attention tiles' dot-product kernels for a bfloat16 KV cache. `APHRO_NO_AVX512` turns it
/// off with the rest of AVX-512, `APHRO_NO_AVX512_BF16` alone.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512bf16() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        has_avx512f()
            && is_x86_feature_detected!("avx512bf16")
            && std::env::var_os("APHRO_NO_AVX512_BF16").is_none()
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
#[inline]
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
    use crate::model::quant::activation::Q8Acts;
    use crate::model::quant::test_util::*;

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
                let p = Packing::of(ty).expect("block formats are packed");
                let nb = cols / BLOCK;
                let x = random_x(MAX_TILE * cols, &mut seed);
                let acts = Q8Acts::quantize(&x, MAX_TILE, cols);
                let tile = Q8Tile::new(&acts, 0, MAX_TILE);
                let a = &tile;
                let gbb = p.group_block_bytes();
                for g in 0..rows.div_ceil(GROUP) {
                    let group = &m.data[g * nb * gbb..(g + 1) * nb * gbb];
                    let want: Vec<[f32; GROUP]> = (0..MAX_TILE)
                        .map(|t| group_dot_scalar(p, group, nb, a, t))
                        .collect();
                    let check = |name: &str, got: &[[f32; GROUP]; MAX_TILE], n: usize| {
                        for t in 0..n {
                            assert_eq!(got[t], want[t], "{ty:?} {name} T={n} g={g} t={t}");
                        }
                    };
                    let mut got = [[0f32; GROUP]; MAX_TILE];
                    group_dot::<MAX_TILE>(p, group, a, &mut got);
                    check("dispatch", &got, MAX_TILE);
                    group_dot::<5>(p, group, a, &mut got);
                    check("dispatch", &got, 5);
                    group_dot::<4>(p, group, a, &mut got);
                    check("dispatch", &got, 4);
                    group_dot::<1>(p, group, a, &mut got);
                    check("dispatch", &got, 1);
                    #[cfg(target_arch = "x86_64")]
                    {
                        if has_avx2() {
                            // SAFETY: AVX2/FMA/F16C present; shapes as in `group_dot`.
                            unsafe {
                                x86::group_dot_avx2::<3>(p, group, nb, a, &mut got);
                            }
                            check("avx2", &got, 3);
                        }
                        if has_avx512_vnni() {
                            // SAFETY: AVX-512 VNNI/VL present; shapes as in `group_dot`.
                            unsafe {
                                x86::group_dot_vnni::<2>(p, group, nb, a, &mut got);
                            }
                            check("vnni", &got, 2);
                            // SAFETY: as above.
                            unsafe {
                                x86::group_dot_vnni::<7>(p, group, nb, a, &mut got);
                            }
                            check("vnni", &got, 7);
                        }
                    }
                }
            }
        }
    }
}
