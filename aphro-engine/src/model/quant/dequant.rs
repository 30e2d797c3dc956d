//! Exact dequantization to f32, of ggml blocks and of packed rows: the same floats as
//! ggml / gguf-py (`d * q + m` in f32, no FMA), which is what the HF float32 reference used.

use super::format::ggml::{self, q4_0, q4_1, q4k, q5_1, q5k, q6k, q8_0};
use super::format::{f16_at, QuantType};
use super::kernels::half_to_f32;
use super::packed::{Packing, HIGH_NIBBLE_COLS, LANE_BYTES};

/// Dequantize whole blocks of `ty` from `src` into `out`.
pub fn dequantize_into(ty: QuantType, src: &[u8], out: &mut [f32]) {
    match ty {
        QuantType::F16 => half_to_f32(false, src, out),
        QuantType::BF16 => half_to_f32(true, src, out),
        QuantType::Q8_0 => each_block(ty, src, out, dequant_q8_0),
        QuantType::Q4_0 => each_block(ty, src, out, dequant_q4_0),
        QuantType::Q4_1 => each_block(ty, src, out, dequant_q4_1),
        QuantType::Q5_1 => each_block(ty, src, out, dequant_q5_1),
        QuantType::Q4K => each_block(ty, src, out, dequant_q4k),
        QuantType::Q5K => each_block(ty, src, out, dequant_q5k),
        QuantType::Q6K => each_block(ty, src, out, dequant_q6k),
    }
}

/// `block(b, o)` for each whole block `b` of `src` and its values `o` in `out`.
#[inline(always)]
fn each_block(ty: QuantType, src: &[u8], out: &mut [f32], block: impl Fn(&[u8], &mut [f32])) {
    let (elems, bytes) = ty.block_layout();
    for (b, o) in src.chunks_exact(bytes).zip(out.chunks_exact_mut(elems)) {
        block(b, o);
    }
}

fn dequant_q8_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, q8_0::D);
    for j in 0..q8_0::ELEMS {
        o[j] = (b[q8_0::QS + j] as i8) as f32 * d;
    }
}

fn dequant_q4_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, q4_0::D);
    for j in 0..ggml::HALF {
        let q = b[q4_0::QS + j];
        o[j] = ((q & ggml::NIBBLE_MASK) as i32 - q4_0::OFFSET) as f32 * d;
        o[j + ggml::HALF] = ((q >> ggml::NIBBLE_BITS) as i32 - q4_0::OFFSET) as f32 * d;
    }
}

fn dequant_q4_1(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, q4_1::D);
    let m = f16_at(b, q4_1::M);
    for j in 0..ggml::HALF {
        let q = b[q4_1::QS + j];
        o[j] = (q & ggml::NIBBLE_MASK) as f32 * d + m;
        o[j + ggml::HALF] = (q >> ggml::NIBBLE_BITS) as f32 * d + m;
    }
}

fn dequant_q5_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, q5_1::D), f16_at(b, q5_1::M));
    let qh = ggml::q5_high_bits(b, q5_1::QH);
    for j in 0..ggml::HALF {
        let (x0, x1) = ggml::q5_pair(b[q5_1::QS + j], qh, j);
        o[j] = x0 as f32 * d + m;
        o[j + ggml::HALF] = x1 as f32 * d + m;
    }
}

/// ggml's `dequantize_row_q4_K`: `d * sc * q - dmin * m` per 32-value sub-block.
fn dequant_q4k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q4k::D);
    let dmin = f16_at(b, q4k::DMIN);
    let scales = &b[q4k::SCALES..q4k::QS];
    let qs = &b[q4k::QS..q4k::BYTES];
    for (j, o) in out.chunks_exact_mut(q4k::SUB).enumerate() {
        let (sc, m) = q4k::scale_min(j, scales);
        let (dj, mj) = (d * sc as f32, dmin * m as f32);
        for (l, o) in o.iter_mut().enumerate() {
            *o = dj * q4k::nibble(qs, j, l) as f32 - mj;
        }
    }
}

/// ggml's `dequantize_row_q5_K`: Q4_K's scales plus one high bit per value from `qh`.
fn dequant_q5k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q5k::D);
    let dmin = f16_at(b, q5k::DMIN);
    let scales = &b[q5k::SCALES..q5k::QH];
    let qh = &b[q5k::QH..q5k::QS];
    let qs = &b[q5k::QS..q5k::BYTES];
    for (j, o) in out.chunks_exact_mut(q4k::SUB).enumerate() {
        let (sc, m) = q4k::scale_min(j, scales);
        let (dj, mj) = (d * sc as f32, dmin * m as f32);
        for (l, o) in o.iter_mut().enumerate() {
            *o = dj * q5k::quant(qh, qs, j, l) as f32 - mj;
        }
    }
}

/// ggml's `dequantize_row_q6_K`: `d * sc * (q - 32)`, one scale per 16 values.
fn dequant_q6k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, q6k::D);
    for (n, o) in out.chunks_exact_mut(128).enumerate() {
        for (quarter, o) in o.chunks_exact_mut(32).enumerate() {
            for (l, o) in o.iter_mut().enumerate() {
                let sc = q6k::scale(b, n, quarter, l / 16);
                *o = d * sc as f32 * q6k::quant(b, n, quarter, l) as f32;
            }
        }
    }
}

/// Row `k` of one packed group-block `b` of packing `p` into its 32 values `o`: the
/// floats ggml's dequantization gives for the original block (the same operations on the
/// same scales, which packing copies or multiplies out exactly as ggml does).
#[inline]
pub(super) fn dequantize_packed(p: Packing, b: &[u8], k: usize, o: &mut [f32]) {
    let f32_at = |at: usize| f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let byte = |w: usize, j: usize| b[p.quant_at(w, k) + j];
    let (lo, hi) = (ggml::NIBBLE_MASK, ggml::NIBBLE_BITS);
    match p {
        Packing::Q8_0 => {
            let d = f16_at(b, p.d_at(k));
            for w in 0..p.vectors() {
                for j in 0..LANE_BYTES {
                    o[LANE_BYTES * w + j] = (byte(w, j) as i8) as f32 * d;
                }
            }
        }
        Packing::Q4_0 => {
            let d = f16_at(b, p.d_at(k));
            for w in 0..p.vectors() {
                for j in 0..LANE_BYTES {
                    let (c, q) = (LANE_BYTES * w + j, byte(w, j));
                    o[c] = ((q & lo) as i32 - q4_0::OFFSET) as f32 * d;
                    o[c + HIGH_NIBBLE_COLS] = ((q >> hi) as i32 - q4_0::OFFSET) as f32 * d;
                }
            }
        }
        Packing::Q4_1 => {
            let (d, m) = (f16_at(b, p.d_at(k)), f16_at(b, p.m_at(k)));
            for w in 0..p.vectors() {
                for j in 0..LANE_BYTES {
                    let (c, q) = (LANE_BYTES * w + j, byte(w, j));
                    o[c] = (q & lo) as f32 * d + m;
                    o[c + HIGH_NIBBLE_COLS] = (q >> hi) as f32 * d + m;
                }
            }
        }
        // `D * q + M`, with `M = -dmin * m` (Q5_1: its own `m`).
        Packing::Q4K => {
            let (dd, m) = (f32_at(p.d_at(k)), f32_at(p.m_at(k)));
            for w in 0..p.vectors() {
                for j in 0..LANE_BYTES {
                    let (c, q) = (LANE_BYTES * w + j, byte(w, j));
                    o[c] = dd * (q & lo) as f32 + m;
                    o[c + HIGH_NIBBLE_COLS] = dd * (q >> hi) as f32 + m;
                }
            }
        }
        Packing::U8 => {
            let (dd, m) = (f32_at(p.d_at(k)), f32_at(p.m_at(k)));
            for w in 0..p.vectors() {
                for j in 0..LANE_BYTES {
                    o[LANE_BYTES * w + j] = dd * byte(w, j) as f32 + m;
                }
            }
        }
        // `D * q`, one `D` for the vectors of columns 0..16, one for 16..32.
        Packing::Q6K => {
            let (d_lo, d_hi) = (f32_at(p.d_at(k)), f32_at(p.m_at(k)));
            for w in 0..p.vectors() {
                let dd = if w < p.vectors() / 2 { d_lo } else { d_hi };
                for j in 0..LANE_BYTES {
                    o[LANE_BYTES * w + j] = dd * (byte(w, j) as i8) as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::test_util::*;
    use crate::model::quant::QuantMatrix;
    use half::f16;

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

    /// Every packed format's rows, dequantized from the packed groups, are exactly ggml's
    /// dequantization of the original blocks (also in a zero-padded last group).
    #[test]
    fn packed_rows_dequantize_like_ggml() {
        let mut seed = 17u64;
        for ty in BLOCK_FORMATS {
            let (rows, cols) = (13, 512);
            let raw = random_ggml(ty, rows, cols, &mut seed);
            let m = QuantMatrix::new(ty, rows, cols, raw.clone()).expect("valid");
            let rb = raw.len() / rows;
            for r in 0..rows {
                let mut want = vec![0f32; cols];
                dequantize_into(ty, &raw[r * rb..(r + 1) * rb], &mut want);
                let mut got = vec![0f32; cols];
                m.dequantize_row(r, &mut got);
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{ty:?} row {r}"
                );
            }
        }
    }
}
