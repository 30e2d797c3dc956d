//! `aphro embed`: `/v1/embeddings` bodies offline on a pooling model folder — one body in,
//! the response (or vLLM's error body) out; `--jsonl` for one body per line. The same code as
//! the route (`server::pooling::embed_body`), without a server.
use super::io::{read_input, write_lines};
use crate::server::pooling::{embed_body, EmbedOutput};
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
    // Chat `messages` render through the model's chat template, as on the server.
    let model = aphro_core::Model::load(&dir.to_string_lossy())
        .with_context(|| format!("loading the tokenizer of `{}`", args.model))?;
    let renderer = aphro_core::Renderer::new(
        std::sync::Arc::new(model),
        aphro_core::RenderOptions {
            max_model_len: Some(embedder.max_model_len()),
            ..Default::default()
        },
    )?;
    let input = read_input(args.input.as_deref())?;
    write_lines(&input, args.jsonl, |body| {
        let id = format!("embd-{}", random_request_id());
        match embed_body(&embedder, Some(&renderer), name.clone(), id, body) {
            Ok(EmbedOutput::Json(r)) => Ok(serde_json::to_value(r).unwrap_or_default()),
            // One JSON line per request: the binary forms have no place in it.
            Ok(EmbedOutput::Bytes { .. }) => Err(serde_json::to_value(
                crate::error::ApiError::bad_request(
                    "encoding_format bytes / bytes_only is not supported by `aphro embed` \
                     (JSON output): use float or base64",
                )
                .with_param("encoding_format")
                .error_response(),
            )
            .unwrap_or_default()),
            Err(e) => Err(serde_json::to_value(e.error_response()).unwrap_or_default()),
        }
    })
}
