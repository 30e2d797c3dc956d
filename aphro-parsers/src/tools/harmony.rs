//! `openai` (gpt-oss Harmony). vLLM parses token ids with the `o200k_harmony` encoding; here the
//! decoded text with special tokens kept is parsed instead. Messages are
//! `<|start|>assistant<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>TEXT<|end|>`
//! (the first `<|start|>assistant` is in the prompt). `analysis` → reasoning, `final` → content,
//! `commentary` with `to=functions.NAME` → tool call (TEXT = arguments), `commentary` without a
//! recipient → content. `<|call|>`/`<|return|>` also end a message. Text without Harmony framing
//! yields no content.
use super::{RawCall, ToolFormat, ToolOutput};
use crate::ParserConfig;

pub struct Harmony;

const ENDS: &[&str] = &["<|end|>", "<|call|>", "<|return|>"];

/// First message terminator: one left-to-right pass (searching each marker separately would
/// rescan the rest of the output once per message).
fn end_of_message(s: &str) -> Option<(usize, usize)> {
    s.match_indices("<|").find_map(|(i, _)| {
        ENDS.iter()
            .find(|m| s[i..].starts_with(**m))
            .map(|m| (i, m.len()))
    })
}

impl ToolFormat for Harmony {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let mut content: Option<String> = None;
        let mut reasoning: Option<String> = None;
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(m) = rest.find("<|message|>") {
            let header = &rest[..m];
            let header = header.rsplit("<|start|>").next().unwrap_or(header);
            let body_all = &rest[m + "<|message|>".len()..];
            let (body, next) = match end_of_message(body_all) {
                Some((p, len)) => (&body_all[..p], &body_all[p + len..]),
                None => (body_all, ""),
            };
            rest = next;
            let channel = header
                .split("<|channel|>")
                .nth(1)
                .map(|c| {
                    c.split(|ch: char| ch.is_whitespace() || ch == '<')
                        .next()
                        .unwrap_or("")
                })
                .unwrap_or("");
            let recipient = header
                .split_whitespace()
                .chain(header.split("<|channel|>").flat_map(str::split_whitespace))
                .find_map(|w| w.strip_prefix("to="))
                .map(|r| r.split("<|").next().unwrap_or(r));
            match (channel, recipient) {
                (_, Some(r)) if r.starts_with("functions.") => {
                    calls.push(RawCall::new(&r["functions.".len()..], body));
                }
                ("analysis", _) => reasoning.get_or_insert_with(String::new).push_str(body),
                ("final", _) | ("commentary", None) => {
                    content.get_or_insert_with(String::new).push_str(body)
                }
                _ => {}
            }
            if next.is_empty() {
                break;
            }
        }
        ToolOutput {
            content,
            reasoning,
            calls,
        }
    }
}
