//! `aphro embed`: `/v1/embeddings` bodies offline on a pooling model folder — one body in,
//! the response (or vLLM's error body) out; `--jsonl` for one body per line. The same code as
//! the route (`server::pooling::embed_body`), without a server.
use super::io::{read_input, write_lines};
use crate::server::pooling::embed_body;
use anyhow::Context;
use aphro_core::protocol::random_request_id;
use aphro_engine::pooling::Embedder;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A pooling model: an HF folder (e.g. all-MiniLM-L6-v2) or a cached hub id.
    #[arg(long)]
    pub model: String,
    /// The name responses report as `model` (default: MODEL as given).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Request file (default: stdin).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// One request per input line, one response (or error body) per output line.
    #[arg(long)]
    pub jsonl: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| args.model.clone());
    let dir = aphro_engine::model::resolve_model_path(Path::new(&args.model))?;
    let embedder = Embedder::load(&dir)
        .with_context(|| format!("loading pooling model `{}`", args.model))?
        .with_served_name(name.clone());
    let input = read_input(args.input.as_deref())?;
    write_lines(&input, args.jsonl, |body| {
        let id = format!("embd-{}", random_request_id());
        embed_body(&embedder, name.clone(), id, body)
            .map(|r| serde_json::to_value(r).unwrap_or_default())
            .map_err(|e| serde_json::to_value(e.error_response()).unwrap_or_default())
    })
}
