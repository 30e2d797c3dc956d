//! `aphro parse`: run a tool-call / reasoning parser over model output, as the server would.
//!
//! Input: one JSON object (or one per line with `--jsonl`) with the corpus fields
//! `{"model_output", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
//! "prompt_text"}`. Output per input: `{"content", "reasoning", "tool_calls": [{"id", "name",
//! "arguments"}], "finish_reason"}`. `--stream-chunk N` feeds the text in N-character deltas and
//! prints the aggregate (which must equal the one-shot result).
use anyhow::{bail, Context};
use aphro_parsers::{Aggregator, ParserConfig, ParserRegistry};
use serde_json::{json, Value};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// vLLM `--tool-call-parser` name (e.g. hermes, qwen3_coder, kimi_k2).
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// vLLM `--reasoning-parser` name (e.g. qwen3, deepseek_r1).
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// Read from this file instead of stdin.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// One JSON object per line; one output line each.
    #[arg(long)]
    pub jsonl: bool,
    /// Feed the output in deltas of N characters instead of all at once.
    #[arg(long, value_name = "N")]
    pub stream_chunk: Option<usize>,
}

fn run_one(args: &Args, req: &Value) -> anyhow::Result<Value> {
    let text = req
        .get("model_output")
        .and_then(Value::as_str)
        .context("missing string field model_output")?;
    let ctx = ParserConfig::from_request_json(req)?;
    let mut p = ParserRegistry::new().new_parser(
        args.tool_call_parser.as_deref(),
        args.reasoning_parser.as_deref(),
        &ctx,
    )?;
    let msg = match args.stream_chunk {
        None => aphro_parsers::parse(p.as_mut(), text),
        Some(n) => {
            let n = n.max(1);
            let mut agg = Aggregator::new();
            let chars: Vec<(usize, char)> = text.char_indices().collect();
            for chunk in chars.chunks(n) {
                let start = chunk[0].0;
                let last = chunk[chunk.len() - 1];
                agg.add(&p.push(&text[start..last.0 + last.1.len_utf8()]));
            }
            agg.add(&p.finish());
            agg.into_message()
        }
    };
    let calls: Vec<Value> = msg
        .tool_calls
        .iter()
        .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
        .collect();
    Ok(json!({
        "content": msg.content,
        "reasoning": msg.reasoning,
        "tool_calls": calls,
        "finish_reason": msg.finish_reason(&ctx),
    }))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.tool_call_parser.is_none() && args.reasoning_parser.is_none() {
        bail!("give --tool-call-parser and/or --reasoning-parser");
    }
    let mut input = String::new();
    match &args.input {
        Some(path) => {
            input = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?
        }
        None => {
            std::io::stdin()
                .read_to_string(&mut input)
                .context("reading stdin")?;
        }
    }
    if args.jsonl {
        for (i, line) in input
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let req: Value = serde_json::from_str(line)
                .with_context(|| format!("line {}: invalid JSON", i + 1))?;
            println!(
                "{}",
                run_one(&args, &req).with_context(|| format!("line {}", i + 1))?
            );
        }
    } else {
        let req: Value = serde_json::from_str(&input).context("input is not a JSON object")?;
        println!("{}", serde_json::to_string_pretty(&run_one(&args, &req)?)?);
    }
    Ok(ExitCode::SUCCESS)
}
