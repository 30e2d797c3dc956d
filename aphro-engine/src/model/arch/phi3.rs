//! `Phi3ForCausalLM`: the Llama block with fused projections, `qkv_proj` rows
//! `[q; k; v]` and `gate_up_proj` rows `[gate; up]` (concatenated, not interleaved), and
//! sliding-window attention when `sliding_window` is set.
//!
//! GGUF (`phi3`, as llama.cpp's `Phi3MiniModel` converts it): the fused matrices keep their
//! layout as `attn_qkv` and `ffn_up`, Q/K rows are not permuted, and
//! `phi3.attention.sliding_window` is 0 when there is none.

use aphro_core::gguf::GgufFile;

use super::{hf_sliding_window, Architecture};
use crate::model::config::LlamaConfig;
use crate::model::ModelError;

pub const ARCH: Architecture = Architecture {
    name: "phi3",
    hf_classes: &["Phi3ForCausalLM"],
    hf_model_types: &["phi3"],
    from_hf: |v, cfg| {
        fused(cfg);
        cfg.features.sliding_window = hf_sliding_window(v);
        Ok(())
    },
    from_gguf: Some(from_gguf),
    gguf_tensor,
    gguf_qk_permuted: false,
};

fn fused(cfg: &mut LlamaConfig) {
    cfg.features.fused_qkv = true;
    cfg.features.fused_gate_up = true;
}

fn from_gguf(g: &GgufFile, cfg: &mut LlamaConfig) -> Result<(), ModelError> {
    fused(cfg);
    // Phi-3's LongRoPE (the 128k checkpoints) comes as per-dimension factor tensors, and
    // Phi-4-mini rotates part of each head; neither is implemented, so neither loads.
    if g.tensor_info("rope_factors_long.weight").is_some() {
        return Err(ModelError::Unsupported(
            "Phi-3 LongRoPE (rope_factors_long / rope_factors_short)".into(),
        ));
    }
    if let Ok(dims) = g.get_i64("phi3.rope.dimension_count") {
        if usize::try_from(dims).ok() != Some(cfg.head_dim) {
            return Err(ModelError::Unsupported(format!(
                "Phi-3 partial rotary embedding ({dims} of {} head dimensions)",
                cfg.head_dim
            )));
        }
    }
    cfg.features.sliding_window = g
        .get_i64("phi3.attention.sliding_window")
        .ok()
        .and_then(|w| usize::try_from(w).ok())
        .filter(|&w| w > 0);
    Ok(())
}

fn gguf_tensor(hf: &str) -> Option<&'static str> {
    Some(match hf {
        "self_attn.qkv_proj" => "attn_qkv",
        "mlp.gate_up_proj" => "ffn_up",
        _ => return None,
    })
}
