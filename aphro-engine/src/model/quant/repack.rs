//! ggml bytes → the forms the kernels read: rows repacked into the interleaved groups of
//! [`super::packed`] (the K-quants' scales multiplied out to f32), their read-back for the
//! formats packed byte for byte, and Q5_0 blocks rewritten as Q8_0 blocks with the same
//! values.

use rayon::prelude::*;

use super::format::ggml::{self, q4k, q5_0, q5_1, q5k, q6k, q8_0, Classic};
use super::format::{f16_at, QuantError, QuantType};
use super::packed::{Packing, BLOCK, GROUP, HIGH_NIBBLE_COLS, LANE_BYTES};

/// ggml rows → the interleaved groups of [`super::packed`]; a format with no packed
/// layout (the 16-bit floats) is [`QuantError::NoFusedKernel`].
pub(super) fn pack(
    ty: QuantType,
    rows: usize,
    cols: usize,
    src: &[u8],
) -> Result<Vec<u8>, QuantError> {
    let p = Packing::of(ty)?;
    let geometry = ty.block_layout();
    Ok(match ty {
        QuantType::Q8_0 => pack_classic(p, q8_0::CLASSIC, geometry, rows, cols, src),
        QuantType::Q4_0 => pack_classic(p, ggml::q4_0::CLASSIC, geometry, rows, cols, src),
        QuantType::Q4_1 => pack_classic(p, ggml::q4_1::CLASSIC, geometry, rows, cols, src),
        QuantType::Q4K => pack_expanded(p, geometry, rows, cols, src, q4k_block32),
        QuantType::Q5K => pack_expanded(p, geometry, rows, cols, src, q5k_block32),
        QuantType::Q5_1 => pack_expanded(p, geometry, rows, cols, src, q5_1_block32),
        QuantType::Q6K => pack_expanded(p, geometry, rows, cols, src, q6k_block32),
        // Refused by `Packing::of` already.
        QuantType::F16 | QuantType::BF16 => return Err(QuantError::NoFusedKernel { ty }),
    })
}

/// Q8_0/Q4_0/Q4_1 rows → packed groups holding ggml's bytes: each block's f16 scale(s)
/// into the header, its quants 4 bytes a lane.
fn pack_classic(
    p: Packing,
    f: Classic,
    (block, bb): (usize, usize),
    rows: usize,
    cols: usize,
    src: &[u8],
) -> Vec<u8> {
    let nb = cols / block;
    let rb = nb * bb;
    let gbb = p.group_block_bytes();
    let sb = p.scale_bytes();
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
                    o[p.d_at(k)..p.d_at(k) + sb].copy_from_slice(&b[f.d..f.d + sb]);
                    if let Some(m) = f.m {
                        o[p.m_at(k)..p.m_at(k) + sb].copy_from_slice(&b[m..m + sb]);
                    }
                    for w in 0..p.vectors() {
                        let (at, from) = (p.quant_at(w, k), f.qs + LANE_BYTES * w);
                        o[at..at + LANE_BYTES].copy_from_slice(&b[from..from + LANE_BYTES]);
                    }
                }
            }
        });
    out
}

/// Row `r` of a matrix packed by [`pack_classic`] (`nb` blocks a row) back in ggml's
/// bytes: `bb` bytes a block, `rb` a row.
pub(super) fn unpack_classic_row(
    p: Packing,
    f: Classic,
    data: &[u8],
    r: usize,
    nb: usize,
    (bb, rb): (usize, usize),
) -> Vec<u8> {
    let gbb = p.group_block_bytes();
    let sb = p.scale_bytes();
    let (g, k) = (r / GROUP, r % GROUP);
    let mut out = vec![0u8; rb];
    for (i, o) in out.chunks_exact_mut(bb).enumerate() {
        let src = &data[(g * nb + i) * gbb..(g * nb + i + 1) * gbb];
        o[f.d..f.d + sb].copy_from_slice(&src[p.d_at(k)..p.d_at(k) + sb]);
        if let Some(m) = f.m {
            o[m..m + sb].copy_from_slice(&src[p.m_at(k)..p.m_at(k) + sb]);
        }
        for w in 0..p.vectors() {
            let (at, to) = (p.quant_at(w, k), f.qs + LANE_BYTES * w);
            o[to..to + LANE_BYTES].copy_from_slice(&src[at..at + LANE_BYTES]);
        }
    }
    out
}

/// Q4_K/Q5_K/Q6_K/Q5_1 rows → packed groups: each 32 columns get their f32 scale(s)
/// multiplied out as ggml's dequantization does (`d * sc`, `dmin * m`) and their quants in
/// the 8-bit or Q4_0-nibble order of [`super::packed`]. `block32(super_block, j)` decodes
/// columns `32j..32j+32` of one ggml block.
fn pack_expanded(
    p: Packing,
    (block, bb): (usize, usize),
    rows: usize,
    cols: usize,
    src: &[u8],
    block32: impl Fn(&[u8], usize) -> (f32, f32, [u8; BLOCK]) + Sync,
) -> Vec<u8> {
    let nsb = cols / block;
    let rb = nsb * bb;
    let nb = cols / BLOCK;
    let gbb = p.group_block_bytes();
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
                let per = block / BLOCK;
                for (si, sb) in row.chunks_exact(bb).enumerate() {
                    for j in 0..per {
                        let o = &mut dst[(si * per + j) * gbb..(si * per + j + 1) * gbb];
                        let (s0, s1, q) = block32(sb, j);
                        o[p.d_at(k)..p.d_at(k) + 4].copy_from_slice(&s0.to_le_bytes());
                        o[p.m_at(k)..p.m_at(k) + 4].copy_from_slice(&s1.to_le_bytes());
                        for w in 0..p.vectors() {
                            let at = p.quant_at(w, k);
                            if p.is_nibbles() {
                                for jj in 0..LANE_BYTES {
                                    let c = LANE_BYTES * w + jj;
                                    o[at + jj] =
                                        q[c] | (q[c + HIGH_NIBBLE_COLS] << ggml::NIBBLE_BITS);
                                }
                            } else {
                                let c = LANE_BYTES * w;
                                o[at..at + LANE_BYTES].copy_from_slice(&q[c..c + LANE_BYTES]);
                            }
                        }
                    }
                }
            }
        });
    out
}

/// Columns `32j..32j+32` of a Q4_K super-block: (`d*sc`, `-dmin*m`, the nibbles).
fn q4k_block32(b: &[u8], j: usize) -> (f32, f32, [u8; BLOCK]) {
    let d = f16_at(b, q4k::D);
    let dmin = f16_at(b, q4k::DMIN);
    let (sc, m) = q4k::scale_min(j, &b[q4k::SCALES..q4k::QS]);
    let qs = &b[q4k::QS..q4k::BYTES];
    let q = std::array::from_fn(|l| q4k::nibble(qs, j, l));
    (d * sc as f32, -(dmin * m as f32), q)
}

/// Columns `32j..32j+32` of a Q5_K super-block: (`d*sc`, `-dmin*m`, the 5-bit `q`).
fn q5k_block32(b: &[u8], j: usize) -> (f32, f32, [u8; BLOCK]) {
    let d = f16_at(b, q5k::D);
    let dmin = f16_at(b, q5k::DMIN);
    let (sc, m) = q4k::scale_min(j, &b[q5k::SCALES..q5k::QH]);
    let (qh, qs) = (&b[q5k::QH..q5k::QS], &b[q5k::QS..q5k::BYTES]);
    let q = std::array::from_fn(|l| q5k::quant(qh, qs, j, l));
    (d * sc as f32, -(dmin * m as f32), q)
}

/// A Q5_1 block (`j` = 0): (`d`, `m`, the 5-bit `q`).
fn q5_1_block32(b: &[u8], _j: usize) -> (f32, f32, [u8; BLOCK]) {
    let qh = ggml::q5_high_bits(b, q5_1::QH);
    let mut q = [0u8; BLOCK];
    for l in 0..ggml::HALF {
        (q[l], q[l + ggml::HALF]) = ggml::q5_pair(b[q5_1::QS + l], qh, l);
    }
    (f16_at(b, q5_1::D), f16_at(b, q5_1::M), q)
}

/// Columns `32j..32j+32` of a Q6_K super-block: (`d*sc` of columns 0..16, of 16..32,
/// `q - 32` as i8 bytes).
fn q6k_block32(b: &[u8], j: usize) -> (f32, f32, [u8; BLOCK]) {
    let d = f16_at(b, q6k::D);
    let (n, quarter) = (j / 4, j % 4);
    let q = std::array::from_fn(|l| q6k::quant(b, n, quarter, l) as i8 as u8);
    let s = |half: usize| d * q6k::scale(b, n, quarter, half) as f32;
    (s(0), s(1), q)
}

/// ggml Q5_0 blocks (f16 `d`, 32 high bits, 16 nibble bytes; value `(q - 16) * d`) as
/// Q8_0 blocks with the same `d` and `q - 16` in i8: the same values, so the Q8_0 kernels
/// and dequantization serve Q5_0 tensors (llama.cpp's fallback for rows not a multiple of
/// 256 in K-quant files). A trailing partial block is dropped (sizes are checked after).
pub fn q5_0_to_q8_0(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len() / q5_0::BYTES * q8_0::BYTES);
    for b in src.chunks_exact(q5_0::BYTES) {
        let mut o = [0u8; q8_0::BYTES];
        o[q8_0::D..q8_0::D + 2].copy_from_slice(&b[q5_0::D..q5_0::D + 2]);
        let qh = ggml::q5_high_bits(b, q5_0::QH);
        for j in 0..ggml::HALF {
            let (lo, hi) = ggml::q5_pair(b[q5_0::QS + j], qh, j);
            o[q8_0::QS + j] = (lo as i32 - q5_0::OFFSET) as i8 as u8;
            o[q8_0::QS + j + ggml::HALF] = (hi as i32 - q5_0::OFFSET) as i8 as u8;
        }
        out.extend_from_slice(&o);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::dequant::dequantize_into;
    use crate::model::quant::test_util::*;
    use crate::model::quant::QuantMatrix;
    use crate::test_support::lcg;
    use half::f16;

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

    /// Repacking a format that has no packed layout is an error, not a silent copy.
    #[test]
    fn packing_a_16_bit_float_is_an_error() {
        for ty in [QuantType::F16, QuantType::BF16] {
            match pack(ty, 2, 32, &[0u8; 128]) {
                Err(QuantError::NoFusedKernel { ty: got }) => assert_eq!(got, ty),
                other => panic!("{ty:?}: {other:?}"),
            }
        }
        let q8 = random_ggml(QuantType::Q8_0, 2, 32, &mut 5u64);
        assert!(pack(QuantType::Q8_0, 2, 32, &q8).is_ok());
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
}
