//! What a pooling model is, read from its folder: the BERT hyper-parameters of `config.json`
//! and sentence-transformers' `modules.json`, `<Pooling>/config.json` and
//! `sentence_bert_config.json`, combined with vLLM 0.33.0's rules
//! (`transformers_utils/config.py: get_pooling_config`, `config/model.py`,
//! `model_executor/layers/pooler/activations.py`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::PoolingError;

/// BERT encoder hyper-parameters (`config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    pub hidden_act: HiddenAct,
}

/// The feed-forward activation (`hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenAct {
    /// `gelu`: the exact erf form.
    Gelu,
    /// `gelu_new`, `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
    Relu,
}

fn usize_field(v: &Value, key: &str) -> Result<usize, PoolingError> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| PoolingError::Config(format!("config.json lacks {key}")))
}

impl BertConfig {
    pub fn from_hf_json(v: &Value) -> Result<Self, PoolingError> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type != "bert" {
            return Err(PoolingError::Unsupported(format!(
                "pooling model_type {model_type:?} (supported: bert)"
            )));
        }
        let pos = v
            .get("position_embedding_type")
            .and_then(Value::as_str)
            .unwrap_or("absolute");
        if pos != "absolute" {
            return Err(PoolingError::Unsupported(format!(
                "position_embedding_type {pos:?} (supported: absolute)"
            )));
        }
        let hidden_act = match v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu")
        {
            "gelu" => HiddenAct::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" => HiddenAct::GeluTanh,
            "relu" => HiddenAct::Relu,
            other => {
                return Err(PoolingError::Unsupported(format!("hidden_act {other:?}")));
            }
        };
        let cfg = Self {
            vocab_size: usize_field(v, "vocab_size")?,
            hidden_size: usize_field(v, "hidden_size")?,
            num_layers: usize_field(v, "num_hidden_layers")?,
            num_heads: usize_field(v, "num_attention_heads")?,
            intermediate_size: usize_field(v, "intermediate_size")?,
            max_position_embeddings: usize_field(v, "max_position_embeddings")?,
            type_vocab_size: v
                .get("type_vocab_size")
                .and_then(Value::as_u64)
                .unwrap_or(2) as usize,
            layer_norm_eps: v
                .get("layer_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-12),
            hidden_act,
        };
        if cfg.num_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_heads) {
            return Err(PoolingError::Config(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                cfg.hidden_size, cfg.num_heads
            )));
        }
        Ok(cfg)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
}

/// How one vector is made from a sequence's hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingType {
    /// The first token (`[CLS]`).
    Cls,
    /// The mean over every token of the prompt, specials included.
    Mean,
    /// The last token.
    Last,
    /// The element-wise maximum over every token (sentence-transformers' max pooling).
    Max,
}

/// What the model serves (vLLM's pooling task).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingTask {
    /// A bi-encoder: `embed`, and cosine `score` / `rerank`.
    Embed,
    /// A sequence classifier: `classify`, and (one label) cross-encoder `score` / `rerank`.
    Classify,
}

/// The activation a classifier's logits go through (vLLM `get_act_fn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassifierActivation {
    Identity,
    Sigmoid,
    Softmax,
}

/// Everything vLLM derives from the model folder besides the weights.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolingModelConfig {
    pub bert: BertConfig,
    pub task: PoolingTask,
    pub pooling: PoolingType,
    /// Whether the embedding is L2-normalized when the request leaves `use_activation` unset.
    pub normalize: bool,
    /// The longest prompt in tokens (`max_seq_length` of `sentence_bert_config.json`, else
    /// `max_position_embeddings`).
    pub max_model_len: usize,
    /// Labels of the classifier (`id2label`, ordered by id); empty for a bi-encoder.
    pub labels: Vec<String>,
    pub activation: ClassifierActivation,
    /// `None`: `dimensions` is refused; `Some(vec![])`: any size (`is_matryoshka`);
    /// otherwise the allowed sizes (`matryoshka_dimensions`).
    pub matryoshka: Option<Vec<usize>>,
    /// Prompt prefixes by Cohere `input_type` (vLLM: `task_instructions` of config.json, else
    /// the `prompts` of `config_sentence_transformers.json`); empty: none defined.
    pub task_instructions: std::collections::BTreeMap<String, String>,
}

fn read_json(path: &Path) -> Result<Option<Value>, PoolingError> {
    match std::fs::read(path) {
        Ok(raw) => serde_json::from_slice(&raw)
            .map(Some)
            .map_err(|e| PoolingError::Config(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(PoolingError::Config(format!("{}: {e}", path.display()))),
    }
}

/// vLLM `parse_pooling_type`: `pooling_mode_cls_token` → CLS, `pooling_mode_mean_tokens` →
/// MEAN, `pooling_mode_lasttoken` → LAST (the text between `pooling_mode_` and the next `_`,
/// so `mean_sqrt_len_tokens` is MEAN too, as in vLLM); max pooling is read as
/// sentence-transformers defines it; weighted mean is skipped.
fn st_pooling_type(cfg: &Value) -> Option<PoolingType> {
    let obj = cfg.as_object()?;
    obj.iter()
        .filter(|(_, v)| v.as_bool() == Some(true))
        .find_map(|(k, _)| {
            let mode = k.strip_prefix("pooling_mode_")?;
            match mode.split('_').next()? {
                "cls" => Some(PoolingType::Cls),
                "mean" => Some(PoolingType::Mean),
                "lasttoken" => Some(PoolingType::Last),
                "max" => Some(PoolingType::Max),
                _ => None,
            }
        })
}

impl PoolingModelConfig {
    /// Read `dir`'s `config.json` and sentence-transformers files.
    pub fn from_dir(dir: &Path) -> Result<Self, PoolingError> {
        let config = read_json(&dir.join("config.json"))?
            .ok_or_else(|| PoolingError::Config(format!("{} has no config.json", dir.display())))?;
        let bert = BertConfig::from_hf_json(&config)?;
        let arch = config
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .unwrap_or("BertModel");
        let task = match arch {
            "BertModel" | "BertForMaskedLM" | "BertForPreTraining" => PoolingTask::Embed,
            "BertForSequenceClassification" => PoolingTask::Classify,
            other => {
                return Err(PoolingError::Unsupported(format!(
                    "pooling architecture {other:?} (supported: BertModel, \
                     BertForSequenceClassification)"
                )))
            }
        };
        // sentence-transformers: modules.json names the Pooling module's folder; a listed
        // Normalize module turns normalization on (its folder is never read).
        let mut pooling = None;
        let mut normalize = true;
        if let Some(modules) = read_json(&dir.join("modules.json"))? {
            let modules = modules.as_array().cloned().unwrap_or_default();
            normalize = modules.iter().any(|m| {
                m.get("type").and_then(Value::as_str)
                    == Some("sentence_transformers.models.Normalize")
            });
            if let Some(m) = modules.iter().find(|m| {
                m.get("type").and_then(Value::as_str)
                    == Some("sentence_transformers.models.Pooling")
            }) {
                let path = m.get("path").and_then(Value::as_str).unwrap_or("");
                if let Some(cfg) = read_json(&dir.join(path).join("config.json"))? {
                    pooling = st_pooling_type(&cfg);
                }
            }
        }
        // BERT's class default (vLLM `@default_pooling_type`) is CLS.
        let pooling = pooling.unwrap_or(PoolingType::Cls);
        let mut max_model_len = bert.max_position_embeddings;
        if let Some(st) = read_json(&dir.join("sentence_bert_config.json"))? {
            if let Some(n) = st.get("max_seq_length").and_then(Value::as_u64) {
                max_model_len = max_model_len.min(n as usize);
            }
        }
        let labels = labels_of(&config);
        let activation = activation_of(&config, labels.len());
        let matryoshka = match config
            .get("matryoshka_dimensions")
            .and_then(Value::as_array)
        {
            Some(dims) => Some(
                dims.iter()
                    .filter_map(Value::as_u64)
                    .map(|d| d as usize)
                    .collect(),
            ),
            None if config.get("is_matryoshka").and_then(Value::as_bool) == Some(true) => {
                Some(Vec::new())
            }
            None => None,
        };
        let string_map = |v: Option<&Value>| -> std::collections::BTreeMap<String, String> {
            v.and_then(Value::as_object)
                .map(|o| {
                    o.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut task_instructions = string_map(config.get("task_instructions"));
        if task_instructions.is_empty() {
            if let Some(st) = read_json(&dir.join("config_sentence_transformers.json"))? {
                task_instructions = string_map(st.get("prompts"));
            }
        }
        Ok(Self {
            bert,
            task,
            pooling,
            normalize,
            max_model_len,
            labels,
            activation,
            matryoshka,
            task_instructions,
        })
    }
}

/// Whether vLLM's `--runner auto` runs the model at `dir` as a pooling model: a folder with
/// sentence-transformers' `modules.json`, or whose `config.json` names a BERT pooling
/// architecture (`BertModel`, `BertForSequenceClassification`).
pub fn is_pooling_model(dir: &Path) -> bool {
    if !dir.is_dir() {
        return false;
    }
    if dir.join("modules.json").is_file() {
        return true;
    }
    let Ok(Some(config)) = read_json(&dir.join("config.json")) else {
        return false;
    };
    config
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .is_some_and(|a| matches!(a, "BertModel" | "BertForSequenceClassification"))
}

/// `id2label` ordered by id (`num_labels` `LABEL_i` when absent, as transformers defaults).
fn labels_of(config: &Value) -> Vec<String> {
    if let Some(map) = config.get("id2label").and_then(Value::as_object) {
        let by_id: BTreeMap<usize, String> = map
            .iter()
            .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_str()?.to_string())))
            .collect();
        if !by_id.is_empty() {
            let n = by_id.keys().max().map_or(0, |m| m + 1);
            return (0..n)
                .map(|i| {
                    by_id
                        .get(&i)
                        .cloned()
                        .unwrap_or_else(|| format!("LABEL_{i}"))
                })
                .collect();
        }
    }
    let n = config
        .get("num_labels")
        .and_then(Value::as_u64)
        .unwrap_or(2) as usize;
    (0..n).map(|i| format!("LABEL_{i}")).collect()
}

/// vLLM `get_act_fn`: `problem_type` first, then sentence-transformers' activation, else by
/// the number of labels (sigmoid for one, softmax for more).
fn activation_of(config: &Value, num_labels: usize) -> ClassifierActivation {
    let by_count = if num_labels < 2 {
        ClassifierActivation::Sigmoid
    } else {
        ClassifierActivation::Softmax
    };
    match config.get("problem_type").and_then(Value::as_str) {
        Some("regression") => return ClassifierActivation::Identity,
        Some("single_label_classification") => return by_count,
        Some("multi_label_classification") => return ClassifierActivation::Sigmoid,
        _ => {}
    }
    let st = config
        .get("sentence_transformers")
        .and_then(|s| s.get("activation_fn"))
        .or_else(|| config.get("sbert_ce_default_activation_function"))
        .and_then(Value::as_str);
    if let Some(name) = st.and_then(|s| s.strip_prefix("torch.nn.modules.")) {
        if name.ends_with(".Identity") {
            return ClassifierActivation::Identity;
        }
    }
    by_count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_modes_follow_vllm_names() {
        let cfg =
            serde_json::json!({"pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true});
        assert_eq!(st_pooling_type(&cfg), Some(PoolingType::Mean));
        let cfg = serde_json::json!({"pooling_mode_lasttoken": true});
        assert_eq!(st_pooling_type(&cfg), Some(PoolingType::Last));
        let cfg = serde_json::json!({"pooling_mode_weightedmean_tokens": true});
        assert_eq!(st_pooling_type(&cfg), None);
        let cfg = serde_json::json!({"pooling_mode_max_tokens": true});
        assert_eq!(st_pooling_type(&cfg), Some(PoolingType::Max));
    }

    #[test]
    fn activation_rules() {
        let one = serde_json::json!({"id2label": {"0": "LABEL_0"}, "problem_type": null});
        assert_eq!(labels_of(&one), vec!["LABEL_0"]);
        assert_eq!(activation_of(&one, 1), ClassifierActivation::Sigmoid);
        let reg = serde_json::json!({"problem_type": "regression"});
        assert_eq!(activation_of(&reg, 1), ClassifierActivation::Identity);
        let two = serde_json::json!({"num_labels": 2});
        assert_eq!(labels_of(&two), vec!["LABEL_0", "LABEL_1"]);
        assert_eq!(activation_of(&two, 2), ClassifierActivation::Softmax);
        let st = serde_json::json!({
            "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"
        });
        assert_eq!(activation_of(&st, 1), ClassifierActivation::Identity);
    }
}
