//! `Gemma3ForCausalLM` (text; GGUF `gemma3`): embeddings times `sqrt(hidden_size)`, the
//! `(1 + w)` RMSNorm, four norms per layer (before and after attention and the MLP), Q/K
//! RMSNorm per head, attention scale `query_pre_attn_scalar^-0.5`, sliding-window layers
//! interleaved with full ones (each kind with its own RoPE base), GeGLU with the tanh GELU,
//! and optional `final_logit_softcapping`.

use aphro_core::gguf::GgufFile;
use serde_json::Value;

use super::{hf_f64, hf_sliding_layers, hf_sliding_window, Architecture};
use crate::model::config::{LlamaConfig, MlpActivation};
use crate::model::ModelError;

pub const ARCH: Architecture = Architecture {
    name: "gemma3",
    hf_classes: &["Gemma3ForCausalLM"],
    hf_model_types: &["gemma3_text"],
    from_hf,
    from_gguf: Some(from_gguf),
    gguf_tensor,
    gguf_qk_permuted: false,
};

/// What HF and GGUF configs share.
fn common(cfg: &mut LlamaConfig) {
    cfg.qk_norm = true;
    let f = &mut cfg.features;
    f.sandwich_norms = true;
    f.mlp = MlpActivation::GeluTanh;
    // HF: `torch.tensor(hidden_size ** 0.5)` in f32.
    f.embed_scale = Some((cfg.hidden_size as f64).sqrt() as f32);
}

fn from_hf(v: &Value, cfg: &mut LlamaConfig) -> Result<(), ModelError> {
    // HF scales only the global layers' RoPE; the shared tables would scale both.
    if cfg.rope_scaling.is_some() {
        return Err(ModelError::Unsupported(
            "Gemma 3 rope_scaling (it applies to the global layers only)".into(),
        ));
    }
    common(cfg);
    let scalar = hf_f64(v, "query_pre_attn_scalar").unwrap_or(cfg.head_dim as f64);
    let f = &mut cfg.features;
    // The checkpoint stores `w` of `x * (1 + w)`.
    f.norm_weight_offset = 1.0;
    f.attn_scale = Some(scalar.powf(-0.5) as f32);
    f.final_logit_softcap = hf_f64(v, "final_logit_softcapping").map(|c| c as f32);
    f.sliding_window = hf_sliding_window(v);
    f.rope_local_theta = Some(
        v.pointer("/rope_parameters/sliding_attention/rope_theta")
            .and_then(|x| x.as_f64())
            .or_else(|| hf_f64(v, "rope_local_base_freq"))
            .unwrap_or(10000.0) as f32,
    );
    if let Some(t) = v
        .pointer("/rope_parameters/full_attention/rope_theta")
        .and_then(|x| x.as_f64())
    {
        cfg.rope_theta = t as f32;
    }
    let n = cfg.num_layers;
    f.sliding_layers = match hf_sliding_layers(v, n)? {
        Some(s) => s,
        None => {
            // Older configs: every `sliding_window_pattern`-th layer is global.
            let p = v
                .get("sliding_window_pattern")
                .and_then(|x| x.as_u64())
                .unwrap_or(6) as usize;
            (0..n).map(|i| (i + 1) % p.max(1) != 0).collect()
        }
    };
    Ok(())
}

fn from_gguf(g: &GgufFile, cfg: &mut LlamaConfig) -> Result<(), ModelError> {
    common(cfg);
    let f = &mut cfg.features;
    // llama.cpp's converter stores the norms as `1 + w` already.
    f.norm_weight_offset = 0.0;
    // As llama.cpp: 1/sqrt(key_length) (query_pre_attn_scalar = head_dim for these sizes).
    f.attn_scale = Some(1.0 / (cfg.head_dim as f32).sqrt());
    f.final_logit_softcap = g
        .get_f64("gemma3.final_logit_softcapping")
        .ok()
        .map(|c| c as f32);
    f.sliding_window = g
        .get_i64("gemma3.attention.sliding_window")
        .ok()
        .and_then(|w| usize::try_from(w).ok());
    // llama.cpp's fixed layout for Gemma 3: five sliding layers, then a global one; local
    // RoPE base 10000.
    f.sliding_layers = (0..cfg.num_layers).map(|i| (i + 1) % 6 != 0).collect();
    f.rope_local_theta = Some(10000.0);
    Ok(())
}

fn gguf_tensor(hf: &str) -> Option<&'static str> {
    Some(match hf {
        "post_attention_layernorm" => "post_attention_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        _ => return None,
    })
}
