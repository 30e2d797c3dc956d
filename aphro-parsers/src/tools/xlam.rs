//! `xlam`: a JSON array `[{"name", "arguments"}]` either as the whole output, inside a ```json
//! fence, after `</think>`, after `[TOOL_CALLS]`, or inside `<tool_call>…</tool_call>`. Elements
//! without `name`/`arguments` are skipped. Prose before a bare array is not parsed. Ids are
//! `call_<i>_<uuid>`.
use super::{hermes::call_from_obj, IdStyle, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::loads;
use crate::ParserConfig;
use serde_json::Value;

pub struct Xlam;

fn array_calls(s: &str) -> Option<Vec<RawCall>> {
    let s = s.trim();
    if !(s.starts_with('[') && s.ends_with(']')) {
        return None;
    }
    let Value::Array(items) = loads(s)? else {
        return None;
    };
    Some(
        items
            .iter()
            .filter_map(|it| call_from_obj(it, &["arguments"]))
            .collect(),
    )
}

// No `early()`: calls are sent at `finish()`. The array is looked for in several places in
// priority order (after `</think>`, in a fence, after `[TOOL_CALLS]`, in `<tool_call>`, bare),
// and the first and last of these need the array to run to the very end of the output, so a
// later `</think>` or trailing text can still change which array (if any) is used.
impl ToolFormat for Xlam {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let found: Option<(Option<String>, Vec<RawCall>)> = (|| {
            if let Some(p) = text.find("</think>") {
                let e = p + "</think>".len();
                if let Some(c) = array_calls(&text[e..]) {
                    return Some((Some(text[..e].to_string()), c));
                }
            }
            if let Some(p) = text.find("```") {
                let after = &text[p + 3..];
                let inner_start = after.strip_prefix("json").map_or(0, |_| 4);
                if let Some(q) = after[inner_start..].find("```") {
                    let inner = &after[inner_start..inner_start + q];
                    if let Some(c) = array_calls(inner) {
                        let outside = format!("{}{}", &text[..p], &after[inner_start + q + 3..]);
                        return Some((Some(outside.trim().to_string()), c));
                    }
                }
            }
            if let Some(p) = text.find("[TOOL_CALLS]") {
                if let Some(c) = array_calls(&text[p + "[TOOL_CALLS]".len()..]) {
                    return Some((Some(text[..p].trim().to_string()), c));
                }
            }
            if let Some(p) = text.find("<tool_call>") {
                let after = &text[p + "<tool_call>".len()..];
                let inner = after.find("</tool_call>").map_or(after, |e| &after[..e]);
                if let Some(c) = array_calls(inner) {
                    return Some((Some(text[..p].trim().to_string()), c));
                }
            }
            array_calls(text).map(|c| (None, c))
        })();
        match found {
            Some((content, calls)) if !calls.is_empty() => ToolOutput::calls(content, calls),
            _ => ToolOutput::unchanged(text),
        }
    }

    fn id_style(&self) -> IdStyle {
        IdStyle::Xlam
    }
}
