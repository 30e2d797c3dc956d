//! The row-interleaved layout the fused kernels read.
//!
//! Group `g` holds rows `8g..8g+8` (the
//! last group zero-padded), its blocks in column order; one group-block is
//! the 8 rows' scales (see [`header_bytes`]), then the quants as 32-byte vectors:
//! vector `w` holds, for row `k` in lane `k`, bytes `4w..4w+4` of that row's quants. For
//! the 8-bit forms those are columns `4w..4w+4`; for the 4-bit ones the low nibbles are
//! columns `4w..4w+4` and the high nibbles `16+4w..16+4w+4` (ggml's Q4_0 order; Q4_K
//! nibbles are reordered to it). Q8_0/Q4_0/Q4_1 keep ggml's bytes exactly; the K-quants'
//! per-super-block scales are multiplied out into f32 (`d * sc` exactly as ggml's
//! dequantization computes them), so they dequantize to the same floats.

use super::QuantType;

/// Rows per interleaved group of the packed layout.
pub const GROUP: usize = 8;

/// Bytes of the scale header of one group-block (32 columns of 8 rows): f16 `d` (and
/// `m`) for the classic formats; for Q4_K eight f32 `d*sc` then eight f32 `-dmin*m`
/// per 32 values (Q5_K alike; Q5_1: its `d` and `m` widened), for Q6_K eight f32
/// `d*sc` for columns 0..16 then eight for 16..32.
pub fn header_bytes(ty: QuantType) -> usize {
    match ty {
        QuantType::Q4_1 => 32,
        QuantType::Q4K | QuantType::Q5K | QuantType::Q5_1 | QuantType::Q6K => 64,
        _ => 16,
    }
}

/// Offset of the quants inside one ggml block.
pub fn ggml_qs_offset(ty: QuantType) -> usize {
    if ty == QuantType::Q4_1 {
        4
    } else {
        2
    }
}

/// Quant bytes per row and 32 columns (32 for the 8-bit forms — Q8_0; Q6_K stored as
/// `q - 32` in i8; Q5_1/Q5_K as their 5-bit `q` in u8 —, 16 nibble bytes for the 4-bit
/// formats).
pub fn qs_bytes(ty: QuantType) -> usize {
    if matches!(
        ty,
        QuantType::Q8_0 | QuantType::Q6K | QuantType::Q5K | QuantType::Q5_1
    ) {
        32
    } else {
        16
    }
}

/// Bytes of one group-block: 8 rows × 32 columns.
pub fn group_block_bytes(ty: QuantType) -> usize {
    header_bytes(ty) + super::GROUP * qs_bytes(ty)
}
