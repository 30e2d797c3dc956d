//! The structural tag a chat request's tools and reasoning become at render time, as
//! `vllm-rs render` builds it (`docs/structured-outputs.md`, "Tool calls and reasoning").
//!
//! * A tool parser with a call format (hermes, qwen3_json, llama3_json, llama4_json,
//!   deepseek_v3, deepseek_v31, kimi_k2) turns
//!   `tool_choice` `required` / named — and `auto` when a tool is `strict` — into tags for
//!   the offered tools: the call envelope is fixed and the arguments follow the tool's
//!   schema when it is strict (else any JSON). `parallel_tool_calls: false` stops the list
//!   after one call. With `auto` and a request constraint, the output is either the calls
//!   or the constraint; with `required` / named, the request's constraint is dropped.
//! * With tools offered and a request constraint, a tool parser without a call format
//!   still sends the constraint as a structural tag.
//! * A reasoning parser puts its reasoning block before whatever constraint there is
//!   (optional; mandatory and without its start marker when the prompt ends inside
//!   reasoning), and the request is marked `reasoning_ended`, since the grammar itself now
//!   covers the reasoning.
//!
//! The tag is serialized compactly with xgrammar's field order and defaults, so the render
//! answer matches vllm-rs byte for byte; [`crate::structural_tag`] compiles it.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::protocol::ChatCompletionRequest;
use crate::structured::{Constraint, ConstraintKind};

/// The parsers a render is configured with, and where the prompt left reasoning.
#[derive(Debug, Clone, Copy)]
pub struct GrammarContext<'a> {
    pub tool_parser: Option<&'a str>,
    pub reasoning_parser: Option<&'a str>,
    /// Where the prompt left reasoning.
    pub prompt_reasoning: PromptReasoning,
}

/// The prompt's last reasoning marker, which decides how the output may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PromptReasoning {
    /// No marker: the output may open a reasoning block.
    #[default]
    Absent,
    /// A start marker (DeepSeek-R1's generation prompt ends in `<think>\n`): the output
    /// starts inside reasoning.
    Open,
    /// An end marker (a template with thinking switched off closed it).
    Closed,
}

/// What the render sends instead of the request's own constraint.
#[derive(Debug, Clone, PartialEq)]
pub struct GrammarPlan {
    /// The `structured_outputs` object: `{"structural_tag": "<compact JSON>"}`.
    pub structured_outputs: Value,
    /// The grammar covers reasoning, so the engine applies it from the first token.
    pub reasoning_ended: bool,
}

/// How a tool parser writes its calls.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CallFormat {
    /// `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` or without the
    /// newlines (vLLM's hermes builder).
    Hermes,
    /// xgrammar's `qwen_3`: the newline form, triggered by `<tool_call>`.
    Qwen3,
    /// xgrammar's `llama`: `{"name": ..., "parameters": ...}`.
    Llama,
    /// xgrammar's `deepseek_r1` (the `deepseek_v3` parser): calls inside
    /// `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`, arguments in a fenced JSON block.
    DeepSeekV3,
    /// xgrammar's `deepseek_v3_1`: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`.
    DeepSeekV31,
    /// xgrammar's `kimi`: `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS`.
    Kimi,
}

/// Tool parsers that only get the request constraint as a structural tag when tools are
/// offered (their calls are not grammar-constrained by vllm-rs).
const PLAIN_TOOL_PARSERS: [&str; 6] = [
    "granite4",
    "mistral",
    "glm45",
    "internlm",
    "phi4_mini_json",
    "seed_oss",
];

fn call_format(tool_parser: &str) -> Option<CallFormat> {
    Some(match tool_parser {
        "hermes" => CallFormat::Hermes,
        "qwen3_json" => CallFormat::Qwen3,
        "llama3_json" | "llama4_json" => CallFormat::Llama,
        "deepseek_v3" => CallFormat::DeepSeekV3,
        "deepseek_v31" => CallFormat::DeepSeekV31,
        "kimi_k2" => CallFormat::Kimi,
        _ => return None,
    })
}

/// A reasoning parser's block: (start marker, end marker, what follows the end).
fn reasoning_block(reasoning_parser: &str) -> Option<(&'static str, &'static str, &'static str)> {
    Some(match reasoning_parser {
        "qwen3" | "minimax_m2" => ("<think>", "</think>", "\n\n"),
        "glm45" => ("\n<think>", "</think>", "\n"),
        "deepseek_r1" | "deepseek_v3" | "step3" | "step5" | "glm47" | "kimi_k2" => {
            ("<think>", "</think>", "")
        }
        _ => return None,
    })
}

/// The plan for `req` whose own constraint (after `response_format` folding) is `so`;
/// `None` leaves the request as it is.
pub fn plan(
    req: &ChatCompletionRequest,
    so: Option<&Value>,
    ctx: GrammarContext<'_>,
) -> Result<Option<GrammarPlan>> {
    let tools = req.tools.as_deref().unwrap_or(&[]);
    let choice = ToolChoice::of(req);
    let mut format: Option<Value> = None;
    if let (Some(parser), false, false) = (
        ctx.tool_parser,
        tools.is_empty(),
        choice == ToolChoice::None,
    ) {
        let so_format = so.map(constraint_format).transpose()?;
        if let Some(cf) = call_format(parser) {
            let single = req.parallel_tool_calls == Some(false);
            let any_strict = tools.iter().any(|t| is_strict(&t.function.extra));
            let offered: Vec<(&str, Value)> = tools
                .iter()
                .filter(|t| match &choice {
                    ToolChoice::Named(n) => t.function.name == *n,
                    _ => true,
                })
                .map(|t| {
                    let args = if is_strict(&t.function.extra) {
                        t.function.parameters.clone().unwrap_or(Value::Bool(true))
                    } else {
                        Value::Bool(true)
                    };
                    (t.function.name.as_str(), args)
                })
                .collect();
            format = match (&choice, so_format) {
                (ToolChoice::Auto, Some(sf)) => Some(json!({"type": "or", "elements": [
                    calls(cf, &offered, Mode::Required, single), sf]})),
                (ToolChoice::Auto, None) if any_strict => {
                    Some(calls(cf, &offered, Mode::Auto, single))
                }
                (ToolChoice::Auto, None) => None,
                (ToolChoice::Required, _) => Some(calls(cf, &offered, Mode::Required, single)),
                (ToolChoice::Named(_), _) => Some(calls(cf, &offered, Mode::Forced, single)),
                (ToolChoice::None, _) => None,
            };
        } else if PLAIN_TOOL_PARSERS.contains(&parser) {
            format = so_format;
        } else if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
            // A call format this renderer does not build: the calls stay unconstrained
            // and the derenderer reads them in the parser's own format.
            return Ok(None);
        }
    }
    let block = ctx.reasoning_parser.and_then(reasoning_block);
    if format.is_none() && block.is_some() {
        format = so.map(constraint_format).transpose()?;
    }
    let Some(mut format) = format else {
        return Ok(None);
    };
    if let Some((start, end, after)) = block {
        let open = ctx.prompt_reasoning == PromptReasoning::Open;
        let begin = if open { "" } else { start };
        let mut prefix = json!({"type": "tag", "begin": begin, "content": any_text(), "end": end});
        if !after.is_empty() {
            prefix = json!({"type": "sequence", "elements": [
                prefix, {"type": "const_string", "value": after}]});
        }
        if !open {
            prefix = json!({"type": "optional", "content": prefix});
        }
        let mut elements = vec![prefix, format];
        // GLM-4.5 answers a closed block with a newline first.
        if reasoning_parser_is(ctx, "glm45") && ctx.prompt_reasoning == PromptReasoning::Closed {
            elements.insert(0, json!({"type": "const_string", "value": "\n"}));
        }
        format = json!({"type": "sequence", "elements": elements});
    }
    let tag = json!({"type": "structural_tag", "format": format});
    Ok(Some(GrammarPlan {
        structured_outputs: json!({"structural_tag": tag.to_string()}),
        reasoning_ended: block.is_some(),
    }))
}

fn reasoning_parser_is(ctx: GrammarContext<'_>, name: &str) -> bool {
    ctx.reasoning_parser == Some(name)
}

#[derive(Debug, Clone, PartialEq)]
enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

impl ToolChoice {
    fn of(req: &ChatCompletionRequest) -> Self {
        match &req.tool_choice {
            None | Some(Value::Null) => {
                if req.tools.is_some() {
                    Self::Auto
                } else {
                    Self::None
                }
            }
            Some(Value::String(s)) => match s.as_str() {
                "required" => Self::Required,
                "auto" => Self::Auto,
                _ => Self::None,
            },
            Some(v) => v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .map_or(Self::None, |n| Self::Named(n.to_owned())),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Auto,
    Required,
    Forced,
}

fn is_strict(extra: &Map<String, Value>) -> bool {
    extra.get("strict") == Some(&Value::Bool(true))
}

fn any_text() -> Value {
    json!({"type": "any_text", "excludes": [], "max_tokens": null, "max_chars": null})
}

fn json_schema(schema: Value) -> Value {
    json!({"type": "json_schema", "json_schema": schema, "style": "json", "any_order": false,
           "max_whitespace_cnt": null, "excludes": []})
}

/// The call tags of the offered tools in one parser's format.
fn calls(cf: CallFormat, tools: &[(&str, Value)], mode: Mode, single: bool) -> Value {
    let tag = |begin: String, args: &Value, end: &str| json!({"type": "tag", "begin": begin, "content": json_schema(args.clone()), "end": end});
    match cf {
        CallFormat::DeepSeekV3 | CallFormat::DeepSeekV31 | CallFormat::Kimi => {
            sectioned_calls(cf, tools, mode, single)
        }
        CallFormat::Hermes => {
            let mut tags = Vec::new();
            for (name, args) in tools {
                for (open, close) in [
                    ("<tool_call>\n", "}\n</tool_call>"),
                    ("<tool_call>", "}</tool_call>"),
                ] {
                    tags.push(tag(
                        format!("{open}{{\"name\": \"{name}\", \"arguments\": "),
                        args,
                        close,
                    ));
                }
            }
            match mode {
                Mode::Auto => json!({"type": "triggered_tags", "triggers": ["<tool_call>"],
                    "tags": tags, "at_least_one": false, "stop_after_first": single,
                    "excludes": []}),
                Mode::Required | Mode::Forced => json!({"type": "tags_with_separator",
                    "tags": tags, "separator": "", "at_least_one": true,
                    "stop_after_first": single || mode == Mode::Forced}),
            }
        }
        CallFormat::Qwen3 | CallFormat::Llama => {
            let (trigger, tags): (&str, Vec<Value>) = if cf == CallFormat::Qwen3 {
                (
                    "<tool_call>",
                    tools
                        .iter()
                        .map(|(name, args)| {
                            tag(
                                format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": "),
                                args,
                                "}\n</tool_call>",
                            )
                        })
                        .collect(),
                )
            } else {
                (
                    "{\"name\": ",
                    tools
                        .iter()
                        .map(|(name, args)| {
                            tag(
                                format!("{{\"name\": \"{name}\", \"parameters\": "),
                                args,
                                "}",
                            )
                        })
                        .collect(),
                )
            };
            if mode == Mode::Forced {
                if let [only] = tags.as_slice() {
                    return only.clone();
                }
            }
            json!({"type": "triggered_tags", "triggers": [trigger], "tags": tags,
                   "at_least_one": mode != Mode::Auto, "stop_after_first": single,
                   "excludes": ["<think>", "</think>"]})
        }
    }
}

/// Calls wrapped in a section (DeepSeek, Kimi): `required` is the section holding one or
/// more calls, a named tool the section with that call, `auto` free text with sections.
fn sectioned_calls(cf: CallFormat, tools: &[(&str, Value)], mode: Mode, single: bool) -> Value {
    const DS_OPEN: &str = "<｜tool▁calls▁begin｜>";
    const DS_CLOSE: &str = "<｜tool▁calls▁end｜>";
    const KIMI_OPEN: &str = "<|tool_calls_section_begin|>";
    const KIMI_CLOSE: &str = "<|tool_calls_section_end|>";
    let (open, close, separator) = match cf {
        CallFormat::DeepSeekV3 => (DS_OPEN, DS_CLOSE, "\n"),
        CallFormat::DeepSeekV31 => (DS_OPEN, DS_CLOSE, ""),
        _ => (KIMI_OPEN, KIMI_CLOSE, ""),
    };
    // (begin, content, end) of one call.
    let call = |name: &str, args: &Value| -> (String, Value, String) {
        match cf {
            CallFormat::DeepSeekV3 => (
                format!("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n"),
                json_schema(args.clone()),
                "\n```<｜tool▁call▁end｜>".to_owned(),
            ),
            CallFormat::DeepSeekV31 => (
                format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>"),
                json_schema(args.clone()),
                "<｜tool▁call▁end｜>".to_owned(),
            ),
            _ => (
                format!("<|tool_call_begin|>functions.{name}:"),
                json!({"type": "sequence", "elements": [
                    {"type": "regex", "pattern": "\\d+"},
                    {"type": "const_string", "value": "<|tool_call_argument_begin|>"},
                    json_schema(args.clone())]}),
                "<|tool_call_end|>".to_owned(),
            ),
        }
    };
    let tag = |(begin, content, end): (String, Value, String)| json!({"type": "tag", "begin": begin, "content": content, "end": end});
    let list = json!({"type": "tags_with_separator",
        "tags": tools.iter().map(|(n, a)| tag(call(n, a))).collect::<Vec<_>>(),
        "separator": separator, "at_least_one": true, "stop_after_first": single});
    let kimi = !matches!(cf, CallFormat::DeepSeekV3 | CallFormat::DeepSeekV31);
    let section = |content: Value| {
        if kimi {
            json!({"type": "sequence", "elements": [
                {"type": "const_string", "value": open}, content,
                {"type": "const_string", "value": close}]})
        } else {
            json!({"type": "tag", "begin": open, "content": content, "end": close})
        }
    };
    match mode {
        Mode::Forced => match (tools, kimi) {
            ([(name, args)], false) => {
                let (begin, content, end) = call(name, args);
                json!({"type": "tag", "begin": format!("{open}{begin}"), "content": content,
                       "end": format!("{end}{close}")})
            }
            ([(name, args)], true) => section(tag(call(name, args))),
            _ => section(list),
        },
        Mode::Required => section(list),
        Mode::Auto => {
            let mut excludes = vec!["<think>", "</think>"];
            if kimi {
                excludes.push("<|tool_call_begin|>");
            }
            json!({"type": "triggered_tags", "triggers": [open],
                "tags": [{"type": "tag", "begin": open, "content": list, "end": close}],
                "at_least_one": false, "stop_after_first": single, "excludes": excludes})
        }
    }
}

/// A request constraint as a structural-tag format (whitespace options do not carry over).
fn constraint_format(so: &Value) -> Result<Value> {
    let bad = |m: String| Error::for_param(m, "structured_outputs");
    // The engine's own reading of the constraint, so both sides accept and refuse alike.
    Ok(match Constraint::from_structured_outputs(so)?.kind {
        ConstraintKind::Json(schema) => json_schema(schema),
        ConstraintKind::JsonObject => json_schema(json!({"type": "object"})),
        ConstraintKind::Regex(pattern) => json!({"type": "regex", "pattern": pattern}),
        ConstraintKind::Choice(choices) => json!({"type": "or", "elements": choices
            .iter()
            .map(|c| json!({"type": "const_string", "value": c}))
            .collect::<Vec<_>>()}),
        ConstraintKind::Grammar(g) => json!({"type": "grammar", "grammar": g}),
        ConstraintKind::StructuralTag(t) => {
            let tag: Value = match t {
                Value::String(s) => serde_json::from_str(&s).map_err(|e| {
                    bad(format!(
                        "Invalid structural_tag specification: not valid JSON: {e}"
                    ))
                })?,
                other => other,
            };
            let format = match (tag.get("format"), tag.as_object()) {
                (Some(f), _) => f.clone(),
                (None, Some(obj)) => crate::structural_tag::legacy_to_format(obj)
                    .map_err(|e| bad(format!("Invalid structural_tag specification: {e}")))?,
                (None, None) => {
                    return Err(bad(
                        "Invalid structural_tag specification: not an object.".into()
                    ))
                }
            };
            normalize(&format)
        }
    })
}

/// A format with xgrammar's defaults filled in and its fields in xgrammar's order, as vllm-rs
/// re-serializes a request's structural tag it embeds; unknown types pass unchanged.
fn normalize(f: &Value) -> Value {
    let Some(obj) = f.as_object() else {
        return f.clone();
    };
    let field = |k: &str, default: Value| obj.get(k).cloned().unwrap_or(default);
    let req = |k: &str| field(k, Value::Null);
    let each = |k: &str| -> Value {
        Value::Array(
            obj.get(k)
                .and_then(Value::as_array)
                .map(|a| a.iter().map(normalize).collect())
                .unwrap_or_default(),
        )
    };
    let tags = |k: &str| -> Value {
        Value::Array(
            obj.get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|t| {
                            let mut t = t.clone();
                            if let Some(o) = t.as_object_mut() {
                                o.entry("type").or_insert_with(|| "tag".into());
                            }
                            normalize(&t)
                        })
                        .collect()
                })
                .unwrap_or_default(),
        )
    };
    let content = || obj.get("content").map(normalize).unwrap_or(Value::Null);
    match obj.get("type").and_then(Value::as_str) {
        Some("const_string") => json!({"type": "const_string", "value": req("value")}),
        Some("json_schema") => json!({"type": "json_schema", "json_schema": req("json_schema"),
            "style": field("style", "json".into()), "any_order": field("any_order", false.into()),
            "max_whitespace_cnt": req("max_whitespace_cnt"), "excludes": field("excludes", json!([]))}),
        Some("any_text") => json!({"type": "any_text", "excludes": field("excludes", json!([])),
            "max_tokens": req("max_tokens"), "max_chars": req("max_chars")}),
        Some("regex") => json!({"type": "regex", "pattern": req("pattern")}),
        Some("grammar") => json!({"type": "grammar", "grammar": req("grammar")}),
        Some(t @ ("sequence" | "or")) => json!({"type": t, "elements": each("elements")}),
        Some(t @ ("optional" | "plus" | "star")) => json!({"type": t, "content": content()}),
        Some("repeat") => json!({"type": "repeat", "min": req("min"), "max": req("max"),
            "content": content()}),
        Some("tag") => json!({"type": "tag", "begin": req("begin"), "content": content(),
            "end": req("end")}),
        Some("triggered_tags") => json!({"type": "triggered_tags", "triggers": req("triggers"),
            "tags": tags("tags"), "at_least_one": field("at_least_one", false.into()),
            "stop_after_first": field("stop_after_first", false.into()),
            "excludes": field("excludes", json!([]))}),
        Some("tags_with_separator") => json!({"type": "tags_with_separator", "tags": tags("tags"),
            "separator": req("separator"), "at_least_one": field("at_least_one", false.into()),
            "stop_after_first": field("stop_after_first", false.into())}),
        _ => f.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: Value) -> ChatCompletionRequest {
        serde_json::from_value(body).expect("valid request")
    }

    fn tag_of(p: &GrammarPlan) -> Value {
        serde_json::from_str(
            p.structured_outputs["structural_tag"]
                .as_str()
                .expect("string"),
        )
        .expect("JSON")
    }

    const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "strict": true, "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}]"#;

    fn ctx<'a>(tool: Option<&'a str>, reasoning: Option<&'a str>) -> GrammarContext<'a> {
        GrammarContext {
            tool_parser: tool,
            reasoning_parser: reasoning,
            prompt_reasoning: PromptReasoning::Absent,
        }
    }

    #[test]
    fn required_hermes_offers_both_spellings_of_every_tool() {
        let tools: Value = serde_json::from_str(TOOLS).expect("json");
        let r = req(json!({"messages": [], "tools": tools, "tool_choice": "required"}));
        let p = plan(&r, None, ctx(Some("hermes"), None))
            .expect("ok")
            .expect("a plan");
        let f = &tag_of(&p)["format"];
        assert_eq!(f["type"], "tags_with_separator");
        assert_eq!(f["tags"].as_array().map(Vec::len), Some(4));
        // Not strict: any JSON arguments; strict: the tool's schema.
        assert_eq!(f["tags"][0]["content"]["json_schema"], true);
        assert_eq!(
            f["tags"][2]["content"]["json_schema"]["properties"]["tz"]["type"],
            "string"
        );
        assert!(!p.reasoning_ended);
    }

    #[test]
    fn named_llama_is_one_tag_and_auto_without_strict_tools_is_free() {
        let tools: Value = serde_json::from_str(TOOLS).expect("json");
        let named = req(json!({"messages": [], "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
        let p = plan(&named, None, ctx(Some("llama3_json"), None))
            .expect("ok")
            .expect("a plan");
        assert_eq!(
            tag_of(&p)["format"]["begin"],
            "{\"name\": \"get_weather\", \"parameters\": "
        );
        let auto = req(json!({"messages": [], "tools": [tools[0].clone()]}));
        assert_eq!(
            plan(&auto, None, ctx(Some("llama3_json"), None)).expect("ok"),
            None
        );
    }

    #[test]
    fn reasoning_wraps_the_constraint() {
        let r = req(json!({"messages": []}));
        let so = json!({"regex": "a+"});
        let p = plan(&r, Some(&so), ctx(None, Some("qwen3")))
            .expect("ok")
            .expect("a plan");
        assert!(p.reasoning_ended);
        assert_eq!(
            p.structured_outputs["structural_tag"],
            "{\"type\":\"structural_tag\",\"format\":{\"type\":\"sequence\",\"elements\":[{\"type\":\"optional\",\"content\":{\"type\":\"sequence\",\"elements\":[{\"type\":\"tag\",\"begin\":\"<think>\",\"content\":{\"type\":\"any_text\",\"excludes\":[],\"max_tokens\":null,\"max_chars\":null},\"end\":\"</think>\"},{\"type\":\"const_string\",\"value\":\"\\n\\n\"}]}},{\"type\":\"regex\",\"pattern\":\"a+\"}]}}"
        );
        let inside = GrammarContext {
            prompt_reasoning: PromptReasoning::Open,
            ..ctx(None, Some("deepseek_r1"))
        };
        let p = plan(&r, Some(&so), inside).expect("ok").expect("a plan");
        assert_eq!(tag_of(&p)["format"]["elements"][0]["begin"], "");
        // No constraint, no tools: nothing to do.
        assert_eq!(
            plan(&r, None, ctx(Some("hermes"), Some("qwen3"))).expect("ok"),
            None
        );
    }

    /// The probe tools of the vllm-rs goldens below: one plain tool, one strict.
    fn probe_tools() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Get weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
               {"type": "function", "function": {"name": "get_time", "strict": true,
                 "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"],
                                "additionalProperties": false}}}])
    }

    /// Byte-for-byte what `vllm-rs render` (vllm 0.33.0) sends for the same request.
    #[test]
    fn tags_match_vllm_rs_render() {
        let msgs = json!([{"role": "user", "content": "Weather in Paris?"}]);
        let cases = [
            ("deepseek_v3", json!({"type": "function", "function": {"name": "get_time"}}), None, "{\"type\":\"structural_tag\",\"format\":{\"type\":\"tag\",\"begin\":\"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\\n```json\\n\",\"content\":{\"type\":\"json_schema\",\"json_schema\":{\"type\":\"object\",\"properties\":{\"tz\":{\"type\":\"string\"}},\"required\":[\"tz\"],\"additionalProperties\":false},\"style\":\"json\",\"any_order\":false,\"max_whitespace_cnt\":null,\"excludes\":[]},\"end\":\"\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>\"}}"),
            ("kimi_k2", json!("required"), Some(false), "{\"type\":\"structural_tag\",\"format\":{\"type\":\"sequence\",\"elements\":[{\"type\":\"const_string\",\"value\":\"<|tool_calls_section_begin|>\"},{\"type\":\"tags_with_separator\",\"tags\":[{\"type\":\"tag\",\"begin\":\"<|tool_call_begin|>functions.get_weather:\",\"content\":{\"type\":\"sequence\",\"elements\":[{\"type\":\"regex\",\"pattern\":\"\\\\d+\"},{\"type\":\"const_string\",\"value\":\"<|tool_call_argument_begin|>\"},{\"type\":\"json_schema\",\"json_schema\":true,\"style\":\"json\",\"any_order\":false,\"max_whitespace_cnt\":null,\"excludes\":[]}]},\"end\":\"<|tool_call_end|>\"},{\"type\":\"tag\",\"begin\":\"<|tool_call_begin|>functions.get_time:\",\"content\":{\"type\":\"sequence\",\"elements\":[{\"type\":\"regex\",\"pattern\":\"\\\\d+\"},{\"type\":\"const_string\",\"value\":\"<|tool_call_argument_begin|>\"},{\"type\":\"json_schema\",\"json_schema\":{\"type\":\"object\",\"properties\":{\"tz\":{\"type\":\"string\"}},\"required\":[\"tz\"],\"additionalProperties\":false},\"style\":\"json\",\"any_order\":false,\"max_whitespace_cnt\":null,\"excludes\":[]}]},\"end\":\"<|tool_call_end|>\"}],\"separator\":\"\",\"at_least_one\":true,\"stop_after_first\":true},{\"type\":\"const_string\",\"value\":\"<|tool_calls_section_end|>\"}]}}"),
            ("hermes", Value::Null, None, "{\"type\":\"structural_tag\",\"format\":{\"type\":\"triggered_tags\",\"triggers\":[\"<tool_call>\"],\"tags\":[{\"type\":\"tag\",\"begin\":\"<tool_call>\\n{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \",\"content\":{\"type\":\"json_schema\",\"json_schema\":true,\"style\":\"json\",\"any_order\":false,\"max_whitespace_cnt\":null,\"excludes\":[]},\"end\":\"}\\n</tool_call>\"},{\"type\":\"tag\",\"begin\":\"<tool_call>{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \",\"content\":{\"type\":\"json_schema\",\"json_schema\":true,\"style\":\"json\",\"any_order\":false,\"max_whitespace_cnt\":null,\"excludes\":[]},\"end\":\"}</tool_call>\"},{\"type\":\"tag\",\"begin\":\"<tool_call>\\n{\\\"name\\\": \\\"get_time\\\", \\\"arguments\\\": \",\"content\":{\"type\":\"json_schema\",\"json_schema\":{\"type\":\"object\",\"properties\":{\"tz\":{\"type\":\"string\"}},\"required\":[\"tz\"],\"additionalProperties\":false},\"style\":\"json\",\"any_order\":false,\"max_whitespace_cnt\":null,\"excludes\":[]},\"end\":\"}\\n</tool_call>\"},{\"type\":\"tag\",\"begin\":\"<tool_call>{\\\"name\\\": \\\"get_time\\\", \\\"arguments\\\": \",\"content\":{\"type\":\"json_schema\",\"json_schema\":{\"type\":\"object\",\"properties\":{\"tz\":{\"type\":\"string\"}},\"required\":[\"tz\"],\"additionalProperties\":false},\"style\":\"json\",\"any_order\":false,\"max_whitespace_cnt\":null,\"excludes\":[]},\"end\":\"}</tool_call>\"}],\"at_least_one\":false,\"stop_after_first\":false,\"excludes\":[]}}"),
        ];
        for (parser, choice, parallel, want) in cases {
            let mut body = json!({"messages": msgs, "tools": probe_tools()});
            if !choice.is_null() {
                body["tool_choice"] = choice;
            }
            if let Some(p) = parallel {
                body["parallel_tool_calls"] = json!(p);
            }
            let p = plan(&req(body), None, ctx(Some(parser), None))
                .expect("ok")
                .expect("a plan");
            assert_eq!(p.structured_outputs["structural_tag"], want, "{parser}");
        }
    }
}
