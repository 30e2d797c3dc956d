//! `minimax_m2` (engine-based): `<minimax:tool_call>` containing one or more
//! `<invoke name="NAME"><parameter name="K">V</parameter>…</invoke>` blocks, then
//! `</minimax:tool_call>`. Values typed by the tool schema (strings by default). An unterminated
//! invoke yields the call with the parameters completed so far. Content stripped.
use super::{
    blocks, safe_end, seek, stripped, Early, EarlyScan, Live, RawCall, ToolFormat, ToolOutput,
};
use crate::pyjson::{convert_json_param, dumps};
use crate::ParserConfig;
use serde_json::{Map, Value};

pub struct MinimaxM2;

const OPEN: &str = "<minimax:tool_call>";
const CLOSE: &str = "</minimax:tool_call>";
const INVOKE: &str = "<invoke";
const INVOKE_END: &str = "</invoke>";

/// One invoke block (closed or not; `inv` starts after `<invoke`) → call.
fn invoke_call(inv: &str, ctx: &ParserConfig) -> Option<RawCall> {
    let (name, body) = attr_name(inv)?;
    let mut args = Map::new();
    for (_, p, closed) in blocks(body, "<parameter", "</parameter>") {
        if !closed {
            break;
        }
        let Some((k, v)) = attr_name(p) else { continue };
        let v = v.trim_matches('\n');
        args.insert(
            k.to_string(),
            convert_json_param(v, ctx.param_schema(name, k)),
        );
    }
    Some(RawCall::new(name, dumps(&Value::Object(args))))
}

fn attr_name(s: &str) -> Option<(&str, &str)> {
    // `name="X">rest`
    let s = s.trim_start().strip_prefix("name=")?;
    let (name, rest) = if let Some(q) = s.strip_prefix('"') {
        q.split_once('"')?
    } else {
        let e = s.find('>')?;
        (&s[..e], &s[e..])
    };
    let rest = rest.trim_start().strip_prefix('>')?;
    Some((name, rest))
}

impl ToolFormat for MinimaxM2 {
    fn parse(&self, text: &str, ctx: &ParserConfig) -> ToolOutput {
        let Some(first) = text.find(OPEN) else {
            return ToolOutput::unchanged(text);
        };
        let mut calls = Vec::new();
        for (_, section, _) in blocks(text, OPEN, CLOSE) {
            calls.extend(
                blocks(section, INVOKE, INVOKE_END)
                    .into_iter()
                    .filter_map(|(_, inv, _)| invoke_call(inv, ctx)),
            );
        }
        ToolOutput::calls(stripped(&text[..first]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[OPEN],
            strip: true,
        }
    }

    /// Each invoke stands alone and an unterminated one still counts, so the call is sent once
    /// `name="…">` is complete, its arguments (typed, re-serialized) whole at `</invoke>` (or
    /// at the section end that cuts it).
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(MinimaxScan::default()))
    }

    fn engine(&self) -> bool {
        true
    }
}

/// Past this many bytes of an invoke without a complete `name="…">`, the name is left to the
/// invoke's end (keeps the retries bounded, so streaming stays linear).
const NAME_WINDOW: usize = 512;

#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[doc(hidden)]
pub enum Phase {
    #[default]
    Open,
    Section,
    /// In the invoke whose text starts at `start`; `sent`: the call was sent.
    Invoke {
        start: usize,
        sent: bool,
    },
}

/// The incremental mirror of [`MinimaxM2::parse`].
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[doc(hidden)]
pub struct MinimaxScan {
    phase: Phase,
    from: usize,
}

impl EarlyScan for MinimaxScan {
    fn save(&self) -> super::ScanSnapshot {
        super::ScanSnapshot::Minimax(self.clone())
    }

    fn load(&mut self, s: super::ScanSnapshot) -> bool {
        match s {
            super::ScanSnapshot::Minimax(x) => {
                *self = x;
                true
            }
            _ => false,
        }
    }

    fn scan(&mut self, buf: &str, ctx: &ParserConfig, out: &mut Vec<Early>) {
        loop {
            match self.phase {
                Phase::Open => {
                    let Some((p, _)) = seek(buf, &mut self.from, &[OPEN]) else {
                        return;
                    };
                    self.from = p + OPEN.len();
                    self.phase = Phase::Section;
                }
                Phase::Section => {
                    let Some((p, i)) = seek(buf, &mut self.from, &[INVOKE, CLOSE]) else {
                        return;
                    };
                    if i == 1 {
                        self.from = p + CLOSE.len();
                        self.phase = Phase::Open;
                    } else {
                        self.from = p + INVOKE.len();
                        self.phase = Phase::Invoke {
                            start: self.from,
                            sent: false,
                        };
                    }
                }
                Phase::Invoke { start, sent } => {
                    let ends = [INVOKE_END, CLOSE];
                    let Some((p, i)) = seek(buf, &mut self.from, &ends) else {
                        if !sent && buf.len() - start <= NAME_WINDOW {
                            let e = safe_end(buf, start, &ends);
                            if let Some((name, _)) = attr_name(&buf[start..e]) {
                                out.push(Early::Call {
                                    name: name.to_string(),
                                    id: None,
                                    args: String::new(),
                                });
                                self.phase = Phase::Invoke { start, sent: true };
                            }
                        }
                        return;
                    };
                    if let Some(c) = invoke_call(&buf[start..p], ctx) {
                        out.push(if sent {
                            Early::Args(c.arguments)
                        } else {
                            Early::Call {
                                name: c.name,
                                id: None,
                                args: c.arguments,
                            }
                        });
                    }
                    self.from = p + ends[i].len();
                    self.phase = if i == 0 { Phase::Section } else { Phase::Open };
                }
            }
        }
    }
}

impl MinimaxScan {
    /// Every buffer offset the scanner holds (for snapshot rebasing and validation).
    pub(crate) fn offsets(&mut self) -> Vec<&mut usize> {
        let mut v = vec![&mut self.from];
        if let Phase::Invoke { start, .. } = &mut self.phase {
            v.push(start);
        }
        v
    }

    /// Order constraints between the offsets of a restored snapshot (each offset is already
    /// known to be a char boundary of the buffer).
    pub(crate) fn check(&self, len: usize) -> bool {
        let _ = len;
        match &self.phase {
            Phase::Invoke { start, .. } => *start <= self.from,
            _ => true,
        }
    }
}
