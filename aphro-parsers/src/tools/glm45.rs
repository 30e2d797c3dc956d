//! `glm45` / `glm47` (engine-based): `<tool_call>NAME` then pairs
//! `<arg_key>K</arg_key><arg_value>V</arg_value>` (newlines optional) then `</tool_call>`.
//! Values are strings unless the tool schema gives another type (then JSON-decoded). An
//! unterminated call still yields the name and the pairs completed so far. Content before the
//! first call is stripped (whitespace-only → null).
use super::{blocks, seek, stripped, Early, EarlyScan, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::{convert_json_param, dumps};
use crate::ParserConfig;
use serde_json::{Map, Value};

pub struct Glm45;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const KEY: &str = "<arg_key>";

/// One call block (closed or not) → call; `None` when the name is empty.
fn block(inner: &str, ctx: &ParserConfig) -> Option<RawCall> {
    let name_end = [inner.find('\n'), inner.find(KEY)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(inner.len());
    let name = inner[..name_end].trim();
    if name.is_empty() {
        return None;
    }
    let mut args = Map::new();
    let mut rest = &inner[name_end..];
    while let Some(k0) = rest.find(KEY) {
        let after_k = &rest[k0 + KEY.len()..];
        let Some(k1) = after_k.find("</arg_key>") else {
            break;
        };
        let key = after_k[..k1].trim();
        let after = &after_k[k1 + "</arg_key>".len()..];
        let Some(v0) = after.find("<arg_value>") else {
            break;
        };
        let after_v = &after[v0 + "<arg_value>".len()..];
        let Some(v1) = after_v.find("</arg_value>") else {
            break;
        };
        let raw = after_v[..v1].trim();
        args.insert(
            key.to_string(),
            convert_json_param(raw, ctx.param_schema(name, key)),
        );
        rest = &after_v[v1 + "</arg_value>".len()..];
    }
    Some(RawCall::new(name, dumps(&Value::Object(args))))
}

impl ToolFormat for Glm45 {
    fn parse(&self, text: &str, ctx: &ParserConfig) -> ToolOutput {
        let Some(first) = text.find(OPEN) else {
            return ToolOutput::unchanged(text);
        };
        let calls = blocks(text, OPEN, CLOSE)
            .into_iter()
            .filter_map(|(_, inner, _)| block(inner, ctx))
            .collect();
        ToolOutput::calls(stripped(&text[..first]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[OPEN],
            strip: true,
        }
    }

    /// Each block stands alone and an unterminated one still yields its name: the call is sent
    /// once its name ends (newline or `<arg_key>`), its arguments at `</tool_call>`. (The
    /// arguments are re-serialized from typed values, so they are not streamed piecewise.)
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(GlmScan::default()))
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
    Open,
    /// In the name of the block whose inner text starts here.
    Name(usize),
    /// In the arguments of the block starting here; `bool`: the call was sent.
    Body(usize, bool),
}

/// The incremental mirror of [`Glm45::parse`].
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[doc(hidden)]
pub struct GlmScan {
    phase: Phase,
    from: usize,
}

impl EarlyScan for GlmScan {
    fn save(&self) -> super::ScanSnapshot {
        super::ScanSnapshot::Glm(self.clone())
    }

    fn load(&mut self, s: super::ScanSnapshot) -> bool {
        match s {
            super::ScanSnapshot::Glm(x) => {
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
                    self.phase = Phase::Name(self.from);
                }
                Phase::Name(start) => {
                    let Some((p, i)) = seek(buf, &mut self.from, &["\n", KEY, CLOSE]) else {
                        return;
                    };
                    if i == 2 {
                        self.phase = Phase::Body(start, false);
                        continue;
                    }
                    let name = buf[start..p].trim();
                    let sent = !name.is_empty();
                    if sent {
                        out.push(Early::Call {
                            name: name.to_string(),
                            id: None,
                            args: String::new(),
                        });
                    }
                    self.from = p;
                    self.phase = Phase::Body(start, sent);
                }
                Phase::Body(start, sent) => {
                    let Some((p, _)) = seek(buf, &mut self.from, &[CLOSE]) else {
                        return;
                    };
                    if let Some(c) = block(&buf[start..p], ctx) {
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
                    self.from = p + CLOSE.len();
                    self.phase = Phase::Open;
                }
            }
        }
    }
}

impl GlmScan {
    /// Every buffer offset the scanner holds (for snapshot rebasing and validation).
    pub(crate) fn offsets(&mut self) -> Vec<&mut usize> {
        let mut v = vec![&mut self.from];
        match &mut self.phase {
            Phase::Open => {}
            Phase::Name(s) | Phase::Body(s, _) => v.push(s),
        }
        v
    }

    /// Order constraints between the offsets of a restored snapshot (each offset is already
    /// known to be a char boundary of the buffer).
    pub(crate) fn check(&self, len: usize) -> bool {
        let _ = len;
        match &self.phase {
            Phase::Open => true,
            Phase::Name(s) | Phase::Body(s, _) => *s <= self.from,
        }
    }
}
