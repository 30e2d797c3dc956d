//! `MixtralForCausalLM`: the Llama/Mistral block with a mixture-of-experts feed-forward
//! (softmax router, top-k, renormalised weights; `block_sparse_moe.*` names). llama.cpp
//! converts Mixtral as `llama` with expert tensors, which the `llama` entry loads.

use super::{nothing_more, same_names, Architecture};

pub const ARCH: Architecture = Architecture {
    name: "mixtral",
    hf_classes: &["MixtralForCausalLM"],
    hf_model_types: &["mixtral"],
    from_hf: nothing_more,
    from_gguf: None,
    gguf_tensor: same_names,
    gguf_qk_permuted: true,
};
