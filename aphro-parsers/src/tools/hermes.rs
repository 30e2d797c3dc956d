//! Hermes format (`hermes`, `qwen3_json`; `longcat` and `granite4` with their markers; `ernie45`):
//! `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks. A final block without the
//! closing marker is accepted (not for granite4). Content is the text before the first opener
//! (null if empty); text after the calls is dropped. Any malformed block → no calls and the whole
//! output is content. Arguments are re-encoded with Python `json.dumps`.
use super::{blocks, nonempty, Live, RawCall, ToolFormat, ToolOutput};
use crate::pyjson::{dumps, loads};
use crate::ParserConfig;
use serde_json::Value;

pub struct Hermes {
    pub open: &'static [&'static str],
    pub close: &'static str,
    /// granite4: a block must be closed to count.
    pub require_close: bool,
}

pub const HERMES: Hermes = Hermes {
    open: &["<tool_call>"],
    close: "</tool_call>",
    require_close: false,
};
pub const LONGCAT: Hermes = Hermes {
    open: &["<longcat_tool_call>"],
    close: "</longcat_tool_call>",
    require_close: false,
};
pub const GRANITE4: Hermes = Hermes {
    open: &["<tool_call>"],
    close: "</tool_call>",
    require_close: true,
};

/// `arguments` as returned. vLLM 0.33.0 re-encodes a string-valued `arguments` (double
/// encoding); the later upstream fix passes a string that holds JSON through unchanged. We take
/// the fix (corpus case `hermes-extra-1` records the 0.33.0 value; the test checks the fix).
pub(crate) fn arguments_text(v: &Value) -> String {
    match v {
        Value::String(s) if loads(s).is_some() => s.clone(),
        other => dumps(other),
    }
}

/// `{"name", "arguments"|"parameters"}` → call, or `None` if a key is missing.
pub(crate) fn call_from_obj(v: &Value, keys: &[&str]) -> Option<RawCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = keys.iter().find_map(|k| v.get(*k))?;
    Some(RawCall::new(name, arguments_text(args)))
}

impl ToolFormat for Hermes {
    fn parse(&self, text: &str, _ctx: &ParserConfig) -> ToolOutput {
        let open = self.open[0];
        let bs = blocks(text, open, self.close);
        let bs: Vec<_> = if self.require_close {
            bs.into_iter().filter(|b| b.2).collect()
        } else {
            bs
        };
        if bs.is_empty() {
            return ToolOutput::unchanged(text);
        }
        let mut calls = Vec::new();
        for (_, inner, _) in &bs {
            match loads(inner)
                .as_ref()
                .and_then(|v| call_from_obj(v, &["arguments"]))
            {
                Some(c) => calls.push(c),
                None => return ToolOutput::unchanged(text),
            }
        }
        let first = text.find(open).unwrap_or(text.len());
        ToolOutput::calls(nonempty(&text[..first]), calls)
    }

    // No `early()`: calls are sent at `finish()`. One malformed block anywhere — including
    // one that has not been generated yet — turns *every* call back into content, so no call
    // is final before the output ends.
    fn live(&self) -> Live {
        Live::Prefix {
            openers: self.open,
            strip: false,
        }
    }
}
