//! `aphro launch render MODEL`: the GPU-less frontend (render, derender, tokenize, models,
//! health, version, metrics). Loads the tokenizer and template only, never weights.
use super::server_args::{
    build_derenderer, build_renderer, resolve_model_arg, served_names, FrontendArgs, ServerArgs,
};
use crate::server::{self, AppState, Role, ServerSettings};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Debug, clap::Subcommand)]
pub enum LaunchCommand {
    /// Run the GPU-less render/derender frontend.
    Render(RenderArgs),
}

#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// Model: HF directory, `.gguf` file or hub id (default: the embedded SmolLM2).
    pub model: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub frontend: FrontendArgs,
    /// Context length (default: from the model files).
    #[arg(long)]
    pub max_model_len: Option<usize>,
}

pub fn run(cmd: LaunchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        LaunchCommand::Render(args) => run_render(args),
    }
}

fn run_render(args: RenderArgs) -> anyhow::Result<ExitCode> {
    let server_args = args.server.clone();
    let state = build_render_state(args)?;
    server::run_blocking(
        state,
        &server_args.host,
        server_args.port,
        server_args.listen_config(),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Loads tokenizer, renderer and derenderer into the state [`server::router`] serves.
pub fn build_render_state(args: RenderArgs) -> anyhow::Result<AppState> {
    let model_arg = resolve_model_arg(args.model.as_deref())?;
    let model = Arc::new(args.frontend.load_model(&model_arg)?);
    let served = served_names(
        &args.server,
        args.model
            .as_deref()
            .unwrap_or(aphro_core::default_model::DEFAULT_MODEL_NAME),
    );
    let renderer = Arc::new(build_renderer(
        model.clone(),
        &args.frontend,
        args.server.limits.request_limits(),
        &served,
        args.max_model_len,
    )?);
    let derenderer = Arc::new(build_derenderer(
        model,
        &args.frontend,
        &served,
        args.max_model_len,
    )?);
    let settings = ServerSettings {
        role: Role::Render,
        served_model_names: served,
        model_root: model_arg,
        max_model_len: renderer.max_model_len(),
        api_keys: args.server.api_key.clone(),
        enable_request_id_headers: args.server.enable_request_id_headers,
        max_body_bytes: args.server.max_request_body_bytes,
        body_read_timeout: args.server.body_read_timeout(),
        enable_scale_out: false,
        skip_tokenizer_init: false,
    };
    Ok(AppState::new(settings)
        .with_renderer(renderer)
        .with_derenderer(derenderer))
}
