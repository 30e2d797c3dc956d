//! `Qwen3ForCausalLM`: per-head RMSNorm of Q and K (over `head_dim`) before RoPE.

use super::{same_names, Architecture};

pub const ARCH: Architecture = Architecture {
    name: "qwen3",
    hf_classes: &["Qwen3ForCausalLM"],
    hf_model_types: &["qwen3"],
    from_hf: |_, cfg| {
        cfg.qk_norm = true;
        Ok(())
    },
    from_gguf: Some(|_, cfg| {
        cfg.qk_norm = true;
        Ok(())
    }),
    gguf_tensor: same_names,
    gguf_qk_permuted: false,
};
