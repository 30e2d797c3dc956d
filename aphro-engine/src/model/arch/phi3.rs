//! `Phi3ForCausalLM`: the Llama block with fused projections, `qkv_proj` rows
//! `[q; k; v]` and `gate_up_proj` rows `[gate; up]` (concatenated, not interleaved), and
//! sliding-window attention when `sliding_window` is set.

use super::{hf_sliding_window, same_names, Architecture};

pub const ARCH: Architecture = Architecture {
    name: "phi3",
    hf_classes: &["Phi3ForCausalLM"],
    hf_model_types: &["phi3"],
    from_hf: |v, cfg| {
        cfg.features.fused_qkv = true;
        cfg.features.fused_gate_up = true;
        cfg.features.sliding_window = hf_sliding_window(v);
        Ok(())
    },
    from_gguf: None,
    gguf_tensor: same_names,
    gguf_qk_permuted: false,
};
