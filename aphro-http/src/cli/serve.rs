//! `aphro serve [MODEL]`: the integrated server (OpenAI API + render, derender, generate), or
//! with `--tokens-only` the token-in/token-out engine alone (no tokenizer is loaded).
//! Without MODEL it serves the embedded default model. A pooling model (`--runner pooling`,
//! or detected from the folder) serves `/v1/embeddings` instead; a speech model (a Whisper
//! folder, detected) serves `/v1/audio/transcriptions` and `/v1/audio/translations`.
use super::generate::EngineArgs;
use super::server_args::{FrontendArgs, ServerArgs};
use crate::server::{self, AppState, Role};
use std::process::ExitCode;

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
    /// Also serve the KoboldAI API (`/api/v1/generate`, `/api/extra/generate/stream`, ...),
    /// as Aphrodite does; behind `--api-key` like the `/v1` routes.
    #[arg(long)]
    pub launch_kobold_api: bool,
    /// What runs the model: `generate` (a decoder: the OpenAI text routes), `pooling` (an
    /// encoder: `/v1/embeddings`), or `auto`: pooling for a folder with sentence-transformers'
    /// `modules.json` or a BERT architecture in `config.json`, generate otherwise.
    #[arg(long, value_enum, default_value_t = Runner::Auto)]
    pub runner: Runner,
    /// Speech models: the longest audio a request may carry, in seconds (longer uploads are
    /// a 400). Default: no limit beyond the upload size (`VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`).
    #[arg(long, value_name = "SECONDS")]
    pub max_audio_duration: Option<f64>,
    /// Speech models: threads the model computes on (default: every core).
    #[arg(long, value_name = "N")]
    pub speech_threads: Option<usize>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub frontend: FrontendArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `--runner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Runner {
    Auto,
    Generate,
    Pooling,
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
/// the state [`server::router`] serves, through [`crate::server::Server::builder`];
/// embedders and the load benchmark call this too.
pub fn build_state(mut args: Args) -> anyhow::Result<AppState> {
    if let Some(m) = args.model_arg.take() {
        args.engine.model = Some(m);
    }
    let pooling = match args.runner {
        Runner::Pooling => true,
        Runner::Generate => false,
        Runner::Auto => args.engine.model.as_deref().is_some_and(|m| {
            aphro_engine::model::resolve_model_path(std::path::Path::new(m))
                .is_ok_and(|dir| aphro_engine::pooling::is_pooling_model(&dir))
        }),
    };
    // `--runner auto` serves a Whisper folder as a speech model.
    let speech = args.runner == Runner::Auto
        && args.engine.model.as_deref().is_some_and(|m| {
            aphro_engine::model::resolve_model_path(std::path::Path::new(m))
                .is_ok_and(|dir| aphro_engine::speech::Transcriber::is_speech_model(&dir))
        });
    let role = if speech {
        if args.tokens_only || args.enable_scale_out || args.launch_kobold_api {
            anyhow::bail!(
                "a speech model serves the audio routes only: --tokens-only, \
                 --enable-scale-out and --launch-kobold-api do not apply"
            );
        }
        Role::Speech
    } else if pooling {
        if args.tokens_only || args.enable_scale_out || args.launch_kobold_api {
            anyhow::bail!(
                "a pooling model serves the pooling routes only: --tokens-only, \
                 --enable-scale-out and --launch-kobold-api need --runner generate"
            );
        }
        Role::Pooling
    } else if args.tokens_only {
        Role::TokensOnly
    } else {
        Role::Full
    };
    let mut builder = args
        .server
        .builder(role, args.engine.model.clone(), &args.frontend)?;
    if let Some(s) = args.max_audio_duration {
        if !(s.is_finite() && s > 0.0) {
            anyhow::bail!("--max-audio-duration must be a positive number of seconds");
        }
        builder = builder.max_audio_duration(s);
    }
    if let Some(n) = args.speech_threads {
        builder = builder.speech_threads(n.max(1));
    }
    let server = builder
        .engine(args.engine.serving_config(true)?)
        .dtype(args.engine.effective_dtype().into())
        .enable_scale_out(args.enable_scale_out)
        .skip_tokenizer_init(args.skip_tokenizer_init)
        .launch_kobold_api(args.launch_kobold_api)
        .build()?;
    Ok(server.into_state())
}
