//! Flags shared by the server subcommands (`aphro serve`, `aphro launch render`), named as
//! vLLM names them so existing launch scripts carry over.
use crate::server::{FrontendOptions, Role, Server, ServerBuilder};
use anyhow::Context;
use aphro_core::ContentFormat;
use serde_json::{Map, Value};
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// API key(s) required on /v1, /v2, /inference and /cohere routes.
    #[arg(long = "api-key", env = "VLLM_API_KEY", value_delimiter = ',')]
    pub api_key: Vec<String>,
    /// Names clients may use in `model` (default: the model argument).
    #[arg(long = "served-model-name", num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Echo `X-Request-Id` (or a fresh id) back as a response header.
    #[arg(long)]
    pub enable_request_id_headers: bool,
    /// Largest request body accepted, in bytes; larger bodies get 413 before parsing.
    #[arg(long, default_value_t = crate::extract::DEFAULT_MAX_BODY_BYTES)]
    pub max_request_body_bytes: usize,
    /// Seconds an idle keep-alive connection is kept open, and a new connection waits for
    /// its request headers.
    #[arg(long, default_value_t = 5)]
    pub timeout_keep_alive: u64,
    /// Seconds a client has to send a whole request body (408 after it).
    #[arg(long, default_value_t = crate::extract::DEFAULT_BODY_READ_TIMEOUT.as_secs())]
    pub request_body_timeout: u64,
    /// Open connections served at once; more get a 503 and are closed (default: what the
    /// open-files limit allows, less a reserve).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds running requests get to finish after SIGTERM/SIGINT before they are aborted.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// Per-request size limits, checked before the work they bound (400 naming the flag).
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Longest rendered prompt, in characters, that is tokenized (default: max_model_len x
    /// the vocabulary's longest token, the most that can still fit the context).
    #[arg(long)]
    pub max_prompt_chars: Option<usize>,
    /// Prompts in one /v1/completions request.
    #[arg(long, default_value_t = aphro_core::RequestLimits::default().max_prompts_per_request)]
    pub max_prompts_per_request: usize,
    /// Largest `n`.
    #[arg(long, default_value_t = aphro_core::RequestLimits::default().max_n)]
    pub max_n: usize,
    /// Stop strings per request.
    #[arg(long, default_value_t = aphro_core::RequestLimits::default().max_stop_strings)]
    pub max_stop_strings: usize,
    /// Characters of one stop string.
    #[arg(long, default_value_t = aphro_core::RequestLimits::default().max_stop_string_chars)]
    pub max_stop_string_chars: usize,
    /// Tools in one chat request.
    #[arg(long, default_value_t = aphro_core::RequestLimits::default().max_tools)]
    pub max_tools: usize,
}

impl LimitArgs {
    pub fn request_limits(&self) -> aphro_core::RequestLimits {
        aphro_core::RequestLimits {
            max_prompt_chars: self.max_prompt_chars,
            max_prompts_per_request: self.max_prompts_per_request,
            max_n: self.max_n,
            max_stop_strings: self.max_stop_strings,
            max_stop_string_chars: self.max_stop_string_chars,
            max_tools: self.max_tools,
        }
    }
}

impl ServerArgs {
    /// The listener settings these flags describe.
    pub fn listen_config(&self) -> crate::server::ListenConfig {
        crate::server::ListenConfig {
            keep_alive: std::time::Duration::from_secs(self.timeout_keep_alive.max(1)),
            max_connections: self.max_connections,
            shutdown_timeout: std::time::Duration::from_secs(self.shutdown_timeout),
        }
    }

    pub fn body_read_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.request_body_timeout.max(1))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct FrontendArgs {
    /// Chat template file overriding the model's.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// auto | string | openai.
    #[arg(long, default_value = "auto")]
    pub chat_template_content_format: String,
    /// JSON object of template kwargs applied to every request (request values win).
    #[arg(long)]
    pub default_chat_template_kwargs: Option<String>,
    /// Tool-call parser name (vLLM's names, e.g. hermes).
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// Reasoning parser name (vLLM's names, e.g. qwen3).
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// Let the model choose tool calls when `tool_choice` is `auto`.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
    /// Accept `chat_template_kwargs` keys and `reasoning_effort` that the chat template never
    /// reads (they are then silently dropped, as transformers and vLLM do). By default such
    /// requests get a 400 naming the parameter.
    #[arg(long)]
    pub no_strict_chat_template_kwargs: bool,
    /// Honour per-request `mm_processor_kwargs` (vLLM's flag). Without it a non-empty value
    /// next to images is a 400.
    #[arg(long)]
    pub trust_request_mm_kwargs: bool,
    /// Rescale and normalize image pixels on the CPU and send them in the model dtype, as
    /// vLLM's `--no-mm-device-do-normalize`; by default `pixel_values` stay `uint8`.
    #[arg(long)]
    pub no_mm_device_do_normalize: bool,
    /// Hosts `http(s)` image URLs may be fetched from (vLLM's flag; `*` for any host). Unset,
    /// only `data:` image URLs are accepted (vLLM would fetch from anywhere). The fetch
    /// limits are vLLM's environment variables: `VLLM_IMAGE_FETCH_TIMEOUT` (5 s),
    /// `VLLM_MEDIA_FETCH_MAX_RETRIES` (3), `VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB` (256),
    /// `VLLM_MEDIA_URL_ALLOW_REDIRECTS` (1).
    #[arg(long, num_args = 1..)]
    pub allowed_media_domains: Vec<String>,
    /// A directory `file://` image URLs may be read from (vLLM's flag).
    #[arg(long)]
    pub allowed_local_media_path: Option<PathBuf>,
    /// Show every logprob token as a `token_id:N` placeholder (requests can still set
    /// `return_tokens_as_token_ids` themselves).
    #[arg(long)]
    pub return_tokens_as_token_ids: bool,
    /// Where the sampling defaults come from: `auto` (the model's generation_config.json,
    /// beside a .gguf file for GGUF models), `vllm` (none), or a directory holding one.
    #[arg(long, default_value = "auto")]
    pub generation_config: aphro_core::model::GenerationConfig,
    /// JSON object laid over those defaults, with HF key names, e.g.
    /// `{"temperature": 0.5, "max_new_tokens": 256}`.
    #[arg(long, value_parser = parse_json_object)]
    pub override_generation_config: Option<Map<String, Value>>,
}

fn parse_json_object(s: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(s) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("expected a JSON object".into()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}

impl FrontendArgs {
    /// The flags as the builder's plain options (reads the `--chat-template` file).
    pub fn options(&self, limits: aphro_core::RequestLimits) -> anyhow::Result<FrontendOptions> {
        let chat_template = match &self.chat_template {
            Some(p) => Some(
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            ),
            None => None,
        };
        let default_chat_template_kwargs = match &self.default_chat_template_kwargs {
            Some(raw) => serde_json::from_str::<Map<String, Value>>(raw)
                .context("--default-chat-template-kwargs must be a JSON object")?,
            None => Map::new(),
        };
        Ok(FrontendOptions {
            chat_template,
            content_format: self.chat_template_content_format.parse::<ContentFormat>()?,
            default_chat_template_kwargs,
            tool_call_parser: self.tool_call_parser.clone(),
            reasoning_parser: self.reasoning_parser.clone(),
            enable_auto_tool_choice: self.enable_auto_tool_choice,
            strict_template_kwargs: !self.no_strict_chat_template_kwargs,
            return_tokens_as_token_ids: self.return_tokens_as_token_ids,
            generation_config: self.generation_config.clone(),
            override_generation_config: self.override_generation_config.clone().unwrap_or_default(),
            limits,
            multimodal: aphro_core::multimodal::MultimodalOptions {
                device_normalize: !self.no_mm_device_do_normalize,
                trust_request_mm_kwargs: self.trust_request_mm_kwargs,
            },
            media_fetch: aphro_core::multimodal::MediaFetchOptions {
                allowed_media_domains: self.allowed_media_domains.clone(),
                allowed_local_media_path: self.allowed_local_media_path.clone(),
                ..aphro_core::multimodal::MediaFetchOptions::from_env()
                    .map_err(anyhow::Error::msg)?
            },
        })
    }
}

impl ServerArgs {
    /// The server flags and the frontend's on a builder of `role` for `model` (as the user
    /// named it; `None` = the embedded default).
    pub fn builder(
        &self,
        role: Role,
        model: Option<String>,
        frontend: &FrontendArgs,
    ) -> anyhow::Result<ServerBuilder> {
        let mut b = Server::builder()
            .role(role)
            .frontend(frontend.options(self.limits.request_limits())?)
            .enable_request_id_headers(self.enable_request_id_headers)
            .max_body_bytes(self.max_request_body_bytes)
            .body_read_timeout(self.body_read_timeout());
        if let Some(m) = model {
            b = b.model(m);
        }
        for name in &self.served_model_name {
            b = b.served_model_name(name.clone());
        }
        for key in &self.api_key {
            b = b.api_key(key.clone());
        }
        Ok(b)
    }
}
