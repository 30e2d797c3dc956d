//! `step3`: `<｜tool_calls_begin｜>` then per call
//! `<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="NAME">`
//! `<steptml:parameter name="K">V</steptml:parameter>…</steptml:invoke><｜tool_call_end｜>`, closing
//! `<｜tool_calls_end｜>`. Integer/number/boolean values are converted with the schema;
//! object/array values stay strings (as in vLLM). Content stripped.
use super::{blocks, stripped, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::{convert_qwen_param, dumps, schema_types};
use crate::ParserConfig;
use serde_json::{Map, Value};

pub struct Step3;

const BEGIN: &str = "<｜tool_calls_begin｜>";

fn named<'a>(s: &'a str, tag: &str) -> Option<(&'a str, &'a str)> {
    let s = s.strip_prefix(tag)?.trim_start().strip_prefix("name=\"")?;
    let (name, rest) = s.split_once('"')?;
    Some((name, rest.trim_start().strip_prefix('>')?))
}

impl ToolFormat for Step3 {
    fn parse(&self, text: &str, ctx: &ParserConfig) -> ToolOutput {
        let Some(s) = text.find(BEGIN) else {
            return ToolOutput::unchanged(text);
        };
        let mut calls = Vec::new();
        for (_, inner, closed) in blocks(&text[s..], "<｜tool_call_begin｜>", "<｜tool_call_end｜>")
        {
            if !closed {
                continue;
            }
            let Some((_ty, rest)) = inner.split_once("<｜tool_sep｜>") else {
                continue;
            };
            let Some(inv) = rest.find("<steptml:invoke") else {
                continue;
            };
            let Some((name, body)) = named(&rest[inv..], "<steptml:invoke") else {
                continue;
            };
            let mut args = Map::new();
            for (_, p, closed) in blocks(body, "<steptml:parameter", "</steptml:parameter>") {
                if !closed {
                    break;
                }
                let Some((k, v)) = named(&format!("<steptml:parameter{p}"), "<steptml:parameter")
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                else {
                    continue;
                };
                let schema = ctx.param_schema(name, &k);
                let types = schema_types(schema);
                let val = if types.iter().any(|t| {
                    matches!(
                        t.as_str(),
                        "integer" | "int" | "number" | "float" | "boolean" | "bool"
                    )
                }) && v != "null"
                {
                    convert_qwen_param(&v, schema)
                } else {
                    Value::String(v)
                };
                args.insert(k, val);
            }
            calls.push(RawCall::new(name, dumps(&Value::Object(args))));
        }
        ToolOutput::calls(stripped(&text[..s]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[BEGIN],
            strip: true,
        }
    }
}
