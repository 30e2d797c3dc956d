//! Block-quantized weights (ggml layouts): exact dequantization and fused CPU matmul kernels.
//!
//! Dequantization reproduces ggml / gguf-py bit for bit (`d * q + m` in f32, no FMA), which
//! is what the HF float32 reference used. The fused kernels work like llama.cpp's: the
//! activations are quantized to 8 bits per 32-block once per matmul ([`Q8Acts`]) and
//! multiplied with the weight quants in integer arithmetic, so decode reads 4.5–8.5 bits
//! per weight (Q4_0/Q4_1/Q8_0; 6–10 for the K-quants and Q5_1, whose scales are expanded
//! to f32 per 32 values at load) and does no per-weight float work. `APHRO_NO_VNNI=1`
//! forces the AVX2 kernels on CPUs with AVX-512 VNNI (for comparisons).
//!
//! This module is the public surface; the parts live in:
//! - [`format`]: the ggml formats ([`QuantType`]), their block geometry, [`QuantError`];
//! - [`packed`]: the row-interleaved layout the fused kernels read;
//! - `repack`: ggml bytes → that layout (and Q5_0 → Q8_0);
//! - `dequant`: ggml blocks → f32;
//! - `activation`: matmul inputs → 8-bit blocks ([`Q8Acts`]);
//! - `matrix`: [`QuantMatrix`] and the matmul drivers (row groups over the rayon pool);
//! - `kernels`: the group kernels (scalar reference, AVX2 / AVX-512 VNNI) and their
//!   run-time dispatch, the f32 dot and the f16/bf16 widening.

mod activation;
mod dequant;
mod format;
mod kernels;
mod matrix;
pub mod packed;
mod repack;
#[cfg(test)]
mod test_util;

pub use activation::{Q8Acts, Q8Row};
pub use dequant::dequantize_into;
pub use format::{QuantError, QuantType};
pub use kernels::dot_f32;
#[cfg(target_arch = "x86_64")]
pub(crate) use kernels::has_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) use kernels::{has_avx512bf16, has_avx512f};
pub use matrix::{dense_matmul, QuantMatrix};
pub use packed::GROUP;
pub use repack::q5_0_to_q8_0;
