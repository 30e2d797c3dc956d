//! `aphro launch render MODEL`: the GPU-less frontend (render, derender, tokenize, models,
//! health, version, metrics). Loads the tokenizer and template only, never weights.
use super::server_args::{FrontendArgs, ServerArgs};
use crate::server::{self, AppState, Role};
use std::process::ExitCode;

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

/// Loads tokenizer, renderer and derenderer into the state [`server::router`] serves,
/// through [`crate::server::Server::builder`].
pub fn build_render_state(args: RenderArgs) -> anyhow::Result<AppState> {
    let mut b = args
        .server
        .builder(Role::Render, args.model.clone(), &args.frontend)?;
    if let Some(n) = args.max_model_len {
        b = b.max_model_len(n);
    }
    Ok(b.build()?.into_state())
}
