//! The feed-forward half of a decoder layer: the gated (SwiGLU) MLP and the
//! mixture-of-experts block (Qwen3-MoE, Mixtral, OLMoE).
//!
//! An MoE layer routes each token to `top_k` of `num_experts` gated MLPs. The router runs
//! as one matmul over the step's tokens; the routing decisions are made on the host (a
//! `[tokens, experts]` matrix), then every expert that received tokens runs once over the
//! rows routed to it (gather → gate/up/down → scale by the routing weight → scatter-add).
//! The cost therefore follows the *active* experts, never all of them per token, and an
//! expert may be any [`Linear`] (dense f32/16-bit or block-quantized).

use burn::tensor::backend::Backend;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData, TensorPrimitive};

use super::llama::{Linear, Loader};
use super::ops::EngineOps;
use super::weights::HostTensor;
use super::ModelError;

/// How router logits become per-token expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over all experts, then the top-k probabilities; `renormalize` divides them
    /// by their sum (Mixtral always; Qwen3-MoE / OLMoE when `norm_topk_prob`).
    SoftmaxTopK { renormalize: bool },
    /// Top-k on the raw logits, then a softmax over those k (GPT-OSS).
    TopKSoftmax,
}

/// Checkpoint names of the router and experts, which differ per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertNames {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.N.{w1,w3,w2}` (Mixtral).
    Mixtral,
    /// `mlp.gate`, `mlp.experts.N.{gate,up,down}_proj` (Qwen-MoE, OLMoE).
    Qwen,
    /// `mlp.router.{weight,bias}`, stacked `mlp.experts.{gate_up_proj,down_proj}[_bias]`
    /// (GPT-OSS; see [`ClampedSwiGluMlp::experts_from_stacked`]).
    GptOss,
}

/// Mixture-of-experts hyper-parameters (from `config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// Hidden width of one expert (`moe_intermediate_size`, or `intermediate_size`).
    pub expert_intermediate_size: usize,
    pub routing: Routing,
    pub names: ExpertNames,
    /// Qwen-MoE: layer `l` is sparse when `(l + 1) % decoder_sparse_step == 0`...
    pub decoder_sparse_step: usize,
    /// ...and `l` is not in `mlp_only_layers` (those keep a dense MLP of
    /// `intermediate_size`).
    pub mlp_only_layers: Vec<usize>,
    /// GPT-OSS's clamped SwiGLU `(swiglu_alpha, swiglu_limit)`.
    pub swiglu_clamp: (f32, f32),
}

impl MoeConfig {
    /// The MoE settings of an HF config of architecture `arch`, `None` for dense models.
    pub fn from_hf_json(arch: &str, v: &serde_json::Value) -> Result<Option<Self>, ModelError> {
        let names = match arch {
            "mixtral" => ExpertNames::Mixtral,
            "qwen3_moe" | "olmoe" => ExpertNames::Qwen,
            "gpt_oss" => ExpertNames::GptOss,
            _ => return Ok(None),
        };
        let int = |k: &str| v.get(k).and_then(|x| x.as_u64()).map(|x| x as usize);
        let need =
            |k: &str| int(k).ok_or_else(|| ModelError::Config(format!("config.json lacks {k}")));
        let num_experts = int("num_experts")
            .or_else(|| int("num_local_experts"))
            .ok_or_else(|| ModelError::Config("config.json lacks num_experts".into()))?;
        let expert_intermediate_size = match arch {
            "qwen3_moe" => need("moe_intermediate_size")?,
            _ => need("intermediate_size")?,
        };
        let norm_topk_prob = v.get("norm_topk_prob").and_then(|x| x.as_bool());
        let routing = match names {
            ExpertNames::GptOss => Routing::TopKSoftmax,
            _ => Routing::SoftmaxTopK {
                // transformers' Mixtral router always renormalises; the others follow the
                // flag (default false in their config classes).
                renormalize: arch == "mixtral" || norm_topk_prob.unwrap_or(false),
            },
        };
        let float = |k: &str, d: f64| v.get(k).and_then(|x| x.as_f64()).unwrap_or(d) as f32;
        let mlp_only_layers = v
            .get("mlp_only_layers")
            .and_then(|a| a.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_u64()).map(|x| x as usize))
            .into_iter()
            .flatten()
            .collect();
        let cfg = Self {
            num_experts,
            top_k: need("num_experts_per_tok")?,
            expert_intermediate_size,
            routing,
            names,
            decoder_sparse_step: int("decoder_sparse_step").unwrap_or(1),
            mlp_only_layers,
            swiglu_clamp: (float("swiglu_alpha", 1.702), float("swiglu_limit", 7.0)),
        };
        cfg.validate()?;
        Ok(Some(cfg))
    }

    /// The MoE settings of a GGUF (llama.cpp's `{arch}.expert_count` & co.; Mixtral is
    /// converted as `llama` with experts), `None` for dense models.
    pub fn from_gguf(
        arch: &str,
        g: &aphro_core::gguf::GgufFile,
    ) -> Result<Option<Self>, ModelError> {
        let int =
            |k: &str| -> Option<usize> { g.arch_i64(k).ok().and_then(|v| usize::try_from(v).ok()) };
        let num_experts = int("expert_count").unwrap_or(0);
        if num_experts == 0 {
            return Ok(None);
        }
        let need =
            |k: &str| int(k).ok_or_else(|| ModelError::Config(format!("GGUF lacks {arch}.{k}")));
        // llama.cpp renormalises the chosen weights for Mixtral and Qwen3-MoE, not OLMoE,
        // unless the file says otherwise.
        let renormalize = g
            .get(&format!("{arch}.expert_weights_norm"))
            .and_then(|v| v.as_bool())
            .unwrap_or(arch != "olmoe");
        let cfg = Self {
            num_experts,
            top_k: need("expert_used_count")?,
            expert_intermediate_size: int("expert_feed_forward_length")
                .map_or_else(|| need("feed_forward_length"), Ok)?,
            routing: Routing::SoftmaxTopK { renormalize },
            // Only the HF names differ; both map to the same GGUF tensors.
            names: if arch == "llama" {
                ExpertNames::Mixtral
            } else {
                ExpertNames::Qwen
            },
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            swiglu_clamp: (1.702, 7.0),
        };
        cfg.validate()?;
        Ok(Some(cfg))
    }

    fn validate(&self) -> Result<(), ModelError> {
        if self.num_experts == 0 || self.top_k == 0 || self.top_k > self.num_experts {
            return Err(ModelError::Config(format!(
                "num_experts_per_tok {} must be in 1..={} (num_experts)",
                self.top_k, self.num_experts
            )));
        }
        if self.decoder_sparse_step == 0 || self.expert_intermediate_size == 0 {
            return Err(ModelError::Config(
                "decoder_sparse_step and the expert width must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Whether layer `l` has the MoE block (else a dense MLP).
    pub fn is_sparse(&self, l: usize) -> bool {
        !self.mlp_only_layers.contains(&l) && (l + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// Top-k of one token's router logits as `(expert, weight)`, best first. Ties go to the
/// lower expert index (as `torch.topk` orders equal values on the CPU).
pub fn route(logits: &[f32], top_k: usize, routing: Routing) -> Vec<(usize, f32)> {
    let softmax = |xs: &[f32]| -> Vec<f32> {
        let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = xs.iter().map(|&x| (x - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        e.into_iter().map(|x| x / sum).collect()
    };
    let top = |scores: &[f32]| -> Vec<usize> {
        let mut idx: Vec<usize> = (0..scores.len()).collect();
        // Stable sort by descending score: equal scores keep ascending index order.
        idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        idx.truncate(top_k);
        idx
    };
    match routing {
        Routing::SoftmaxTopK { renormalize } => {
            let p = softmax(logits);
            let chosen = top(&p);
            let mut w: Vec<f32> = chosen.iter().map(|&e| p[e]).collect();
            if renormalize {
                let sum: f32 = w.iter().sum();
                w.iter_mut().for_each(|x| *x /= sum);
            }
            chosen.into_iter().zip(w).collect()
        }
        Routing::TopKSoftmax => {
            let chosen = top(logits);
            let picked: Vec<f32> = chosen.iter().map(|&e| logits[e]).collect();
            chosen.into_iter().zip(softmax(&picked)).collect()
        }
    }
}

/// `down(silu(gate(x)) * up(x))`.
pub struct GatedMlp<B: Backend> {
    pub gate: Linear<B>,
    pub up: Linear<B>,
    pub down: Linear<B>,
}

impl<B: EngineOps> GatedMlp<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [g, u] = Linear::forward_many([&self.gate, &self.up], x);
        let act = B::swiglu(g.into_primitive().tensor(), u.into_primitive().tensor());
        self.down
            .forward(Tensor::from_primitive(TensorPrimitive::Float(act)))
    }

    fn load(
        ld: &Loader<'_, B>,
        [gate, up, down]: [&str; 3],
        hidden: usize,
        inter: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            gate: ld.linear(gate, inter, hidden)?,
            up: ld.linear(up, inter, hidden)?,
            down: ld.linear(down, hidden, inter)?,
        })
    }
}

/// GPT-OSS's expert: biased gate/up/down projections and a clamped SwiGLU,
/// `down((clamp(up, ±limit) + 1) * g * sigmoid(alpha * g)) + b` with `g = min(gate, limit)`.
pub struct ClampedSwiGluMlp<B: Backend> {
    pub gate: Linear<B>,
    pub up: Linear<B>,
    pub down: Linear<B>,
    pub gate_bias: Tensor<B, 1>,
    pub up_bias: Tensor<B, 1>,
    pub down_bias: Tensor<B, 1>,
    pub alpha: f32,
    pub limit: f32,
}

impl<B: EngineOps> ClampedSwiGluMlp<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [g, u] = Linear::forward_many([&self.gate, &self.up], x);
        let g = (g + self.gate_bias.clone().unsqueeze()).clamp_max(self.limit);
        let u = (u + self.up_bias.clone().unsqueeze()).clamp(-self.limit, self.limit);
        let glu = g.clone() * burn::tensor::activation::sigmoid(g.mul_scalar(self.alpha));
        self.down.forward(u.add_scalar(1.0) * glu) + self.down_bias.clone().unsqueeze()
    }

    /// The experts of one layer from GPT-OSS's checkpoint tensors, `[in, out]` oriented:
    /// `gate_up` `[E, hidden, 2I]` with gate and up *interleaved* along the last axis
    /// (columns `0::2` and `1::2`), `gate_up_bias` `[E, 2I]`, `down` `[E, I, hidden]`,
    /// `down_bias` `[E, hidden]`. `linear` turns an `[out, in]` host matrix into a
    /// [`Linear`].
    #[allow(clippy::too_many_arguments)]
    pub fn experts_from_stacked(
        gate_up: &[f32],
        gate_up_bias: &[f32],
        down: &[f32],
        down_bias: &[f32],
        (experts, hidden, inter): (usize, usize, usize),
        (alpha, limit): (f32, f32),
        device: &B::Device,
        linear: &dyn Fn(HostTensor, usize, usize) -> Result<Linear<B>, ModelError>,
    ) -> Result<Vec<Self>, ModelError> {
        let sizes = [
            (gate_up.len(), experts * hidden * 2 * inter),
            (gate_up_bias.len(), experts * 2 * inter),
            (down.len(), experts * inter * hidden),
            (down_bias.len(), experts * hidden),
        ];
        if sizes.iter().any(|(got, want)| got != want) {
            return Err(ModelError::Weights(format!(
                "GPT-OSS expert tensors do not fit {experts} experts of {hidden}x{inter}"
            )));
        }
        let host = |data: Vec<f32>, rows, cols| HostTensor::F32 {
            shape: vec![rows, cols],
            data,
        };
        let vector = |v: Vec<f32>| {
            let n = v.len();
            Tensor::<B, 1>::from_data(TensorData::new(v, [n]), device)
        };
        (0..experts)
            .map(|e| {
                let gu = &gate_up[e * hidden * 2 * inter..(e + 1) * hidden * 2 * inter];
                let dn = &down[e * inter * hidden..(e + 1) * inter * hidden];
                let gub = &gate_up_bias[e * 2 * inter..(e + 1) * 2 * inter];
                // `[out, in]` rows: output column `2i + parity` of the `[in, out]` matrix.
                let half = |parity: usize| -> Vec<f32> {
                    (0..inter)
                        .flat_map(|i| (0..hidden).map(move |h| gu[h * 2 * inter + 2 * i + parity]))
                        .collect()
                };
                let down_t: Vec<f32> = (0..hidden)
                    .flat_map(|h| (0..inter).map(move |i| dn[i * hidden + h]))
                    .collect();
                Ok(Self {
                    gate: linear(host(half(0), inter, hidden), inter, hidden)?,
                    up: linear(host(half(1), inter, hidden), inter, hidden)?,
                    down: linear(host(down_t, hidden, inter), hidden, inter)?,
                    gate_bias: vector(gub.iter().step_by(2).copied().collect()),
                    up_bias: vector(gub.iter().skip(1).step_by(2).copied().collect()),
                    down_bias: vector(down_bias[e * hidden..(e + 1) * hidden].to_vec()),
                    alpha,
                    limit,
                })
            })
            .collect()
    }
}

/// One expert of an MoE block.
pub enum Expert<B: Backend> {
    Gated(GatedMlp<B>),
    ClampedSwiGlu(ClampedSwiGluMlp<B>),
}

impl<B: EngineOps> Expert<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Expert::Gated(m) => m.forward(x),
            Expert::ClampedSwiGlu(m) => m.forward(x),
        }
    }
}

/// Router plus experts of one MoE layer.
pub struct MoeBlock<B: Backend> {
    router: Linear<B>,
    /// GPT-OSS: the router's bias, added to its logits.
    router_bias: Option<Tensor<B, 1>>,
    experts: Vec<Expert<B>>,
    top_k: usize,
    routing: Routing,
}

impl<B: EngineOps> MoeBlock<B> {
    pub fn new(
        router: Linear<B>,
        router_bias: Option<Tensor<B, 1>>,
        experts: Vec<Expert<B>>,
        top_k: usize,
        routing: Routing,
    ) -> Self {
        Self {
            router,
            router_bias,
            experts,
            top_k,
            routing,
        }
    }

    /// `(expert, token rows, weights)` for every expert that received at least one token,
    /// in ascending expert order.
    fn groups(&self, logits: &[f32], tokens: usize) -> Vec<(usize, Vec<i64>, Vec<f32>)> {
        let n = self.experts.len();
        let mut rows: Vec<(Vec<i64>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); n];
        for (t, row) in logits.chunks_exact(n).take(tokens).enumerate() {
            for (e, w) in route(row, self.top_k, self.routing) {
                rows[e].0.push(t as i64);
                rows[e].1.push(w);
            }
        }
        rows.into_iter()
            .enumerate()
            .filter(|(_, (r, _))| !r.is_empty())
            .map(|(e, (r, w))| (e, r, w))
            .collect()
    }

    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [tokens, hidden] = x.dims();
        let device = x.device();
        let mut logits = self.router.forward(x.clone());
        if let Some(b) = &self.router_bias {
            logits = logits + b.clone().unsqueeze();
        }
        let logits = logits
            .cast(burn::tensor::FloatDType::F32)
            .into_data()
            .to_vec::<f32>()
            .unwrap_or_default();
        let mut out = Tensor::<B, 2>::zeros([tokens, hidden], &device);
        // Summed in ascending expert order, as transformers' expert loop does.
        for (e, rows, weights) in self.groups(&logits, tokens) {
            let n = rows.len();
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n]), &device);
            let w = Tensor::<B, 2>::from_data(TensorData::new(weights, [n, 1]), &device);
            let y = self.experts[e].forward(x.clone().select(0, idx.clone())) * w;
            out = out.select_assign(0, idx, y, IndexingUpdateOp::Add);
        }
        out
    }
}

/// A layer's feed-forward block.
pub enum Mlp<B: Backend> {
    Dense(GatedMlp<B>),
    Moe(MoeBlock<B>),
}

impl<B: EngineOps> Mlp<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Mlp::Dense(m) => m.forward(x),
            Mlp::Moe(m) => m.forward(x),
        }
    }

    /// Number of tensors [`Self::load`] reads for layer `l` (for the progress bar).
    pub fn tensor_count(moe: Option<&MoeConfig>, l: usize) -> usize {
        match moe {
            Some(m) if m.names == ExpertNames::GptOss && m.is_sparse(l) => 6,
            Some(m) if m.is_sparse(l) => 1 + 3 * m.num_experts,
            _ => 3,
        }
    }

    /// Layer `l`'s feed-forward weights (`hidden` wide; `intermediate` for a dense MLP).
    pub(super) fn load(
        ld: &Loader<'_, B>,
        moe: Option<&MoeConfig>,
        l: usize,
        hidden: usize,
        intermediate: usize,
    ) -> Result<Self, ModelError> {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let Some(m) = moe.filter(|m| m.is_sparse(l)) else {
            let names = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
                .map(|s| p(&format!("{s}.weight")));
            let [g, u, d] = [&names[0], &names[1], &names[2]].map(String::as_str);
            return GatedMlp::load(ld, [g, u, d], hidden, intermediate).map(Mlp::Dense);
        };
        let (router, expert) = match m.names {
            ExpertNames::Mixtral => ("block_sparse_moe.gate", "block_sparse_moe.experts"),
            ExpertNames::Qwen => ("mlp.gate", "mlp.experts"),
            ExpertNames::GptOss => return Self::load_gpt_oss(ld, m, l, hidden),
        };
        let [gate, up, down] = match m.names {
            ExpertNames::Mixtral => ["w1", "w3", "w2"],
            _ => ["gate_proj", "up_proj", "down_proj"],
        };
        let router = ld.linear(&p(&format!("{router}.weight")), m.num_experts, hidden)?;
        let experts = (0..m.num_experts)
            .map(|e| {
                let n = |s: &str| p(&format!("{expert}.{e}.{s}.weight"));
                let (g, u, d) = (n(gate), n(up), n(down));
                GatedMlp::load(ld, [&g, &u, &d], hidden, m.expert_intermediate_size)
                    .map(Expert::Gated)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Mlp::Moe(MoeBlock::new(
            router, None, experts, m.top_k, m.routing,
        )))
    }

    /// GPT-OSS's router (with bias) and stacked experts of layer `l`.
    fn load_gpt_oss(
        ld: &Loader<'_, B>,
        m: &MoeConfig,
        l: usize,
        hidden: usize,
    ) -> Result<Self, ModelError> {
        let p = |s: &str| format!("model.layers.{l}.mlp.{s}");
        let (e, inter) = (m.num_experts, m.expert_intermediate_size);
        let router = ld.linear(&p("router.weight"), e, hidden)?;
        let router_bias = ld.vector(&p("router.bias"), e)?;
        let stacked = |name: &str, shape: &[usize]| -> Result<Vec<f32>, ModelError> {
            let (got, data) = ld.host(&p(name), false)?.into_f32();
            if got != shape {
                return Err(ModelError::ShapeMismatch {
                    name: p(name),
                    expected: shape.to_vec(),
                    got,
                });
            }
            Ok(data)
        };
        let gate_up = stacked("experts.gate_up_proj", &[e, hidden, 2 * inter])?;
        let gate_up_bias = stacked("experts.gate_up_proj_bias", &[e, 2 * inter])?;
        let down = stacked("experts.down_proj", &[e, inter, hidden])?;
        let down_bias = stacked("experts.down_proj_bias", &[e, hidden])?;
        let name = p("experts");
        let experts = ClampedSwiGluMlp::experts_from_stacked(
            &gate_up,
            &gate_up_bias,
            &down,
            &down_bias,
            (e, hidden, inter),
            m.swiglu_clamp,
            ld.device,
            &|t: HostTensor, rows: usize, cols: usize| {
                ld.linear_f32(&name, t.into_f32().1, rows, cols)
            },
        )?;
        let experts = experts.into_iter().map(Expert::ClampedSwiGlu).collect();
        Ok(Mlp::Moe(MoeBlock::new(
            router,
            Some(router_bias),
            experts,
            m.top_k,
            m.routing,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: &[(usize, f32)], want: &[(usize, f32)]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for ((ge, gw), (we, ww)) in got.iter().zip(want) {
            assert_eq!(ge, we, "{got:?} vs {want:?}");
            assert!((gw - ww).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    /// Hand-checked: logits [ln 1, ln 2, ln 3, ln 4] → softmax [0.1, 0.2, 0.3, 0.4].
    #[test]
    fn softmax_then_top_k_with_and_without_renormalisation() {
        let l: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
        let raw = route(&l, 2, Routing::SoftmaxTopK { renormalize: false });
        close(&raw, &[(3, 0.4), (2, 0.3)]);
        let norm = route(&l, 2, Routing::SoftmaxTopK { renormalize: true });
        close(&norm, &[(3, 0.4 / 0.7), (2, 0.3 / 0.7)]);
        // k = all experts, renormalised: the plain softmax.
        let all = route(&l, 4, Routing::SoftmaxTopK { renormalize: true });
        close(&all, &[(3, 0.4), (2, 0.3), (1, 0.2), (0, 0.1)]);
    }

    /// GPT-OSS: top-k on raw logits, softmax over the chosen two only.
    #[test]
    fn top_k_then_softmax() {
        let l = [0.5f32, 3.0, -1.0, 3.0 + 2f32.ln()];
        // exp(3 + ln2) : exp(3) = 2 : 1.
        close(
            &route(&l, 2, Routing::TopKSoftmax),
            &[(3, 2.0 / 3.0), (1, 1.0 / 3.0)],
        );
    }

    /// Equal scores go to the lower expert index, as torch.topk returns them.
    #[test]
    fn ties_prefer_the_lower_expert() {
        let l = [1.0f32, 2.0, 2.0, 0.0, 2.0];
        let r = route(&l, 2, Routing::SoftmaxTopK { renormalize: true });
        close(&r, &[(1, 0.5), (2, 0.5)]);
        let r = route(&l, 1, Routing::TopKSoftmax);
        close(&r, &[(1, 1.0)]);
    }

    #[test]
    fn sparse_layers_follow_step_and_mlp_only_layers() {
        let v = serde_json::json!({
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
            "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": true
        });
        let m = MoeConfig::from_hf_json("qwen3_moe", &v)
            .expect("valid")
            .expect("moe");
        let sparse: Vec<bool> = (0..6).map(|l| m.is_sparse(l)).collect();
        assert_eq!(sparse, [false, true, false, false, false, true]);
        assert_eq!(m.routing, Routing::SoftmaxTopK { renormalize: true });
        let bad = serde_json::json!({"num_local_experts": 2, "num_experts_per_tok": 3,
            "intermediate_size": 8});
        assert!(MoeConfig::from_hf_json("mixtral", &bad).is_err());
        assert!(MoeConfig::from_hf_json("llama", &bad)
            .expect("dense")
            .is_none());
    }

    /// The grouped execution equals a per-token loop over each token's chosen experts.
    #[test]
    fn grouped_experts_equal_a_per_token_reference() {
        use burn::backend::flex::{Flex, FlexDevice};
        let dev = FlexDevice;
        let (hidden, inter, n_exp, tokens) = (6usize, 5usize, 4usize, 7usize);
        let mut seed = 9u64;
        let mut dense = |rows: usize, cols: usize| -> (Linear<Flex>, Vec<f32>) {
            let w = crate::test_support::rand(rows * cols, &mut seed);
            let t = Tensor::<Flex, 2>::from_data(TensorData::new(w.clone(), [rows, cols]), &dev);
            (
                Linear::Dense {
                    w: t.into_primitive().tensor(),
                    rows,
                    cols,
                },
                w,
            )
        };
        let (router, rw) = dense(n_exp, hidden);
        let mut host = Vec::new();
        let experts: Vec<Expert<Flex>> = (0..n_exp)
            .map(|_| {
                let (gate, gw) = dense(inter, hidden);
                let (up, uw) = dense(inter, hidden);
                let (down, dw) = dense(hidden, inter);
                host.push((gw, uw, dw));
                Expert::Gated(GatedMlp { gate, up, down })
            })
            .collect();
        let routing = Routing::SoftmaxTopK { renormalize: false };
        let block = MoeBlock::new(router, None, experts, 2, routing);
        let x = crate::test_support::rand(tokens * hidden, &mut seed);
        let got = block
            .forward(Tensor::from_data(
                TensorData::new(x.clone(), [tokens, hidden]),
                &dev,
            ))
            .into_data()
            .to_vec::<f32>()
            .expect("f32");
        let mv = |w: &[f32], v: &[f32], rows: usize| -> Vec<f32> {
            (0..rows)
                .map(|r| {
                    w[r * v.len()..(r + 1) * v.len()]
                        .iter()
                        .zip(v)
                        .map(|(a, b)| a * b)
                        .sum()
                })
                .collect()
        };
        for t in 0..tokens {
            let xt = &x[t * hidden..(t + 1) * hidden];
            let mut want = vec![0f32; hidden];
            for (e, w) in route(&mv(&rw, xt, n_exp), 2, routing) {
                let (gw, uw, dw) = &host[e];
                let g = mv(gw, xt, inter);
                let u = mv(uw, xt, inter);
                let a: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                for (o, y) in want.iter_mut().zip(mv(dw, &a, hidden)) {
                    *o += w * y;
                }
            }
            for (a, b) in got[t * hidden..(t + 1) * hidden].iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "token {t}: {a} vs {b}");
            }
        }
    }

    /// GPT-OSS experts from the stacked `[in, out]` tensors with interleaved gate/up, routed
    /// top-k-then-softmax with a router bias, equal a per-token reference that reads the
    /// checkpoint layout directly.
    #[test]
    fn gpt_oss_experts_equal_a_reference_on_the_checkpoint_layout() {
        use burn::backend::flex::{Flex, FlexDevice};
        let dev = FlexDevice;
        let (e_n, hidden, inter, tokens, k) = (3usize, 4usize, 3usize, 5usize, 2usize);
        let (alpha, limit) = (1.702f32, 7.0f32);
        let mut seed = 21u64;
        let mut rnd = |n: usize, s: f32| -> Vec<f32> {
            crate::test_support::rand(n, &mut seed)
                .into_iter()
                .map(|v| v * s)
                .collect()
        };
        // Large weights so both clamps bite.
        let gate_up = rnd(e_n * hidden * 2 * inter, 40.0);
        let gub = rnd(e_n * 2 * inter, 1.0);
        let down = rnd(e_n * inter * hidden, 2.0);
        let db = rnd(e_n * hidden, 1.0);
        let rw = rnd(e_n * hidden, 2.0);
        let rb = rnd(e_n, 1.0);
        let x = rnd(tokens * hidden, 1.0);
        let dense = |t: HostTensor, rows: usize, cols: usize| -> Result<Linear<Flex>, ModelError> {
            let (_, data) = t.into_f32();
            let w = Tensor::<Flex, 2>::from_data(TensorData::new(data, [rows, cols]), &dev);
            Ok(Linear::Dense {
                w: w.into_primitive().tensor(),
                rows,
                cols,
            })
        };
        let experts = ClampedSwiGluMlp::<Flex>::experts_from_stacked(
            &gate_up,
            &gub,
            &down,
            &db,
            (e_n, hidden, inter),
            (alpha, limit),
            &dev,
            &dense,
        )
        .expect("experts");
        let router = dense(
            HostTensor::F32 {
                shape: vec![e_n, hidden],
                data: rw.clone(),
            },
            e_n,
            hidden,
        )
        .expect("router");
        let bias = Tensor::<Flex, 1>::from_data(TensorData::new(rb.clone(), [e_n]), &dev);
        let experts = experts.into_iter().map(Expert::ClampedSwiGlu).collect();
        let block = MoeBlock::new(router, Some(bias), experts, k, Routing::TopKSoftmax);
        let got = block
            .forward(Tensor::from_data(
                TensorData::new(x.clone(), [tokens, hidden]),
                &dev,
            ))
            .into_data()
            .to_vec::<f32>()
            .expect("f32");
        let mut clamped = 0;
        for t in 0..tokens {
            let xt = &x[t * hidden..(t + 1) * hidden];
            let logits: Vec<f32> = (0..e_n)
                .map(|e| rb[e] + (0..hidden).map(|h| rw[e * hidden + h] * xt[h]).sum::<f32>())
                .collect();
            let mut want = vec![0f32; hidden];
            for (e, w) in route(&logits, k, Routing::TopKSoftmax) {
                // gu = x @ gate_up[e] + b; gate = gu[0::2], up = gu[1::2].
                let gu: Vec<f32> = (0..2 * inter)
                    .map(|c| {
                        gub[e * 2 * inter + c]
                            + (0..hidden)
                                .map(|h| {
                                    xt[h] * gate_up[e * hidden * 2 * inter + h * 2 * inter + c]
                                })
                                .sum::<f32>()
                    })
                    .collect();
                let act: Vec<f32> = (0..inter)
                    .map(|i| {
                        let (g, u) = (gu[2 * i], gu[2 * i + 1]);
                        clamped += (g > limit || u.abs() > limit) as usize;
                        let g = g.min(limit);
                        let u = u.clamp(-limit, limit);
                        (u + 1.0) * g / (1.0 + (-alpha * g).exp())
                    })
                    .collect();
                for (h, o) in want.iter_mut().enumerate() {
                    let y = db[e * hidden + h]
                        + (0..inter)
                            .map(|i| act[i] * down[e * inter * hidden + i * hidden + h])
                            .sum::<f32>();
                    *o += w * y;
                }
            }
            for (a, b) in got[t * hidden..(t + 1) * hidden].iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "token {t}: {a} vs {b}"
                );
            }
        }
        assert!(clamped > 0, "the test weights never reach the clamp");
    }
}
