//! The model registry: one file per architecture, each stating only how it differs from
//! the Llama block that [`super::llama`] runs (config keys, flags, weight names).
//!
//! An HF `config.json` is matched by `architectures[0]` (then `model_type`); a GGUF by
//! `general.architecture`. To add an architecture, write `arch/<name>.rs` with a
//! `pub const ARCH: Architecture` and list it in [`REGISTRY`].

use aphro_core::gguf::GgufFile;
use serde_json::Value;

use super::config::LlamaConfig;
use super::ModelError;

mod gemma3;
mod gpt_oss;
mod granite;
mod llama;
mod mistral;
mod mixtral;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_moe;

/// Sets an architecture's fields of a config from GGUF metadata.
pub type GgufConfigure = fn(&GgufFile, &mut LlamaConfig) -> Result<(), ModelError>;

/// How one architecture differs from the plain Llama block.
pub struct Architecture {
    /// Our name for it, and its GGUF `general.architecture` when [`Self::from_gguf`] is set.
    pub name: &'static str,
    /// HF `architectures` entries (`config.json`) that select it.
    pub hf_classes: &'static [&'static str],
    /// HF `model_type` values that select it when `architectures` is absent.
    pub hf_model_types: &'static [&'static str],
    /// Set the architecture's fields of `cfg` (already holding the shared Llama keys) from
    /// its `config.json`.
    pub from_hf: fn(&Value, &mut LlamaConfig) -> Result<(), ModelError>,
    /// The same from GGUF metadata; `None`: this architecture is not loaded from GGUF.
    pub from_gguf: Option<GgufConfigure>,
    /// GGUF tensor name of a per-layer HF parameter (`self_attn.q_proj`, no layer, no
    /// suffix) where it differs from llama.cpp's Llama names.
    pub gguf_tensor: fn(&str) -> Option<&'static str>,
    /// Whether llama.cpp's converter permuted the Q/K rows (for interleaved RoPE pairs).
    pub gguf_qk_permuted: bool,
}

/// Every architecture the engine runs.
pub const REGISTRY: &[&Architecture] = &[
    &llama::ARCH,
    &mistral::ARCH,
    &qwen2::ARCH,
    &qwen3::ARCH,
    &gemma3::ARCH,
    &phi3::ARCH,
    &granite::ARCH,
    &qwen3_moe::ARCH,
    &qwen3_moe::GGUF_ARCH,
    &mixtral::ARCH,
    &olmoe::ARCH,
    &gpt_oss::ARCH,
];

/// No renamed tensors (the Llama names).
pub(crate) fn same_names(_: &str) -> Option<&'static str> {
    None
}

/// No keys beyond the shared ones.
pub(crate) fn nothing_more(_: &Value, _: &mut LlamaConfig) -> Result<(), ModelError> {
    Ok(())
}

/// The supported architectures, for error messages: HF classes, then GGUF names.
pub fn supported() -> String {
    let hf: Vec<&str> = REGISTRY
        .iter()
        .flat_map(|a| a.hf_classes)
        .copied()
        .collect();
    let gguf: Vec<&str> = REGISTRY
        .iter()
        .filter(|a| a.from_gguf.is_some())
        .map(|a| a.name)
        .collect();
    format!("{} (GGUF: {})", hf.join(", "), gguf.join(", "))
}

/// The entry named `name` (a [`LlamaConfig::architecture`]).
pub fn by_name(name: &str) -> Option<&'static Architecture> {
    REGISTRY.iter().copied().find(|a| a.name == name)
}

/// The entry for an HF `config.json`.
pub fn for_hf(v: &Value) -> Result<&'static Architecture, ModelError> {
    let classes: Vec<&str> = v
        .get("architectures")
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default();
    let model_type = v.get("model_type").and_then(|s| s.as_str()).unwrap_or("");
    let found = match classes.first() {
        Some(c) => REGISTRY.iter().find(|a| a.hf_classes.contains(c)),
        None => REGISTRY
            .iter()
            .find(|a| a.hf_model_types.contains(&model_type)),
    };
    found.copied().ok_or_else(|| {
        ModelError::UnsupportedArchitecture(if classes.is_empty() {
            model_type.to_string()
        } else {
            classes.join(",")
        })
    })
}

/// The entry for a GGUF's `general.architecture`.
pub fn for_gguf(name: &str) -> Result<&'static Architecture, ModelError> {
    REGISTRY
        .iter()
        .copied()
        .find(|a| a.name == name && a.from_gguf.is_some())
        .ok_or_else(|| ModelError::UnsupportedArchitecture(name.to_string()))
}

/// `config.json` number `key`, if present.
pub(crate) fn hf_f64(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(|x| x.as_f64())
}

/// HF's `sliding_window` (null or absent: none).
pub(crate) fn hf_sliding_window(v: &Value) -> Option<usize> {
    v.get("sliding_window")
        .and_then(|x| x.as_u64())
        .map(|w| w as usize)
        .filter(|&w| w > 0)
}

/// HF's `layer_types` as "is a sliding-window layer" per layer (`None`: absent).
pub(crate) fn hf_sliding_layers(v: &Value, layers: usize) -> Result<Option<Vec<bool>>, ModelError> {
    let Some(types) = v.get("layer_types").and_then(|t| t.as_array()) else {
        return Ok(None);
    };
    let s: Vec<bool> = types
        .iter()
        .map(|t| t.as_str() == Some("sliding_attention"))
        .collect();
    if s.len() != layers {
        return Err(ModelError::Config(format!(
            "layer_types has {} entries for {layers} layers",
            s.len()
        )));
    }
    Ok(Some(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_architecture_lists_the_supported_ones() {
        let v = serde_json::json!({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"});
        let e = for_hf(&v)
            .map(|a| a.name)
            .expect_err("gpt2 is not supported");
        let msg = e.to_string();
        assert!(msg.contains("GPT2LMHeadModel"), "{msg}");
        for a in REGISTRY {
            for c in a.hf_classes {
                assert!(msg.contains(c), "{msg} lacks {c}");
            }
        }
        assert!(for_gguf("bert").is_err());
    }

    #[test]
    fn names_are_unique() {
        for (i, a) in REGISTRY.iter().enumerate() {
            for b in &REGISTRY[i + 1..] {
                assert_ne!(a.name, b.name);
                assert!(a.hf_classes.iter().all(|c| !b.hf_classes.contains(c)));
            }
        }
    }
}
