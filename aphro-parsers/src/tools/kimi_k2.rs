//! `kimi_k2` (engine-based): `<|tool_calls_section_begin|>` then per call
//! `<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>` then
//! `<|tool_calls_section_end|>`. ID is `functions.NAME:N` or `NAME:N` and is returned as the call
//! id. ARGS verbatim (an unterminated last call keeps the text so far). Content before the
//! section is kept unstripped.
//!
//! Bare counter ids (`0`): vLLM 0.33.0 drops the call; the later upstream fix infers the function
//! from the tool list when exactly one tool's properties contain all argument keys. We take the
//! fix (corpus `kimi_k2-t-bare-counter-infer` records 0.33.0; the test checks the fix).
use super::{nonempty, safe_end, seek, Early, EarlyScan, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::loads;
use crate::ParserConfig;
use serde_json::Value;

pub struct KimiK2;

const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const SECTION_END: &str = "<|tool_calls_section_end|>";
const CALL_BEGIN: &str = "<|tool_call_begin|>";
const ARG_BEGIN: &str = "<|tool_call_argument_begin|>";
const CALL_END: &str = "<|tool_call_end|>";

/// `functions.NAME:N` / `NAME:N` → NAME.
fn name_from_id(id: &str) -> Option<&str> {
    let (head, n) = id.rsplit_once(':')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let name = head.strip_prefix("functions.").unwrap_or(head);
    (!name.is_empty()).then_some(name)
}

fn infer_from_args(args: &str, ctx: &ParserConfig) -> Option<String> {
    let Value::Object(obj) = loads(args)? else {
        return None;
    };
    let mut found = None;
    for t in &ctx.tools {
        let f = t.get("function").unwrap_or(t);
        let Some(props) = f
            .get("parameters")
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object)
        else {
            continue;
        };
        if obj.keys().all(|k| props.contains_key(k)) {
            if found.is_some() {
                return None; // ambiguous
            }
            found = f.get("name").and_then(Value::as_str).map(str::to_string);
        }
    }
    found
}

impl ToolFormat for KimiK2 {
    fn parse(&self, text: &str, ctx: &ParserConfig) -> ToolOutput {
        let Some(s) = text.find(SECTION_BEGIN) else {
            return ToolOutput::unchanged(text);
        };
        let mut section = &text[s + SECTION_BEGIN.len()..];
        if let Some(e) = section.find(SECTION_END) {
            section = &section[..e];
        }
        let mut calls = Vec::new();
        for (_, inner, _) in super::blocks(section, CALL_BEGIN, CALL_END) {
            let Some((id, args)) = inner.split_once(ARG_BEGIN) else {
                continue;
            };
            let id = id.trim();
            match name_from_id(id) {
                Some(name) => calls.push(RawCall {
                    name: name.to_string(),
                    arguments: args.to_string(),
                    id: Some(id.to_string()),
                }),
                None if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) => {
                    if let Some(name) = infer_from_args(args, ctx) {
                        let n = ctx.history_tool_calls + calls.len();
                        calls.push(RawCall {
                            id: Some(format!("functions.{name}:{n}")),
                            name,
                            arguments: args.to_string(),
                        });
                    }
                }
                None => {}
            }
        }
        ToolOutput::calls(nonempty(&text[..s]), calls)
    }

    /// Each call stands alone and an unterminated one keeps its argument text so far, so a
    /// call is sent as soon as `<|tool_call_argument_begin|>` ends its id, and the verbatim
    /// arguments stream as they arrive (a partial end marker is held back). A bare counter id
    /// needs the complete arguments to infer the function: that call is sent at its end.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(KimiScan::default()))
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[SECTION_BEGIN],
            strip: false,
        }
    }

    fn engine(&self) -> bool {
        true
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[doc(hidden)]
pub enum Phase {
    #[default]
    Section,
    Between,
    /// Inside a call's id, which starts here.
    Id(usize),
    /// Inside a call's arguments, which start at `start`; `stream`: the call was sent and
    /// `sent` is where the arguments sent so far end; else a bare counter id (`Some`) or no
    /// call.
    Args {
        start: usize,
        sent: usize,
        stream: bool,
        bare: bool,
    },
    Done,
}

/// The incremental mirror of [`KimiK2::parse`].
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[doc(hidden)]
pub struct KimiScan {
    phase: Phase,
    from: usize,
    calls: usize,
}

impl EarlyScan for KimiScan {
    fn save(&self) -> super::ScanSnapshot {
        super::ScanSnapshot::Kimi(self.clone())
    }

    fn load(&mut self, s: super::ScanSnapshot) -> bool {
        match s {
            super::ScanSnapshot::Kimi(x) => {
                *self = x;
                true
            }
            _ => false,
        }
    }

    fn scan(&mut self, buf: &str, ctx: &ParserConfig, out: &mut Vec<Early>) {
        loop {
            match self.phase {
                Phase::Done => return,
                Phase::Section => {
                    let Some((p, _)) = seek(buf, &mut self.from, &[SECTION_BEGIN]) else {
                        return;
                    };
                    self.from = p + SECTION_BEGIN.len();
                    self.phase = Phase::Between;
                }
                Phase::Between => {
                    let Some((p, i)) = seek(buf, &mut self.from, &[CALL_BEGIN, SECTION_END]) else {
                        return;
                    };
                    if i == 1 {
                        self.phase = Phase::Done;
                    } else {
                        self.from = p + CALL_BEGIN.len();
                        self.phase = Phase::Id(self.from);
                    }
                }
                Phase::Id(start) => {
                    let Some((p, i)) =
                        seek(buf, &mut self.from, &[ARG_BEGIN, CALL_END, SECTION_END])
                    else {
                        return;
                    };
                    match i {
                        0 => {
                            let id = buf[start..p].trim();
                            let args = p + ARG_BEGIN.len();
                            let mut stream = false;
                            let mut bare = false;
                            if let Some(name) = name_from_id(id) {
                                out.push(Early::Call {
                                    name: name.to_string(),
                                    id: Some(id.to_string()),
                                    args: String::new(),
                                });
                                self.calls += 1;
                                stream = true;
                            } else {
                                bare = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit());
                            }
                            self.from = args;
                            self.phase = Phase::Args {
                                start: args,
                                sent: args,
                                stream,
                                bare,
                            };
                        }
                        1 => {
                            self.from = p + CALL_END.len();
                            self.phase = Phase::Between;
                        }
                        _ => self.phase = Phase::Done,
                    }
                }
                Phase::Args {
                    start,
                    sent,
                    stream,
                    bare,
                } => {
                    let ends = [CALL_END, SECTION_END];
                    let Some((p, i)) = seek(buf, &mut self.from, &ends) else {
                        if stream {
                            let e = safe_end(buf, sent, &ends);
                            if e > sent {
                                out.push(Early::Args(buf[sent..e].to_string()));
                                self.phase = Phase::Args {
                                    start,
                                    sent: e,
                                    stream,
                                    bare,
                                };
                            }
                        }
                        return;
                    };
                    if stream && p > sent {
                        out.push(Early::Args(buf[sent..p].to_string()));
                    }
                    if bare {
                        if let Some(name) = infer_from_args(&buf[start..p], ctx) {
                            let n = ctx.history_tool_calls.saturating_add(self.calls);
                            out.push(Early::Call {
                                id: Some(format!("functions.{name}:{n}")),
                                name,
                                args: buf[start..p].to_string(),
                            });
                            self.calls += 1;
                        }
                    }
                    if i == 0 {
                        self.from = p + CALL_END.len();
                        self.phase = Phase::Between;
                    } else {
                        self.phase = Phase::Done;
                    }
                }
            }
        }
    }
}

impl KimiScan {
    /// Every buffer offset the scanner holds (for snapshot rebasing and validation).
    pub(crate) fn offsets(&mut self) -> Vec<&mut usize> {
        let mut v = vec![&mut self.from];
        match &mut self.phase {
            Phase::Section | Phase::Between | Phase::Done => {}
            Phase::Id(s) => v.push(s),
            Phase::Args { start, sent, .. } => {
                v.push(start);
                v.push(sent);
            }
        }
        v
    }

    /// Order constraints between the offsets of a restored snapshot (each offset is already
    /// known to be a char boundary of the buffer).
    pub(crate) fn check(&self, len: usize) -> bool {
        let _ = len;
        match &self.phase {
            _ if self.calls > len => false,
            Phase::Section | Phase::Between | Phase::Done => true,
            Phase::Id(s) => *s <= self.from,
            Phase::Args { start, sent, .. } => *start <= self.from && *start <= *sent,
        }
    }
}
