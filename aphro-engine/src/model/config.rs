//! Hyper-parameters of a Llama-family model, from GGUF metadata or an HF `config.json`.

use aphro_core::gguf::GgufFile;

use super::moe::MoeConfig;
use super::ModelError;

#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// The registry name ([`super::arch::Architecture::name`]): `llama`, `gemma3`, ...
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    /// RoPE frequency scaling (`rope_scaling` / `rope_parameters`), if any.
    pub rope_scaling: Option<RopeScaling>,
    pub rms_norm_eps: f32,
    pub max_position: usize,
    pub tie_word_embeddings: bool,
    /// Qwen2: biases on the Q/K/V projections.
    pub qkv_bias: bool,
    /// Qwen3: per-head RMSNorm on Q and K before RoPE.
    pub qk_norm: bool,
    /// OLMoE: the Q/K RMSNorm spans the whole projection (all heads), not one head.
    pub qk_norm_whole: bool,
    /// Mixture-of-experts feed-forward (Qwen3-MoE, Mixtral, OLMoE); `None`: dense MLP.
    pub moe: Option<MoeConfig>,
    pub eos_token_ids: Vec<u32>,
    /// Where the block departs from Llama's (set by the architecture's registry entry).
    pub features: ArchFeatures,
}

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MlpActivation {
    /// SwiGLU: `silu(gate) * up`.
    #[default]
    Silu,
    /// GeGLU with PyTorch's tanh-approximate GELU (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// The per-architecture departures from the Llama block; the default is Llama.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchFeatures {
    /// Sliding-window attention width (keys `p - w < k <= p`), on the layers of
    /// [`Self::sliding_layers`].
    pub sliding_window: Option<usize>,
    /// Which layers use the window; empty: all of them.
    pub sliding_layers: Vec<bool>,
    /// RoPE base of the sliding-window layers when it differs from `rope_theta` (Gemma 3).
    pub rope_local_theta: Option<f32>,
    /// Added to every RMSNorm weight at load (Gemma's `x * (1 + w)` checkpoints).
    pub norm_weight_offset: f32,
    /// Norms after attention and after the MLP too, before each residual add (Gemma).
    pub sandwich_norms: bool,
    /// Embeddings are multiplied by this (Gemma: `sqrt(hidden)`, Granite's multiplier).
    pub embed_scale: Option<f32>,
    /// Attention score scale instead of `1/sqrt(head_dim)`.
    pub attn_scale: Option<f32>,
    pub mlp: MlpActivation,
    /// Logits become `cap * tanh(logits / cap)`.
    pub final_logit_softcap: Option<f32>,
    /// Each residual branch is scaled by this before the add (Granite).
    pub residual_multiplier: f32,
    /// Logits are divided by this (Granite's `logits_scaling`).
    pub logits_divisor: f32,
    /// One `qkv_proj` matrix with rows `[q; k; v]` (Phi-3).
    pub fused_qkv: bool,
    /// One `gate_up_proj` matrix with rows `[gate; up]` (Phi-3).
    pub fused_gate_up: bool,
    /// `o_proj` has a bias (GPT-OSS).
    pub o_bias: bool,
    /// One learned logit per head in every softmax denominator (GPT-OSS `self_attn.sinks`).
    pub attention_sinks: bool,
}

impl Default for ArchFeatures {
    fn default() -> Self {
        Self {
            sliding_window: None,
            sliding_layers: Vec::new(),
            rope_local_theta: None,
            norm_weight_offset: 0.0,
            sandwich_norms: false,
            embed_scale: None,
            attn_scale: None,
            mlp: MlpActivation::Silu,
            final_logit_softcap: None,
            residual_multiplier: 1.0,
            logits_divisor: 1.0,
            fused_qkv: false,
            fused_gate_up: false,
            o_bias: false,
            attention_sinks: false,
        }
    }
}

/// The RoPE scaling types the engine implements (transformers' `ROPE_INIT_FUNCTIONS`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// `rope_type: llama3` (Llama 3.1+).
    Llama3(Llama3RopeScaling),
    /// `rope_type: linear`: every frequency divided by `factor` (position interpolation).
    Linear { factor: f32 },
    /// `rope_type: yarn`.
    Yarn(YarnRopeScaling),
}

/// `rope_scaling: {"rope_type": "llama3", ...}` (Llama 3.1+).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position: f32,
}

/// `rope_scaling: {"rope_type": "yarn", ...}` as transformers' `_compute_yarn_parameters`:
/// frequencies blend interpolation (`/ factor`) and extrapolation over a linear ramp between
/// the correction dimensions of `beta_fast` and `beta_slow` rotations, and cos/sin are
/// multiplied by `attention_factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnRopeScaling {
    pub factor: f64,
    pub original_max_position: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// Round the ramp's ends to whole dimensions (HF's default `true`).
    pub truncate: bool,
    pub attention_factor: f64,
}

impl YarnRopeScaling {
    /// From the `rope_scaling` object; `max_position` is `max_position_embeddings` (the
    /// factor's fallback, as HF).
    fn from_hf(s: &serde_json::Value, max_position: usize) -> Result<Self, ModelError> {
        let f = |k: &str| s.get(k).and_then(|x| x.as_f64());
        let original_max_position = f("original_max_position_embeddings").ok_or_else(|| {
            ModelError::Config("yarn rope_scaling lacks original_max_position_embeddings".into())
        })?;
        let factor = f("factor").unwrap_or(max_position as f64 / original_max_position);
        if f("partial_rotary_factor").is_some_and(|p| p != 1.0) {
            return Err(ModelError::Unsupported(
                "yarn with partial_rotary_factor != 1".into(),
            ));
        }
        let mscale = |scale: f64, m: f64| {
            if scale <= 1.0 {
                1.0
            } else {
                0.1 * m * scale.ln() + 1.0
            }
        };
        let attention_factor = match (f("attention_factor"), f("mscale"), f("mscale_all_dim")) {
            (Some(a), _, _) => a,
            (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                mscale(factor, m) / mscale(factor, all)
            }
            _ => mscale(factor, 1.0),
        };
        // HF: `get("beta_fast") or 32` (a 0 takes the default too).
        let nonzero = |k: &str, d: f64| f(k).filter(|&v| v != 0.0).unwrap_or(d);
        Ok(Self {
            factor,
            original_max_position,
            beta_fast: nonzero("beta_fast", 32.0),
            beta_slow: nonzero("beta_slow", 1.0),
            truncate: s.get("truncate").and_then(|t| t.as_bool()).unwrap_or(true),
            attention_factor,
        })
    }

    /// The inverse frequencies for `head_dim` `d` and base `theta`, in f32 like HF.
    fn inv_freq(&self, theta: f32, d: usize) -> Vec<f32> {
        let base = theta as f64;
        let correction_dim = |rotations: f64| {
            d as f64 * (self.original_max_position / (rotations * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let (mut low, mut high) = (
            correction_dim(self.beta_fast),
            correction_dim(self.beta_slow),
        );
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(d as f64 - 1.0));
        if low == high {
            high += 0.001;
        }
        (0..d / 2)
            .map(|i| {
                let pos_freq = theta.powf((2 * i) as f32 / d as f32);
                let extrapolation = 1.0 / pos_freq;
                let interpolation = 1.0 / (self.factor as f32 * pos_freq);
                let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                let extrapolation_factor = 1.0 - ramp;
                interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
            })
            .collect()
    }
}

impl LlamaConfig {
    /// Whether llama.cpp's converter permuted the Q/K rows of this architecture (it does so
    /// for `llama`/`mistral` so ggml can use interleaved RoPE pairs).
    pub fn gguf_qk_permuted(&self) -> bool {
        super::arch::by_name(&self.architecture).is_some_and(|a| a.gguf_qk_permuted)
    }

    /// The sliding window of layer `l`, if it has one.
    pub fn layer_window(&self, l: usize) -> Option<usize> {
        let f = &self.features;
        f.sliding_window.filter(|_| {
            f.sliding_layers
                .get(l)
                .copied()
                .unwrap_or(f.sliding_layers.is_empty())
        })
    }

    /// Whether layer `l` uses [`ArchFeatures::rope_local_theta`].
    pub fn layer_uses_local_rope(&self, l: usize) -> bool {
        self.features.rope_local_theta.is_some() && self.layer_window(l).is_some()
    }

    pub fn from_gguf(g: &GgufFile) -> Result<Self, ModelError> {
        let arch = g.architecture()?.to_string();
        let entry = super::arch::for_gguf(&arch)?;
        let moe = MoeConfig::from_gguf(&arch, g)?;
        let int = |k: &str| -> Result<usize, ModelError> {
            let v = g.arch_i64(k)?;
            usize::try_from(v).map_err(|_| ModelError::Config(format!("{arch}.{k} = {v}")))
        };
        let hidden_size = int("embedding_length")?;
        let num_heads = int("attention.head_count")?;
        let num_kv_heads = int("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = int("attention.key_length").unwrap_or(hidden_size / num_heads.max(1));
        let vocab_size = match int("vocab_size") {
            Ok(v) => v,
            Err(_) => g.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let eos = g
            .get_i64("tokenizer.ggml.eos_token_id")
            .ok()
            .and_then(|v| u32::try_from(v).ok());
        let cfg = Self {
            vocab_size,
            hidden_size,
            // An all-MoE GGUF may lack the dense width.
            intermediate_size: match (int("feed_forward_length"), &moe) {
                (Ok(v), _) => v,
                (Err(_), Some(m)) => m.expert_intermediate_size,
                (Err(e), None) => return Err(e),
            },
            num_layers: int("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta: g
                .get_f64(&format!("{arch}.rope.freq_base"))
                .unwrap_or(10000.0) as f32,
            rope_scaling: None,
            rms_norm_eps: g
                .get_f64(&format!("{arch}.attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f32,
            max_position: int("context_length").unwrap_or(4096),
            tie_word_embeddings: g.tensor_info("output.weight").is_none(),
            qkv_bias: false,
            qk_norm: false,
            qk_norm_whole: false,
            moe,
            eos_token_ids: eos.into_iter().collect(),
            architecture: arch,
            features: ArchFeatures::default(),
        };
        let mut cfg = cfg;
        if let Some(configure) = entry.from_gguf {
            configure(g, &mut cfg)?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// From an HF `config.json` value.
    pub fn from_hf_json(v: &serde_json::Value) -> Result<Self, ModelError> {
        let entry = super::arch::for_hf(v)?;
        let int = |k: &str| -> Option<usize> { v.get(k)?.as_u64().map(|x| x as usize) };
        let need =
            |k: &str| int(k).ok_or_else(|| ModelError::Config(format!("config.json lacks {k}")));
        let hidden_size = need("hidden_size")?;
        let num_heads = need("num_attention_heads")?;
        let num_kv_heads = int("num_key_value_heads").unwrap_or(num_heads);
        let head_dim = int("head_dim").unwrap_or(hidden_size / num_heads.max(1));
        let eos_token_ids = match v.get("eos_token_id") {
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect(),
            Some(x) => x.as_u64().map(|x| x as u32).into_iter().collect(),
            None => Vec::new(),
        };
        let max_position = int("max_position_embeddings").unwrap_or(4096);
        let rope_scaling = rope_scaling_from_hf(v, max_position)?;
        let cfg = Self {
            vocab_size: need("vocab_size")?,
            hidden_size,
            intermediate_size: need("intermediate_size")?,
            num_layers: need("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta: v
                .get("rope_theta")
                .or_else(|| v.pointer("/rope_parameters/rope_theta"))
                .and_then(|x| x.as_f64())
                .unwrap_or(10000.0) as f32,
            rope_scaling,
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(|x| x.as_f64())
                .unwrap_or(1e-6) as f32,
            max_position,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
            qkv_bias: v
                .get("attention_bias")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
            qk_norm: false,
            qk_norm_whole: false,
            moe: MoeConfig::from_hf_json(entry.name, v)?,
            eos_token_ids,
            architecture: entry.name.to_string(),
            features: ArchFeatures::default(),
        };
        let mut cfg = cfg;
        (entry.from_hf)(v, &mut cfg)?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return bad(format!(
                "{} heads is not a multiple of {} KV heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even", self.head_dim));
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.num_layers == 0 {
            return bad("zero-sized model dimension".into());
        }
        Ok(())
    }

    /// RoPE inverse frequencies, computed in f32 like HF (`1 / theta^(2i/d)`), with Llama 3
    /// scaling applied when configured.
    pub fn inv_freq(&self) -> Vec<f32> {
        self.inv_freq_for(self.rope_theta)
    }

    /// [`Self::inv_freq`] with base `theta`.
    pub fn inv_freq_for(&self, theta: f32) -> Vec<f32> {
        let d = self.head_dim;
        let plain = |i: usize| 1.0f32 / theta.powf((2 * i) as f32 / d as f32);
        match self.rope_scaling {
            None => (0..d / 2).map(plain).collect(),
            Some(RopeScaling::Linear { factor }) => (0..d / 2).map(|i| plain(i) / factor).collect(),
            Some(RopeScaling::Yarn(y)) => y.inv_freq(theta, d),
            Some(RopeScaling::Llama3(s)) => (0..d / 2)
                .map(|i| {
                    let f = plain(i);
                    let low_wl = s.original_max_position / s.low_freq_factor;
                    let high_wl = s.original_max_position / s.high_freq_factor;
                    let wl = 2.0 * std::f32::consts::PI / f;
                    if wl < high_wl {
                        f
                    } else if wl > low_wl {
                        f / s.factor
                    } else {
                        let smooth = (s.original_max_position / wl - s.low_freq_factor)
                            / (s.high_freq_factor - s.low_freq_factor);
                        (1.0 - smooth) * f / s.factor + smooth * f
                    }
                })
                .collect(),
        }
    }

    /// The factor RoPE's cos/sin are multiplied by (YaRN's attention factor; else 1).
    pub fn rope_attention_factor(&self) -> f32 {
        match self.rope_scaling {
            Some(RopeScaling::Yarn(y)) => y.attention_factor as f32,
            _ => 1.0,
        }
    }
}

/// The RoPE scaling of an HF config: the 4.x `rope_scaling` object, else transformers 5's
/// `rope_parameters` when it names a type. Types we do not implement are refused rather
/// than run with other frequencies (`dynamic` NTK changes nothing within the original
/// context, so it runs as unscaled).
fn rope_scaling_from_hf(
    v: &serde_json::Value,
    max_position: usize,
) -> Result<Option<RopeScaling>, ModelError> {
    let kind = |s: &serde_json::Value| {
        s.get("rope_type")
            .or_else(|| s.get("type"))
            .and_then(|t| t.as_str())
            .map(str::to_string)
    };
    let Some((s, ty)) = ["rope_scaling", "rope_parameters"]
        .iter()
        .filter_map(|k| v.get(*k))
        .find_map(|s| Some((s, kind(s)?)))
    else {
        return Ok(None);
    };
    let f = |k: &str, d: f64| s.get(k).and_then(|x| x.as_f64()).unwrap_or(d) as f32;
    Ok(match ty.as_str() {
        "default" | "dynamic" => None,
        "llama3" => Some(RopeScaling::Llama3(Llama3RopeScaling {
            factor: f("factor", 8.0),
            low_freq_factor: f("low_freq_factor", 1.0),
            high_freq_factor: f("high_freq_factor", 4.0),
            original_max_position: f("original_max_position_embeddings", 8192.0),
        })),
        "linear" => {
            let factor = s
                .get("factor")
                .and_then(|x| x.as_f64())
                .ok_or_else(|| ModelError::Config("linear rope_scaling lacks factor".into()))?
                as f32;
            Some(RopeScaling::Linear { factor })
        }
        "yarn" => Some(RopeScaling::Yarn(YarnRopeScaling::from_hf(
            s,
            max_position,
        )?)),
        other => {
            return Err(ModelError::Unsupported(format!(
                "rope_scaling type {other:?} (supported: default, linear, llama3, yarn, dynamic)"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_architecture_is_named() {
        let v = serde_json::json!({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]});
        let e = LlamaConfig::from_hf_json(&v).expect_err("gpt2 is unsupported");
        assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}");
    }

    #[test]
    fn unimplemented_rope_scaling_is_refused() {
        let v = serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100,
            "rope_scaling": {"type": "longrope", "factor": 4.0}
        });
        let e = LlamaConfig::from_hf_json(&v).expect_err("longrope is not implemented");
        assert!(e.to_string().contains("longrope"), "{e}");
    }

    fn with_rope(scaling: serde_json::Value) -> LlamaConfig {
        let v = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 2,
            "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100,
            "rope_theta": 150000.0, "max_position_embeddings": 2048, "rope_scaling": scaling
        });
        LlamaConfig::from_hf_json(&v).expect("valid")
    }

    /// YaRN keeps the fast dimensions (below the `beta_fast` correction dimension),
    /// interpolates the slow ones (above `beta_slow`'s) by `factor`, blends between, and
    /// scales cos/sin by `0.1 ln(factor) + 1`.
    #[test]
    fn yarn_blends_extrapolation_and_interpolation() {
        let plain = with_rope(serde_json::Value::Null);
        let y = with_rope(serde_json::json!({"rope_type": "yarn", "factor": 8.0,
            "original_max_position_embeddings": 256, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": false}));
        let (p, f) = (plain.inv_freq(), y.inv_freq());
        // head_dim 32, base 150000: correction dims 32·ln(256/(2πβ))/(2 ln 150000).
        let dim = |beta: f64| {
            32.0 * (256.0 / (beta * 2.0 * std::f64::consts::PI)).ln() / (2.0 * 150000f64.ln())
        };
        let (low, high) = (dim(32.0).max(0.0), dim(1.0));
        assert!(low > 0.0 && high < 15.0 && high - low > 2.0, "{low} {high}");
        for i in 0..16 {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let want = p[i] as f64 * (1.0 - ramp) + p[i] as f64 / 8.0 * ramp;
            assert!(
                (f[i] as f64 - want).abs() <= 1e-6 * want,
                "{i}: {} vs {want}",
                f[i]
            );
        }
        assert_eq!(f[0], p[0]);
        assert!((f[15] - p[15] / 8.0).abs() <= 1e-7 * p[15]);
        let want = (0.1 * 8f64.ln() + 1.0) as f32;
        assert!((y.rope_attention_factor() - want).abs() < 1e-7);
        assert_eq!(plain.rope_attention_factor(), 1.0);
        // transformers 5's `rope_parameters` alone selects it too.
        let v = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 2,
            "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100,
            "rope_parameters": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 150000.0,
                "original_max_position_embeddings": 256, "truncate": false}
        });
        let c = LlamaConfig::from_hf_json(&v).expect("valid");
        assert!(matches!(c.rope_scaling, Some(RopeScaling::Yarn(_))));
    }

    #[test]
    fn linear_rope_divides_every_frequency() {
        let plain = with_rope(serde_json::Value::Null).inv_freq();
        let lin = with_rope(serde_json::json!({"type": "linear", "factor": 4.0})).inv_freq();
        for (a, b) in plain.iter().zip(&lin) {
            assert_eq!(*b, a / 4.0);
        }
    }

    #[test]
    fn qwen2_config_has_bias() {
        let v = serde_json::json!({
            "model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2,
            "vocab_size": 100, "eos_token_id": [5, 6], "tie_word_embeddings": true
        });
        let c = LlamaConfig::from_hf_json(&v).expect("valid");
        assert!(c.qkv_bias && !c.qk_norm && c.tie_word_embeddings);
        assert_eq!((c.head_dim, c.eos_token_ids.clone()), (16, vec![5, 6]));
    }
}
