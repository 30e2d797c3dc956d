//! `aphro detokenize`: the `/detokenize` body (`api.md` §9) offline — `{"tokens": [int]}` in,
//! `{"prompt": str}` out; `--jsonl` for batches.
use super::io::{read_input, write_lines};
use aphro_core::protocol::DetokenizeRequest;
use aphro_core::Renderer;
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: an HF-layout directory, a `.gguf` file, or a hub id.
    #[arg(long)]
    pub model: String,
    /// Request file (default: stdin).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// One request per input line, one response (or error body) per output line.
    #[arg(long)]
    pub jsonl: bool,
}

fn detokenize_one(r: &Renderer, body: &Value) -> Result<Value, Value> {
    let req: DetokenizeRequest = serde_json::from_value(body.clone()).map_err(|e| {
        aphro_core::Error::validation(
            format!("1 validation error:\n  body.tokens: {e}"),
            Some("body.tokens"),
        )
        .to_envelope()
    })?;
    r.detokenize(&req)
        .map(|x| serde_json::to_value(x).unwrap_or(Value::Null))
        .map_err(|e| e.to_envelope())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let r = super::tokenize::renderer(&args.model, None)?;
    let input = read_input(args.input.as_deref())?;
    write_lines(&input, args.jsonl, |b| detokenize_one(&r, b))
}
