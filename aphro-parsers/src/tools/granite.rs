//! `granite` (engine-based; Granite 3.0/3.1): `<|tool_call|>` or `<tool_call>` followed by a JSON
//! array of `{"name", "arguments"}` with no closing marker. A truncated array still yields the
//! calls read so far, the last one with its argument text up to the end of the output. Content
//! before the marker is stripped.
use super::{
    hermes::call_from_obj, seek, stripped, Early, EarlyScan, Live, RawCall, ToolFormat, ToolOutput,
};
use crate::pyjson::{balanced_len, decode_prefix, loads, Balance};
use crate::scan::find_earliest;
use crate::ParserConfig;

pub struct Granite;

const OPENERS: &[&str] = &["<|tool_call|>", "<tool_call>"];

/// A truncated `{"name": "…", "arguments": …` object: the name and the raw argument text.
fn partial_call(obj: &str) -> Option<RawCall> {
    let n = obj.find("\"name\"")?;
    let after = obj[n + 6..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let name = &after[..after.find('"')?];
    let a = obj.find("\"arguments\"")?;
    let args = obj[a + 11..].trim_start().strip_prefix(':')?.trim_start();
    Some(RawCall::new(name, args))
}

impl ToolFormat for Granite {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some((s, i)) = find_earliest(text, OPENERS) else {
            return ToolOutput::unchanged(text);
        };
        let content = stripped(&text[..s]);
        let body = text[s + OPENERS[i].len()..].trim_start();
        if let Some((v, _)) = decode_prefix(body) {
            if let Some(items) = v.as_array() {
                let calls: Vec<_> = items
                    .iter()
                    .filter_map(|it| call_from_obj(it, &["arguments"]))
                    .collect();
                return ToolOutput::calls(content, calls);
            }
        }
        // Truncated array: read complete objects, then a partial last one.
        let Some(mut rest) = body.strip_prefix('[') else {
            return ToolOutput::unchanged(text);
        };
        let mut calls = Vec::new();
        loop {
            rest = rest.trim_start().trim_start_matches(',').trim_start();
            if !rest.starts_with('{') {
                break;
            }
            match balanced_len(rest) {
                Some(n) => {
                    if let Some(c) = loads(&rest[..n])
                        .as_ref()
                        .and_then(|v| call_from_obj(v, &["arguments"]))
                    {
                        calls.push(c);
                    }
                    rest = &rest[n..];
                }
                None => {
                    if let Some(c) = partial_call(rest) {
                        calls.push(c);
                    }
                    break;
                }
            }
        }
        ToolOutput::calls(content, calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: OPENERS,
            strip: true,
        }
    }

    /// Whether the whole array decodes or is read object by object (truncated), the calls
    /// start with the same complete objects in order; so each complete object's call is sent
    /// at its closing brace (arguments are re-serialized, hence whole). The scan stops at
    /// anything that is not a further object (then the rest comes at `finish()`), and the
    /// last, unterminated object (raw argument text) is only known at the end.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(GraniteScan::default()))
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
    Opener,
    /// Whitespace before the `[`.
    Bracket,
    /// Between objects: 0 = leading whitespace, 1 = commas, 2 = whitespace.
    Sep(u8),
    /// In the object starting here.
    Obj(usize),
    Done,
}

/// The incremental mirror of the truncated-array reading in [`Granite::parse`].
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[doc(hidden)]
pub struct GraniteScan {
    phase: Phase,
    from: usize,
    bal: Balance,
}

impl EarlyScan for GraniteScan {
    fn save(&self) -> super::ScanSnapshot {
        super::ScanSnapshot::Granite(self.clone())
    }

    fn load(&mut self, s: super::ScanSnapshot) -> bool {
        match s {
            super::ScanSnapshot::Granite(x) => {
                *self = x;
                true
            }
            _ => false,
        }
    }

    fn scan(&mut self, buf: &str, _ctx: &ParserConfig, out: &mut Vec<Early>) {
        loop {
            match self.phase {
                Phase::Done => return,
                Phase::Opener => {
                    let Some((p, i)) = seek(buf, &mut self.from, OPENERS) else {
                        return;
                    };
                    self.from = p + OPENERS[i].len();
                    self.phase = Phase::Bracket;
                }
                Phase::Bracket | Phase::Sep(_) => {
                    let Some(c) = buf[self.from..].chars().next() else {
                        return;
                    };
                    let n = c.len_utf8();
                    match (&mut self.phase, c) {
                        (Phase::Bracket, c) if c.is_whitespace() => self.from += n,
                        (Phase::Bracket, '[') => {
                            self.from += n;
                            self.phase = Phase::Sep(0);
                        }
                        (Phase::Sep(0 | 2), c) if c.is_whitespace() => self.from += n,
                        (Phase::Sep(s @ (0 | 1)), ',') => {
                            *s = 1;
                            self.from += n;
                        }
                        (Phase::Sep(s @ 1), c) if c.is_whitespace() => {
                            *s = 2;
                            self.from += n;
                        }
                        (Phase::Sep(_), '{') => {
                            self.bal = Balance::default();
                            self.phase = Phase::Obj(self.from);
                        }
                        _ => self.phase = Phase::Done,
                    }
                }
                Phase::Obj(start) => {
                    let fed = start + self.bal.fed();
                    let Some(n) = self.bal.feed(&buf.as_bytes()[fed..]) else {
                        return;
                    };
                    let end = start + n;
                    if let Some(c) = loads(&buf[start..end])
                        .as_ref()
                        .and_then(|v| call_from_obj(v, &["arguments"]))
                    {
                        out.push(Early::Call {
                            name: c.name,
                            id: None,
                            args: c.arguments,
                        });
                    }
                    self.from = end;
                    self.phase = Phase::Sep(0);
                }
            }
        }
    }
}

impl GraniteScan {
    /// Every buffer offset the scanner holds (for snapshot rebasing and validation).
    pub(crate) fn offsets(&mut self) -> Vec<&mut usize> {
        let mut v = vec![&mut self.from];
        if let Phase::Obj(s) = &mut self.phase {
            v.push(s);
        }
        v
    }

    /// Order constraints between the offsets of a restored snapshot (each offset is already
    /// known to be a char boundary of the buffer).
    pub(crate) fn check(&self, len: usize) -> bool {
        let _ = len;
        match &self.phase {
            Phase::Obj(s) => s.checked_add(self.bal.fed()).is_some_and(|f| f <= len),
            _ => true,
        }
    }
}
