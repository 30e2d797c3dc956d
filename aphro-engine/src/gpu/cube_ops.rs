//! [`EngineOps`] for every CubeCL backend (`burn-cuda`, `burn-wgpu`): paged attention and
//! the KV-cache write as CubeCL kernels over the block pool, mixed-precision dense matmul.

use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use super::kernels::{paged_attention_kernel, scatter_rows_kernel};
use super::layout::PagedMeta;
use crate::model::ops::{reference, AttnSeq, AttnShape, EngineOps};
use crate::model::{ModelDType, WeightStorage};

/// Lanes per (row, head) cube: one warp on NVIDIA, and what lavapipe runs well.
pub const ATTN_UNITS: usize = 32;

fn u32_tensor<R: CubeRuntime>(
    like: &CubeTensor<R>,
    data: &[u32],
    shape: [usize; 2],
) -> CubeTensor<R> {
    // Zero-length buffers are not portable; pad (the kernels never read the pad).
    let (data, shape) = if data.is_empty() {
        (&[0u32][..], [1, 1])
    } else {
        (data, shape)
    };
    let client = like.client.clone();
    let handle = client.create_from_slice(u32::as_bytes(data));
    CubeTensor::new_contiguous(
        client,
        like.device.clone(),
        Shape::new(shape),
        handle,
        DType::U32,
    )
}

fn dims2<R: CubeRuntime>(t: &CubeTensor<R>) -> [usize; 2] {
    let s = t.shape();
    [s[0], s[1]]
}

impl<R, F, I, BT> EngineOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    /// Dense weights on the device: a GGUF's block quantization is expanded at load (the
    /// quantized kernels are CPU-only), `bfloat16`/`float16` keep 16-bit device tensors.
    fn weight_storage(dtype: ModelDType) -> WeightStorage {
        match dtype {
            ModelDType::Auto | ModelDType::Float32 => WeightStorage::F32,
            ModelDType::BFloat16 => WeightStorage::Dense16(burn::tensor::FloatDType::BF16),
            ModelDType::Float16 => WeightStorage::Dense16(burn::tensor::FloatDType::F16),
        }
    }

    fn reshape_and_cache(
        cache: CubeTensor<R>,
        new: CubeTensor<R>,
        slots: &[usize],
    ) -> CubeTensor<R> {
        let [tokens, width] = dims2(&new);
        if tokens == 0 {
            return cache;
        }
        let Ok(slots32) = slots
            .iter()
            .map(|&s| u32::try_from(s))
            .collect::<Result<Vec<u32>, _>>()
        else {
            return reference::reshape_and_cache::<Self>(cache, new, slots);
        };
        // Written in place, so the pool must not be shared with a live tensor.
        if !cache.handle.can_mut() {
            return reference::reshape_and_cache::<Self>(cache, new, slots);
        }
        let slots_t = u32_tensor(&cache, &slots32, [slots32.len(), 1]);
        let client = cache.client.clone();
        let n = tokens * width;
        let cube_dim = CubeDim::new(&client, n);
        let cube_count = calculate_cube_count_elemwise(&client, n, cube_dim);
        let dtypes = [new.dtype.into(), cache.dtype.into()];
        scatter_rows_kernel::launch::<R>(
            &client,
            cube_count,
            cube_dim,
            new.into_tensor_arg(),
            slots_t.into_tensor_arg(),
            cache.clone().into_tensor_arg(),
            dtypes,
        );
        cache
    }

    fn paged_attention(
        q: CubeTensor<R>,
        k_cache: &CubeTensor<R>,
        v_cache: &CubeTensor<R>,
        seqs: &[AttnSeq<'_>],
        shape: &AttnShape,
    ) -> CubeTensor<R> {
        let [tokens, qdim] = dims2(&q);
        let Ok(meta) = PagedMeta::build(tokens, seqs, shape.block_size) else {
            // The runner validated the batch; keep the reference's behaviour otherwise.
            return reference::paged_attention::<Self>(q, k_cache, v_cache, seqs, shape);
        };
        let client = q.client.clone();
        let row_seq = u32_tensor(&q, &meta.row_seq, [tokens, 1]);
        let row_pos = u32_tensor(&q, &meta.row_pos, [tokens, 1]);
        // 2-D: the kernel walks a sequence's row with `stride(0)`, its entries with `stride(1)`.
        let tables = u32_tensor(&q, &meta.block_tables, [seqs.len(), meta.max_blocks]);
        let out = empty_device_dtype(
            client.clone(),
            q.device.clone(),
            Shape::new([tokens, qdim]),
            q.dtype,
        );
        let dtypes = [q.dtype.into(), k_cache.dtype.into()];
        paged_attention_kernel::launch::<R>(
            &client,
            CubeCount::Static(shape.num_heads as u32, tokens as u32, 1),
            CubeDim::new_1d(ATTN_UNITS as u32),
            q.into_tensor_arg(),
            k_cache.clone().into_tensor_arg(),
            v_cache.clone().into_tensor_arg(),
            row_seq.into_tensor_arg(),
            row_pos.into_tensor_arg(),
            tables.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            shape.scale,
            shape.window.map_or(0, |w| w as u32),
            shape.head_dim,
            shape.num_heads / shape.num_kv_heads,
            shape.block_size,
            ATTN_UNITS,
            dtypes,
        );
        out
    }

    /// 16-bit weights multiply 16-bit activations (f32 accumulation inside the matmul);
    /// the result returns in the activations' type.
    fn dense_matmul(x: CubeTensor<R>, w: &CubeTensor<R>) -> CubeTensor<R> {
        if x.dtype == w.dtype {
            return reference::dense_matmul::<Self>(x, w);
        }
        let x_dtype = x.dtype;
        let x = burn_cubecl::kernel::cast(x, w.dtype);
        let y = reference::dense_matmul::<Self>(x, w);
        burn_cubecl::kernel::cast(y, x_dtype)
    }
}
