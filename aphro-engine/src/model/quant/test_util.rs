//! Shared inputs of the quant unit tests: every block format, and random ggml blocks,
//! matrices and activations from the crate's LCG.

use half::f16;

use super::{QuantMatrix, QuantType};
use crate::test_support::lcg;

/// Every block format; all have fused kernels.
pub(super) const BLOCK_FORMATS: [QuantType; 7] = [
    QuantType::Q8_0,
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
    QuantType::Q5_1,
];

/// The formats whose scales are expanded to f32 when packed (no ggml read-back).
pub(super) const EXPANDED_SCALE_FORMATS: [QuantType; 4] = [
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
    QuantType::Q5_1,
];

pub(super) fn random_matrix(
    ty: QuantType,
    rows: usize,
    cols: usize,
    seed: &mut u64,
) -> QuantMatrix {
    let data = random_ggml(ty, rows, cols, seed);
    QuantMatrix::new(ty, rows, cols, data).expect("consistent sizes")
}

/// Random ggml-layout blocks with sane scales.
pub(super) fn random_ggml(ty: QuantType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
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
                if matches!(
                    ty,
                    QuantType::Q4_1 | QuantType::Q4K | QuantType::Q5K | QuantType::Q5_1
                ) {
                    let m = f16::from_f32(-0.05).to_le_bytes();
                    data[start + 2..start + 4].copy_from_slice(&m);
                }
            }
        }
    }
    data
}

pub(super) fn random_x(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| (lcg(seed) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}
