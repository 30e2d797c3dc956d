//! Command-line interface. One module per subcommand; each exposes `Args` (clap) and
//! `run(args) -> anyhow::Result<ExitCode>`. Subcommand names and flags are a public
//! interface that users script against: keep them stable.
pub mod parse;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub mod bench;
pub mod generate;
pub mod render;

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

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the version and exit.
    Version,
    /// Parse model output with vLLM tool-call / reasoning parsers (debugging aid).
    Parse(parse::Args),
    /// Render one chat/completion request (or a JSONL batch) to GenerateRequest JSON, offline.
    Render(render::Args),
    /// Run GenerateRequest bodies (the render output) through the engine, offline; with
    /// `--jsonl` the whole file is one batch.
    Generate(generate::Args),
    /// Engine throughput: prefill, batch-1 decode and aggregate decode tok/s.
    Bench(bench::Args),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Version => {
            println!("aphro {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        Command::Parse(args) => parse::run(args),
        Command::Render(args) => render::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench::run(args),
    }
}
