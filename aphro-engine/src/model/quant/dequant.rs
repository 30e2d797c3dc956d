//! Exact dequantization of ggml blocks to f32: the same floats as ggml / gguf-py (`d * q + m`
//! in f32, no FMA), which is what the HF float32 reference used.

use super::format::{f16_at, QuantType};
use super::kernels::half_to_f32;

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
            QuantType::Q5K => dequant_q5k(b, o),
            QuantType::Q5_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                for j in 0..16 {
                    let x0 = (b[8 + j] & 0xF) as u32 | (((qh >> j) << 4) & 0x10);
                    let x1 = (b[8 + j] >> 4) as u32 | ((qh >> (j + 12)) & 0x10);
                    o[j] = x0 as f32 * d + m;
                    o[j + 16] = x1 as f32 * d + m;
                }
            }
            QuantType::Q6K => dequant_q6k(b, o),
            QuantType::F16 | QuantType::BF16 => {}
        }
    }
}

pub(super) fn q4k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
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

/// ggml's `dequantize_row_q5_K`: Q4_K's scales plus one high bit per value from `qh`.
fn dequant_q5k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (n, o) in out.chunks_exact_mut(64).enumerate() {
        let ql = &qs[n * 32..n * 32 + 32];
        let (s1, m1) = q4k_scale_min(2 * n, scales);
        let (s2, m2) = q4k_scale_min(2 * n + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * n), 1u8 << (2 * n + 1));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            o[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
            o[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
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
}
