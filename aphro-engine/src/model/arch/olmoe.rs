//! `OlmoeForCausalLM`: Q/K RMSNorm over the whole projection (all heads at once), and a
//! mixture-of-experts feed-forward without top-k renormalisation.

use super::{same_names, Architecture};

fn olmoe(cfg: &mut super::LlamaConfig) {
    cfg.qk_norm = true;
    cfg.qk_norm_whole = true;
}

pub const ARCH: Architecture = Architecture {
    name: "olmoe",
    hf_classes: &["OlmoeForCausalLM"],
    hf_model_types: &["olmoe"],
    from_hf: |_, cfg| {
        olmoe(cfg);
        Ok(())
    },
    from_gguf: Some(|_, cfg| {
        olmoe(cfg);
        Ok(())
    }),
    gguf_tensor: same_names,
    gguf_qk_permuted: false,
};
