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
    #[arg(value_name = "MODEL")]
    pub model: Option<String>,
    /// The model as a flag, as vLLM's `--model`; MODEL wins when both are given.
    #[arg(long = "model", value_name = "MODEL")]
    pub model_flag: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub frontend: FrontendArgs,
    /// Context length (default: from the model files).
    #[arg(long)]
    pub max_model_len: Option<usize>,
}

impl RenderArgs {
    /// The model to load: MODEL, else `--model`.
    pub fn model(&self) -> Option<String> {
        self.model.clone().or_else(|| self.model_flag.clone())
    }
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
        .builder(Role::Render, args.model(), &args.frontend)?;
    if let Some(n) = args.max_model_len {
        b = b.max_model_len(n);
    }
    Ok(b.build()?.into_state())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        launch: LaunchCommand,
    }

    fn model(args: &[&str]) -> Option<String> {
        let argv = ["aphro", "render"].iter().chain(args);
        let LaunchCommand::Render(r) = Cli::parse_from(argv).launch;
        r.model()
    }

    #[test]
    fn the_model_comes_as_an_argument_or_as_vllms_flag() {
        assert_eq!(model(&[]), None);
        assert_eq!(model(&["a/b"]).as_deref(), Some("a/b"));
        assert_eq!(model(&["--model", "c/d"]).as_deref(), Some("c/d"));
        assert_eq!(model(&["a/b", "--model", "c/d"]).as_deref(), Some("a/b"));
    }
}
