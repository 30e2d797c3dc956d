//! `qwen3_coder` / `qwen3_xml` (one engine parser) and `seed_oss` (same grammar, `<seed:…>`
//! wrappers): `<tool_call>` `<function=NAME>` `<parameter=K>`V`</parameter>`… `</function>`
//! `</tool_call>`. One newline right after `>` and right before `</parameter>` is trimmed. Values
//! are converted with the tool's JSON schema (integer, number, boolean, object/array via JSON,
//! nullable via `anyOf`/type lists, `null` → null); a value that does not fit stays a string.
//! `<function=…>` without the wrapper is accepted. An unterminated parameter is dropped; the call
//! keeps the parameters completed so far. Content before the first call is stripped.
use super::{seek, stripped, Early, EarlyScan, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::{convert_qwen_param, dumps};
use crate::scan::find_earliest;
use crate::ParserConfig;
use serde_json::{Map, Value};

pub struct Qwen3Coder {
    pub openers: &'static [&'static str],
}

pub const QWEN3_CODER: Qwen3Coder = Qwen3Coder {
    openers: &["<tool_call>", "<function="],
};
pub const SEED_OSS: Qwen3Coder = Qwen3Coder {
    openers: &["<seed:tool_call>", "<function="],
};

const FUNC: &str = "<function=";
const PARAM: &str = "<parameter=";

fn trim_one_nl(s: &str) -> &str {
    let s = s.strip_prefix('\n').unwrap_or(s);
    s.strip_suffix('\n').unwrap_or(s)
}

/// The arguments of a call from its body (the text between `<function=NAME>` and its end).
fn call_args(name: &str, body: &str, ctx: &ParserConfig) -> String {
    let mut args = Map::new();
    let mut b = body;
    while let Some(p) = b.find(PARAM) {
        let pa = &b[p + PARAM.len()..];
        let Some(ke) = pa.find('>') else { break };
        let key = pa[..ke].trim();
        let val_all = &pa[ke + 1..];
        let (val, next) = match val_all.find("</parameter>") {
            Some(e) => (&val_all[..e], &val_all[e + "</parameter>".len()..]),
            None => match val_all.find(PARAM) {
                Some(e) => (&val_all[..e], &val_all[e..]),
                None => break, // unterminated: dropped
            },
        };
        let raw = trim_one_nl(val);
        args.insert(
            key.to_string(),
            convert_qwen_param(raw, ctx.param_schema(name, key)),
        );
        b = next;
    }
    dumps(&Value::Object(args))
}

impl ToolFormat for Qwen3Coder {
    fn parse(&self, text: &str, ctx: &ParserConfig) -> ToolOutput {
        let Some((first, _)) = find_earliest(text, self.openers) else {
            return ToolOutput::unchanged(text);
        };
        let mut calls = Vec::new();
        let mut rest = &text[first..];
        while let Some(f) = rest.find(FUNC) {
            let after = &rest[f + FUNC.len()..];
            let name_end = [after.find('>'), after.find('\n')]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(after.len());
            let name = after[..name_end].trim();
            let body_start = if after[name_end..].starts_with('>') {
                name_end + 1
            } else {
                name_end
            };
            let body_all = &after[body_start..];
            // Search `</function>` only up to the next `<function=` so malformed output without
            // closers stays linear.
            let next = body_all.find(FUNC).unwrap_or(body_all.len());
            let body_end = body_all[..next].find("</function>").unwrap_or(next);
            let body = &body_all[..body_end];
            rest = &body_all[body_end..];
            if name.is_empty() {
                continue;
            }
            calls.push(RawCall::new(name, call_args(name, body, ctx)));
        }
        if calls.is_empty() {
            // Engine style: content without the unterminated opener.
            return ToolOutput::calls(stripped(&text[..first]), Vec::new());
        }
        ToolOutput::calls(stripped(&text[..first]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: self.openers,
            strip: true,
        }
    }

    /// Each `<function=…>` stands alone and an unterminated one still yields its name, so the
    /// call is sent once the name ends (`>` or newline); its arguments (typed, re-serialized)
    /// follow whole at `</function>` or at the next `<function=`.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(QwenScan::default()))
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
    Func,
    /// In the name that starts here.
    Name(usize),
    /// In the body starting at `start` of the call named `name` (`None`: empty name, no call).
    Body { start: usize, name: Option<String> },
}

/// The incremental mirror of [`Qwen3Coder::parse`].
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[doc(hidden)]
pub struct QwenScan {
    phase: Phase,
    from: usize,
}

impl EarlyScan for QwenScan {
    fn save(&self) -> super::ScanSnapshot {
        super::ScanSnapshot::Qwen(self.clone())
    }

    fn load(&mut self, s: super::ScanSnapshot) -> bool {
        match s {
            super::ScanSnapshot::Qwen(x) => {
                *self = x;
                true
            }
            _ => false,
        }
    }

    fn scan(&mut self, buf: &str, ctx: &ParserConfig, out: &mut Vec<Early>) {
        loop {
            match &self.phase {
                Phase::Func => {
                    let Some((p, _)) = seek(buf, &mut self.from, &[FUNC]) else {
                        return;
                    };
                    self.from = p + FUNC.len();
                    self.phase = Phase::Name(self.from);
                }
                Phase::Name(start) => {
                    let start = *start;
                    let Some((p, i)) = seek(buf, &mut self.from, &[">", "\n"]) else {
                        return;
                    };
                    let name = buf[start..p].trim();
                    let name = (!name.is_empty()).then(|| name.to_string());
                    if let Some(n) = &name {
                        out.push(Early::Call {
                            name: n.clone(),
                            id: None,
                            args: String::new(),
                        });
                    }
                    self.from = if i == 0 { p + 1 } else { p };
                    self.phase = Phase::Body {
                        start: self.from,
                        name,
                    };
                }
                Phase::Body { start, name } => {
                    let Some((p, _)) = seek(buf, &mut self.from, &["</function>", FUNC]) else {
                        return;
                    };
                    if let Some(n) = name {
                        out.push(Early::Args(call_args(n, &buf[*start..p], ctx)));
                    }
                    self.from = p;
                    self.phase = Phase::Func;
                }
            }
        }
    }
}

impl QwenScan {
    /// Every buffer offset the scanner holds (for snapshot rebasing and validation).
    pub(crate) fn offsets(&mut self) -> Vec<&mut usize> {
        let mut v = vec![&mut self.from];
        match &mut self.phase {
            Phase::Func => {}
            Phase::Name(s) | Phase::Body { start: s, .. } => v.push(s),
        }
        v
    }

    /// Order constraints between the offsets of a restored snapshot (each offset is already
    /// known to be a char boundary of the buffer).
    pub(crate) fn check(&self, len: usize) -> bool {
        let _ = len;
        match &self.phase {
            Phase::Func => true,
            Phase::Name(s) | Phase::Body { start: s, .. } => *s <= self.from,
        }
    }
}
