//! `mistral` (engine-based, v11+ format): `[TOOL_CALLS]NAME{json-args}` repeated for parallel
//! calls. The JSON object after the name is passed through verbatim (even truncated/invalid);
//! text after a closed object is dropped. Content is the text before the first `[TOOL_CALLS]`,
//! stripped. The pre-v11 array form `[TOOL_CALLS][{…}]` is mis-parsed with name `[` exactly as
//! vLLM 0.33.0 does without the Mistral tokenizer. Ids are 9 random alphanumerics.
use super::{
    safe_end, seek, stripped, Early, EarlyScan, IdStyle, Live, RawCall, ToolFormat, ToolOutput,
};
use crate::pyjson::{balanced_len, Balance};
use crate::ParserConfig;

pub struct Mistral;

const MARK: &str = "[TOOL_CALLS]";

impl ToolFormat for Mistral {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let Some(first) = text.find(MARK) else {
            return ToolOutput::unchanged(text);
        };
        let mut calls = Vec::new();
        for seg in text[first + MARK.len()..].split(MARK) {
            let (name, args) = match seg.find('{') {
                Some(b) => {
                    let obj = &seg[b..];
                    let args = balanced_len(obj).map_or(obj, |n| &obj[..n]);
                    (seg[..b].trim(), args)
                }
                None => (seg.trim(), "{}"),
            };
            if !name.is_empty() {
                calls.push(RawCall::new(name, args));
            }
        }
        ToolOutput::calls(stripped(&text[..first]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[MARK],
            strip: true,
        }
    }

    fn engine(&self) -> bool {
        true
    }

    /// Each `[TOOL_CALLS]` segment is one call whatever follows: the call is sent when the `{`
    /// after its name arrives, and the verbatim argument text streams until the object closes
    /// (or the next `[TOOL_CALLS]` cuts it); a partial marker is held back. A name without an
    /// object (`{}` arguments) is sent when the next marker arrives.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(MistralScan::default()))
    }

    fn id_style(&self) -> IdStyle {
        IdStyle::Mistral
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[doc(hidden)]
pub enum Phase {
    #[default]
    First,
    /// In a segment's name, which starts here.
    Name(usize),
    /// In the arguments object starting at `start` (`sent`: sent up to here; `stream`: the
    /// segment is a call; `end`: the object closed there).
    Obj {
        start: usize,
        sent: usize,
        stream: bool,
        end: Option<usize>,
    },
}

/// The incremental mirror of [`Mistral::parse`].
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[doc(hidden)]
pub struct MistralScan {
    phase: Phase,
    from: usize,
    bal: Balance,
}

impl EarlyScan for MistralScan {
    fn save(&self) -> super::ScanSnapshot {
        super::ScanSnapshot::Mistral(self.clone())
    }

    fn load(&mut self, s: super::ScanSnapshot) -> bool {
        match s {
            super::ScanSnapshot::Mistral(x) => {
                *self = x;
                true
            }
            _ => false,
        }
    }

    fn scan(&mut self, buf: &str, _ctx: &ParserConfig, out: &mut Vec<Early>) {
        loop {
            match self.phase {
                Phase::First => {
                    let Some((p, _)) = seek(buf, &mut self.from, &[MARK]) else {
                        return;
                    };
                    self.from = p + MARK.len();
                    self.phase = Phase::Name(self.from);
                }
                Phase::Name(start) => {
                    let Some((p, i)) = seek(buf, &mut self.from, &["{", MARK]) else {
                        return;
                    };
                    let name = buf[start..p].trim();
                    if i == 1 {
                        if !name.is_empty() {
                            out.push(Early::Call {
                                name: name.to_string(),
                                id: None,
                                args: "{}".to_string(),
                            });
                        }
                        self.from = p + MARK.len();
                        self.phase = Phase::Name(self.from);
                        continue;
                    }
                    let stream = !name.is_empty();
                    if stream {
                        out.push(Early::Call {
                            name: name.to_string(),
                            id: None,
                            args: String::new(),
                        });
                    }
                    self.bal = Balance::default();
                    self.from = p;
                    self.phase = Phase::Obj {
                        start: p,
                        sent: p,
                        stream,
                        end: None,
                    };
                }
                Phase::Obj {
                    start,
                    sent,
                    stream,
                    mut end,
                } => {
                    let mark = seek(buf, &mut self.from, &[MARK]).map(|x| x.0);
                    let fed = start + self.bal.fed();
                    if end.is_none() {
                        let limit = mark.unwrap_or_else(|| safe_end(buf, fed, &[MARK]));
                        end = self
                            .bal
                            .feed(&buf.as_bytes()[fed..limit.max(fed)])
                            .map(|n| start + n);
                    }
                    let upto = end.or(mark).unwrap_or_else(|| safe_end(buf, sent, &[MARK]));
                    let mut sent = sent;
                    if stream && upto > sent {
                        out.push(Early::Args(buf[sent..upto].to_string()));
                        sent = upto;
                    }
                    match mark {
                        Some(m) => {
                            self.from = m + MARK.len();
                            self.phase = Phase::Name(self.from);
                        }
                        None => {
                            self.phase = Phase::Obj {
                                start,
                                sent,
                                stream,
                                end,
                            };
                            return;
                        }
                    }
                }
            }
        }
    }
}

impl MistralScan {
    /// Every buffer offset the scanner holds (for snapshot rebasing and validation).
    pub(crate) fn offsets(&mut self) -> Vec<&mut usize> {
        let mut v = vec![&mut self.from];
        match &mut self.phase {
            Phase::First => {}
            Phase::Name(s) => v.push(s),
            Phase::Obj {
                start, sent, end, ..
            } => {
                v.push(start);
                v.push(sent);
                if let Some(e) = end {
                    v.push(e);
                }
            }
        }
        v
    }

    /// Order constraints between the offsets of a restored snapshot (each offset is already
    /// known to be a char boundary of the buffer).
    pub(crate) fn check(&self, len: usize) -> bool {
        let _ = len;
        match &self.phase {
            Phase::First => true,
            Phase::Name(s) => *s <= self.from,
            Phase::Obj { start, end, .. } => {
                start.checked_add(self.bal.fed()).is_some_and(|f| f <= len)
                    && end.is_none_or(|e| e > *start)
            }
        }
    }
}
