//! Input/output shared by the offline subcommands (`derender`, `tokenize`, `detokenize`).
use anyhow::Context;
use serde_json::Value;
use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::ExitCode;

/// The whole input: a file, or stdin.
pub fn read_input(path: Option<&Path>) -> anyhow::Result<String> {
    let mut input = String::new();
    match path {
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
    Ok(input)
}

/// A JSON body, or the structural 400 envelope.
pub fn parse_body(text: &str) -> Result<Value, Value> {
    serde_json::from_str::<Value>(text).map_err(|e| {
        aphro_core::Error::validation(
            format!("1 validation error:\n  JSON decode error: {e}"),
            Some("body"),
        )
        .to_envelope()
    })
}

/// Runs `f` on one body (or on every non-blank line with `jsonl`) and prints one JSON line per
/// result; any error makes the exit status non-zero.
pub fn write_lines(
    input: &str,
    jsonl: bool,
    f: impl Fn(&Value) -> Result<Value, Value>,
) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut failed = false;
    let mut one = |text: &str| -> anyhow::Result<()> {
        let v = match parse_body(text).and_then(|b| f(&b)) {
            Ok(v) => v,
            Err(e) => {
                failed = true;
                e
            }
        };
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
        Ok(())
    };
    if jsonl {
        for line in input.as_bytes().lines() {
            let line = line.context("reading input")?;
            if line.trim().is_empty() {
                continue;
            }
            one(&line)?;
        }
    } else {
        one(input)?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
