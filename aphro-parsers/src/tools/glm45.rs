//! `glm45` / `glm47` (engine-based): `<tool_call>NAME` then pairs
//! `<arg_key>K</arg_key><arg_value>V</arg_value>` (newlines optional) then `</tool_call>`.
//! Values are strings unless the tool schema gives another type (then JSON-decoded). An
//! unterminated call still yields the name and the pairs completed so far. Content before the
//! first call is stripped (whitespace-only → null).
use super::{blocks, stripped, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::{convert_json_param, dumps};
use crate::ParserConfig;
use serde_json::{Map, Value};

pub struct Glm45;

const OPEN: &str = "<tool_call>";

impl ToolFormat for Glm45 {
    fn parse(&self, text: &str, ctx: &ParserConfig) -> ToolOutput {
        let Some(first) = text.find(OPEN) else {
            return ToolOutput::unchanged(text);
        };
        let mut calls = Vec::new();
        for (_, inner, _) in blocks(text, OPEN, "</tool_call>") {
            let name_end = [inner.find('\n'), inner.find("<arg_key>")]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(inner.len());
            let name = inner[..name_end].trim();
            if name.is_empty() {
                continue;
            }
            let mut args = Map::new();
            let mut rest = &inner[name_end..];
            while let Some(k0) = rest.find("<arg_key>") {
                let after_k = &rest[k0 + "<arg_key>".len()..];
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
            calls.push(RawCall::new(name, dumps(&Value::Object(args))));
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
