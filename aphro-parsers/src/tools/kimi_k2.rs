//! `kimi_k2` (engine-based): `<|tool_calls_section_begin|>` then per call
//! `<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>` then
//! `<|tool_calls_section_end|>`. ID is `functions.NAME:N` or `NAME:N` and is returned as the call
//! id. ARGS verbatim (an unterminated last call keeps the text so far). Content before the
//! section is kept unstripped.
//!
//! Bare counter ids (`0`): vLLM 0.33.0 drops the call; the later upstream fix infers the function
//! from the tool list when exactly one tool's properties contain all argument keys. We take the
//! fix (corpus `kimi_k2-t-bare-counter-infer` records 0.33.0; the test checks the fix).
use super::{nonempty, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::loads;
use crate::ParserConfig;
use serde_json::Value;

pub struct KimiK2;

const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const SECTION_END: &str = "<|tool_calls_section_end|>";
const CALL_BEGIN: &str = "<|tool_call_begin|>";
const ARG_BEGIN: &str = "<|tool_call_argument_begin|>";
const CALL_END: &str = "<|tool_call_end|>";

/// `functions.NAME:N` / `NAME:N` → NAME.
fn name_from_id(id: &str) -> Option<&str> {
    let (head, n) = id.rsplit_once(':')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let name = head.strip_prefix("functions.").unwrap_or(head);
    (!name.is_empty()).then_some(name)
}

fn infer_from_args(args: &str, ctx: &ParserConfig) -> Option<String> {
    let Value::Object(obj) = loads(args)? else {
        return None;
    };
    let mut found = None;
    for t in &ctx.tools {
        let f = t.get("function").unwrap_or(t);
        let Some(props) = f
            .get("parameters")
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object)
        else {
            continue;
        };
        if obj.keys().all(|k| props.contains_key(k)) {
            if found.is_some() {
                return None; // ambiguous
            }
            found = f.get("name").and_then(Value::as_str).map(str::to_string);
        }
    }
    found
}

impl ToolFormat for KimiK2 {
    fn parse(&self, text: &str, ctx: &ParserConfig) -> ToolOutput {
        let Some(s) = text.find(SECTION_BEGIN) else {
            return ToolOutput::unchanged(text);
        };
        let mut section = &text[s + SECTION_BEGIN.len()..];
        if let Some(e) = section.find(SECTION_END) {
            section = &section[..e];
        }
        let mut calls = Vec::new();
        for (_, inner, _) in super::blocks(section, CALL_BEGIN, CALL_END) {
            let Some((id, args)) = inner.split_once(ARG_BEGIN) else {
                continue;
            };
            let id = id.trim();
            match name_from_id(id) {
                Some(name) => calls.push(RawCall {
                    name: name.to_string(),
                    arguments: args.to_string(),
                    id: Some(id.to_string()),
                }),
                None if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) => {
                    if let Some(name) = infer_from_args(args, ctx) {
                        let n = ctx.history_tool_calls + calls.len();
                        calls.push(RawCall {
                            id: Some(format!("functions.{name}:{n}")),
                            name,
                            arguments: args.to_string(),
                        });
                    }
                }
                None => {}
            }
        }
        ToolOutput::calls(nonempty(&text[..s]), calls)
    }

    fn live(&self) -> Live {
        Live::Prefix {
            openers: &[SECTION_BEGIN],
            strip: false,
        }
    }

    fn engine(&self) -> bool {
        true
    }
}
