//! `aphro tokenize`: the `/tokenize` body (`api.md` §9) offline — `{"prompt": …}` or `{"messages": …}`
//! in, `{"count","max_model_len","tokens","token_strs"?}` out; `--jsonl` for batches.
use super::io::{read_input, write_lines};
use anyhow::Context;
use aphro_core::protocol::TokenizeRequest;
use aphro_core::{Model, RenderOptions, Renderer};
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: an HF-layout directory, a `.gguf` file, or a hub id.
    #[arg(long)]
    pub model: String,
    /// Context length override (reported as `max_model_len`).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Request file (default: stdin).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// One request per input line, one response (or error body) per output line.
    #[arg(long)]
    pub jsonl: bool,
}

pub(crate) fn renderer(model: &str, max_model_len: Option<usize>) -> anyhow::Result<Renderer> {
    let m = Model::load(model).with_context(|| format!("loading model `{model}`"))?;
    Ok(Renderer::new(
        Arc::new(m),
        RenderOptions {
            max_model_len,
            ..RenderOptions::default()
        },
    )?)
}

fn tokenize_one(r: &Renderer, body: &Value) -> Result<Value, Value> {
    let req: TokenizeRequest = serde_json::from_value(body.clone()).map_err(|e| {
        aphro_core::Error::validation(
            format!("1 validation error:\n  body: {e} (need `prompt` or `messages`)"),
            Some("body"),
        )
        .to_envelope()
    })?;
    r.tokenize(&req)
        .map(|x| serde_json::to_value(x).unwrap_or(Value::Null))
        .map_err(|e| e.to_envelope())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let r = renderer(&args.model, args.max_model_len)?;
    let input = read_input(args.input.as_deref())?;
    write_lines(&input, args.jsonl, |b| tokenize_one(&r, b))
}
