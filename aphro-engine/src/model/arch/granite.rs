//! `GraniteForCausalLM`: the Llama block with four multipliers: embeddings times
//! `embedding_multiplier`, each residual branch times `residual_multiplier`, attention
//! scale `attention_multiplier` (instead of `1/sqrt(head_dim)`), logits divided by
//! `logits_scaling`. GGUF (`granite`): the same four as `granite.embedding_scale`,
//! `residual_scale`, `attention.scale` and `logit_scale`.

use super::{hf_f64, same_names, Architecture};
use crate::model::ModelError;

pub const ARCH: Architecture = Architecture {
    name: "granite",
    hf_classes: &["GraniteForCausalLM"],
    hf_model_types: &["granite"],
    from_hf: |v, cfg| {
        set_multipliers(cfg, HF_KEYS, |k| {
            hf_f64(v, k).ok_or_else(|| ModelError::Config(format!("config.json lacks {k}")))
        })
    },
    from_gguf: Some(|g, cfg| {
        set_multipliers(cfg, GGUF_KEYS, |k| {
            g.get_f64(&format!("granite.{k}"))
                .map_err(|_| ModelError::Config(format!("the GGUF lacks granite.{k}")))
        })
    }),
    gguf_tensor: same_names,
    // A `LlamaModel` to llama.cpp's converter: Q/K rows permuted.
    gguf_qk_permuted: true,
};

/// The four multipliers' names, in the order embedding, residual, attention, logits.
const HF_KEYS: [&str; 4] = [
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
];
/// llama.cpp's `GraniteModel` names them `*_scale` (under `granite.`).
const GGUF_KEYS: [&str; 4] = [
    "embedding_scale",
    "residual_scale",
    "attention.scale",
    "logit_scale",
];

fn set_multipliers(
    cfg: &mut crate::model::config::LlamaConfig,
    [embedding, residual, attention, logits]: [&str; 4],
    need: impl Fn(&str) -> Result<f64, ModelError>,
) -> Result<(), ModelError> {
    let f = &mut cfg.features;
    f.embed_scale = Some(need(embedding)? as f32);
    f.residual_multiplier = need(residual)? as f32;
    f.attn_scale = Some(need(attention)? as f32);
    f.logits_divisor = need(logits)? as f32;
    Ok(())
}
