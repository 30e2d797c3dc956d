//! GPU side of the engine: CubeCL kernels (paged attention over the block pool, the KV
//! write) and the [`crate::model::EngineOps`] implementation every CubeCL backend shares
//! (`burn-cuda` under the `cuda` feature, `burn-wgpu` under `wgpu`). The launch metadata
//! and the kernel's index math live in [`layout`], compiled and tested on every build.

pub mod layout;

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube_ops;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub mod kernels;

#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub use cube_ops::ATTN_UNITS;
