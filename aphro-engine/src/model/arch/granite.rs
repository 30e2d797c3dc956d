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
        let need = |k: &str| {
            hf_f64(v, k).ok_or_else(|| ModelError::Config(format!("config.json lacks {k}")))
        };
        let f = &mut cfg.features;
        f.embed_scale = Some(need("embedding_multiplier")? as f32);
        f.residual_multiplier = need("residual_multiplier")? as f32;
        f.attn_scale = Some(need("attention_multiplier")? as f32);
        f.logits_divisor = need("logits_scaling")? as f32;
        Ok(())
    },
    from_gguf: Some(|g, cfg| {
        // llama.cpp's `GraniteModel` names the multipliers `*_scale`.
        let need = |k: &str| {
            g.get_f64(&format!("granite.{k}"))
                .map_err(|_| ModelError::Config(format!("the GGUF lacks granite.{k}")))
        };
        let f = &mut cfg.features;
        f.embed_scale = Some(need("embedding_scale")? as f32);
        f.residual_multiplier = need("residual_scale")? as f32;
        f.attn_scale = Some(need("attention.scale")? as f32);
        f.logits_divisor = need("logit_scale")? as f32;
        Ok(())
    }),
    gguf_tensor: same_names,
    // A `LlamaModel` to llama.cpp's converter: Q/K rows permuted.
    gguf_qk_permuted: true,
};
