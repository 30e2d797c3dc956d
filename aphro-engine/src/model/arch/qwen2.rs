//! `Qwen2ForCausalLM`: biases on the Q/K/V projections (not on O).

use super::{same_names, Architecture};

pub const ARCH: Architecture = Architecture {
    name: "qwen2",
    hf_classes: &["Qwen2ForCausalLM"],
    hf_model_types: &["qwen2"],
    from_hf: |_, cfg| {
        cfg.qkv_bias = true;
        Ok(())
    },
    from_gguf: Some(|_, cfg| {
        cfg.qkv_bias = true;
        Ok(())
    }),
    gguf_tensor: same_names,
    gguf_qk_permuted: false,
};
