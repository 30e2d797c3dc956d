//! The row-interleaved layout the fused kernels read, defined once here for the repacking,
//! the dequantization of packed rows and both kernels (scalar and x86).
//!
//! Group `g` holds rows `8g..8g+8` (the last group zero-padded), its blocks in column
//! order; one group-block covers [`BLOCK`] columns of the [`GROUP`] rows: their scales
//! (see [`header_bytes`]), then the quants as [`VECTOR_BYTES`]-byte vectors:
//! vector `w` holds, for row `k` in lane `k`, bytes `4w..4w+4` of that row's quants
//! ([`LANE_BYTES`] a lane). For the 8-bit forms those are columns `4w..4w+4`; for the
//! 4-bit ones the low nibbles are columns `4w..4w+4` and the high nibbles
//! `16+4w..16+4w+4` ([`HIGH_NIBBLE_COLS`]; ggml's Q4_0 order; Q4_K nibbles are reordered
//! to it). Q8_0/Q4_0/Q4_1 keep ggml's bytes exactly; the K-quants' per-super-block scales
//! are multiplied out into f32 (`d * sc` exactly as ggml's dequantization computes them),
//! so they dequantize to the same floats.
//!
//! Each fused format has a `Packing`, which fixes its group-block geometry and is also
//! what the kernels dispatch on (Q5_K and Q5_1 share one).

use super::format::{ggml, QuantError, QuantType};

/// Rows per interleaved group of the packed layout.
pub const GROUP: usize = 8;

/// Columns per packed block; also the activations' block ([`super::Q8Acts`]), so one
/// weight block meets one activation block.
pub const BLOCK: usize = 32;

/// Bytes of one row in one quant vector (and of one broadcast activation word).
pub const LANE_BYTES: usize = 4;

/// Bytes of one quant vector: lane `k` is row `k`'s [`LANE_BYTES`].
pub const VECTOR_BYTES: usize = GROUP * LANE_BYTES;

/// In the 4-bit packings, the high nibble of the byte whose low nibble is column `c` is
/// column `c + HIGH_NIBBLE_COLS` (ggml's Q4_0 order, kept for Q4_0/Q4_1 and given to Q4_K).
pub const HIGH_NIBBLE_COLS: usize = ggml::HALF;

/// How one fused format sits in the packed layout, and so which group kernel reads it.
/// The discriminants are the kernels' const-generic ids ([`Packing::from_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Packing {
    /// Q8_0: the 8 rows' f16 `d`; i8 quants.
    Q8_0 = 0,
    /// Q4_0: f16 `d`; nibbles, value `q - 8`.
    Q4_0 = 1,
    /// Q4_1: f16 `d`, then f16 `m`; nibbles.
    Q4_1 = 2,
    /// Q4_K: f32 `D = d*sc`, then f32 `M = -dmin*m` per 32 values; nibbles.
    Q4K = 3,
    /// Q6_K: f32 `d*sc` of columns 0..16, then of columns 16..32; `q - 32` as i8.
    Q6K = 4,
    /// Q5_K and Q5_1: f32 `D`, then f32 `M` (Q5_1: its `d` and `m` widened); the 5-bit
    /// `q` as u8.
    U8 = 5,
}

impl Packing {
    /// Every packing, in id order.
    #[cfg(test)]
    pub(crate) const ALL: [Packing; 6] = [
        Packing::Q8_0,
        Packing::Q4_0,
        Packing::Q4_1,
        Packing::Q4K,
        Packing::Q6K,
        Packing::U8,
    ];

    /// The packing of a fused format; the 16-bit floats have none
    /// ([`QuantError::NoFusedKernel`]).
    #[inline]
    pub(crate) fn of(ty: QuantType) -> Result<Packing, QuantError> {
        match ty {
            QuantType::Q8_0 => Ok(Packing::Q8_0),
            QuantType::Q4_0 => Ok(Packing::Q4_0),
            QuantType::Q4_1 => Ok(Packing::Q4_1),
            QuantType::Q4K => Ok(Packing::Q4K),
            QuantType::Q6K => Ok(Packing::Q6K),
            QuantType::Q5K | QuantType::Q5_1 => Ok(Packing::U8),
            QuantType::F16 | QuantType::BF16 => Err(QuantError::NoFusedKernel { ty }),
        }
    }

    /// The packing whose id (`self as u8`) is `id`, for kernels that take the packing as a
    /// const generic; evaluated in a `const` block, an unknown id fails the build.
    #[inline]
    pub(crate) const fn from_id(id: u8) -> Packing {
        match id {
            0 => Packing::Q8_0,
            1 => Packing::Q4_0,
            2 => Packing::Q4_1,
            3 => Packing::Q4K,
            4 => Packing::Q6K,
            5 => Packing::U8,
            _ => panic!("no packing has this id"),
        }
    }

    /// Bytes of one scale: f16 where the header keeps ggml's scales (Q8_0, Q4_0, Q4_1),
    /// f32 where they are multiplied out.
    #[inline]
    pub(crate) const fn scale_bytes(self) -> usize {
        match self {
            Packing::Q8_0 | Packing::Q4_0 | Packing::Q4_1 => 2,
            Packing::Q4K | Packing::Q6K | Packing::U8 => 4,
        }
    }

    /// Scales per row in a group-block: `d` alone (Q8_0, Q4_0), or `d` and `m` (Q6_K: the
    /// two halves' scales).
    #[inline]
    pub(crate) const fn scales_per_row(self) -> usize {
        match self {
            Packing::Q8_0 | Packing::Q4_0 => 1,
            Packing::Q4_1 | Packing::Q4K | Packing::Q6K | Packing::U8 => 2,
        }
    }

    /// Offset of row `k`'s first scale (`d`, `D`, or Q6_K's for columns 0..16): the 8
    /// rows' first scales come first, as one vector.
    #[inline]
    pub(crate) const fn d_at(self, k: usize) -> usize {
        k * self.scale_bytes()
    }

    /// Offset of the 8 rows' second scales (`m`, `M`, or Q6_K's for columns 16..32).
    #[inline]
    pub(crate) const fn m_base(self) -> usize {
        GROUP * self.scale_bytes()
    }

    /// Offset of row `k`'s second scale.
    #[inline]
    pub(crate) const fn m_at(self, k: usize) -> usize {
        self.m_base() + k * self.scale_bytes()
    }

    /// Bytes of the scale header of one group-block.
    #[inline]
    pub(crate) const fn header_bytes(self) -> usize {
        self.scales_per_row() * GROUP * self.scale_bytes()
    }

    /// Whether the quants are nibbles, two columns a byte (Q4_0, Q4_1, Q4_K).
    #[inline]
    pub(crate) const fn is_nibbles(self) -> bool {
        match self {
            Packing::Q4_0 | Packing::Q4_1 | Packing::Q4K => true,
            Packing::Q8_0 | Packing::Q6K | Packing::U8 => false,
        }
    }

    /// Quant bytes of one row in one block: 16 nibble bytes or 32 bytes.
    #[inline]
    pub(crate) const fn qs_bytes(self) -> usize {
        if self.is_nibbles() {
            BLOCK / 2
        } else {
            BLOCK
        }
    }

    /// Quant vectors per group-block.
    #[inline]
    pub(crate) const fn vectors(self) -> usize {
        self.qs_bytes() / LANE_BYTES
    }

    /// Offset of quant vector `w` in a group-block.
    #[inline]
    pub(crate) const fn vector_at(self, w: usize) -> usize {
        self.header_bytes() + w * VECTOR_BYTES
    }

    /// Offset of row `k`'s [`LANE_BYTES`] in quant vector `w`.
    #[inline]
    pub(crate) const fn quant_at(self, w: usize, k: usize) -> usize {
        self.vector_at(w) + k * LANE_BYTES
    }

    /// Bytes of one group-block: the header and 8 rows × [`BLOCK`] columns of quants.
    #[inline]
    pub(crate) const fn group_block_bytes(self) -> usize {
        self.header_bytes() + GROUP * self.qs_bytes()
    }
}

/// The packing of a fused format.
///
/// # Panics
/// For F16 and BF16, which are stored as they are, not packed.
fn packing(ty: QuantType) -> Packing {
    Packing::of(ty).unwrap_or_else(|e| panic!("{e}"))
}

/// Bytes of the scale header of one group-block (32 columns of 8 rows): f16 `d` (and
/// `m`) for the classic formats; for Q4_K eight f32 `d*sc` then eight f32 `-dmin*m`
/// per 32 values (Q5_K alike; Q5_1: its `d` and `m` widened), for Q6_K eight f32
/// `d*sc` for columns 0..16 then eight for 16..32.
///
/// # Panics
/// For F16 and BF16, which are not packed.
pub fn header_bytes(ty: QuantType) -> usize {
    packing(ty).header_bytes()
}

/// Offset of the quants inside one ggml block (for Q6_K its low nibbles, for Q5_K its
/// low four bits; the 16-bit floats' values start the block).
pub fn ggml_qs_offset(ty: QuantType) -> usize {
    match ty {
        QuantType::Q8_0 => ggml::q8_0::QS,
        QuantType::Q4_0 => ggml::q4_0::QS,
        QuantType::Q4_1 => ggml::q4_1::QS,
        QuantType::Q5_1 => ggml::q5_1::QS,
        QuantType::Q4K => ggml::q4k::QS,
        QuantType::Q5K => ggml::q5k::QS,
        QuantType::Q6K => ggml::q6k::QL,
        QuantType::F16 | QuantType::BF16 => 0,
    }
}

/// Quant bytes per row and 32 columns (32 for the 8-bit forms — Q8_0; Q6_K stored as
/// `q - 32` in i8; Q5_1/Q5_K as their 5-bit `q` in u8 —, 16 nibble bytes for the 4-bit
/// formats).
///
/// # Panics
/// For F16 and BF16, which are not packed.
pub fn qs_bytes(ty: QuantType) -> usize {
    packing(ty).qs_bytes()
}

/// Bytes of one group-block: 8 rows × 32 columns.
///
/// # Panics
/// For F16 and BF16, which are not packed.
pub fn group_block_bytes(ty: QuantType) -> usize {
    packing(ty).group_block_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The geometry built from the constants is the one the kernels were written against:
    /// the x86 kernel's former tables of group-block and header bytes, indexed by id.
    #[test]
    fn geometry_equals_the_kernels_former_tables() {
        let group_block = [272usize, 144, 160, 192, 320, 320];
        let header = [16usize, 16, 32, 64, 64, 64];
        for p in Packing::ALL {
            let id = p as usize;
            assert_eq!(p.group_block_bytes(), group_block[id], "{p:?}");
            assert_eq!(p.header_bytes(), header[id], "{p:?}");
            // The last row's last lane ends the group-block.
            assert_eq!(
                p.quant_at(p.vectors() - 1, GROUP - 1) + LANE_BYTES,
                p.group_block_bytes(),
                "{p:?}"
            );
            // The scales fill the header: one vector of `d`, then one of `m` if any.
            let last = if p.scales_per_row() == 2 {
                p.m_at(GROUP - 1)
            } else {
                p.d_at(GROUP - 1)
            };
            assert_eq!(last + p.scale_bytes(), p.header_bytes(), "{p:?}");
        }
    }

    /// A type without a packed layout is an error naming it, not a no-op: the 16-bit
    /// floats get [`QuantError::NoFusedKernel`], every block format a packing.
    #[test]
    fn unsupported_types_are_errors() {
        for ty in [QuantType::F16, QuantType::BF16] {
            match Packing::of(ty) {
                Err(QuantError::NoFusedKernel { ty: got }) => assert_eq!(got, ty),
                other => panic!("{ty:?}: {other:?}"),
            }
            assert!(!ty.has_fused_kernel());
        }
        for ty in crate::model::quant::test_util::BLOCK_FORMATS {
            assert!(Packing::of(ty).is_ok(), "{ty:?}");
            assert!(ty.has_fused_kernel());
        }
    }

    #[test]
    fn ids_round_trip() {
        for (i, p) in Packing::ALL.into_iter().enumerate() {
            assert_eq!(p as usize, i);
            assert_eq!(Packing::from_id(p as u8), p);
        }
    }

    /// The formats packed byte for byte are exactly those whose header keeps f16 scales,
    /// and their header holds what their ggml block does (`d`, and `m` if any).
    #[test]
    fn lossless_formats_keep_ggmls_scales() {
        for ty in crate::model::quant::test_util::BLOCK_FORMATS {
            let p = Packing::of(ty).expect("block formats are packed");
            assert_eq!(ty.packs_losslessly(), p.scale_bytes() == 2, "{ty:?}");
            if let Some(f) = ty.classic_fields() {
                assert_eq!(f.m.is_some(), p.scales_per_row() == 2, "{ty:?}");
                assert_eq!(p.qs_bytes(), ty.block_layout().1 - f.qs, "{ty:?}");
            }
        }
    }
}
