//! The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3), generic over the
//! backend. Activations are token-major `[tokens, features]` for the whole step: every
//! sequence's tokens go through the matmuls together; attention splits them again.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

use super::config::{LlamaConfig, MlpActivation};
use super::moe::{GatedMlp, Mlp};
use super::ops::{AttnSeq, AttnShape, EngineOps};
use super::quant::{QuantMatrix, QuantType};
use super::weights::{HostTensor, WeightSource};
use super::ModelError;

fn wrap<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn unwrap<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// A `[out, in]` projection, dense or block-quantized.
#[derive(Clone)]
pub enum Linear<B: Backend> {
    Dense {
        w: FloatTensor<B>,
        rows: usize,
        cols: usize,
    },
    Quant(Arc<QuantMatrix>),
}

impl<B: EngineOps> Linear<B> {
    fn rows(&self) -> usize {
        match self {
            Linear::Dense { rows, .. } => *rows,
            Linear::Quant(q) => q.rows,
        }
    }

    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Linear::Dense { w, .. } => wrap(B::dense_matmul(unwrap(x), w)),
            Linear::Quant(q) => wrap(B::quantized_matmul(unwrap(x), q)),
        }
    }

    /// Several projections of the same input; quantized ones share one kernel launch.
    pub fn forward_many<const N: usize>(ls: [&Self; N], x: Tensor<B, 2>) -> [Tensor<B, 2>; N] {
        let quant: Vec<&QuantMatrix> = ls
            .iter()
            .filter_map(|l| match l {
                Linear::Quant(q) => Some(q.as_ref()),
                Linear::Dense { .. } => None,
            })
            .collect();
        if quant.len() == N {
            let mut outs = B::quantized_matmul_many(unwrap(x), &quant).into_iter();
            return std::array::from_fn(|_| wrap(outs.next().expect("one output per matrix")));
        }
        ls.map(|l| l.forward(x.clone()))
    }

    /// Rows `ids` as f32 (the embedding lookup).
    fn rows_of(&self, ids: &[u32], device: &B::Device) -> Tensor<B, 2> {
        match self {
            Linear::Dense { w, .. } => {
                let idx: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
                let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [ids.len()]), device);
                // 16-bit device weights: the residual stream stays f32.
                wrap::<B, 2>(w.clone())
                    .select(0, idx)
                    .cast(burn::tensor::FloatDType::F32)
            }
            Linear::Quant(q) => {
                let mut out = vec![0f32; ids.len() * q.cols];
                for (o, &id) in out.chunks_mut(q.cols).zip(ids) {
                    q.dequantize_row(id as usize, o);
                }
                Tensor::from_data(TensorData::new(out, [ids.len(), q.cols]), device)
            }
        }
    }
}

pub struct Layer<B: Backend> {
    attn_norm: Tensor<B, 1>,
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    o: Linear<B>,
    /// GPT-OSS: `o_proj`'s bias.
    o_bias: Option<Tensor<B, 1>>,
    /// GPT-OSS: one sink logit per query head ([`EngineOps::paged_attention_with_sinks`]).
    sinks: Option<Vec<f32>>,
    q_bias: Option<Tensor<B, 1>>,
    k_bias: Option<Tensor<B, 1>>,
    v_bias: Option<Tensor<B, 1>>,
    q_norm: Option<Tensor<B, 1>>,
    k_norm: Option<Tensor<B, 1>>,
    /// Gemma: the norm of the attention output, before the residual add.
    post_attn_norm: Option<Tensor<B, 1>>,
    ffn_norm: Tensor<B, 1>,
    /// Gemma: the norm of the MLP output, before the residual add.
    post_ffn_norm: Option<Tensor<B, 1>>,
    /// The feed-forward block: a gated MLP, or mixture-of-experts ([`super::moe`]).
    mlp: Mlp<B>,
    /// Sliding-window width of this layer's attention.
    window: Option<usize>,
    /// Whether RoPE uses the local (sliding-layer) base.
    local_rope: bool,
}

/// Per-step inputs the model needs besides the tokens.
pub struct StepPlan<'a> {
    pub token_ids: &'a [u32],
    pub positions: &'a [usize],
    /// Cache row (`block * block_size + offset`) of each token.
    pub slots: &'a [usize],
    pub seqs: &'a [AttnSeq<'a>],
    /// Rows of the step whose logits are wanted.
    pub logit_rows: &'a [usize],
}

/// Residual-stream snapshots of one row (for parity debugging): `embed`, `layer.N`, `final_norm`.
pub type HiddenTrace = Vec<(String, Vec<f32>)>;

pub struct Llama<B: Backend> {
    pub cfg: LlamaConfig,
    embed: Linear<B>,
    layers: Vec<Layer<B>>,
    norm: Tensor<B, 1>,
    lm_head: Linear<B>,
    inv_freq: Vec<f32>,
    /// Inverse frequencies of the sliding layers' RoPE base (Gemma 3).
    local_inv_freq: Option<Vec<f32>>,
    device: B::Device,
}

/// How the projection matrices are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightStorage {
    /// Dense f32 backend tensors (the exact-parity path).
    F32,
    /// Keep a GGUF's block quantization (fused kernels); everything else f32.
    KeepQuant,
    /// 16-bit floats (F16 or BF16), widened to f32 inside the matmul.
    Half(QuantType),
    /// Dense backend tensors of a 16-bit float type (GPU backends; everything else f32).
    Dense16(burn::tensor::FloatDType),
}

pub(super) struct Loader<'a, B: Backend> {
    src: &'a dyn WeightSource,
    bar: &'a indicatif::ProgressBar,
    keep_quant: bool,
    half: Option<QuantType>,
    dense16: Option<burn::tensor::FloatDType>,
    pub(super) device: &'a B::Device,
}

impl<B: EngineOps> Loader<'_, B> {
    pub(super) fn host(&self, name: &str, keep_quant: bool) -> Result<HostTensor, ModelError> {
        let t = self
            .src
            .get(name, keep_quant)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        self.bar.inc(1);
        Ok(t)
    }

    fn check(name: &str, got: &[usize], want: &[usize]) -> Result<(), ModelError> {
        if got != want {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: want.to_vec(),
                got: got.to_vec(),
            });
        }
        Ok(())
    }

    pub(super) fn vector(&self, name: &str, len: usize) -> Result<Tensor<B, 1>, ModelError> {
        self.vector_plus(name, len, 0.0)
    }

    /// An RMSNorm weight with `offset` added to each element (Gemma's `1 + w`).
    fn vector_plus(&self, name: &str, len: usize, offset: f32) -> Result<Tensor<B, 1>, ModelError> {
        let (shape, mut data) = self.host(name, false)?.into_f32();
        Self::check(name, &shape, &[len])?;
        if offset != 0.0 {
            data.iter_mut().for_each(|w| *w += offset);
        }
        Ok(Tensor::from_data(TensorData::new(data, [len]), self.device))
    }

    /// A fused projection whose row blocks of `parts` rows each are separate matrices
    /// (Phi-3's `qkv_proj`, `gate_up_proj`). Quantized blocks are dequantized first.
    fn split_linear<const N: usize>(
        &self,
        name: &str,
        parts: [usize; N],
        cols: usize,
    ) -> Result<[Linear<B>; N], ModelError> {
        let rows: usize = parts.iter().sum();
        let (shape, data) = self.host(name, false)?.into_f32();
        Self::check(name, &shape, &[rows, cols])?;
        let mut out = Vec::with_capacity(N);
        let mut r0 = 0;
        for n in parts {
            let part = data[r0 * cols..(r0 + n) * cols].to_vec();
            out.push(self.linear_f32(name, part, n, cols)?);
            r0 += n;
        }
        out.try_into()
            .map_err(|_| ModelError::Weights(format!("{name}: split")))
    }

    /// An f32 `[rows, cols]` matrix in this loader's storage.
    pub(super) fn linear_f32(
        &self,
        name: &str,
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<Linear<B>, ModelError> {
        if let Some(ty) = self.half {
            let q = QuantMatrix::from_f32_half(ty, rows, cols, &data)
                .map_err(|e| ModelError::Weights(format!("{name}: {e}")))?;
            return Ok(Linear::Quant(Arc::new(q)));
        }
        let w = Tensor::<B, 2>::from_data(TensorData::new(data, [rows, cols]), self.device);
        let w = match self.dense16 {
            Some(dt) => w.cast(dt),
            None => w,
        };
        Ok(Linear::Dense {
            w: unwrap(w),
            rows,
            cols,
        })
    }

    fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Tensor<B, 1>>, ModelError> {
        match self.src.get(name, false)? {
            None => Ok(None),
            Some(_) => self.vector(name, len).map(Some),
        }
    }

    pub(super) fn linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Linear<B>, ModelError> {
        let t = self.host(name, self.keep_quant)?;
        Self::check(name, &t.shape(), &[rows, cols])?;
        match t {
            HostTensor::Quant(q) if self.half.is_none() && self.dense16.is_none() => {
                Ok(Linear::Quant(Arc::new(q)))
            }
            t => self.linear_f32(name, t.into_f32().1, rows, cols),
        }
    }
}

impl<B: EngineOps> Llama<B> {
    /// Build the model from a weight source; `keep_quant` keeps block-quantized matrices
    /// quantized (the `--dtype auto` path), otherwise everything is dequantized to f32.
    pub fn load(
        cfg: LlamaConfig,
        src: &dyn WeightSource,
        keep_quant: bool,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let storage = if keep_quant {
            WeightStorage::KeepQuant
        } else {
            WeightStorage::F32
        };
        Self::load_with(cfg, src, storage, device)
    }

    /// [`Self::load`] with an explicit [`WeightStorage`] for the projection matrices (norms
    /// and biases are always f32).
    pub fn load_with(
        cfg: LlamaConfig,
        src: &dyn WeightSource,
        storage: WeightStorage,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        Self::load_with_progress(cfg, src, storage, device, &indicatif::ProgressBar::hidden())
    }

    /// [`Self::load_with`], advancing `bar` by one per tensor loaded (its length is set to
    /// the number of tensors expected).
    pub fn load_with_progress(
        cfg: LlamaConfig,
        src: &dyn WeightSource,
        storage: WeightStorage,
        device: &B::Device,
        bar: &indicatif::ProgressBar,
    ) -> Result<Self, ModelError> {
        let per_layer = 6
            + 3 * cfg.qkv_bias as usize
            + cfg.features.o_bias as usize
            + cfg.features.attention_sinks as usize
            + 2 * cfg.qk_norm as usize
            + 2 * cfg.features.sandwich_norms as usize;
        let mlps: usize = (0..cfg.num_layers)
            .map(|l| Mlp::<B>::tensor_count(cfg.moe.as_ref(), l))
            .sum();
        bar.set_length(
            (2 + cfg.num_layers * per_layer + mlps + !cfg.tie_word_embeddings as usize) as u64,
        );
        let ld = Loader::<B> {
            src,
            bar,
            keep_quant: storage == WeightStorage::KeepQuant,
            half: match storage {
                WeightStorage::Half(ty) if ty.is_half() => Some(ty),
                WeightStorage::Half(ty) => {
                    return Err(ModelError::Config(format!(
                        "{ty:?} is not a 16-bit float type"
                    )))
                }
                _ => None,
            },
            dense16: match storage {
                WeightStorage::Dense16(dt) => Some(dt),
                _ => None,
            },
            device,
        };
        let (dm, ff, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
        let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
        let f = &cfg.features;
        let norm_offset = f.norm_weight_offset;
        let embed = ld.linear("model.embed_tokens.weight", cfg.vocab_size, dm)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let bias = |s: &str, n| -> Result<Option<Tensor<B, 1>>, ModelError> {
                if cfg.qkv_bias {
                    ld.vector(&p(s), n).map(Some)
                } else {
                    ld.opt_vector(&p(s), n)
                }
            };
            let norm = |s: &str, n| ld.vector_plus(&p(s), n, norm_offset);
            // Per head (Qwen3) or over the whole projection (OLMoE).
            let qk_norm = |s: &str, whole: usize| -> Result<Option<Tensor<B, 1>>, ModelError> {
                if cfg.qk_norm {
                    norm(s, if cfg.qk_norm_whole { whole } else { d }).map(Some)
                } else {
                    Ok(None)
                }
            };
            let [q, k, v] = if f.fused_qkv {
                ld.split_linear(&p("self_attn.qkv_proj.weight"), [qd, kvd, kvd], dm)?
            } else {
                [
                    ld.linear(&p("self_attn.q_proj.weight"), qd, dm)?,
                    ld.linear(&p("self_attn.k_proj.weight"), kvd, dm)?,
                    ld.linear(&p("self_attn.v_proj.weight"), kvd, dm)?,
                ]
            };
            let mlp = if cfg.moe.as_ref().is_some_and(|m| m.is_sparse(i)) {
                Mlp::load(&ld, cfg.moe.as_ref(), i, dm, ff)?
            } else {
                let [gate, up] = if f.fused_gate_up {
                    ld.split_linear(&p("mlp.gate_up_proj.weight"), [ff, ff], dm)?
                } else {
                    [
                        ld.linear(&p("mlp.gate_proj.weight"), ff, dm)?,
                        ld.linear(&p("mlp.up_proj.weight"), ff, dm)?,
                    ]
                };
                let down = ld.linear(&p("mlp.down_proj.weight"), dm, ff)?;
                Mlp::Dense(GatedMlp { gate, up, down })
            };
            // Gemma's `post_attention_layernorm` follows attention; Llama's precedes the MLP.
            let (post_attn_norm, ffn_norm, post_ffn_norm) = if f.sandwich_norms {
                (
                    Some(norm("post_attention_layernorm.weight", dm)?),
                    norm("pre_feedforward_layernorm.weight", dm)?,
                    Some(norm("post_feedforward_layernorm.weight", dm)?),
                )
            } else {
                (None, norm("post_attention_layernorm.weight", dm)?, None)
            };
            layers.push(Layer {
                attn_norm: norm("input_layernorm.weight", dm)?,
                q,
                k,
                v,
                o: ld.linear(&p("self_attn.o_proj.weight"), dm, qd)?,
                o_bias: if f.o_bias {
                    Some(ld.vector(&p("self_attn.o_proj.bias"), dm)?)
                } else {
                    None
                },
                sinks: if f.attention_sinks {
                    let name = p("self_attn.sinks");
                    let (shape, data) = ld.host(&name, false)?.into_f32();
                    Loader::<B>::check(&name, &shape, &[cfg.num_heads])?;
                    Some(data)
                } else {
                    None
                },
                q_bias: bias("self_attn.q_proj.bias", qd)?,
                k_bias: bias("self_attn.k_proj.bias", kvd)?,
                v_bias: bias("self_attn.v_proj.bias", kvd)?,
                q_norm: qk_norm("self_attn.q_norm.weight", qd)?,
                k_norm: qk_norm("self_attn.k_norm.weight", kvd)?,
                post_attn_norm,
                ffn_norm,
                post_ffn_norm,
                mlp,
                window: cfg.layer_window(i),
                local_rope: cfg.layer_uses_local_rope(i),
            });
        }
        let norm = ld.vector_plus("model.norm.weight", dm, norm_offset)?;
        let lm_head = if cfg.tie_word_embeddings || src.get("lm_head.weight", false)?.is_none() {
            embed.clone()
        } else {
            ld.linear("lm_head.weight", cfg.vocab_size, dm)?
        };
        bar.set_length(bar.position());
        bar.finish();
        Ok(Self {
            inv_freq: cfg.inv_freq(),
            local_inv_freq: cfg.features.rope_local_theta.map(|t| cfg.inv_freq_for(t)),
            cfg,
            embed,
            layers,
            norm,
            lm_head,
            device: device.clone(),
        })
    }

    pub fn device(&self) -> &B::Device {
        &self.device
    }

    fn rms_norm(&self, x: Tensor<B, 2>, w: &Tensor<B, 1>) -> Tensor<B, 2> {
        let w = w.clone().into_primitive().tensor();
        wrap(B::rms_norm(unwrap(x), &w, self.cfg.rms_norm_eps))
    }

    /// Run one step. `k_cache`/`v_cache` hold one tensor per layer and are updated in place.
    pub fn forward(
        &self,
        plan: &StepPlan<'_>,
        k_cache: &mut [Option<FloatTensor<B>>],
        v_cache: &mut [Option<FloatTensor<B>>],
        block_size: usize,
        mut trace: Option<&mut HiddenTrace>,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.cfg;
        let t = plan.token_ids.len();
        let d = cfg.head_dim;
        let (h, kvh) = (cfg.num_heads, cfg.num_kv_heads);
        // cos/sin per token: [t, d] with HF's cat(freqs, freqs) layout.
        // YaRN scales cos/sin (HF: `emb.cos() * attention_scaling`).
        let rope_scale = cfg.rope_attention_factor();
        let tables = |inv_freq: &[f32]| {
            let mut cos = Vec::with_capacity(t * d);
            let mut sin = Vec::with_capacity(t * d);
            for &p in plan.positions {
                for _ in 0..2 {
                    for &f in inv_freq {
                        let a = p as f32 * f;
                        cos.push(a.cos() * rope_scale);
                        sin.push(a.sin() * rope_scale);
                    }
                }
            }
            (cos, sin)
        };
        let global_rope = tables(&self.inv_freq);
        let local_rope = self.local_inv_freq.as_deref().map(tables);
        let f = &cfg.features;
        let shape = AttnShape {
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
            block_size,
            scale: f.attn_scale.unwrap_or(1.0 / (d as f32).sqrt()),
            window: None,
        };
        let snap = |x: &Tensor<B, 2>, name: String, trace: &mut Option<&mut HiddenTrace>| {
            if let Some(tr) = trace.as_deref_mut() {
                let dm = cfg.hidden_size;
                let row = x.clone().slice([t - 1..t, 0..dm]).into_data();
                tr.push((name, row.to_vec::<f32>().unwrap_or_default()));
            }
        };

        let mut x = self.embed.rows_of(plan.token_ids, &self.device);
        if let Some(s) = f.embed_scale {
            x = x.mul_scalar(s);
        }
        snap(&x, "embed".into(), &mut trace);
        for (l, layer) in self.layers.iter().enumerate() {
            let hn = self.rms_norm(x.clone(), &layer.attn_norm);
            let [mut q, mut k, mut v] = Linear::forward_many([&layer.q, &layer.k, &layer.v], hn);
            if let Some(b) = &layer.q_bias {
                q = q + b.clone().unsqueeze();
            }
            if let Some(b) = &layer.k_bias {
                k = k + b.clone().unsqueeze();
            }
            if let Some(b) = &layer.v_bias {
                v = v + b.clone().unsqueeze();
            }
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                if cfg.qk_norm_whole {
                    q = self.rms_norm(q, qn);
                    k = self.rms_norm(k, kn);
                } else {
                    q = self.rms_norm(q.reshape([t * h, d]), qn).reshape([t, h * d]);
                    k = self
                        .rms_norm(k.reshape([t * kvh, d]), kn)
                        .reshape([t, kvh * d]);
                }
            }
            let (cos, sin) = match (&local_rope, layer.local_rope) {
                (Some(local), true) => local,
                _ => &global_rope,
            };
            let q: Tensor<B, 2> = wrap(B::rope(unwrap(q), h, cos, sin));
            let k: Tensor<B, 2> = wrap(B::rope(unwrap(k), kvh, cos, sin));
            let shape = AttnShape {
                window: layer.window,
                ..shape
            };
            let kc = k_cache[l]
                .take()
                .ok_or_else(|| ModelError::Weights("KV cache missing".into()))?;
            let vc = v_cache[l]
                .take()
                .ok_or_else(|| ModelError::Weights("KV cache missing".into()))?;
            let kc = B::cache_keys(kc, unwrap(k), plan.slots, &shape);
            let vc = B::reshape_and_cache(vc, unwrap(v), plan.slots);
            let attn: Tensor<B, 2> = wrap(match &layer.sinks {
                None => B::paged_attention(unwrap(q), &kc, &vc, plan.seqs, &shape),
                Some(sinks) => {
                    B::paged_attention_with_sinks(unwrap(q), &kc, &vc, plan.seqs, &shape, sinks)
                }
            });
            k_cache[l] = Some(kc);
            v_cache[l] = Some(vc);
            let mut out = layer.o.forward(attn);
            if let Some(b) = &layer.o_bias {
                out = out + b.clone().unsqueeze();
            }
            x = self.residual_add(x, out, layer.post_attn_norm.as_ref());
            let hn = self.rms_norm(x.clone(), &layer.ffn_norm);
            let ffn = self.feed_forward(layer, hn);
            x = self.residual_add(x, ffn, layer.post_ffn_norm.as_ref());
            snap(&x, format!("layer.{l}"), &mut trace);
        }
        let x = self.rms_norm(x, &self.norm);
        snap(&x, "final_norm".into(), &mut trace);
        if plan.logit_rows.is_empty() {
            return Ok(Vec::new());
        }
        let idx: Vec<i64> = plan.logit_rows.iter().map(|&r| r as i64).collect();
        let n = idx.len();
        let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [n]), &self.device);
        let logits = self.lm_head.forward(x.select(0, idx));
        assert_eq!(logits.dims()[1], self.lm_head.rows());
        let mut logits = logits
            .into_data()
            .into_vec::<f32>()
            .map_err(|e| ModelError::Weights(format!("reading logits: {e:?}")))?;
        if f.logits_divisor != 1.0 {
            logits.iter_mut().for_each(|v| *v /= f.logits_divisor);
        }
        if let Some(cap) = f.final_logit_softcap {
            logits.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
        Ok(logits)
    }

    /// The layer's MLP on the normed residual stream `x` (the one place the feed-forward
    /// runs).
    fn feed_forward(&self, layer: &Layer<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let m = match &layer.mlp {
            Mlp::Dense(m) => m,
            Mlp::Moe(moe) => return moe.forward(x),
        };
        let [g, u] = Linear::forward_many([&m.gate, &m.up], x);
        let act = match self.cfg.features.mlp {
            MlpActivation::Silu => B::swiglu(unwrap(g), unwrap(u)),
            MlpActivation::GeluTanh => B::geglu_tanh(unwrap(g), unwrap(u)),
        };
        m.down.forward(wrap(act))
    }

    /// `x + m * norm(branch)`: the block's residual add, with Gemma's post-norm and
    /// Granite's residual multiplier `m` where the architecture has them.
    fn residual_add(
        &self,
        x: Tensor<B, 2>,
        branch: Tensor<B, 2>,
        post_norm: Option<&Tensor<B, 1>>,
    ) -> Tensor<B, 2> {
        let branch = match post_norm {
            Some(w) => self.rms_norm(branch, w),
            None => branch,
        };
        let m = self.cfg.features.residual_multiplier;
        if m == 1.0 {
            x + branch
        } else {
            x + branch.mul_scalar(m)
        }
    }
}
