//! `GptOssForCausalLM`: biases on all four attention projections, one learned sink logit
//! per head in the attention softmax, sliding-window layers alternating with full ones
//! (`layer_types`), YaRN RoPE (parsed with the shared config), and a mixture-of-experts
//! block in the checkpoint's stacked layout: router with a bias, top-k then softmax, and
//! clamped-SwiGLU experts with biases ([`crate::model::moe::ClampedSwiGluMlp`]).

use serde_json::Value;

use super::{hf_sliding_layers, hf_sliding_window, same_names, Architecture};
use crate::model::config::LlamaConfig;
use crate::model::ModelError;

pub const ARCH: Architecture = Architecture {
    name: "gpt_oss",
    hf_classes: &["GptOssForCausalLM"],
    hf_model_types: &["gpt_oss"],
    from_hf,
    from_gguf: None,
    gguf_tensor: same_names,
    gguf_qk_permuted: false,
};

fn from_hf(v: &Value, cfg: &mut LlamaConfig) -> Result<(), ModelError> {
    if cfg.moe.is_none() {
        return Err(ModelError::Config(
            "GptOssForCausalLM needs num_local_experts".into(),
        ));
    }
    let f = &mut cfg.features;
    // `attention_bias` (default true in GptOssConfig) covers o_proj too.
    let bias = v
        .get("attention_bias")
        .and_then(|x| x.as_bool())
        .unwrap_or(true);
    cfg.qkv_bias = bias;
    f.o_bias = bias;
    f.attention_sinks = true;
    f.sliding_window = hf_sliding_window(v);
    f.sliding_layers = match hf_sliding_layers(v, cfg.num_layers)? {
        Some(s) => s,
        // GptOssConfig's default: sliding on even layers.
        None => (0..cfg.num_layers).map(|i| i % 2 == 0).collect(),
    };
    Ok(())
}
