//! `aphro render`: an offline renderer. Reads one request (chat if it has `messages`,
//! completion if it has `prompt`) from a file or stdin and prints the render response; with
//! `--jsonl` every input line is a request and every output line its response or error body.
use anyhow::Context;
use aphro_core::protocol::GenerateRequest;
use aphro_core::renderer::{parse_chat_request, parse_completion_request};
use aphro_core::{ContentFormat, Model, RenderOptions, Renderer};
use serde_json::Value;
use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: an HF-layout directory, a `.gguf` file, or a hub id (cache first; HF_HUB_OFFLINE honoured).
    #[arg(long)]
    pub model: String,
    /// Chat template file overriding the model's.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// auto | string | openai (vLLM's --chat-template-content-format).
    #[arg(long, default_value = "auto")]
    pub chat_template_content_format: String,
    /// Context length override.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// vLLM's --tool-call-parser: with --enable-auto-tool-choice, requests may offer tools
    /// (without both, tool choices other than "none" are refused, as vLLM's render does).
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// vLLM's --enable-auto-tool-choice.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
    /// Request file (default: stdin).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// One request per input line, one response (or error body) per output line.
    #[arg(long)]
    pub jsonl: bool,
}

/// Renders one request body to its response JSON, or the error envelope.
fn render_one(renderer: &Renderer, body: &Value) -> Result<Value, Value> {
    let to_json = |g: &GenerateRequest| serde_json::to_value(g).unwrap_or(Value::Null);
    let result = if body.get("messages").is_some() {
        parse_chat_request(body)
            .and_then(|r| renderer.render_chat(&r))
            .map(|g| to_json(&g))
    } else if body.get("prompt").is_some() || body.get("prompt_embeds").is_some() {
        parse_completion_request(body)
            .and_then(|r| renderer.render_completion(&r))
            .map(|v| Value::Array(v.iter().map(to_json).collect()))
    } else {
        Err(aphro_core::Error::validation(
            "1 validation error:\n  request needs `messages` (chat) or `prompt` (completion)",
            Some("body.messages"),
        ))
    };
    result.map_err(|e| e.to_envelope())
}

fn parse_body(text: &str) -> Result<Value, Value> {
    serde_json::from_str::<Value>(text).map_err(|e| {
        aphro_core::Error::validation(
            format!("1 validation error:\n  JSON decode error: {e}"),
            Some("body"),
        )
        .to_envelope()
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let model =
        Model::load(&args.model).with_context(|| format!("loading model `{}`", args.model))?;
    let chat_template = match &args.chat_template {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    let content_format: ContentFormat = args.chat_template_content_format.parse()?;
    let renderer = Renderer::new(
        Arc::new(model),
        RenderOptions {
            chat_template,
            content_format,
            max_model_len: args.max_model_len,
            tool_call_parser: args.tool_call_parser.clone(),
            enable_auto_tool_choice: args.enable_auto_tool_choice,
            ..RenderOptions::default()
        },
    )?;
    let mut input = String::new();
    match &args.input {
        Some(p) => {
            input =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        }
        None => {
            std::io::stdin()
                .read_to_string(&mut input)
                .context("reading stdin")?;
        }
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut failed = false;
    if args.jsonl {
        for line in input.as_bytes().lines() {
            let line = line.context("reading input")?;
            if line.trim().is_empty() {
                continue;
            }
            let v = match parse_body(&line).and_then(|b| render_one(&renderer, &b)) {
                Ok(v) => v,
                Err(e) => {
                    failed = true;
                    e
                }
            };
            writeln!(out, "{}", serde_json::to_string(&v)?)?;
        }
    } else {
        let v = match parse_body(&input).and_then(|b| render_one(&renderer, &b)) {
            Ok(v) => v,
            Err(e) => {
                failed = true;
                e
            }
        };
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
