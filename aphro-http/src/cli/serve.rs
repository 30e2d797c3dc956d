//! `aphro serve [MODEL]`: the integrated server (OpenAI API + render, derender, generate), or
//! with `--tokens-only` the token-in/token-out engine alone (no tokenizer is loaded).
//! Without MODEL it serves the embedded default model.
use super::generate::EngineArgs;
use super::server_args::{
    build_derenderer, build_renderer, served_names, FrontendArgs, ServerArgs,
};
use crate::server::{self, AppState, Role, ServerSettings};
use anyhow::Context;
use aphro_engine::serving::ServingEngine;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: a `.gguf` file, an HF directory or a hub id (default: the embedded SmolLM2).
    #[arg(value_name = "MODEL")]
    pub model_arg: Option<String>,
    /// Engine only: generate and abort, tokens in and out, no tokenizer.
    #[arg(long)]
    pub tokens_only: bool,
    /// Also mount the scale-out routes (render, derender, generate, abort) on the integrated
    /// server; without it they answer 403, as vLLM's do. `--tokens-only` always has them.
    #[arg(long)]
    pub enable_scale_out: bool,
    /// Load no tokenizer: only token-in/token-out generation works; the text routes (OpenAI,
    /// render, tokenize) answer 400 and stop strings are refused.
    #[arg(long)]
    pub skip_tokenizer_init: bool,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub frontend: FrontendArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let server_args = args.server.clone();
    let state = build_state(args)?;
    server::run_blocking(
        state,
        &server_args.host,
        server_args.port,
        server_args.listen_config(),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Loads the engine (and, unless `--tokens-only`, tokenizer, renderer and derenderer) into
/// the state [`server::router`] serves; embedders and the load benchmark call this too.
pub fn build_state(mut args: Args) -> anyhow::Result<AppState> {
    if let Some(m) = args.model_arg.take() {
        args.engine.model = Some(m);
    }
    let display_name = args
        .engine
        .model
        .clone()
        .unwrap_or_else(|| aphro_core::default_model::DEFAULT_MODEL_NAME.to_owned());
    let served = served_names(&args.server, &display_name);
    let mut cfg = args.engine.serving_config(true)?;
    cfg.tokens_only = args.tokens_only;
    cfg.skip_tokenizer_init = args.skip_tokenizer_init;
    cfg.return_tokens_as_token_ids = args.frontend.return_tokens_as_token_ids;
    cfg.generation_config = args.frontend.generation_config.clone();
    cfg.override_generation_config = args
        .frontend
        .override_generation_config
        .clone()
        .unwrap_or_default();
    cfg.served_model_name = served.first().cloned();
    cfg.limits = args.server.limits.request_limits();
    let model_path = cfg.model.clone();
    let engine = Arc::new(ServingEngine::new(cfg).context("starting the engine")?);
    let max_model_len = engine.max_model_len();
    let settings = ServerSettings {
        role: if args.tokens_only {
            Role::TokensOnly
        } else {
            Role::Full
        },
        served_model_names: served.clone(),
        model_root: model_path.clone(),
        max_model_len,
        api_keys: args.server.api_key.clone(),
        enable_request_id_headers: args.server.enable_request_id_headers,
        max_body_bytes: args.server.max_request_body_bytes,
        body_read_timeout: args.server.body_read_timeout(),
        enable_scale_out: args.enable_scale_out,
        skip_tokenizer_init: args.skip_tokenizer_init,
    };
    let mut state = AppState::new(settings).with_engine(engine.clone());
    if !args.tokens_only && !args.skip_tokenizer_init {
        // The engine loaded the tokenizer side with the same generation config: the renderer
        // and derenderer share it rather than reading the model files again.
        let model = match engine.model() {
            Some(m) => Arc::clone(m),
            None => Arc::new(args.frontend.load_model(&model_path)?),
        };
        let renderer = build_renderer(
            model.clone(),
            &args.frontend,
            args.server.limits.request_limits(),
            &served,
            Some(max_model_len),
        )?;
        let derenderer = build_derenderer(model, &args.frontend, &served, Some(max_model_len))?;
        state = state
            .with_renderer(Arc::new(renderer))
            .with_derenderer(Arc::new(derenderer));
    }
    Ok(state)
}
