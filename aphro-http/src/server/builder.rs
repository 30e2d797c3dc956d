//! [`Server::builder`]: a server of any role from plain Rust values, no command line.
//!
//! The CLI (`aphro serve`, `aphro launch render`) turns its flags into this builder, so an
//! embedder gets exactly what the binary serves:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use aphro_http::server::{Role, Server};
//! let server = Server::builder()
//!     .model("HuggingFaceTB/SmolLM2-135M-Instruct") // None: the embedded default
//!     .role(Role::Full)
//!     .served_model_name("smol")
//!     .base_path("/llm")                          // routes under /llm/v1/...
//!     .docs(false)                                // no /openapi.json, /docs
//!     .build()?;
//! let app = axum::Router::new().merge(server.router());
//! # let _ = app; Ok(()) }
//! ```
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use aphro_core::derenderer::{DerenderOptions, Derenderer};
use aphro_core::model::GenerationConfig;
use aphro_core::{ContentFormat, Model, RenderOptions, Renderer, RequestLimits};
use aphro_engine::model::{ModelDType, EMBEDDED_DEFAULT_DTYPE};
use aphro_engine::serving::{ServingConfig, ServingEngine};
use axum::Router;
use serde_json::{Map, Value};

use super::{router_with, AppState, Role, ServerSettings};
use crate::extract::{DEFAULT_BODY_READ_TIMEOUT, DEFAULT_MAX_BODY_BYTES};

/// The renderer's and derenderer's options (vLLM's frontend flags), as plain values.
#[derive(Debug, Clone)]
pub struct FrontendOptions {
    /// The chat template's text (`--chat-template` reads the file).
    pub chat_template: Option<String>,
    pub content_format: ContentFormat,
    pub default_chat_template_kwargs: Map<String, Value>,
    pub tool_call_parser: Option<String>,
    pub reasoning_parser: Option<String>,
    pub enable_auto_tool_choice: bool,
    /// Refuse `chat_template_kwargs` the template never reads (vLLM's default).
    pub strict_template_kwargs: bool,
    pub return_tokens_as_token_ids: bool,
    pub generation_config: GenerationConfig,
    pub override_generation_config: Map<String, Value>,
    pub limits: RequestLimits,
    /// vLLM's multimodal flags (device normalize, trusted per-request processor kwargs).
    pub multimodal: aphro_core::multimodal::MultimodalOptions,
    /// Where image URLs may be loaded from (`--allowed-media-domains`,
    /// `--allowed-local-media-path`, vLLM's fetch limits); by default `data:` URLs only.
    pub media_fetch: aphro_core::multimodal::MediaFetchOptions,
}

impl Default for FrontendOptions {
    fn default() -> Self {
        FrontendOptions {
            chat_template: None,
            content_format: ContentFormat::default(),
            default_chat_template_kwargs: Map::new(),
            tool_call_parser: None,
            reasoning_parser: None,
            enable_auto_tool_choice: false,
            strict_template_kwargs: true,
            return_tokens_as_token_ids: false,
            generation_config: GenerationConfig::default(),
            override_generation_config: Map::new(),
            limits: RequestLimits::default(),
            multimodal: aphro_core::multimodal::MultimodalOptions::default(),
            media_fetch: aphro_core::multimodal::MediaFetchOptions::default(),
        }
    }
}

impl FrontendOptions {
    /// The tokenizer side of `spec` with the generation config applied.
    pub fn load_model(&self, spec: &str) -> anyhow::Result<Model> {
        let mut m = Model::load(spec).with_context(|| format!("loading tokenizer of `{spec}`"))?;
        m.apply_generation_config(&self.generation_config, &self.override_generation_config)?;
        Ok(m)
    }

    pub fn renderer(
        &self,
        model: Arc<Model>,
        served: &[String],
        max_model_len: Option<usize>,
    ) -> anyhow::Result<Renderer> {
        let hooks: Option<Arc<dyn aphro_core::RenderHooks>> =
            if self.tool_call_parser.is_some() || self.reasoning_parser.is_some() {
                Some(Arc::new(aphro_core::parser_hooks::ParserHooks::new(
                    model.clone(),
                    self.tool_call_parser.as_deref(),
                    self.reasoning_parser.as_deref(),
                )))
            } else {
                None
            };
        let mut options = RenderOptions {
            hooks,
            chat_template: self.chat_template.clone(),
            content_format: self.content_format,
            max_model_len,
            served_model_names: Some(served.to_vec()),
            strict_template_kwargs: self.strict_template_kwargs,
            limits: self.limits.clone(),
            tool_call_parser: self.tool_call_parser.clone(),
            enable_auto_tool_choice: self.enable_auto_tool_choice,
            // vLLM reads the Harmony preamble's date and instruction placement from its
            // environment; so does the server.
            harmony: aphro_core::harmony::HarmonyOptions::from_env(),
            multimodal: self.multimodal,
            ..RenderOptions::default()
        };
        options
            .default_chat_template_kwargs
            .extend(self.default_chat_template_kwargs.clone());
        // A Qwen-VL model dir brings its image processor: image parts then render to
        // placeholder runs and `features` (the `--model` string is the mm_hash model id).
        if let Some(vision) = aphro_core::multimodal::VisionModel::for_model(&model)? {
            tracing::info!("multimodal: images through the Qwen-VL processor");
            options.vision = Some(Arc::new(vision));
            let m = &self.media_fetch;
            if !m.allowed_media_domains.is_empty() || m.allowed_local_media_path.is_some() {
                options.media_fetch = Some(Arc::new(aphro_core::multimodal::MediaFetcher::new(
                    m.clone(),
                )?));
            }
        }
        match model.tokenizer.encoder_backend() {
            aphro_core::tokenizer::EncoderBackend::Fast => {
                tracing::info!("tokenizer: encoding with fastokens (matched tokenizers at load)")
            }
            aphro_core::tokenizer::EncoderBackend::Tokenizers { reason } => {
                tracing::warn!("tokenizer: encoding with tokenizers, not fastokens: {reason}")
            }
        }
        Ok(Renderer::new(model, options)?)
    }

    pub fn derenderer(
        &self,
        model: Arc<Model>,
        served: &[String],
        max_model_len: Option<usize>,
    ) -> anyhow::Result<Derenderer> {
        Ok(Derenderer::new(
            model,
            DerenderOptions {
                served_model_name: served.first().cloned(),
                tool_call_parser: self.tool_call_parser.clone(),
                reasoning_parser: self.reasoning_parser.clone(),
                enable_auto_tool_choice: self.enable_auto_tool_choice,
                max_model_len,
                return_tokens_as_token_ids: self.return_tokens_as_token_ids,
                ..DerenderOptions::default()
            },
        )?)
    }
}

/// A built server: its state and how its router is mounted.
pub struct Server {
    state: AppState,
    base_path: Option<String>,
    docs: bool,
}

impl Server {
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// The state the handlers reach (engine, renderer, derenderer, metrics, health).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    pub fn into_state(self) -> AppState {
        self.state
    }

    /// The axum router: every route of the role, under the base path when one is set, ready
    /// to merge into another app or to serve as is.
    pub fn router(&self) -> Router {
        let app = router_with(self.state.clone(), self.docs);
        match &self.base_path {
            Some(base) => Router::new().nest(base, app),
            None => app,
        }
    }
}

/// Builds a [`Server`]; every setting has the CLI's default.
pub struct ServerBuilder {
    role: Role,
    model: Option<String>,
    dtype: Option<ModelDType>,
    engine: ServingConfig,
    frontend: FrontendOptions,
    served_model_names: Vec<String>,
    max_model_len: Option<usize>,
    api_keys: Vec<String>,
    enable_request_id_headers: bool,
    max_body_bytes: usize,
    body_read_timeout: Duration,
    enable_scale_out: bool,
    skip_tokenizer_init: bool,
    launch_kobold_api: bool,
    base_path: Option<String>,
    docs: bool,
    speech_threads: Option<usize>,
    upload_limits: aphro_engine::transcription::UploadLimits,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        ServerBuilder {
            role: Role::Full,
            model: None,
            dtype: None,
            engine: ServingConfig::default(),
            frontend: FrontendOptions::default(),
            served_model_names: Vec::new(),
            max_model_len: None,
            api_keys: Vec::new(),
            enable_request_id_headers: false,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            enable_scale_out: false,
            skip_tokenizer_init: false,
            launch_kobold_api: false,
            base_path: None,
            docs: true,
            speech_threads: None,
            upload_limits: aphro_engine::transcription::UploadLimits {
                max_filesize_mb: aphro_engine::transcription::max_filesize_mb_from_env(),
                max_duration_s: None,
            },
        }
    }
}

impl ServerBuilder {
    /// A `.gguf` file, an HF model directory or a hub id; not set = the embedded default
    /// (downloaded once), which runs in float32 unless [`Self::dtype`] says otherwise.
    pub fn model(mut self, spec: impl Into<String>) -> Self {
        self.model = Some(spec.into());
        self
    }

    /// `Role::Full` (default: the OpenAI API), `Role::TokensOnly` (`--tokens-only`),
    /// `Role::Render` (`aphro launch render`, no engine) or `Role::Pooling` (an HF encoder
    /// folder served as a pooling model).
    pub fn role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }

    pub fn dtype(mut self, dtype: ModelDType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// The engine's settings (`--max-model-len`, `--kv-cache-memory`, `--max-num-seqs`, ...).
    /// Its `model`, `dtype` and the tokenizer-side fields are set from this builder.
    pub fn engine(mut self, config: ServingConfig) -> Self {
        self.engine = config;
        self
    }

    /// The renderer's and derenderer's settings.
    pub fn frontend(mut self, options: FrontendOptions) -> Self {
        self.frontend = options;
        self
    }

    /// Adds a name clients may send as `model` (`--served-model-name`); the first is
    /// reported. Default: the model as given.
    pub fn served_model_name(mut self, name: impl Into<String>) -> Self {
        self.served_model_names.push(name.into());
        self
    }

    /// The served context (`--max-model-len`): what the render role reports and checks, and
    /// on the engine roles the engine's context (overriding [`Self::engine`]'s).
    pub fn max_model_len(mut self, tokens: usize) -> Self {
        self.max_model_len = Some(tokens);
        self
    }

    /// Adds a key the `/v1` routes require as `Authorization: Bearer` (`--api-key`).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_keys.push(key.into());
        self
    }

    pub fn enable_request_id_headers(mut self, on: bool) -> Self {
        self.enable_request_id_headers = on;
        self
    }

    /// Largest request body on every route (`--max-request-body-bytes`).
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    pub fn body_read_timeout(mut self, timeout: Duration) -> Self {
        self.body_read_timeout = timeout;
        self
    }

    /// The integrated server also mounts render, derender and generate
    /// (`--enable-scale-out`).
    pub fn enable_scale_out(mut self, on: bool) -> Self {
        self.enable_scale_out = on;
        self
    }

    /// Also serve the KoboldAI API (`/api/v1/generate`, ...; `--launch-kobold-api`). Only the
    /// integrated server with a tokenizer can.
    pub fn launch_kobold_api(mut self, on: bool) -> Self {
        self.launch_kobold_api = on;
        self
    }

    /// No tokenizer: token-in/token-out only (`--skip-tokenizer-init`).
    pub fn skip_tokenizer_init(mut self, on: bool) -> Self {
        self.skip_tokenizer_init = on;
        self
    }

    /// Mount every route under this prefix (`"/llm"` → `/llm/v1/chat/completions`).
    pub fn base_path(mut self, base: impl Into<String>) -> Self {
        let base = base.into();
        let base = format!("/{}", base.trim_matches('/'));
        self.base_path = (base != "/").then_some(base);
        self
    }

    /// Threads a speech model (`Role::Speech`) computes on (default: every core).
    pub fn speech_threads(mut self, threads: usize) -> Self {
        self.speech_threads = Some(threads);
        self
    }

    /// The longest audio `Role::Speech` accepts per request (`--max-audio-duration`).
    pub fn max_audio_duration(mut self, seconds: f64) -> Self {
        self.upload_limits.max_duration_s = Some(seconds);
        self
    }

    /// The largest upload in MiB (default: `VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`, else 25).
    pub fn max_audio_filesize_mb(mut self, mb: f64) -> Self {
        self.upload_limits.max_filesize_mb = mb;
        self
    }

    /// Serve `/openapi.json` and `/docs` (default: on).
    pub fn docs(mut self, on: bool) -> Self {
        self.docs = on;
        self
    }

    /// Loads the model (and starts the engine for the engine roles).
    pub fn build(self) -> anyhow::Result<Server> {
        let spec = match &self.model {
            Some(m) => m.clone(),
            None => aphro_core::default_model::ensure_default_model()?
                .to_string_lossy()
                .into_owned(),
        };
        let display = self
            .model
            .clone()
            .unwrap_or_else(|| aphro_core::default_model::DEFAULT_MODEL_NAME.to_owned());
        let served = if self.served_model_names.is_empty() {
            vec![display]
        } else {
            self.served_model_names.clone()
        };
        let front = &self.frontend;
        let mut settings = ServerSettings {
            role: self.role,
            served_model_names: served.clone(),
            model_root: spec.clone(),
            max_model_len: 0,
            api_keys: self.api_keys.clone(),
            enable_request_id_headers: self.enable_request_id_headers,
            max_body_bytes: self.max_body_bytes,
            body_read_timeout: self.body_read_timeout,
            enable_scale_out: self.enable_scale_out,
            skip_tokenizer_init: self.skip_tokenizer_init,
            launch_kobold_api: self.launch_kobold_api,
        };
        if self.launch_kobold_api && (self.role != Role::Full || self.skip_tokenizer_init) {
            anyhow::bail!(
                "--launch-kobold-api needs the integrated server with a tokenizer \
                 (not --tokens-only, --skip-tokenizer-init or the render role)"
            );
        }
        let state = match self.role {
            Role::Render if self.skip_tokenizer_init => {
                anyhow::bail!("the render role needs the tokenizer: skip_tokenizer_init is for the engine roles")
            }
            Role::Render => {
                let model = Arc::new(front.load_model(&spec)?);
                let renderer = front.renderer(model.clone(), &served, self.max_model_len)?;
                let derenderer = front.derenderer(model, &served, self.max_model_len)?;
                settings.max_model_len = renderer.max_model_len();
                AppState::new(settings)
                    .with_renderer(Arc::new(renderer))
                    .with_derenderer(Arc::new(derenderer))
            }
            Role::Pooling => {
                let dir = aphro_engine::model::resolve_model_path(std::path::Path::new(&spec))?;
                let embedder = aphro_engine::pooling::Embedder::load(&dir)
                    .with_context(|| format!("loading pooling model `{spec}`"))?
                    .with_served_name(served[0].clone());
                settings.max_model_len = embedder.max_model_len();
                // Chat `messages` of the pooling routes render through the chat template
                // with the server's template flags, as the text routes do.
                let model = Arc::new(front.load_model(&spec)?);
                let renderer = front.renderer(model, &served, Some(embedder.max_model_len()))?;
                AppState::new(settings)
                    .with_embedder(Arc::new(embedder))
                    .with_renderer(Arc::new(renderer))
            }
            Role::Speech => {
                use aphro_engine::speech::{Transcriber, TranscriberConfig};
                let dir = aphro_engine::model::resolve_model_path(std::path::Path::new(&spec))?;
                // One Whisper network per server: `--device` names one device here.
                let device = match self.engine.device.as_slice() {
                    [d] => *d,
                    list => anyhow::bail!(
                        "a speech model runs on one device; --device names {}",
                        list.len()
                    ),
                };
                let transcriber = Transcriber::load(
                    &dir,
                    TranscriberConfig {
                        num_threads: self.speech_threads,
                        device,
                    },
                )
                .with_context(|| format!("loading speech model `{spec}`"))?;
                // vLLM reports the decoder's context as the model length.
                settings.max_model_len = transcriber.info().max_target_positions;
                AppState::new(settings).with_speech(Arc::new(super::audio::SpeechServing::new(
                    Arc::new(transcriber),
                    self.upload_limits,
                    self.engine.max_num_seqs,
                )))
            }
            Role::Full | Role::TokensOnly => {
                let tokens_only = self.role == Role::TokensOnly;
                let mut cfg = self.engine.clone();
                cfg.model = spec.clone();
                if let Some(n) = self.max_model_len {
                    cfg.max_model_len = aphro_engine::serving::MaxModelLen::Tokens(n);
                }
                cfg.dtype = self.dtype.unwrap_or(if self.model.is_none() {
                    EMBEDDED_DEFAULT_DTYPE
                } else {
                    ModelDType::Auto
                });
                cfg.tokens_only = tokens_only;
                cfg.skip_tokenizer_init = self.skip_tokenizer_init;
                cfg.return_tokens_as_token_ids = front.return_tokens_as_token_ids;
                cfg.generation_config = front.generation_config.clone();
                cfg.override_generation_config = front.override_generation_config.clone();
                cfg.served_model_name = served.first().cloned();
                cfg.limits = front.limits.clone();
                let engine = Arc::new(ServingEngine::new(cfg).context("starting the engine")?);
                let max_model_len = engine.max_model_len();
                settings.max_model_len = max_model_len;
                let mut state = AppState::new(settings).with_engine(engine.clone());
                if !tokens_only && !self.skip_tokenizer_init {
                    // The engine loaded the tokenizer side with the same generation config:
                    // the renderer and derenderer share it rather than read the files again.
                    let model = match engine.model() {
                        Some(m) => Arc::clone(m),
                        None => Arc::new(front.load_model(&spec)?),
                    };
                    let renderer = front.renderer(model.clone(), &served, Some(max_model_len))?;
                    let derenderer = front.derenderer(model, &served, Some(max_model_len))?;
                    state = state
                        .with_renderer(Arc::new(renderer))
                        .with_derenderer(Arc::new(derenderer));
                    if self.launch_kobold_api {
                        state = state.with_kobold();
                    }
                }
                state
            }
        };
        Ok(Server {
            state,
            base_path: self.base_path,
            docs: self.docs,
        })
    }
}
