//! `LlamaForCausalLM` (Llama 2/3, SmolLM2): the block every other entry modifies.

use super::{nothing_more, same_names, Architecture};

pub const ARCH: Architecture = Architecture {
    name: "llama",
    hf_classes: &["LlamaForCausalLM"],
    hf_model_types: &["llama"],
    from_hf: nothing_more,
    from_gguf: Some(|_, _| Ok(())),
    gguf_tensor: same_names,
    gguf_qk_permuted: true,
};
