//! The ggml block formats this crate reads: [`QuantType`], and each format's block as ggml
//! lays it out ([`ggml`]: elements and bytes per block, where its scales, mins and quants
//! sit, how the quant bits are arranged), defined here once for the dequantization, the
//! repacking and the tests; [`QuantError`] for bytes that do not fit that geometry.

use half::f16;

use super::packed::Packing;

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
            QuantType::Q8_0 => (ggml::q8_0::ELEMS, ggml::q8_0::BYTES),
            QuantType::Q4_0 => (ggml::q4_0::ELEMS, ggml::q4_0::BYTES),
            QuantType::Q4_1 => (ggml::q4_1::ELEMS, ggml::q4_1::BYTES),
            QuantType::Q5_1 => (ggml::q5_1::ELEMS, ggml::q5_1::BYTES),
            QuantType::Q4K => (ggml::q4k::ELEMS, ggml::q4k::BYTES),
            QuantType::Q5K => (ggml::q5k::ELEMS, ggml::q5k::BYTES),
            QuantType::Q6K => (ggml::q6k::ELEMS, ggml::q6k::BYTES),
            QuantType::F16 | QuantType::BF16 => (1, 2),
        }
    }

    /// Whether this is a plain 16-bit float format rather than a block quantization.
    pub fn is_half(self) -> bool {
        matches!(self, QuantType::F16 | QuantType::BF16)
    }

    /// Whether the fused integer kernels handle it (everything but the 16-bit floats):
    /// whether it has a packed layout (`packed::Packing`).
    pub fn has_fused_kernel(self) -> bool {
        Packing::of(self).is_ok()
    }

    /// Whether the packed layout can be turned back into ggml's bytes (not the K-quants,
    /// whose super-block scales are expanded to one f32 scale per 16/32 values).
    #[cfg(test)]
    pub(super) fn packs_losslessly(self) -> bool {
        self.classic_fields().is_some()
    }

    /// Where the formats packed byte for byte (Q8_0, Q4_0, Q4_1) keep their f16 scales and
    /// their quants in a ggml block; `None` for the others.
    pub(super) fn classic_fields(self) -> Option<ggml::Classic> {
        match self {
            QuantType::Q8_0 => Some(ggml::q8_0::CLASSIC),
            QuantType::Q4_0 => Some(ggml::q4_0::CLASSIC),
            QuantType::Q4_1 => Some(ggml::q4_1::CLASSIC),
            QuantType::Q5_1
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K
            | QuantType::F16
            | QuantType::BF16 => None,
        }
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
    /// A format with no packed layout, hence no fused kernel, where one is needed: the
    /// 16-bit floats, which are stored as they are and widened in the matmul.
    #[error("{ty:?} has no packed layout or fused kernel")]
    NoFusedKernel { ty: QuantType },
}

/// The little-endian f16 at byte `i` of `b`, widened.
#[inline(always)]
pub(super) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// ggml's blocks field by field (`block_q8_0`, `block_q4_K`, ... in ggml-common.h): the
/// byte offset of each field inside one block, and how the quant bits are arranged. Every
/// offset, and every bit shuffle, that the dequantization and the repacking read is here.
pub(super) mod ggml {
    /// Mask of a byte's low nibble.
    pub const NIBBLE_MASK: u8 = 0x0F;
    /// Bits per nibble: the shift that brings a byte's high nibble down.
    pub const NIBBLE_BITS: u32 = 4;
    /// In the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1) nibble byte `j` holds column `j`
    /// in its low nibble and column `j + HALF` in its high one.
    pub const HALF: usize = 16;

    /// Where a format packed byte for byte keeps its fields (see
    /// [`super::QuantType::classic_fields`]): f16 `d`, f16 `m` if it has one, the quants.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Classic {
        pub d: usize,
        pub m: Option<usize>,
        pub qs: usize,
    }

    /// `block_q8_0`: f16 `d`, 32 i8 quants; value `q * d`.
    pub mod q8_0 {
        pub const ELEMS: usize = 32;
        pub const D: usize = 0;
        pub const QS: usize = 2;
        pub const BYTES: usize = QS + ELEMS;
        pub const CLASSIC: super::Classic = super::Classic {
            d: D,
            m: None,
            qs: QS,
        };
    }

    /// `block_q4_0`: f16 `d`, 16 nibble bytes; value `(q - OFFSET) * d`.
    pub mod q4_0 {
        pub const ELEMS: usize = 32;
        pub const D: usize = 0;
        pub const QS: usize = 2;
        pub const BYTES: usize = QS + ELEMS / 2;
        pub const OFFSET: i32 = 8;
        pub const CLASSIC: super::Classic = super::Classic {
            d: D,
            m: None,
            qs: QS,
        };
    }

    /// `block_q4_1`: f16 `d`, f16 `m`, 16 nibble bytes; value `q * d + m`.
    pub mod q4_1 {
        pub const ELEMS: usize = 32;
        pub const D: usize = 0;
        pub const M: usize = 2;
        pub const QS: usize = 4;
        pub const BYTES: usize = QS + ELEMS / 2;
        pub const CLASSIC: super::Classic = super::Classic {
            d: D,
            m: Some(M),
            qs: QS,
        };
    }

    /// `block_q5_0`: f16 `d`, the 32 fifth bits, 16 nibble bytes; value `(q - OFFSET) * d`
    /// (see [`super::ggml::q5_pair`]).
    pub mod q5_0 {
        pub const ELEMS: usize = 32;
        pub const D: usize = 0;
        pub const QH: usize = 2;
        pub const QS: usize = 6;
        pub const BYTES: usize = QS + ELEMS / 2;
        pub const OFFSET: i32 = 16;
    }

    /// `block_q5_1`: f16 `d`, f16 `m`, the 32 fifth bits, 16 nibble bytes; value
    /// `q * d + m`.
    pub mod q5_1 {
        pub const ELEMS: usize = 32;
        pub const D: usize = 0;
        pub const M: usize = 2;
        pub const QH: usize = 4;
        pub const QS: usize = 8;
        pub const BYTES: usize = QS + ELEMS / 2;
    }

    /// The little-endian u32 of a Q5_0/Q5_1 block's fifth bits at `at`.
    #[inline(always)]
    pub fn q5_high_bits(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// The 5-bit quants of columns `j` and `j + HALF` of a Q5_0/Q5_1 block, from nibble
    /// byte `j` and the block's fifth bits `qh` (bit `c` belongs to column `c`).
    #[inline(always)]
    pub fn q5_pair(qs: u8, qh: u32, j: usize) -> (u8, u8) {
        let lo = (qs & NIBBLE_MASK) as u32 | (((qh >> j) << 4) & 0x10);
        let hi = (qs >> NIBBLE_BITS) as u32 | ((qh >> (j + 12)) & 0x10);
        (lo as u8, hi as u8)
    }

    /// `block_q4_K`: 256 values in eight sub-blocks of 32: f16 `d`, f16 `dmin`, the
    /// sub-blocks' 6-bit scales and mins in 12 bytes ([`q4k::scale_min`]), 128 nibble bytes
    /// ([`q4k::nibble`]); value `d * sc * q - dmin * m`.
    pub mod q4k {
        use super::{NIBBLE_BITS, NIBBLE_MASK};

        pub const ELEMS: usize = 256;
        /// Values per sub-block (one scale and min each).
        pub const SUB: usize = 32;
        pub const D: usize = 0;
        pub const DMIN: usize = 2;
        pub const SCALES: usize = 4;
        pub const QS: usize = 16;
        pub const BYTES: usize = QS + ELEMS / 2;

        /// Sub-block `j`'s 6-bit scale and min from the 12 scale bytes (ggml's
        /// `get_scale_min_k4`; Q5_K shares it).
        #[inline(always)]
        pub fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
            if j < 4 {
                (q[j] & 63, q[j + 4] & 63)
            } else {
                (
                    (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                    (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
                )
            }
        }

        /// The 4-bit quant of column `l` of sub-block `j` from the nibble bytes `qs`: each
        /// 32 bytes serve two sub-blocks, the even one in the low nibbles (Q5_K's low bits
        /// alike).
        #[inline(always)]
        pub fn nibble(qs: &[u8], j: usize, l: usize) -> u8 {
            let q = qs[j / 2 * SUB + l];
            if j.is_multiple_of(2) {
                q & NIBBLE_MASK
            } else {
                q >> NIBBLE_BITS
            }
        }
    }

    /// `block_q5_K`: Q4_K's fields with 32 bytes of fifth bits before the nibbles (bit `j`
    /// of byte `l` belongs to column `l` of sub-block `j`).
    pub mod q5k {
        pub const ELEMS: usize = 256;
        pub const D: usize = 0;
        pub const DMIN: usize = 2;
        pub const SCALES: usize = 4;
        pub const QH: usize = 16;
        pub const QS: usize = 48;
        pub const BYTES: usize = QS + ELEMS / 2;

        /// The 5-bit quant of column `l` of sub-block `j`.
        #[inline(always)]
        pub fn quant(qh: &[u8], qs: &[u8], j: usize, l: usize) -> u8 {
            super::q4k::nibble(qs, j, l) | if qh[l] & (1 << j) != 0 { 16 } else { 0 }
        }
    }

    /// `block_q6_K`: 256 values as two halves of 128, each in four quarters of 32: 128
    /// bytes of low nibbles, 64 bytes of 2-bit highs, 16 i8 scales (one per 16 values), f16
    /// `d`; value `d * sc * (q - OFFSET)`.
    pub mod q6k {
        use super::{NIBBLE_BITS, NIBBLE_MASK};

        pub const ELEMS: usize = 256;
        pub const QL: usize = 0;
        pub const QH: usize = 128;
        pub const SCALES: usize = 192;
        pub const D: usize = 208;
        pub const BYTES: usize = D + 2;
        pub const OFFSET: i32 = 32;

        /// `q - OFFSET` of column `128 n + 32 quarter + l` (`l < 32`): the low nibble of
        /// `ql[64 n + l]` (quarter 0), of `ql[64 n + 32 + l]` (1), their high nibbles (2,
        /// 3); the high two bits are bits `2 quarter..` of `qh[32 n + l]`.
        #[inline(always)]
        pub fn quant(b: &[u8], n: usize, quarter: usize, l: usize) -> i32 {
            let ql = b[QL + 64 * n + 32 * (quarter % 2) + l];
            let low = (ql >> (NIBBLE_BITS * (quarter / 2) as u32)) & NIBBLE_MASK;
            let high = (b[QH + 32 * n + l] >> (2 * quarter)) & 3;
            (low | (high << 4)) as i32 - OFFSET
        }

        /// The scale of columns `128 n + 32 quarter + 16 half..` (16 of them).
        #[inline(always)]
        pub fn scale(b: &[u8], n: usize, quarter: usize, half: usize) -> i8 {
            b[SCALES + 8 * n + 2 * quarter + half] as i8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block sizes built from the field offsets are ggml's (`ggml_type_size`).
    #[test]
    fn block_layout_is_ggmls() {
        let want = [
            (QuantType::Q8_0, (32, 34)),
            (QuantType::Q4_0, (32, 18)),
            (QuantType::Q4_1, (32, 20)),
            (QuantType::Q5_1, (32, 24)),
            (QuantType::Q4K, (256, 144)),
            (QuantType::Q5K, (256, 176)),
            (QuantType::Q6K, (256, 210)),
            (QuantType::F16, (1, 2)),
            (QuantType::BF16, (1, 2)),
        ];
        for (ty, layout) in want {
            assert_eq!(ty.block_layout(), layout, "{ty:?}");
        }
        assert_eq!((ggml::q5_0::ELEMS, ggml::q5_0::BYTES), (32, 22));
    }

    /// The Q6_K quant accessor is ggml's `dequantize_row_q6_K` arithmetic, written out.
    #[test]
    fn q6k_quant_follows_ggml() {
        let b: Vec<u8> = (0..ggml::q6k::BYTES).map(|i| (i * 37 + 11) as u8).collect();
        for n in 0..2 {
            let (ql, qh) = (&b[n * 64..], &b[128 + n * 32..]);
            for l in 0..32 {
                let want = [
                    ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32,
                    ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32,
                    ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32,
                    ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32,
                ];
                for (quarter, want) in want.into_iter().enumerate() {
                    assert_eq!(
                        ggml::q6k::quant(&b, n, quarter, l),
                        want,
                        "{n} {quarter} {l}"
                    );
                }
            }
        }
    }
}
