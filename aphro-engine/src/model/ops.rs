//! The hot ops of the engine behind a backend-extension trait.
//!
//! Every method has a default written in plain burn tensor ops (so any backend runs the
//! model); `Flex` overrides them with CPU loops that read the paged cache and the quantized
//! blocks in place. The CubeCL backends (CUDA, wgpu) override them with the kernels of
//! [`crate::gpu`].

use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, DType, Int, Tensor, TensorData, TensorPrimitive};

use super::flash::{paged_attention_with_sinks, write_keys, KvElement};
use super::quant::{dense_matmul, QuantMatrix, QuantType};
use super::{ModelDType, WeightStorage};

/// One sequence's slice of a step, as attention sees it.
#[derive(Debug, Clone, Copy)]
pub struct AttnSeq<'a> {
    /// First row of this sequence in the step's token-major `q`.
    pub q_offset: usize,
    pub q_len: usize,
    /// Position of its first query token; keys cover positions `0..start_pos + q_len`.
    pub start_pos: usize,
    pub block_table: &'a [u32],
}

#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub scale: f32,
    /// Sliding-window attention: a query at position `p` sees the keys at `p - w < k <= p`
    /// (HF's convention: itself and the `w - 1` before it). `None`: every earlier key.
    pub window: Option<usize>,
}

impl AttnShape {
    /// Whether a query at `pos` sees the key at `key` (causal, and inside the window).
    pub fn sees(&self, pos: usize, key: usize) -> bool {
        key <= pos && self.window.is_none_or(|w| key + w > pos)
    }

    fn slot(&self, seq: &AttnSeq<'_>, pos: usize) -> usize {
        seq.block_table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }
}

fn wrap<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn unwrap<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// Backend extension with the engine's fused ops. Cache tensors are
/// `[num_blocks * block_size, num_kv_heads * head_dim]` (one row per slot); activations are
/// token-major `[tokens, features]`. Callers guarantee indices are in range.
pub trait EngineOps: Backend {
    /// How `--dtype` maps to the storage of the projection matrices on this backend. The
    /// default keeps a GGUF's block quantization on the host for the fused CPU kernels.
    fn weight_storage(dtype: ModelDType) -> WeightStorage {
        match dtype {
            ModelDType::Auto => WeightStorage::KeepQuant,
            ModelDType::Float32 => WeightStorage::F32,
            ModelDType::Float16 => WeightStorage::Half(QuantType::F16),
            ModelDType::BFloat16 => WeightStorage::Half(QuantType::BF16),
        }
    }

    /// Write `new` (`[tokens, kv_dim]`) into rows `slots` of `cache`, returning the cache.
    fn reshape_and_cache(
        cache: FloatTensor<Self>,
        new: FloatTensor<Self>,
        slots: &[usize],
    ) -> FloatTensor<Self> {
        reference::reshape_and_cache::<Self>(cache, new, slots)
    }

    /// Write the keys `new` (`[tokens, kv_dim]`) for `slots` into `cache`, in the layout
    /// this backend's [`Self::paged_attention`] reads. The default is the values' layout
    /// ([`Self::reshape_and_cache`]); the CPU keeps each block's keys transposed (see
    /// [`super::flash`]). Either way a block's keys fill its own `block_size` rows, so
    /// copying whole blocks row by row (prefix-cache copy-on-write) needs no layout.
    fn cache_keys(
        cache: FloatTensor<Self>,
        new: FloatTensor<Self>,
        slots: &[usize],
        shape: &AttnShape,
    ) -> FloatTensor<Self> {
        let _ = shape;
        Self::reshape_and_cache(cache, new, slots)
    }

    /// Causal attention of `q` (`[tokens, heads * head_dim]`) over each sequence's cached
    /// keys/values, read through its block table. Returns `[tokens, heads * head_dim]`.
    fn paged_attention(
        q: FloatTensor<Self>,
        k_cache: &FloatTensor<Self>,
        v_cache: &FloatTensor<Self>,
        seqs: &[AttnSeq<'_>],
        shape: &AttnShape,
    ) -> FloatTensor<Self> {
        reference::paged_attention::<Self>(q, k_cache, v_cache, seqs, shape)
    }

    /// [`Self::paged_attention`] with attention sinks (GPT-OSS): `sinks[h]` (one per query
    /// head) is one more logit in each softmax denominator of head `h`, with no value. The
    /// default is the burn-op reference, which reads keys in the values' layout: a backend
    /// that overrides [`Self::cache_keys`] must override this too (the CPU does).
    fn paged_attention_with_sinks(
        q: FloatTensor<Self>,
        k_cache: &FloatTensor<Self>,
        v_cache: &FloatTensor<Self>,
        seqs: &[AttnSeq<'_>],
        shape: &AttnShape,
        sinks: &[f32],
    ) -> FloatTensor<Self> {
        reference::paged_attention_sinks::<Self>(q, k_cache, v_cache, seqs, shape, Some(sinks))
    }

    /// `x W^T` for a block-quantized `W: [rows, cols]`; `x: [tokens, cols]` → `[tokens, rows]`.
    /// The default dequantizes the whole matrix (correct, slow: override it).
    fn quantized_matmul(x: FloatTensor<Self>, w: &QuantMatrix) -> FloatTensor<Self> {
        reference::quantized_matmul::<Self>(x, w)
    }

    /// Several block-quantized matrices applied to the same `x` (q/k/v, gate/up), each
    /// result equal to [`Self::quantized_matmul`]'s. CPU backends quantize `x` once and run
    /// all the rows in one parallel loop.
    fn quantized_matmul_many(x: FloatTensor<Self>, ws: &[&QuantMatrix]) -> Vec<FloatTensor<Self>> {
        ws.iter()
            .map(|w| Self::quantized_matmul(x.clone(), w))
            .collect()
    }

    /// `x W^T` for a dense `W: [rows, cols]`.
    fn dense_matmul(x: FloatTensor<Self>, w: &FloatTensor<Self>) -> FloatTensor<Self> {
        reference::dense_matmul::<Self>(x, w)
    }

    /// RMSNorm of each row of `x: [rows, n]`, times `w: [n]`.
    fn rms_norm(x: FloatTensor<Self>, w: &FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        reference::rms_norm::<Self>(x, w, eps)
    }

    /// HF `rotate_half` RoPE on `x: [tokens, heads * head_dim]`; `cos`/`sin` are
    /// `[tokens, head_dim]` (HF's `cat(freqs, freqs)` layout).
    fn rope(x: FloatTensor<Self>, heads: usize, cos: &[f32], sin: &[f32]) -> FloatTensor<Self> {
        reference::rope::<Self>(x, heads, cos, sin)
    }

    /// `silu(gate) * up` (the SwiGLU MLP's activation).
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        reference::swiglu::<Self>(gate, up)
    }

    /// `gelu_tanh(gate) * up` (GeGLU with PyTorch's tanh-approximate GELU: Gemma).
    fn geglu_tanh(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        reference::geglu_tanh::<Self>(gate, up)
    }
}

/// The trait's defaults in plain burn tensor ops (public so overrides can be tested against them).
pub mod reference {
    use super::*;

    pub fn reshape_and_cache<B: Backend>(
        cache: FloatTensor<B>,
        new: FloatTensor<B>,
        slots: &[usize],
    ) -> FloatTensor<B> {
        // burn 0.21's float `select_assign` only supports `Add`, so write runs of
        // consecutive slots with `slice_assign` (a prefill chunk is a few runs).
        let mut cache: Tensor<B, 2> = wrap(cache);
        let new: Tensor<B, 2> = wrap(new);
        let [_, w] = new.dims();
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == slots[j - 1] + 1 {
                j += 1;
            }
            let rows = new.clone().slice([i..j, 0..w]);
            cache = cache.slice_assign([slots[i]..slots[i] + (j - i), 0..w], rows);
            i = j;
        }
        unwrap(cache)
    }

    pub fn paged_attention<B: Backend>(
        q: FloatTensor<B>,
        k_cache: &FloatTensor<B>,
        v_cache: &FloatTensor<B>,
        seqs: &[AttnSeq<'_>],
        shape: &AttnShape,
    ) -> FloatTensor<B> {
        paged_attention_sinks::<B>(q, k_cache, v_cache, seqs, shape, None)
    }

    /// [`paged_attention`] with optional attention sinks (one logit per query head, as
    /// transformers' GPT-OSS: softmax over `[scores, sink]`, the sink column dropped).
    pub fn paged_attention_sinks<B: Backend>(
        q: FloatTensor<B>,
        k_cache: &FloatTensor<B>,
        v_cache: &FloatTensor<B>,
        seqs: &[AttnSeq<'_>],
        shape: &AttnShape,
        sinks: Option<&[f32]>,
    ) -> FloatTensor<B> {
        let q: Tensor<B, 2> = wrap(q);
        let device = q.device();
        // A 16-bit cache is read in the activations' type.
        let kc: Tensor<B, 2> = wrap::<B, 2>(k_cache.clone()).cast(q.dtype());
        let vc: Tensor<B, 2> = wrap::<B, 2>(v_cache.clone()).cast(q.dtype());
        let sinks = sinks.map(|s| {
            Tensor::<B, 1>::from_data(TensorData::new(s.to_vec(), [s.len()]), &device)
                .cast(q.dtype())
        });
        let (h, kvh, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
        let group = h / kvh;
        let mut outs = Vec::with_capacity(seqs.len());
        for s in seqs {
            let ctx = s.start_pos + s.q_len;
            let idx: Vec<i64> = (0..ctx).map(|p| shape.slot(s, p) as i64).collect();
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [ctx]), &device);
            // [ctx, kvh*d] → [h, ctx, d] (each KV head repeated for its query group).
            let expand = |t: Tensor<B, 2>| -> Tensor<B, 3> {
                t.reshape([ctx, kvh, 1, d])
                    .expand([ctx, kvh, group, d])
                    .reshape([ctx, h, d])
                    .swap_dims(0, 1)
            };
            let k = expand(kc.clone().select(0, idx.clone()));
            let v = expand(vc.clone().select(0, idx));
            let qs = q
                .clone()
                .slice([s.q_offset..s.q_offset + s.q_len, 0..h * d])
                .reshape([s.q_len, h, d])
                .swap_dims(0, 1);
            let scores = qs.matmul(k.swap_dims(1, 2)).mul_scalar(shape.scale);
            let mask: Vec<bool> = (0..s.q_len)
                .flat_map(|i| (0..ctx).map(move |j| !shape.sees(s.start_pos + i, j)))
                .collect();
            let mask =
                Tensor::<B, 2, Bool>::from_data(TensorData::new(mask, [s.q_len, ctx]), &device)
                    .reshape([1, s.q_len, ctx])
                    .expand([h, s.q_len, ctx]);
            let scores = scores.mask_fill(mask, f32::NEG_INFINITY);
            let p = match &sinks {
                None => burn::tensor::activation::softmax(scores, 2),
                Some(sk) => {
                    let col = sk.clone().reshape([h, 1, 1]).expand([h, s.q_len, 1]);
                    let p = burn::tensor::activation::softmax(Tensor::cat(vec![scores, col], 2), 2);
                    p.slice([0..h, 0..s.q_len, 0..ctx])
                }
            };
            outs.push(p.matmul(v).swap_dims(0, 1).reshape([s.q_len, h * d]));
        }
        unwrap(Tensor::cat(outs, 0))
    }

    pub fn quantized_matmul<B: Backend>(x: FloatTensor<B>, w: &QuantMatrix) -> FloatTensor<B> {
        let x: Tensor<B, 2> = wrap(x);
        let wt = Tensor::<B, 2>::from_data(
            TensorData::new(w.dequantize(), [w.rows, w.cols]),
            &x.device(),
        );
        unwrap(x.matmul(wt.transpose()))
    }

    pub fn dense_matmul<B: Backend>(x: FloatTensor<B>, w: &FloatTensor<B>) -> FloatTensor<B> {
        let x: Tensor<B, 2> = wrap(x);
        let w: Tensor<B, 2> = wrap(w.clone());
        unwrap(x.matmul(w.transpose()))
    }

    pub fn rms_norm<B: Backend>(x: FloatTensor<B>, w: &FloatTensor<B>, eps: f32) -> FloatTensor<B> {
        let x: Tensor<B, 2> = wrap(x);
        let w: Tensor<B, 1> = wrap(w.clone());
        let var = x.clone().powi_scalar(2).mean_dim(1);
        let inv = var.add_scalar(eps).sqrt().recip();
        unwrap(x.mul(inv).mul(w.unsqueeze()))
    }

    pub fn rope<B: Backend>(
        x: FloatTensor<B>,
        heads: usize,
        cos: &[f32],
        sin: &[f32],
    ) -> FloatTensor<B> {
        let x: Tensor<B, 2> = wrap(x);
        let device = x.device();
        let [t, w] = x.dims();
        let d = w / heads;
        let table =
            |v: &[f32]| Tensor::<B, 3>::from_data(TensorData::new(v.to_vec(), [t, 1, d]), &device);
        let x = x.reshape([t, heads, d]);
        let x1 = x.clone().slice([0..t, 0..heads, 0..d / 2]);
        let x2 = x.clone().slice([0..t, 0..heads, d / 2..d]);
        let rot = Tensor::cat(vec![x2.neg(), x1], 2);
        unwrap((x.mul(table(cos)) + rot.mul(table(sin))).reshape([t, heads * d]))
    }

    pub fn swiglu<B: Backend>(gate: FloatTensor<B>, up: FloatTensor<B>) -> FloatTensor<B> {
        let g: Tensor<B, 2> = wrap(gate);
        let u: Tensor<B, 2> = wrap(up);
        unwrap(burn::tensor::activation::silu(g) * u)
    }

    pub fn geglu_tanh<B: Backend>(gate: FloatTensor<B>, up: FloatTensor<B>) -> FloatTensor<B> {
        let g: Tensor<B, 2> = wrap(gate);
        let u: Tensor<B, 2> = wrap(up);
        let inner = (g.clone() + g.clone().powi_scalar(3).mul_scalar(GELU_KAPPA))
            .mul_scalar(GELU_BETA)
            .tanh();
        unwrap(g.mul_scalar(0.5) * inner.add_scalar(1.0) * u)
    }

    /// PyTorch's `gelu(approximate="tanh")` constants: `sqrt(2 / pi)` and 0.044715.
    pub const GELU_BETA: f32 = 0.797_884_6;
    pub const GELU_KAPPA: f32 = 0.044715;
}

/// A contiguous f32 view of a Flex tensor (copies only if it is a strided view).
pub(super) fn f32_data(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(
            t.to_contiguous()
                .as_slice::<f32>()
                .map(<[f32]>::to_vec)
                .unwrap_or_default(),
        ),
    }
}

/// A cache write's rows as `f32`: the model's activations, or a 16-bit cache's own rows (a
/// block copy), which widen exactly and so round back to the same bits.
fn rows_as_f32(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    fn widen<T: KvElement + burn::tensor::Element + bytemuck::Pod>(t: &FlexTensor) -> Vec<f32> {
        kv_slice::<T>(t).iter().map(|x| x.to_f32()).collect()
    }
    match t.dtype() {
        DType::F16 => std::borrow::Cow::Owned(widen::<half::f16>(t)),
        DType::BF16 => std::borrow::Cow::Owned(widen::<half::bf16>(t)),
        _ => f32_data(t),
    }
}

/// A KV cache tensor's elements (it is contiguous: the cache writes make it so).
fn kv_slice<T: burn::tensor::Element + bytemuck::Pod>(t: &FlexTensor) -> std::borrow::Cow<'_, [T]> {
    match t.as_slice::<T>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(
            t.to_contiguous()
                .as_slice::<T>()
                .map(<[T]>::to_vec)
                .unwrap_or_default(),
        ),
    }
}

pub(super) fn flex_from(data: Vec<f32>, shape: [usize; 2]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(data, shape))
}

fn dims2(t: &FlexTensor) -> [usize; 2] {
    use burn::tensor::TensorMetadata;
    let s = t.shape();
    [s[0], s[1]]
}

/// The CPU's flash attention over a cache of any supported element type.
fn flex_attention(
    q: FlexTensor,
    k_cache: &FlexTensor,
    v_cache: &FlexTensor,
    seqs: &[AttnSeq<'_>],
    shape: &AttnShape,
    sinks: Option<&[f32]>,
) -> FlexTensor {
    let [tokens, qdim] = dims2(&q);
    let q = f32_data(&q);
    let out = match k_cache.dtype() {
        DType::F16 => paged_attention_with_sinks(
            &q,
            &kv_slice::<half::f16>(k_cache),
            &kv_slice::<half::f16>(v_cache),
            seqs,
            shape,
            sinks,
        ),
        DType::BF16 => paged_attention_with_sinks(
            &q,
            &kv_slice::<half::bf16>(k_cache),
            &kv_slice::<half::bf16>(v_cache),
            seqs,
            shape,
            sinks,
        ),
        _ => paged_attention_with_sinks(
            &q,
            &f32_data(k_cache),
            &f32_data(v_cache),
            seqs,
            shape,
            sinks,
        ),
    };
    flex_from(out, [tokens, qdim])
}

impl EngineOps for Flex {
    fn reshape_and_cache(mut cache: FlexTensor, new: FlexTensor, slots: &[usize]) -> FlexTensor {
        let [_, width] = dims2(&cache);
        let new = rows_as_f32(&new);
        if !cache.is_contiguous() {
            cache = cache.to_contiguous();
        }
        // The runner holds the only reference, so this writes in place (no copy).
        fn write<T: KvElement + burn::tensor::Element + bytemuck::Pod>(
            dst: &mut [T],
            new: &[f32],
            width: usize,
            slots: &[usize],
        ) {
            for (row, &slot) in new.chunks_exact(width).zip(slots) {
                for (d, &x) in dst[slot * width..(slot + 1) * width].iter_mut().zip(row) {
                    *d = T::from_f32(x);
                }
            }
        }
        match cache.dtype() {
            DType::F16 => write(cache.storage_mut::<half::f16>(), &new, width, slots),
            DType::BF16 => write(cache.storage_mut::<half::bf16>(), &new, width, slots),
            _ => write(cache.storage_mut::<f32>(), &new, width, slots),
        }
        cache
    }

    fn cache_keys(
        mut cache: FlexTensor,
        new: FlexTensor,
        slots: &[usize],
        shape: &AttnShape,
    ) -> FlexTensor {
        let new = rows_as_f32(&new);
        if !cache.is_contiguous() {
            cache = cache.to_contiguous();
        }
        match cache.dtype() {
            DType::F16 => write_keys(cache.storage_mut::<half::f16>(), &new, slots, shape),
            DType::BF16 => write_keys(cache.storage_mut::<half::bf16>(), &new, slots, shape),
            _ => write_keys(cache.storage_mut::<f32>(), &new, slots, shape),
        }
        cache
    }

    fn paged_attention(
        q: FlexTensor,
        k_cache: &FlexTensor,
        v_cache: &FlexTensor,
        seqs: &[AttnSeq<'_>],
        shape: &AttnShape,
    ) -> FlexTensor {
        flex_attention(q, k_cache, v_cache, seqs, shape, None)
    }

    fn paged_attention_with_sinks(
        q: FlexTensor,
        k_cache: &FlexTensor,
        v_cache: &FlexTensor,
        seqs: &[AttnSeq<'_>],
        shape: &AttnShape,
        sinks: &[f32],
    ) -> FlexTensor {
        flex_attention(q, k_cache, v_cache, seqs, shape, Some(sinks))
    }

    fn quantized_matmul(x: FlexTensor, w: &QuantMatrix) -> FlexTensor {
        let [tokens, _] = dims2(&x);
        let x = f32_data(&x);
        flex_from(w.matmul(&x, tokens), [tokens, w.rows])
    }

    fn quantized_matmul_many(x: FlexTensor, ws: &[&QuantMatrix]) -> Vec<FlexTensor> {
        let [tokens, _] = dims2(&x);
        let x = f32_data(&x);
        QuantMatrix::matmul_many(ws, &x, tokens)
            .into_iter()
            .zip(ws)
            .map(|(y, w)| flex_from(y, [tokens, w.rows]))
            .collect()
    }

    fn dense_matmul(x: FlexTensor, w: &FlexTensor) -> FlexTensor {
        let [tokens, cols] = dims2(&x);
        let [rows, _] = dims2(w);
        let x = f32_data(&x);
        let w = f32_data(w);
        flex_from(dense_matmul(&w, rows, cols, &x, tokens), [tokens, rows])
    }

    fn rms_norm(x: FlexTensor, w: &FlexTensor, eps: f32) -> FlexTensor {
        let shape = dims2(&x);
        let mut x = f32_data(&x).into_owned();
        super::cpu::rms_norm(&mut x, &f32_data(w), eps);
        flex_from(x, shape)
    }

    fn rope(x: FlexTensor, heads: usize, cos: &[f32], sin: &[f32]) -> FlexTensor {
        let shape = dims2(&x);
        let mut x = f32_data(&x).into_owned();
        super::cpu::rope(&mut x, shape[1], heads, cos, sin);
        flex_from(x, shape)
    }

    fn swiglu(gate: FlexTensor, up: FlexTensor) -> FlexTensor {
        let shape = dims2(&gate);
        let mut g = f32_data(&gate).into_owned();
        super::cpu::swiglu(&mut g, &f32_data(&up));
        flex_from(g, shape)
    }

    fn geglu_tanh(gate: FlexTensor, up: FlexTensor) -> FlexTensor {
        let shape = dims2(&gate);
        let mut g = f32_data(&gate).into_owned();
        super::cpu::geglu_tanh(&mut g, &f32_data(&up));
        flex_from(g, shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::QuantType;

    use crate::test_support::rand;

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "[{i}] {x} vs {y}");
        }
    }

    fn vec_of(t: FlexTensor) -> Vec<f32> {
        t.into_data().to_vec::<f32>().unwrap_or_default()
    }

    #[test]
    fn flex_reshape_and_cache_matches_reference() {
        let mut seed = 1;
        let cache = rand(8 * 6, &mut seed);
        let new = rand(3 * 6, &mut seed);
        let slots = [5, 0, 7];
        let a = <Flex as EngineOps>::reshape_and_cache(
            flex_from(cache.clone(), [8, 6]),
            flex_from(new.clone(), [3, 6]),
            &slots,
        );
        let b = reference::reshape_and_cache::<Flex>(
            flex_from(cache, [8, 6]),
            flex_from(new, [3, 6]),
            &slots,
        );
        assert_eq!(vec_of(a), vec_of(b));
    }

    #[test]
    fn flex_paged_attention_matches_reference() {
        let mut seed = 2;
        let shape = AttnShape {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            block_size: 4,
            scale: 0.35,
            window: None,
        };
        let num_blocks = 10;
        let kv_w = 2 * 8;
        let kc = flex_from(
            rand(num_blocks * 4 * kv_w, &mut seed),
            [num_blocks * 4, kv_w],
        );
        let vc = flex_from(
            rand(num_blocks * 4 * kv_w, &mut seed),
            [num_blocks * 4, kv_w],
        );
        // A prefill chunk over cached blocks (non-contiguous table) plus a decode token.
        let t1 = [7u32, 2, 9];
        let t2 = [4u32, 1];
        let seqs = [
            AttnSeq {
                q_offset: 0,
                q_len: 5,
                start_pos: 4,
                block_table: &t1,
            },
            AttnSeq {
                q_offset: 5,
                q_len: 1,
                start_pos: 6,
                block_table: &t2,
            },
        ];
        let q = rand(6 * 4 * 8, &mut seed);
        // The CPU reads keys in its own block layout, written through `cache_keys`.
        let all_slots: Vec<usize> = (0..num_blocks * 4).collect();
        let kc_cpu = <Flex as EngineOps>::cache_keys(
            flex_from(vec![0.0; num_blocks * 4 * kv_w], [num_blocks * 4, kv_w]),
            kc.clone(),
            &all_slots,
            &shape,
        );
        let a = <Flex as EngineOps>::paged_attention(
            flex_from(q.clone(), [6, 32]),
            &kc_cpu,
            &vc,
            &seqs,
            &shape,
        );
        let b = reference::paged_attention::<Flex>(flex_from(q, [6, 32]), &kc, &vc, &seqs, &shape);
        close(&vec_of(a), &vec_of(b), 1e-5);
    }

    /// Attention sinks (one logit per query head in the denominator) on the CPU's flash
    /// kernel equal the burn-op reference, which appends the sink column to the scores, on
    /// a sliding-window layer with a context long enough to be split into segments; and
    /// they make a difference.
    #[test]
    fn flex_attention_sinks_match_reference() {
        let mut seed = 5;
        let shape = AttnShape {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            block_size: 16,
            scale: 0.35,
            window: Some(40),
        };
        let (num_blocks, kv_w) = (48, 2 * 8);
        let rows = num_blocks * 16;
        let kc = flex_from(rand(rows * kv_w, &mut seed), [rows, kv_w]);
        let vc = flex_from(rand(rows * kv_w, &mut seed), [rows, kv_w]);
        let t1: Vec<u32> = (0..40).rev().collect();
        let t2 = [44u32, 41];
        // A long decode row (split into segments), a prefill chunk, a short full-context
        // row.
        let seqs = [
            AttnSeq {
                q_offset: 0,
                q_len: 1,
                start_pos: 620,
                block_table: &t1,
            },
            AttnSeq {
                q_offset: 1,
                q_len: 20,
                start_pos: 3,
                block_table: &t1,
            },
            AttnSeq {
                q_offset: 21,
                q_len: 2,
                start_pos: 17,
                block_table: &t2,
            },
        ];
        let q: Vec<f32> = rand(23 * 32, &mut seed).iter().map(|v| v * 4.0).collect();
        let sinks = [0.5f32, -1.0, 2.5, 1.2];
        let all_slots: Vec<usize> = (0..rows).collect();
        let kc_cpu = <Flex as EngineOps>::cache_keys(
            flex_from(vec![0.0; rows * kv_w], [rows, kv_w]),
            kc.clone(),
            &all_slots,
            &shape,
        );
        let a = vec_of(<Flex as EngineOps>::paged_attention_with_sinks(
            flex_from(q.clone(), [23, 32]),
            &kc_cpu,
            &vc,
            &seqs,
            &shape,
            &sinks,
        ));
        let b = vec_of(reference::paged_attention_sinks::<Flex>(
            flex_from(q.clone(), [23, 32]),
            &kc,
            &vc,
            &seqs,
            &shape,
            Some(&sinks),
        ));
        close(&a, &b, 1e-5);
        let plain = vec_of(<Flex as EngineOps>::paged_attention(
            flex_from(q, [23, 32]),
            &kc_cpu,
            &vc,
            &seqs,
            &shape,
        ));
        let moved = plain
            .iter()
            .zip(&a)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(moved > 1e-2, "sinks changed nothing ({moved})");
    }

    /// The fused CPU RMSNorm / RoPE / SwiGLU equal the burn-op defaults.
    #[test]
    fn flex_elementwise_ops_match_reference() {
        let mut seed = 4;
        for (t, heads, d) in [(1, 3, 8), (5, 2, 64), (3, 1, 2)] {
            let w = heads * d;
            let x = rand(t * w, &mut seed);
            let nw = rand(w, &mut seed);
            let a = <Flex as EngineOps>::rms_norm(
                flex_from(x.clone(), [t, w]),
                &FlexTensor::from_data(TensorData::new(nw.clone(), [w])),
                1e-5,
            );
            let b = reference::rms_norm::<Flex>(
                flex_from(x.clone(), [t, w]),
                &FlexTensor::from_data(TensorData::new(nw, [w])),
                1e-5,
            );
            close(&vec_of(a), &vec_of(b), 1e-5);
            let ang = rand(t * d, &mut seed);
            let cos: Vec<f32> = ang.iter().map(|a| (a * 6.0).cos()).collect();
            let sin: Vec<f32> = ang.iter().map(|a| (a * 6.0).sin()).collect();
            let a = <Flex as EngineOps>::rope(flex_from(x.clone(), [t, w]), heads, &cos, &sin);
            let b = reference::rope::<Flex>(flex_from(x.clone(), [t, w]), heads, &cos, &sin);
            close(&vec_of(a), &vec_of(b), 1e-6);
            let u = rand(t * w, &mut seed);
            let g: Vec<f32> = x.iter().map(|v| v * 20.0).collect();
            let a = <Flex as EngineOps>::swiglu(
                flex_from(g.clone(), [t, w]),
                flex_from(u.clone(), [t, w]),
            );
            let b = reference::swiglu::<Flex>(
                flex_from(g.clone(), [t, w]),
                flex_from(u.clone(), [t, w]),
            );
            close(&vec_of(a), &vec_of(b), 1e-6);
            let a = <Flex as EngineOps>::geglu_tanh(
                flex_from(g.clone(), [t, w]),
                flex_from(u.clone(), [t, w]),
            );
            let b = reference::geglu_tanh::<Flex>(flex_from(g, [t, w]), flex_from(u, [t, w]));
            close(&vec_of(a), &vec_of(b), 1e-5);
        }
    }

    #[test]
    fn flex_matmuls_match_reference() {
        let mut seed = 3;
        let (rows, cols) = (40, 64);
        let mut bytes = Vec::new();
        for _ in 0..rows * cols / 32 {
            bytes.extend_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
            bytes.extend_from_slice(&half::f16::from_f32(-0.1).to_le_bytes());
            bytes.extend(
                rand(16, &mut seed)
                    .iter()
                    .map(|v| ((v + 0.5) * 255.0) as u8),
            );
        }
        let w = QuantMatrix::new(QuantType::Q4_1, rows, cols, bytes).expect("valid");
        for tokens in [1, 7] {
            let x = rand(tokens * cols, &mut seed);
            let a = <Flex as EngineOps>::quantized_matmul(flex_from(x.clone(), [tokens, cols]), &w);
            let b = reference::quantized_matmul::<Flex>(flex_from(x.clone(), [tokens, cols]), &w);
            // The fused kernel rounds the activations to 8 bits per 32-block (as llama.cpp
            // does): within that rounding of the f32 reference, and exactly the kernel.
            let a = vec_of(a);
            close(&a, &vec_of(b), 2e-2);
            assert_eq!(a, w.matmul(&x, tokens));
            let wd = flex_from(w.dequantize(), [rows, cols]);
            let a = <Flex as EngineOps>::dense_matmul(flex_from(x.clone(), [tokens, cols]), &wd);
            let b = reference::dense_matmul::<Flex>(flex_from(x, [tokens, cols]), &wd);
            close(&vec_of(a), &vec_of(b), 1e-5);
        }
    }
}
