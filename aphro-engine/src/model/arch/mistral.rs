//! `MistralForCausalLM`: the Llama block with sliding-window attention on every layer
//! (`sliding_window`; null means full attention).

use super::{hf_sliding_window, same_names, Architecture};

pub const ARCH: Architecture = Architecture {
    name: "mistral",
    hf_classes: &["MistralForCausalLM"],
    hf_model_types: &["mistral"],
    from_hf: |v, cfg| {
        cfg.features.sliding_window = hf_sliding_window(v);
        Ok(())
    },
    from_gguf: Some(|_, _| Ok(())),
    gguf_tensor: same_names,
    gguf_qk_permuted: true,
};
