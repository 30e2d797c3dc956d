//! `qwen3_coder` / `qwen3_xml` (one engine parser) and `seed_oss` (same grammar, `<seed:…>`
//! wrappers): `<tool_call>` `<function=NAME>` `<parameter=K>`V`</parameter>`… `</function>`
//! `</tool_call>`. One newline right after `>` and right before `</parameter>` is trimmed. Values
//! are converted with the tool's JSON schema (integer, number, boolean, object/array via JSON,
//! nullable via `anyOf`/type lists, `null` → null); a value that does not fit stays a string.
//! `<function=…>` without the wrapper is accepted. An unterminated parameter is dropped; the call
//! keeps the parameters completed so far. Content before the first call is stripped.
use super::{stripped, Live, RawCall, ToolFormat, ToolOutput};
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
            calls.push(RawCall::new(name, dumps(&Value::Object(args))));
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

    fn engine(&self) -> bool {
        true
    }
}
