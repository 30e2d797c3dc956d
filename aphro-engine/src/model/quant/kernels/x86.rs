//! AVX2+FMA kernels (and the AVX-512 VNNI variant of the group kernel): f32 dot, half
//! widening, and the integer weight × Q8-activation dot. Compiled only on x86_64; the
//! caller checks the CPU features at run time.

#![allow(unsafe_code)]
use std::arch::x86_64::*;

use super::super::activation::{Q8Tile, WORDS};
use super::super::format::ggml::{q4_0, NIBBLE_BITS, NIBBLE_MASK};
use super::super::packed::{Packing, GROUP, HIGH_NIBBLE_COLS, LANE_BYTES, VECTOR_BYTES};
use super::MAX_TILE;

/// The shift from a byte's high nibble to its low one, as the shift intrinsics take it.
const NIBBLE_SHIFT: i32 = NIBBLE_BITS as i32;

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
/// operands used here: with VNNI any bytes (no intermediate saturation); with the AVX2
/// `maddubs` form 4/5-bit weights or the sign trick (|u| <= 128, |s| <= 127), which keep
/// every pair sum inside i16.
#[inline(always)]
unsafe fn dot4<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(acc, u, s)
    } else {
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
        _mm256_add_epi32(acc, p)
    }
}

/// The 8 rows' scales at `at` of a group-block of packing `K` as f32 lanes: f32 as stored
/// where packing multiplied them out, ggml's f16 widened otherwise.
#[inline(always)]
unsafe fn load_scales<const K: u8>(b: *const u8, at: usize) -> __m256 {
    const { assert!(GROUP == 8) };
    if const { Packing::from_id(K).scale_bytes() == 4 } {
        _mm256_loadu_ps(b.add(at) as *const f32)
    } else {
        _mm256_cvtph_ps(_mm_loadu_si128(b.add(at) as *const __m128i))
    }
}

/// How many group-blocks ahead of the one being multiplied the kernel prefetches.
const PREFETCH_BLOCKS: usize = 4;

/// One packed row group (see [`super::super::packed`]) against the first `T` rows of an
/// activation tile; `K` is the group's [`Packing`] id, and every offset comes from that
/// packing's geometry. Lane `k` of every vector is row `k` of the group, so the 8 rows'
/// results come out as one vector with no horizontal sums.
// `t` is the tile row as well as the accumulator's index (the activation words are
// reached through it), so the loops stay over `0..T`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn group_dot<const T: usize, const VNNI: bool, const K: u8>(
    group: *const u8,
    nb: usize,
    tile: &Q8Tile,
    out: &mut [[f32; GROUP]; MAX_TILE],
) {
    let p = const { Packing::from_id(K) };
    let gbb = const { Packing::from_id(K).group_block_bytes() };
    let vectors = const { Packing::from_id(K).vectors() };
    const { assert!(VECTOR_BYTES == 32 && LANE_BYTES == 4 && T <= MAX_TILE) };
    let mask = _mm256_set1_epi8(NIBBLE_MASK as i8);
    // Flips a byte's top bit: signed weight `w` read as unsigned is `w + 128`.
    let flip = _mm256_set1_epi8(i8::MIN);
    let words = tile.words.as_ptr();
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nb {
        // SAFETY (loads below): the caller guarantees `nb` whole group-blocks and a tile
        // of at least `nb` blocks.
        let b = group.add(i * gbb);
        // The weights stream from memory once per matmul: fetch a few blocks ahead (past
        // the group's end that is the next group, stored right after it). Prefetches
        // never fault, so running past the matrix is harmless.
        if T > 1 {
            let ahead = group.wrapping_add((i + PREFETCH_BLOCKS) * gbb);
            let mut line = 0;
            while line < gbb {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
                line += 64;
            }
        }
        let at = i * MAX_TILE;
        // Word `w` (columns `4w..4w + 4`) of row `t`'s block `i`, in every lane.
        let act =
            |t: usize, w: usize| _mm256_set1_epi32(*words.add((i * WORDS + w) * MAX_TILE + t));
        // The per-block tile value `v` of row `t`, in every lane.
        let per_row_i = |v: &[i32], t: usize| _mm256_set1_epi32(*v.get_unchecked(at + t));
        let per_row_f = |v: &[f32], t: usize| _mm256_set1_ps(*v.get_unchecked(at + t));
        let mut isum = [_mm256_setzero_si256(); T];
        match p {
            Packing::Q6K => {
                // Two 16-column halves with their own f32 scales.
                let mut ihi = [_mm256_setzero_si256(); T];
                for w in 0..vectors {
                    let wv = _mm256_loadu_si256(b.add(p.vector_at(w)) as *const __m256i);
                    let half = if w < vectors / 2 { &mut isum } else { &mut ihi };
                    if VNNI {
                        // `vpdpbusd` takes unsigned × signed bytes without the AVX2 form's
                        // i16 saturation: the weights biased to unsigned, one xor per
                        // weight vector instead of two sign ops per row.
                        let u = _mm256_xor_si256(wv, flip);
                        for t in 0..T {
                            half[t] = dot4::<VNNI>(half[t], u, act(t, w));
                        }
                    } else {
                        let au = _mm256_sign_epi8(wv, wv);
                        for t in 0..T {
                            half[t] = dot4::<VNNI>(half[t], au, _mm256_sign_epi8(act(t, w), wv));
                        }
                    }
                }
                let dlo = load_scales::<K>(b, p.d_at(0));
                let dhi = load_scales::<K>(b, p.m_base());
                for t in 0..T {
                    let (mut lo, mut hi) = (isum[t], ihi[t]);
                    if VNNI {
                        lo = _mm256_sub_epi32(lo, per_row_i(&tile.bias_lo, t));
                        hi = _mm256_sub_epi32(hi, per_row_i(&tile.bias_hi, t));
                    }
                    let dx = per_row_f(&tile.d, t);
                    acc[t] =
                        _mm256_fmadd_ps(_mm256_mul_ps(dlo, dx), _mm256_cvtepi32_ps(lo), acc[t]);
                    acc[t] =
                        _mm256_fmadd_ps(_mm256_mul_ps(dhi, dx), _mm256_cvtepi32_ps(hi), acc[t]);
                }
                continue;
            }
            Packing::U8 => {
                for w in 0..vectors {
                    let wv = _mm256_loadu_si256(b.add(p.vector_at(w)) as *const __m256i);
                    for t in 0..T {
                        isum[t] = dot4::<VNNI>(isum[t], wv, act(t, w));
                    }
                }
            }
            Packing::Q8_0 if VNNI => {
                // The biased unsigned form, as for Q6_K above.
                for w in 0..vectors {
                    let wv = _mm256_loadu_si256(b.add(p.vector_at(w)) as *const __m256i);
                    let u = _mm256_xor_si256(wv, flip);
                    for t in 0..T {
                        isum[t] = dot4::<VNNI>(isum[t], u, act(t, w));
                    }
                }
                for t in 0..T {
                    isum[t] = _mm256_sub_epi32(isum[t], per_row_i(&tile.bias, t));
                }
            }
            Packing::Q8_0 => {
                for w in 0..vectors {
                    let wv = _mm256_loadu_si256(b.add(p.vector_at(w)) as *const __m256i);
                    let au = _mm256_sign_epi8(wv, wv);
                    for t in 0..T {
                        isum[t] = dot4::<VNNI>(isum[t], au, _mm256_sign_epi8(act(t, w), wv));
                    }
                }
            }
            Packing::Q4_0 | Packing::Q4_1 | Packing::Q4K => {
                const HIGH_WORDS: usize = HIGH_NIBBLE_COLS / LANE_BYTES;
                for w in 0..vectors {
                    let wv = _mm256_loadu_si256(b.add(p.vector_at(w)) as *const __m256i);
                    let lo = _mm256_and_si256(wv, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(wv, NIBBLE_SHIFT), mask);
                    for t in 0..T {
                        isum[t] = dot4::<VNNI>(isum[t], lo, act(t, w));
                        isum[t] = dot4::<VNNI>(isum[t], hi, act(t, HIGH_WORDS + w));
                    }
                }
            }
        }
        let dw = load_scales::<K>(b, p.d_at(0));
        let m = if p.scales_per_row() == 2 {
            load_scales::<K>(b, p.m_base())
        } else {
            _mm256_setzero_ps()
        };
        for t in 0..T {
            let mut dot = isum[t];
            if p == Packing::Q4_0 {
                let off = q4_0::OFFSET * *tile.sum.get_unchecked(at + t);
                dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(off));
            }
            let scale = _mm256_mul_ps(dw, per_row_f(&tile.d, t));
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[t]);
            match p {
                // `m * s`, the activations' stored `d * sum(q)`.
                Packing::Q4_1 => acc[t] = _mm256_fmadd_ps(m, per_row_f(&tile.s, t), acc[t]),
                // `M * d * sum(q)` with the exact sum.
                Packing::Q4K | Packing::U8 => {
                    acc[t] = _mm256_fmadd_ps(m, per_row_f(&tile.d_sum, t), acc[t]);
                }
                // No offset term.
                Packing::Q8_0 | Packing::Q4_0 | Packing::Q6K => {}
            }
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// The group kernel for packing `p`, picked once per group.
#[inline(always)]
unsafe fn group_dot_any<const T: usize, const VNNI: bool>(
    p: Packing,
    group: &[u8],
    nb: usize,
    tile: &Q8Tile,
    out: &mut [[f32; GROUP]; MAX_TILE],
) {
    let g = group.as_ptr();
    match p {
        Packing::Q8_0 => group_dot::<T, VNNI, { Packing::Q8_0 as u8 }>(g, nb, tile, out),
        Packing::Q4_0 => group_dot::<T, VNNI, { Packing::Q4_0 as u8 }>(g, nb, tile, out),
        Packing::Q4_1 => group_dot::<T, VNNI, { Packing::Q4_1 as u8 }>(g, nb, tile, out),
        Packing::Q4K => group_dot::<T, VNNI, { Packing::Q4K as u8 }>(g, nb, tile, out),
        Packing::Q6K => group_dot::<T, VNNI, { Packing::Q6K as u8 }>(g, nb, tile, out),
        Packing::U8 => group_dot::<T, VNNI, { Packing::U8 as u8 }>(g, nb, tile, out),
    }
}

/// The group kernel with AVX-512 VNNI's `vpdpbusd` on 256-bit vectors (AVX-512VL: 32
/// vector registers, room for a full tile's accumulators).
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn group_dot_vnni<const T: usize>(
    p: Packing,
    group: &[u8],
    nb: usize,
    tile: &Q8Tile,
    out: &mut [[f32; GROUP]; MAX_TILE],
) {
    group_dot_any::<T, true>(p, group, nb, tile, out)
}

/// The group kernel with AVX2 `maddubs` + `madd`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_dot_avx2<const T: usize>(
    p: Packing,
    group: &[u8],
    nb: usize,
    tile: &Q8Tile,
    out: &mut [[f32; GROUP]; MAX_TILE],
) {
    group_dot_any::<T, false>(p, group, nb, tile, out)
}
