//! Model files: resolve `--model` (HF-layout dir, `.gguf` file, or hub id through hf-hub's
//! cache) and load what the renderer needs — tokenizer, chat template, special tokens,
//! context length and `generation_config.json` defaults — once, at startup.
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// vLLM's fallback when no context-length key is found.
pub const DEFAULT_MAX_MODEL_LEN: usize = 2048;

/// Where the model's files came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    Dir(PathBuf),
    Gguf(PathBuf),
    /// A hub id resolved to a snapshot directory of the local cache.
    Hub {
        repo_id: String,
        snapshot: PathBuf,
    },
}

/// Sampling defaults from `generation_config.json` (`api.md` §10). Only these keys are read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub temperature: Option<f64>,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub max_tokens: Option<i64>,
    pub skip_special_tokens: Option<bool>,
    /// Merged into a request's `stop_token_ids` (gpt-oss style multi-EOS configs).
    pub stop_token_ids: Vec<i64>,
}

impl GenerationDefaults {
    /// Parses a `generation_config.json` object.
    pub fn from_json(v: &Value) -> Self {
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        Self {
            repetition_penalty: f("repetition_penalty"),
            presence_penalty: f("presence_penalty"),
            frequency_penalty: f("frequency_penalty"),
            temperature: f("temperature"),
            top_k: v.get("top_k").and_then(Value::as_i64),
            top_p: f("top_p"),
            min_p: f("min_p"),
            max_tokens: v.get("max_new_tokens").and_then(Value::as_i64),
            skip_special_tokens: v.get("skip_special_tokens").and_then(Value::as_bool),
            // EOS ids are the engine's business (it stops on them unless `ignore_eos`); they
            // are not written into the rendered `stop_token_ids`.
            stop_token_ids: Vec::new(),
        }
    }
}

/// vLLM's `--generation-config`: where the server-side sampling defaults come from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GenerationConfig {
    /// The model's `generation_config.json` (beside a `.gguf` file for GGUF models).
    #[default]
    Auto,
    /// None: vLLM's neutral defaults.
    Vllm,
    /// `generation_config.json` in this directory.
    Dir(PathBuf),
}

impl std::str::FromStr for GenerationConfig {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s {
            "auto" => GenerationConfig::Auto,
            "vllm" => GenerationConfig::Vllm,
            dir => GenerationConfig::Dir(PathBuf::from(dir)),
        })
    }
}

/// Options for [`Model::load_with`].
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// hf-hub cache dir; default: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub hub_cache: Option<PathBuf>,
    /// Never touch the network (also set by `HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// Hub revision (default `main`).
    pub revision: Option<String>,
}

/// Everything the renderer needs from the model's files.
#[derive(Debug, Clone)]
pub struct Model {
    /// The `--model` string as given (the served model name by default).
    pub name: String,
    pub source: ModelSource,
    /// Shared: the serving engine's detokenizer and the renderer read the same one.
    pub tokenizer: Arc<Tokenizer>,
    /// Chat template source, if the model has one.
    pub chat_template: Option<String>,
    /// Named special tokens the template sees (`bos_token`, `eos_token`, …), in
    /// transformers' order.
    pub special_tokens: Map<String, Value>,
    /// Context length (config.json / GGUF), if the files state one.
    pub max_model_len: Option<usize>,
    pub generation_defaults: GenerationDefaults,
    /// Primary EOS ids (generation_config, else tokenizer config).
    pub eos_token_ids: Vec<u32>,
    /// `model_type` / GGUF architecture (e.g. `"qwen3"`, `"gpt_oss"`).
    pub model_type: Option<String>,
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    serde_json::from_str(&text).map_err(|e| Error::json(format!("parsing {}", path.display()), e))
}

fn read_json_opt(path: &Path) -> Result<Option<Value>> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// A special token in tokenizer_config.json: a string or an `AddedToken` dict.
fn token_content(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` in a tokenizer config: a string, or a list of `{name, template}`.
fn template_from_config(v: &Value) -> Option<String> {
    match v.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let find = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            find("default").or_else(|| {
                list.first()
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
        }
        _ => None,
    }
}

/// vLLM's derivation of the context length from `config.json`.
pub fn max_model_len_from_config(cfg: &Value) -> Option<usize> {
    let cfg = cfg
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(cfg);
    const KEYS: [&str; 8] = [
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "seq_length",
        "model_max_length",
        "max_sequence_length",
        "max_seq_length",
        "seq_len",
    ];
    let mut len = KEYS
        .iter()
        .filter_map(|k| cfg.get(*k).and_then(Value::as_u64))
        .min()?;
    let rope = cfg
        .get("rope_scaling")
        .or_else(|| cfg.get("rope_parameters"));
    if let Some(rope) = rope.and_then(Value::as_object) {
        let ty = rope
            .get("rope_type")
            .or_else(|| rope.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if !matches!(ty, "su" | "longrope" | "llama3" | "mrope" | "default" | "") {
            if let Some(factor) = rope.get("factor").and_then(Value::as_f64) {
                if ty == "yarn" {
                    if let Some(orig) = rope
                        .get("original_max_position_embeddings")
                        .and_then(Value::as_u64)
                    {
                        len = orig;
                    }
                }
                len = (len as f64 * factor) as u64;
            }
        }
    }
    usize::try_from(len).ok()
}

fn hub_cache_dir(opts: &LoadOptions) -> PathBuf {
    if let Some(p) = &opts.hub_cache {
        return p.clone();
    }
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("huggingface").join("hub")
}

fn env_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// Files fetched for a hub model (missing optional ones are fine).
const HUB_FILES: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// The snapshot directory of `repo_id` at `revision` (default `main`) in the local Hugging
/// Face cache, if it holds `file`: the commit `refs/<revision>` names, as huggingface_hub's
/// `try_to_load_from_cache` reads it (a commit hash as the revision names its snapshot
/// directly). `hub_cache` defaults to `$HF_HUB_CACHE`, `$HF_HOME/hub`, then
/// `~/.cache/huggingface/hub`. Never touches the network; every hub lookup in aphro (the
/// renderer's files and the engine's weights) goes through here, so both read one snapshot.
pub fn cached_snapshot(
    repo_id: &str,
    revision: Option<&str>,
    hub_cache: Option<&Path>,
    file: &str,
) -> Option<PathBuf> {
    let cache_dir = match hub_cache {
        Some(p) => p.to_path_buf(),
        None => hub_cache_dir(&LoadOptions::default()),
    };
    let revision = revision.unwrap_or("main");
    let repo = hf_hub::Repo::with_revision(
        repo_id.to_owned(),
        hf_hub::RepoType::Model,
        revision.to_owned(),
    );
    if let Some(path) = hf_hub::Cache::new(cache_dir.clone()).repo(repo).get(file) {
        return path.parent().map(Path::to_path_buf);
    }
    // A pinned commit has no ref file: its snapshot is named by the hash itself.
    let is_commit = revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit());
    let (org_name, snapshot) = (repo_id.replace('/', "--"), revision);
    let dir = cache_dir
        .join(format!("models--{org_name}"))
        .join("snapshots")
        .join(snapshot);
    (is_commit && dir.join(file).exists()).then_some(dir)
}

/// Resolves a hub id to a local snapshot dir: the cache first, then (unless offline) a
/// download through hf-hub from `HF_ENDPOINT` (default huggingface.co). hf-hub's agents trust
/// the platform store / `SSL_CERT_FILE` (ureq's `native-certs`) and read the proxy variables.
pub fn resolve_hub(repo_id: &str, opts: &LoadOptions) -> Result<PathBuf> {
    let cache_dir = hub_cache_dir(opts);
    let revision = opts.revision.clone().unwrap_or_else(|| "main".to_owned());
    let repo = hf_hub::Repo::with_revision(
        repo_id.to_owned(),
        hf_hub::RepoType::Model,
        revision.clone(),
    );
    if let Some(dir) = cached_snapshot(repo_id, Some(&revision), Some(&cache_dir), "tokenizer.json")
    {
        return Ok(dir);
    }
    if opts.offline || env_offline() {
        return Err(Error::ModelFiles(format!(
            "model `{repo_id}` is not a local directory or .gguf file and is not in the Hugging Face cache \
             ({}); HF_HUB_OFFLINE is set, so it was not downloaded",
            cache_dir.display()
        )));
    }
    let mut builder = hf_hub::api::sync::ApiBuilder::new()
        .with_cache_dir(cache_dir.clone())
        .with_progress(false);
    // A hub mirror, as huggingface_hub reads it.
    if let Some(endpoint) = std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.trim().is_empty())
    {
        builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_owned());
    }
    let api = builder.build().map_err(|e| {
        Error::ModelFiles(format!(
            "model `{repo_id}`: cannot start the hub client: {e}"
        ))
    })?;
    let api_repo = api.repo(repo);
    let tok = api_repo.get("tokenizer.json").map_err(|e| {
        Error::ModelFiles(format!(
            "model `{repo_id}` is not a local directory or .gguf file, is not in the Hugging Face cache ({}) \
             and could not be downloaded: {e}",
            cache_dir.display()
        ))
    })?;
    for f in HUB_FILES.iter().skip(1) {
        let _ = api_repo.get(f); // optional files
    }
    tok.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| Error::ModelFiles(format!("model `{repo_id}`: bad cache path")))
}

impl Model {
    /// Loads `spec` (dir, `.gguf`, or hub id) with default options.
    /// Replaces [`Model::generation_defaults`] as vLLM's `get_diff_sampling_param` does:
    /// the `generation_config.json` that `source` names, with `overrides`
    /// (`--override-generation-config`, HF key names such as `max_new_tokens`) on top.
    pub fn apply_generation_config(
        &mut self,
        source: &GenerationConfig,
        overrides: &Map<String, Value>,
    ) -> Result<()> {
        let file = match source {
            GenerationConfig::Vllm => None,
            GenerationConfig::Dir(d) => {
                let p = d.join("generation_config.json");
                if !p.is_file() {
                    return Err(Error::ModelFiles(format!(
                        "--generation-config {}: no generation_config.json there",
                        d.display()
                    )));
                }
                Some(p)
            }
            GenerationConfig::Auto => match &self.source {
                ModelSource::Dir(d) | ModelSource::Hub { snapshot: d, .. } => {
                    Some(d.join("generation_config.json"))
                }
                ModelSource::Gguf(f) => f.parent().map(|d| d.join("generation_config.json")),
            },
        };
        let mut config = match file {
            Some(p) => match read_json_opt(&p)? {
                Some(Value::Object(m)) => m,
                Some(_) => {
                    return Err(Error::ModelFiles(format!(
                        "{} is not a JSON object",
                        p.display()
                    )))
                }
                None => Map::new(),
            },
            None => Map::new(),
        };
        config.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        let stop_token_ids = std::mem::take(&mut self.generation_defaults.stop_token_ids);
        self.generation_defaults = GenerationDefaults {
            stop_token_ids,
            ..GenerationDefaults::from_json(&Value::Object(config))
        };
        Ok(())
    }

    pub fn load(spec: &str) -> Result<Self> {
        Self::load_with(spec, &LoadOptions::default())
    }

    pub fn load_with(spec: &str, opts: &LoadOptions) -> Result<Self> {
        let path = Path::new(spec);
        if path.is_dir() {
            Self::from_dir(spec, path, ModelSource::Dir(path.to_path_buf()))
        } else if path.is_file()
            && path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            Self::from_gguf(spec, path)
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            || spec.starts_with('/')
            || spec.starts_with('.')
        {
            Err(Error::ModelFiles(format!(
                "model path `{spec}` does not exist"
            )))
        } else {
            let snapshot = resolve_hub(spec, opts)?;
            Self::from_dir(
                spec,
                &snapshot.clone(),
                ModelSource::Hub {
                    repo_id: spec.to_owned(),
                    snapshot,
                },
            )
        }
    }

    /// An HF-layout directory.
    pub fn from_dir(name: &str, dir: &Path, source: ModelSource) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(Error::ModelFiles(format!(
                "model `{name}`: no tokenizer.json in {}",
                dir.display()
            )));
        }
        let tokenizer = Tokenizer::from_file(&tok_path)?;
        let tok_cfg = read_json_opt(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        // transformers 5: a separate chat_template.jinja wins over the config's field.
        let chat_template = if dir.join("chat_template.jinja").is_file() {
            let p = dir.join("chat_template.jinja");
            Some(
                std::fs::read_to_string(&p)
                    .map_err(|e| Error::io(format!("reading {}", p.display()), e))?,
            )
        } else if let Some(v) = read_json_opt(&dir.join("chat_template.json"))? {
            template_from_config(&v)
        } else {
            template_from_config(&tok_cfg)
        };
        let special_tokens = special_tokens_from_config(&tok_cfg);
        let config = read_json_opt(&dir.join("config.json"))?;
        let gen_cfg = read_json_opt(&dir.join("generation_config.json"))?;
        let max_model_len = config.as_ref().and_then(max_model_len_from_config);
        let generation_defaults = gen_cfg
            .as_ref()
            .map(GenerationDefaults::from_json)
            .unwrap_or_default();
        let mut eos_token_ids: Vec<u32> = match gen_cfg.as_ref().and_then(|g| g.get("eos_token_id"))
        {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_u64)
                .filter_map(|v| u32::try_from(v).ok())
                .collect(),
            Some(v) => v
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .into_iter()
                .collect(),
            None => Vec::new(),
        };
        if eos_token_ids.is_empty() {
            if let Some(id) = special_tokens
                .get("eos_token")
                .and_then(Value::as_str)
                .and_then(|t| tokenizer.token_to_id(t))
            {
                eos_token_ids.push(id);
            }
        }
        Ok(Self {
            name: name.to_owned(),
            source,
            tokenizer: Arc::new(tokenizer),
            chat_template,
            special_tokens,
            max_model_len,
            generation_defaults,
            eos_token_ids,
            model_type: config
                .as_ref()
                .and_then(|c| c.get("model_type"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    /// A `.gguf` file: tokenizer, template and context length from its metadata.
    pub fn from_gguf(name: &str, path: &Path) -> Result<Self> {
        let g = GgufFile::open(path)?;
        let (tokenizer, sp) = crate::gguf_tokenizer::tokenizer_from_gguf(&g)?;
        let chat_template = g
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        let mut special_tokens = Map::new();
        for (key, id) in [
            ("bos_token", sp.bos),
            ("eos_token", sp.eos),
            ("unk_token", sp.unk),
            ("pad_token", sp.pad),
        ] {
            if let Some(t) = id.and_then(|i| tokenizer.id_to_token(i)) {
                special_tokens.insert(key.to_owned(), Value::String(t));
            }
        }
        let max_model_len = g
            .arch_i64("context_length")
            .ok()
            .and_then(|v| usize::try_from(v).ok());
        Ok(Self {
            name: name.to_owned(),
            source: ModelSource::Gguf(path.to_path_buf()),
            tokenizer: Arc::new(tokenizer),
            chat_template,
            special_tokens,
            max_model_len,
            generation_defaults: GenerationDefaults::default(),
            eos_token_ids: sp.eos.into_iter().collect(),
            model_type: g.architecture().ok().map(str::to_owned),
        })
    }
}

/// The special-token variables transformers passes to templates: the standard attributes
/// that are set, then `extra_special_tokens` (named ones, e.g. Gemma 3's `boi_token`).
pub fn special_tokens_from_config(cfg: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    for key in [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ] {
        if let Some(t) = cfg.get(key).and_then(token_content) {
            out.insert(key.to_owned(), Value::String(t));
        }
    }
    if let Some(extra) = cfg.get("extra_special_tokens").and_then(Value::as_object) {
        for (k, v) in extra {
            if let Some(t) = token_content(v) {
                out.insert(k.clone(), Value::String(t));
            }
        }
    }
    out
}
