//! The ggml block formats this crate reads: [`QuantType`], each format's block geometry
//! (elements and bytes per block, as ggml defines them), and [`QuantError`] for byte
//! counts that do not fit that geometry.

use half::f16;

/// The ggml block formats this crate understands, plus plain 16-bit floats (`--dtype
/// float16|bfloat16`: weights stored in 16 bits, widened to f32 inside the matmul).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
    /// IEEE half, little-endian, one element per "block".
    F16,
    /// bfloat16, little-endian, one element per "block".
    BF16,
}

impl QuantType {
    /// (elements per block, bytes per block) — the same numbers as ggml.
    pub fn block_layout(self) -> (usize, usize) {
        match self {
            QuantType::Q8_0 => (32, 34),
            QuantType::Q4_0 => (32, 18),
            QuantType::Q4_1 => (32, 20),
            QuantType::Q5_1 => (32, 24),
            QuantType::Q4K => (256, 144),
            QuantType::Q5K => (256, 176),
            QuantType::Q6K => (256, 210),
            QuantType::F16 | QuantType::BF16 => (1, 2),
        }
    }

    /// Whether this is a plain 16-bit float format rather than a block quantization.
    pub fn is_half(self) -> bool {
        matches!(self, QuantType::F16 | QuantType::BF16)
    }

    /// Whether the fused integer kernels handle it (everything but the 16-bit floats).
    pub fn has_fused_kernel(self) -> bool {
        !self.is_half()
    }

    /// Whether the packed layout can be turned back into ggml's bytes (not the K-quants,
    /// whose super-block scales are expanded to one f32 scale per 16/32 values).
    pub(super) fn packs_losslessly(self) -> bool {
        matches!(self, QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q4_1)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("{ty:?} needs the row length ({cols}) to be a multiple of {block}")]
    RowNotBlockAligned {
        ty: QuantType,
        cols: usize,
        block: usize,
    },
    #[error("{ty:?} matrix {rows}x{cols} needs {want} bytes, got {got}")]
    WrongSize {
        ty: QuantType,
        rows: usize,
        cols: usize,
        want: usize,
        got: usize,
    },
}

pub(super) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}
