//! `step3`: `<｜tool_calls_begin｜>` then per call
//! `<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="NAME">`
//! `<steptml:parameter name="K">V</steptml:parameter>…</steptml:invoke><｜tool_call_end｜>`, closing
//! `<｜tool_calls_end｜>`. Integer/number/boolean values are converted with the schema;
//! object/array values stay strings (as in vLLM). Content stripped.
use super::{blocks, stripped, ClosedBlocks, EarlyScan, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::{convert_qwen_param, dumps, schema_types};
use crate::ParserConfig;
use serde_json::{Map, Value};

pub struct Step3;

const BEGIN: &str = "<｜tool_calls_begin｜>";
const CALL_BEGIN: &str = "<｜tool_call_begin｜>";
const CALL_END: &str = "<｜tool_call_end｜>";

fn named<'a>(s: &'a str, tag: &str) -> Option<(&'a str, &'a str)> {
    let s = s.strip_prefix(tag)?.trim_start().strip_prefix("name=\"")?;
    let (name, rest) = s.split_once('"')?;
    Some((name, rest.trim_start().strip_prefix('>')?))
}

/// One closed call block → call.
fn block(inner: &str, ctx: &ParserConfig) -> Option<RawCall> {
    let (_ty, rest) = inner.split_once("<｜tool_sep｜>")?;
    let inv = rest.find("<steptml:invoke")?;
    let (name, body) = named(&rest[inv..], "<steptml:invoke")?;
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
    Some(RawCall::new(name, dumps(&Value::Object(args))))
}

impl ToolFormat for Step3 {
    fn parse(&self, text: &str, ctx: &ParserConfig) -> ToolOutput {
        let Some(s) = text.find(BEGIN) else {
            return ToolOutput::unchanged(text);
        };
        let calls = blocks(&text[s..], CALL_BEGIN, CALL_END)
            .into_iter()
            .filter(|b| b.2)
            .filter_map(|(_, inner, _)| block(inner, ctx))
            .collect();
        ToolOutput::calls(stripped(&text[..s]), calls)
    }

    /// A call is final at its `<｜tool_call_end｜>` (unclosed blocks are not calls; each block
    /// stands alone): sent whole then.
    fn early(&self) -> Option<Box<dyn EarlyScan>> {
        Some(Box::new(ClosedBlocks::new(
            BEGIN, CALL_BEGIN, CALL_END, None, block,
        )))
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[BEGIN],
            strip: true,
        }
    }
}
