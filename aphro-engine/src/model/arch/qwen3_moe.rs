//! `Qwen3MoeForCausalLM` (GGUF `qwen3moe`): Qwen3's attention (per-head Q/K RMSNorm) with a
//! mixture-of-experts feed-forward ([`crate::model::moe`]): softmax router, top-k,
//! `norm_topk_prob`, sparse layers per `decoder_sparse_step` / `mlp_only_layers`.

use super::{same_names, Architecture};

pub const ARCH: Architecture = Architecture {
    name: "qwen3_moe",
    hf_classes: &["Qwen3MoeForCausalLM"],
    hf_model_types: &["qwen3_moe"],
    from_hf: |_, cfg| {
        cfg.qk_norm = true;
        Ok(())
    },
    from_gguf: None,
    gguf_tensor: same_names,
    gguf_qk_permuted: false,
};

/// llama.cpp's name for the same architecture.
pub const GGUF_ARCH: Architecture = Architecture {
    name: "qwen3moe",
    hf_classes: &[],
    hf_model_types: &[],
    from_hf: super::nothing_more,
    from_gguf: Some(|_, cfg| {
        cfg.qk_norm = true;
        Ok(())
    }),
    gguf_tensor: same_names,
    gguf_qk_permuted: false,
};
