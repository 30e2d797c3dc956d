//! `minimax_m2` (engine-based): `<minimax:tool_call>` containing one or more
//! `<invoke name="NAME"><parameter name="K">V</parameter>…</invoke>` blocks, then
//! `</minimax:tool_call>`. Values typed by the tool schema (strings by default). An unterminated
//! invoke yields the call with the parameters completed so far. Content stripped.
use super::{blocks, stripped, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::{convert_json_param, dumps};
use crate::ParserConfig;
use serde_json::{Map, Value};

pub struct MinimaxM2;

const OPEN: &str = "<minimax:tool_call>";

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
        for (_, section, _) in blocks(text, OPEN, "</minimax:tool_call>") {
            for (_, inv, _) in blocks(section, "<invoke", "</invoke>") {
                let Some((name, body)) = attr_name(inv) else {
                    continue;
                };
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
                calls.push(RawCall::new(name, dumps(&Value::Object(args))));
            }
        }
        ToolOutput::calls(stripped(&text[..first]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[OPEN],
            strip: true,
        }
    }

    fn engine(&self) -> bool {
        true
    }
}
