//! ggml bytes → the forms the kernels read: rows repacked into the interleaved groups of
//! [`super::packed`] (the K-quants' scales multiplied out to f32), and Q5_0 blocks rewritten
//! as Q8_0 blocks with the same values.

use rayon::prelude::*;

use super::dequant::q4k_scale_min;
use super::format::{f16_at, QuantType};
use super::packed::{self, GROUP};

/// ggml rows → the interleaved groups of [`packed`].
pub(super) fn pack(ty: QuantType, rows: usize, cols: usize, src: &[u8]) -> Vec<u8> {
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
