//! Command-line interface. One module per subcommand; each exposes `Args` (clap) and
//! `run(args) -> anyhow::Result<ExitCode>`. Subcommand names and flags are a public
//! interface that users script against: keep them stable.
pub mod parse;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub mod bench;
pub mod derender;
pub mod detokenize;
pub mod embed;
pub mod generate;
pub(crate) mod io;
pub mod launch;
pub mod render;
pub mod serve;
pub mod server_args;
pub mod tokenize;
pub mod transcribe;

#[derive(Debug, Parser)]
#[command(
    name = "aphro",
    version,
    about = "Disaggregated LLM serving: render, generate, derender"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process and matched at once: the size difference between the variants
// costs nothing, and boxing would only add noise to every subcommand.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the version and exit.
    Version,
    /// Parse model output with vLLM tool-call / reasoning parsers (debugging aid).
    Parse(parse::Args),
    /// Render one chat/completion request (or a JSONL batch) to GenerateRequest JSON, offline.
    Render(render::Args),
    /// Launch a server role (vLLM's `vllm launch`).
    #[command(subcommand)]
    Launch(launch::LaunchCommand),
    /// Derender one chat/completion derender request (or a JSONL batch) to the OpenAI response, offline.
    Derender(derender::Args),
    /// Tokenize a `/tokenize` body (prompt or messages), offline.
    Tokenize(tokenize::Args),
    /// Detokenize a `/detokenize` body, offline.
    Detokenize(detokenize::Args),
    /// Run GenerateRequest bodies (the render output) through the engine, offline; with
    /// `--jsonl` the whole file is one batch.
    Generate(generate::Args),
    /// Serve the OpenAI API + render/derender/generate; with --tokens-only the engine alone.
    Serve(serve::Args),
    /// Engine throughput: prefill, batch-1 decode and aggregate decode tok/s.
    Bench(bench::Args),
    /// Embed `/v1/embeddings` bodies (or a JSONL batch) on a pooling model, offline.
    Embed(embed::Args),
    /// Transcribe an audio file (WAV, FLAC, MP3, Ogg Vorbis) on a speech model, offline.
    Transcribe(transcribe::Args),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Version => {
            println!("aphro {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        Command::Parse(args) => parse::run(args),
        Command::Render(args) => render::run(args),
        Command::Launch(cmd) => launch::run(cmd),
        Command::Derender(args) => derender::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Detokenize(args) => detokenize::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Embed(args) => embed::run(args),
        Command::Transcribe(args) => transcribe::run(args),
    }
}
