//! `granite` (engine-based; Granite 3.0/3.1): `<|tool_call|>` or `<tool_call>` followed by a JSON
//! array of `{"name", "arguments"}` with no closing marker. A truncated array still yields the
//! calls read so far, the last one with its argument text up to the end of the output. Content
//! before the marker is stripped.
use super::{hermes::call_from_obj, stripped, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::{balanced_len, decode_prefix, loads};
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

    fn engine(&self) -> bool {
        true
    }
}
