//! `openai` (gpt-oss Harmony). vLLM parses token ids with the `o200k_harmony` encoding; here the
//! decoded text with special tokens kept is parsed instead. Messages are
//! `<|start|>assistant<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>TEXT<|end|>`
//! (the first `<|start|>assistant` is in the prompt). `analysis` → reasoning, `final` → content,
//! `commentary` with `to=functions.NAME` → tool call (TEXT = arguments), `commentary` without a
//! recipient → content. `<|call|>`/`<|return|>` also end a message. Text without Harmony framing
//! yields no content.
use super::{safe_end, seek, Early, EarlyScan, RawCall, ToolFormat, ToolOutput};
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

/// Channel and recipient of a message from the text before its `<|message|>` (the header is
/// what follows the last `<|start|>`).
fn header_kind(header: &str) -> (&str, Option<&str>) {
    let header = header.rsplit("<|start|>").next().unwrap_or(header);
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
    (channel, recipient)
}

impl ToolFormat for Harmony {
    /// `vllm/parser/harmony.py` `HarmonyParser.parse` builds the content itself
    /// (`"\n".join(parts) or None`), without `DelegatingParser`'s whitespace rule.
    fn delegated(&self) -> bool {
        false
    }

    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let mut content: Option<String> = None;
        let mut reasoning: Option<String> = None;
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(m) = rest.find("<|message|>") {
            let header = &rest[..m];
            let body_all = &rest[m + "<|message|>".len()..];
            let (body, next) = match end_of_message(body_all) {
                Some((p, len)) => (&body_all[..p], &body_all[p + len..]),
                None => (body_all, ""),
            };
            rest = next;
            let (channel, recipient) = header_kind(header);
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

    /// A message addressed to `functions.NAME` is a call whatever follows (an unterminated one
    /// keeps its text so far), so the call is sent when its `<|message|>` ends the header, and
    /// its verbatim body streams as argument fragments (a partial end marker is held back).
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(HarmonyScan::default()))
    }
}

/// The incremental mirror of [`Harmony::parse`] for the calls.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[doc(hidden)]
pub struct HarmonyScan {
    /// Start of the current message's header.
    cursor: usize,
    from: usize,
    /// In a body: (where arguments sent so far end, whether this message is a call).
    body: Option<(usize, bool)>,
}

impl EarlyScan for HarmonyScan {
    fn save(&self) -> super::ScanSnapshot {
        super::ScanSnapshot::Harmony(self.clone())
    }

    fn load(&mut self, s: super::ScanSnapshot) -> bool {
        match s {
            super::ScanSnapshot::Harmony(x) => {
                *self = x;
                true
            }
            _ => false,
        }
    }

    fn scan(&mut self, buf: &str, _ctx: &ParserConfig, out: &mut Vec<Early>) {
        loop {
            match self.body {
                None => {
                    let Some((m, _)) = seek(buf, &mut self.from, &["<|message|>"]) else {
                        return;
                    };
                    let body = m + "<|message|>".len();
                    let is_call = match header_kind(&buf[self.cursor..m]) {
                        (_, Some(r)) => match r.strip_prefix("functions.") {
                            Some(name) => {
                                out.push(Early::Call {
                                    name: name.to_string(),
                                    id: None,
                                    args: String::new(),
                                });
                                true
                            }
                            None => false,
                        },
                        _ => false,
                    };
                    self.from = body;
                    self.body = Some((body, is_call));
                }
                Some((sent, is_call)) => match seek(buf, &mut self.from, ENDS) {
                    Some((p, i)) => {
                        if is_call && p > sent {
                            out.push(Early::Args(buf[sent..p].to_string()));
                        }
                        self.cursor = p + ENDS[i].len();
                        self.from = self.cursor;
                        self.body = None;
                    }
                    None => {
                        if is_call {
                            let e = safe_end(buf, sent, ENDS);
                            if e > sent {
                                out.push(Early::Args(buf[sent..e].to_string()));
                                self.body = Some((e, true));
                            }
                        }
                        return;
                    }
                },
            }
        }
    }
}

impl HarmonyScan {
    /// Every buffer offset the scanner holds (for snapshot rebasing and validation).
    pub(crate) fn offsets(&mut self) -> Vec<&mut usize> {
        let mut v = vec![&mut self.cursor, &mut self.from];
        if let Some((s, _)) = &mut self.body {
            v.push(s);
        }
        v
    }

    /// Order constraints between the offsets of a restored snapshot (each offset is already
    /// known to be a char boundary of the buffer).
    pub(crate) fn check(&self, len: usize) -> bool {
        let _ = len;
        self.cursor <= self.from
    }
}
