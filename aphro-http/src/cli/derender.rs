//! `aphro derender`: an offline derenderer. Reads one chat or completion derender body (chat if
//! it has `generate_response` or `chat_request`/`generate_chunk` without `completion_request`,
//! completion if it has `generate_responses` or `completion_request`) from a file or stdin and
//! prints the response; with `--jsonl` one body per line. A bad body prints the error envelope
//! and the exit status is non-zero.
use super::io::{read_input, write_lines};
use anyhow::Context;
use aphro_core::protocol::{
    parse_derender_chat_body, parse_derender_completion_body, DerenderChatBody,
    DerenderCompletionBody,
};
use aphro_core::{DerenderOptions, Derenderer, Model};
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: an HF-layout directory, a `.gguf` file, or a hub id.
    #[arg(long)]
    pub model: String,
    /// Served model name (default: the --model string).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// vLLM --tool-call-parser name.
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// vLLM --reasoning-parser name.
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// vLLM --enable-auto-tool-choice.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
    /// Context length override.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// --max-logprobs (default 20).
    #[arg(long, default_value_t = 20)]
    pub max_logprobs: i64,
    /// vLLM --return-tokens-as-token-ids.
    #[arg(long)]
    pub return_tokens_as_token_ids: bool,
    /// Request file (default: stdin).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// One request per input line, one response (or error body) per output line.
    #[arg(long)]
    pub jsonl: bool,
}

fn is_completion(body: &Value) -> bool {
    body.get("generate_responses").is_some() || body.get("completion_request").is_some()
}

/// Derenders one body to its response JSON, or the error envelope.
pub fn derender_one(d: &Derenderer, body: &Value) -> Result<Value, Value> {
    let to = |r: Result<Value, serde_json::Error>| r.unwrap_or(Value::Null);
    let result = if is_completion(body) {
        parse_derender_completion_body(body).and_then(|b| match b {
            DerenderCompletionBody::Full(r) => d
                .derender_completion(*r)
                .map(|x| to(serde_json::to_value(x))),
            DerenderCompletionBody::Stream(r) => d
                .derender_completion_stream(*r)
                .map(|x| to(serde_json::to_value(x))),
        })
    } else {
        parse_derender_chat_body(body).and_then(|b| match b {
            DerenderChatBody::Full(r) => d.derender_chat(*r).map(|x| to(serde_json::to_value(x))),
            DerenderChatBody::Stream(r) => d
                .derender_chat_stream(*r)
                .map(|x| to(serde_json::to_value(x))),
        })
    };
    result.map_err(|e| e.to_envelope())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let model =
        Model::load(&args.model).with_context(|| format!("loading model `{}`", args.model))?;
    let d = Derenderer::new(
        Arc::new(model),
        DerenderOptions {
            served_model_name: Some(args.served_model_name.unwrap_or(args.model.clone())),
            tool_call_parser: args.tool_call_parser,
            reasoning_parser: args.reasoning_parser,
            enable_auto_tool_choice: args.enable_auto_tool_choice,
            max_model_len: args.max_model_len,
            max_logprobs: args.max_logprobs,
            return_tokens_as_token_ids: args.return_tokens_as_token_ids,
        },
    )?;
    let input = read_input(args.input.as_deref())?;
    write_lines(&input, args.jsonl, |b| derender_one(&d, b))
}
