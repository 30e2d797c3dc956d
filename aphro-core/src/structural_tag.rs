//! vLLM's `structured_outputs.structural_tag` as an llguidance Lark grammar.
//!
//! Two spellings reach the engine (`docs/structured-outputs.md`, "Structural tags"):
//!
//! * xgrammar's format tree, `{"type": "structural_tag", "format": {...}}`
//!   (`xgrammar/structural_tag.py`, the shape vLLM's tool parsers build for `tool_choice`
//!   `required` / named and what `response_format: {"type": "structural_tag"}` carries), and
//! * the legacy `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`, which is a
//!   `triggered_tags` of JSON-schema tags (`v1/structured_output/backend_guidance.py`).
//!
//! Each format node becomes a Lark expression. Free text that runs until a closing string
//! (`any_text` as a tag's content, the text between triggered tags) is a *lazy* lexeme that
//! ends with that string, the way llguidance's own tool-call grammars are written: a greedy
//! text lexeme would swallow the closing string and never let the grammar move on. So every
//! conversion takes the `tail` — the end strings that must follow the node — and returns an
//! expression that includes it.
//!
//! Token-level formats (`token`, `exclude_token`, `any_tokens`, `token_triggered_tags`,
//! `dispatch`, `token_dispatch`) and XML-styled JSON arguments are refused with a message
//! that names them; nothing is silently loosened.

use serde_json::{Map, Value};

/// The format types this module converts (`xgrammar/structural_tag.py`'s `Format` union,
/// less the token-level and XML-argument ones).
const SUPPORTED: &str = "const_string, json_schema, any_text, regex, grammar, sequence, or, \
                         optional, plus, star, repeat, tag, triggered_tags, tags_with_separator";

/// Nested formats deeper than this are refused (a recursion guard, as xgrammar's).
const MAX_DEPTH: usize = 64;

/// Convert a structural tag (a JSON string or object) to a Lark grammar. `json_schema`
/// turns a tag's JSON schema into the schema llguidance compiles (the request's whitespace
/// and `additionalProperties` options folded in).
pub fn to_lark(spec: &Value, json_schema: &dyn Fn(&Value) -> Value) -> Result<String, String> {
    let parsed;
    let spec = match spec {
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s)
                .map_err(|e| format!("the structural tag is not valid JSON: {e}"))?;
            &parsed
        }
        other => other,
    };
    let obj = spec
        .as_object()
        .ok_or("a structural tag must be a JSON object")?;
    match obj.get("type").and_then(Value::as_str) {
        None | Some("structural_tag") => {}
        Some(other) => {
            return Err(format!(
                "a structural tag has `type` \"structural_tag\", not {other:?}"
            ))
        }
    }
    let mut b = Builder {
        rules: Vec::new(),
        next: 0,
        json_schema,
    };
    let start = if let Some(format) = obj.get("format") {
        b.conv(format, None, "format", 0)?
    } else if obj.contains_key("structures") || obj.contains_key("triggers") {
        let legacy = legacy_to_format(obj)?;
        b.conv(&legacy, None, "structures", 0)?
    } else {
        return Err(
            "a structural tag needs `format` (or the legacy `structures` and `triggers`)".into(),
        );
    };
    let start = if start.is_empty() {
        "\"\"".to_string()
    } else {
        start
    };
    let mut out = format!("start: {start}\n");
    for r in &b.rules {
        out.push_str(r);
        out.push('\n');
    }
    Ok(out)
}

/// The legacy shape as the `triggered_tags` it means.
pub(crate) fn legacy_to_format(obj: &Map<String, Value>) -> Result<Value, String> {
    let triggers = obj
        .get("triggers")
        .and_then(Value::as_array)
        .ok_or("`triggers` must be a list of strings")?;
    let structures = obj
        .get("structures")
        .and_then(Value::as_array)
        .ok_or("`structures` must be a list")?;
    if structures.is_empty() {
        return Err("No structural tags found in the grammar spec.".into());
    }
    let mut tags = Vec::new();
    for (i, s) in structures.iter().enumerate() {
        let field = |k: &str| {
            s.get(k)
                .ok_or_else(|| format!("structures[{i}] needs `{k}`"))
                .cloned()
        };
        tags.push(serde_json::json!({
            "type": "tag",
            "begin": field("begin")?,
            "content": {"type": "json_schema", "json_schema": field("schema")?},
            "end": field("end")?,
        }));
    }
    Ok(serde_json::json!({"type": "triggered_tags", "triggers": triggers, "tags": tags}))
}

struct Builder<'a> {
    rules: Vec<String>,
    next: usize,
    json_schema: &'a dyn Fn(&Value) -> Value,
}

impl Builder<'_> {
    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}_{}", self.next)
    }

    /// A named rule (or terminal, for upper-case names) with `body`; returns its name.
    fn rule(&mut self, prefix: &str, attrs: &str, body: &str) -> String {
        let name = self.fresh(prefix);
        self.rules.push(format!("{name}{attrs}: {body}"));
        name
    }

    /// `f` followed by `tail` (one of the end strings), as one Lark expression.
    fn conv(
        &mut self,
        f: &Value,
        tail: Option<&[String]>,
        path: &str,
        depth: usize,
    ) -> Result<String, String> {
        if depth > MAX_DEPTH {
            return Err(format!(
                "{path}: formats nest deeper than {MAX_DEPTH} levels"
            ));
        }
        let obj = f
            .as_object()
            .ok_or_else(|| format!("{path}: a format must be an object"))?;
        let ty = obj
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{path}: a format needs a string `type`"))?;
        let str_field = |k: &str| -> Result<&str, String> {
            obj.get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{path}: `{ty}` needs a string `{k}`"))
        };
        let list_field = |k: &str| -> Result<&Vec<Value>, String> {
            obj.get(k)
                .and_then(Value::as_array)
                .ok_or_else(|| format!("{path}: `{ty}` needs a list `{k}`"))
        };
        let bool_field = |k: &str| obj.get(k).and_then(Value::as_bool).unwrap_or(false);
        let strings = |k: &str| string_list(obj, k, path);
        let content = |b: &mut Self, tail: Option<&[String]>| -> Result<String, String> {
            let c = obj
                .get("content")
                .ok_or_else(|| format!("{path}: `{ty}` needs `content`"))?;
            b.conv(c, tail, &format!("{path}.content"), depth + 1)
        };
        let expr = match ty {
            "const_string" => seq(&[lit(str_field("value")?), ends(tail)]),
            "json_schema" => {
                let schema = obj
                    .get("json_schema")
                    .ok_or_else(|| format!("{path}: `json_schema` needs `json_schema`"))?;
                match obj.get("style").and_then(Value::as_str) {
                    None | Some("json") => {}
                    Some(style) => {
                        return Err(format!(
                            "{path}: JSON arguments in the {style:?} style are not supported; \
                             only \"json\""
                        ))
                    }
                }
                if obj.get("any_order").and_then(Value::as_bool) == Some(true) {
                    return Err(format!("{path}: `any_order: true` is not supported"));
                }
                if !strings("excludes")?.is_empty() {
                    return Err(format!(
                        "{path}: `excludes` on json_schema is not supported"
                    ));
                }
                let mut schema = match schema {
                    Value::Bool(true) => Value::Object(Map::new()),
                    Value::Bool(false) => {
                        return Err(format!("{path}: the JSON schema `false` matches nothing"))
                    }
                    Value::Object(_) => schema.clone(),
                    _ => {
                        return Err(format!(
                            "{path}: `json_schema` must be an object or a boolean"
                        ))
                    }
                };
                schema = (self.json_schema)(&schema);
                if let Some(n) = obj.get("max_whitespace_cnt").and_then(Value::as_u64) {
                    if let Some(Value::Object(xg)) =
                        schema.as_object_mut().and_then(|o| o.get_mut("x-guidance"))
                    {
                        if xg.get("whitespace_flexible") == Some(&Value::Bool(true)) {
                            let p = if n == 0 {
                                "".to_string()
                            } else {
                                format!(r"[\x20\x0A\x0D\x09]{{1,{n}}}")
                            };
                            if n == 0 {
                                xg.insert("whitespace_flexible".into(), Value::Bool(false));
                                xg.remove("whitespace_pattern");
                            } else {
                                xg.insert("whitespace_pattern".into(), Value::String(p));
                            }
                        }
                    }
                }
                seq(&[format!("%json {schema}"), ends(tail)])
            }
            "regex" => seq(&[
                format!("/{}/", slash_escape(str_field("pattern")?)),
                ends(tail),
            ]),
            "grammar" => {
                let g = str_field("grammar")?;
                seq(&[format!("%lark {{\n{g}\n}}"), ends(tail)])
            }
            "any_text" => {
                let text = self.text_terminal(
                    &strings("excludes")?,
                    obj.get("max_chars").and_then(Value::as_u64),
                );
                let max_tokens = obj
                    .get("max_tokens")
                    .and_then(Value::as_u64)
                    .map(|n| format!("max_tokens={n}"));
                self.text_until(&text, tail, max_tokens)
            }
            "sequence" => {
                let elements = list_field("elements")?;
                if elements.is_empty() {
                    return Err(format!("{path}: `sequence` needs at least one element"));
                }
                let mut parts = Vec::new();
                for (i, e) in elements.iter().enumerate() {
                    let last = i + 1 == elements.len();
                    parts.push(self.conv(
                        e,
                        if last { tail } else { None },
                        &format!("{path}.elements[{i}]"),
                        depth + 1,
                    )?);
                }
                seq(&parts)
            }
            "or" => {
                let elements = list_field("elements")?;
                if elements.is_empty() {
                    return Err(format!("{path}: `or` needs at least one element"));
                }
                let mut alts = Vec::new();
                for (i, e) in elements.iter().enumerate() {
                    alts.push(self.conv(e, tail, &format!("{path}.elements[{i}]"), depth + 1)?);
                }
                alt(&alts)
            }
            "optional" | "plus" | "star" => {
                let c = content(self, None)?;
                let op = match ty {
                    "optional" => "?",
                    "plus" => "+",
                    _ => "*",
                };
                let inner = if c.is_empty() {
                    String::new()
                } else {
                    format!("({c}){op}")
                };
                seq(&[inner, ends(tail)])
            }
            "repeat" => {
                let min = obj
                    .get("min")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| format!("{path}: `repeat` needs an integer `min`"))?;
                let max = obj
                    .get("max")
                    .and_then(Value::as_i64)
                    .ok_or_else(|| format!("{path}: `repeat` needs an integer `max`"))?;
                // xgrammar: max -1 is unbounded.
                if max != -1 && (max < 0 || (max as u64) < min) {
                    return Err(format!("{path}: `repeat` needs min <= max"));
                }
                let c = content(self, None)?;
                let inner = if max == 0 || c.is_empty() {
                    String::new()
                } else if max == -1 {
                    format!("({c}){{{min},}}")
                } else {
                    format!("({c}){{{min},{max}}}")
                };
                seq(&[inner, ends(tail)])
            }
            "tag" => {
                let (begin, tag_ends) = tag_parts(obj, path)?;
                let body = content(self, Some(&tag_ends))?;
                seq(&[lit(&begin), body, ends(tail)])
            }
            "triggered_tags" => self.triggered_tags(obj, tail, path, depth)?,
            "tags_with_separator" => {
                let tags = list_field("tags")?;
                if tags.is_empty() {
                    return Err(format!(
                        "{path}: `tags_with_separator` needs at least one tag"
                    ));
                }
                let sep = str_field("separator")?;
                let mut alts = Vec::new();
                for (i, t) in tags.iter().enumerate() {
                    alts.push(self.full_tag(t, &format!("{path}.tags[{i}]"), depth + 1)?);
                }
                let any = alt(&alts);
                let end = ends(tail);
                let at_least_one = bool_field("at_least_one");
                if bool_field("stop_after_first") {
                    if at_least_one {
                        seq(&[any, end])
                    } else {
                        seq(&[format!("({any})?"), end])
                    }
                } else {
                    let more = format!("({} {any})*", lit(sep));
                    let list = seq(&[any, more]);
                    if at_least_one {
                        seq(&[list, end])
                    } else {
                        seq(&[format!("({list})?"), end])
                    }
                }
            }
            "token"
            | "exclude_token"
            | "any_tokens"
            | "token_triggered_tags"
            | "dispatch"
            | "token_dispatch"
            | "qwen_xml_parameter" => {
                return Err(format!(
                    "{path}: the format type {ty:?} is not supported by this engine; supported: \
                     {SUPPORTED}"
                ))
            }
            other => {
                return Err(format!(
                    "{path}: unknown format type {other:?}; supported: {SUPPORTED}"
                ))
            }
        };
        Ok(expr)
    }

    /// A tag as a whole: its begin string, content and end.
    fn full_tag(&mut self, t: &Value, path: &str, depth: usize) -> Result<String, String> {
        if t.get("type").and_then(Value::as_str).unwrap_or("tag") != "tag" {
            return Err(format!("{path}: must be a `tag`"));
        }
        let mut t = t.clone();
        if let Some(o) = t.as_object_mut() {
            o.insert("type".into(), Value::String("tag".into()));
        }
        self.conv(&t, None, path, depth)
    }

    /// Text, then one of the triggers dispatching to the tags it begins; after a tag's end,
    /// text again (xgrammar: `at_least_one` puts a tag first, `stop_after_first` ends the
    /// format after one tag).
    fn triggered_tags(
        &mut self,
        obj: &Map<String, Value>,
        tail: Option<&[String]>,
        path: &str,
        depth: usize,
    ) -> Result<String, String> {
        let triggers: Vec<String> = obj
            .get("triggers")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{path}: `triggered_tags` needs a list `triggers`"))?
            .iter()
            .map(|t| {
                t.as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .ok_or_else(|| format!("{path}: `triggers` must be non-empty strings"))
            })
            .collect::<Result<_, _>>()?;
        if triggers.is_empty() {
            return Err(format!(
                "{path}: `triggered_tags` needs at least one trigger"
            ));
        }
        let tags = obj
            .get("tags")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{path}: `triggered_tags` needs a list `tags`"))?;
        if tags.is_empty() {
            return Err(format!("{path}: `triggered_tags` needs at least one tag"));
        }
        let mut excludes = string_list(obj, "excludes", path)?;
        // The free text holds no trigger: once one appears, its tag must follow.
        excludes.extend(triggers.iter().cloned());
        let text = self.text_terminal(&excludes, None);

        // Per trigger: the rest of each tag it begins.
        let mut rests: Vec<Vec<String>> = vec![Vec::new(); triggers.len()];
        let mut fulls = Vec::new();
        for (i, t) in tags.iter().enumerate() {
            let tpath = format!("{path}.tags[{i}]");
            let tobj = t
                .as_object()
                .ok_or_else(|| format!("{tpath}: must be a `tag` object"))?;
            let (begin, tag_ends) = tag_parts(tobj, &tpath)?;
            let k = triggers
                .iter()
                .position(|tr| begin.starts_with(tr.as_str()))
                .ok_or_else(|| {
                    format!("{tpath}: the begin {begin:?} starts with none of the triggers {triggers:?}")
                })?;
            let c = tobj
                .get("content")
                .ok_or_else(|| format!("{tpath}: `tag` needs `content`"))?;
            let body = self.conv(c, Some(&tag_ends), &format!("{tpath}.content"), depth + 1)?;
            rests[k].push(seq(&[lit(&begin[triggers[k].len()..]), body.clone()]));
            fulls.push(seq(&[lit(&begin), body]));
        }
        let mut dispatches = Vec::new();
        for (k, trigger) in triggers.iter().enumerate() {
            if rests[k].is_empty() {
                continue;
            }
            let head = self.rule("st_head", "[lazy]", &format!("{text} {}", lit(trigger)));
            dispatches.push(seq(&[head, alt(&rests[k])]));
        }
        let dispatch = alt(&dispatches);
        let end = ends(tail);
        let rest_text = self.text_until(&text, tail, None);
        let at_least_one = obj.get("at_least_one").and_then(Value::as_bool) == Some(true);
        let stop_after_first = obj.get("stop_after_first").and_then(Value::as_bool) == Some(true);
        Ok(match (at_least_one, stop_after_first) {
            (true, true) => seq(&[alt(&fulls), end]),
            (true, false) => seq(&[alt(&fulls), format!("({dispatch})*"), rest_text]),
            (false, true) => alt(&[seq(&[dispatch, end]), rest_text]),
            (false, false) => seq(&[format!("({dispatch})*"), rest_text]),
        })
    }

    /// A terminal for free text without any of `excludes`, at most `max_chars` characters.
    fn text_terminal(&mut self, excludes: &[String], max_chars: Option<u64>) -> String {
        let any = match max_chars {
            Some(n) => format!("/(?s:.{{0,{n}}})/"),
            None => "/(?s:.*)/".to_string(),
        };
        let excludes: Vec<&String> = excludes.iter().filter(|e| !e.is_empty()).collect();
        let body = if excludes.is_empty() {
            any
        } else {
            let alts: Vec<String> = excludes.iter().map(|e| regex_escape(e)).collect();
            format!("{any} & ~/(?s:.*(?:{}).*)/", alts.join("|"))
        };
        self.rule("ST_TEXT", "", &body)
    }

    /// Free text up to one of `tail` (consumed, at its first occurrence), or to the end of
    /// the output when there is no tail.
    fn text_until(
        &mut self,
        text: &str,
        tail: Option<&[String]>,
        max_tokens: Option<String>,
    ) -> String {
        let tail: Vec<&String> = tail
            .unwrap_or(&[])
            .iter()
            .filter(|e| !e.is_empty())
            .collect();
        if tail.is_empty() {
            let attrs = max_tokens.map(|m| format!("[{m}]")).unwrap_or_default();
            return self.rule("st_text", &attrs, text);
        }
        let attrs = match max_tokens {
            Some(m) => format!("[lazy, {m}]"),
            None => "[lazy]".to_string(),
        };
        let ends: Vec<String> = tail.iter().map(|e| lit(e)).collect();
        let body = format!("{text} {}", alt(&ends));
        self.rule("st_text", &attrs, &body)
    }
}

/// An optional list of strings (`excludes`): absent or null is empty.
fn string_list(obj: &Map<String, Value>, k: &str, path: &str) -> Result<Vec<String>, String> {
    let bad = || format!("{path}: `{k}` must be a list of strings");
    match obj.get(k) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// A tag's begin string and its end strings.
fn tag_parts(obj: &Map<String, Value>, path: &str) -> Result<(String, Vec<String>), String> {
    let begin = match obj.get("begin") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(_)) => {
            return Err(format!(
                "{path}: a token `begin` is not supported by this engine; use a string"
            ))
        }
        _ => return Err(format!("{path}: `tag` needs a string `begin`")),
    };
    let ends = match obj.get("end") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("{path}: `end` must be a string or a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Object(_)) => {
            return Err(format!(
                "{path}: a token `end` is not supported by this engine; use a string"
            ))
        }
        _ => {
            return Err(format!(
                "{path}: `tag` needs `end`, a string or a list of strings"
            ))
        }
    };
    Ok((begin, ends))
}

/// A Lark string literal (JSON escapes); the empty string is no expression at all.
fn lit(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        Value::from(s).to_string()
    }
}

/// One of the end strings, or nothing.
fn ends(tail: Option<&[String]>) -> String {
    let lits: Vec<String> = tail.unwrap_or(&[]).iter().map(|e| lit(e)).collect();
    alt(&lits)
}

/// Expressions in order, skipping empty ones.
fn seq(parts: &[String]) -> String {
    parts
        .iter()
        .filter(|p| !p.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join(" ")
}

/// One of the expressions; an empty one makes the whole group optional.
fn alt(alts: &[String]) -> String {
    let mut seen = Vec::new();
    let mut empty = false;
    for a in alts {
        if a.is_empty() {
            empty = true;
        } else if !seen.contains(a) {
            seen.push(a.clone());
        }
    }
    match (seen.len(), empty) {
        (0, _) => String::new(),
        (1, false) => seen.remove(0),
        (_, false) => format!("({})", seen.join(" | ")),
        (_, true) => format!("({})?", seen.join(" | ")),
    }
}

/// A regex pattern inside Lark's `/.../`: unescaped slashes escaped.
fn slash_escape(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    let mut escaped = false;
    for c in p.chars() {
        if c == '/' && !escaped {
            out.push('\\');
        }
        escaped = c == '\\' && !escaped;
        out.push(c);
    }
    out
}

/// A literal string as a regex (inside Lark's `/.../`).
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$'
            | '#' | '&' | '-' | '~' | '/' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lark(spec: Value) -> String {
        to_lark(&spec, &|s| s.clone()).expect("converts")
    }

    #[test]
    fn tags_and_triggers_become_lazy_lexemes() {
        let g = lark(json!({"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": ["<tool_call>"],
            "tags": [{"type": "tag", "begin": "<tool_call>{\"name\": \"f\", \"arguments\": ",
                      "content": {"type": "json_schema", "json_schema": {"type": "object"}},
                      "end": "}</tool_call>"}]}}));
        assert!(g.contains("[lazy]: ST_TEXT_1 \"<tool_call>\""), "{g}");
        assert!(g.contains("%json {\"type\":\"object\"}"), "{g}");
        assert!(g.contains("~/(?s:.*(?:<tool_call>).*)/"), "{g}");
    }

    #[test]
    fn legacy_structures_are_triggered_tags() {
        let g = lark(json!({"type": "structural_tag", "triggers": ["<f="],
            "structures": [{"begin": "<f=a>", "schema": {"type": "object"}, "end": "</f>"}]}));
        assert!(g.contains("\"a>\" %json"), "{g}");
    }

    #[test]
    fn refuses_token_formats_and_bad_tags() {
        let err = |spec: Value| to_lark(&spec, &|s| s.clone()).expect_err("refused");
        assert!(err(json!({"format": {"type": "token", "token": 3}})).contains("not supported"));
        assert!(err(json!({"format": {"type": "nope"}})).contains("unknown format type"));
        assert!(err(
            json!({"format": {"type": "triggered_tags", "triggers": ["<a>"],
            "tags": [{"begin": "<b>", "content": {"type": "any_text"}, "end": "</b>"}]}})
        )
        .contains("starts with none of the triggers"));
        assert!(err(json!({"type": "json_schema"})).contains("structural_tag"));
        assert!(err(json!("{not json")).contains("not valid JSON"));
        let mut deep = json!({"type": "const_string", "value": "x"});
        for _ in 0..70 {
            deep = json!({"type": "optional", "content": deep});
        }
        assert!(err(json!({"format": deep})).contains("deeper"));
    }

    #[test]
    fn regex_escaping() {
        assert_eq!(slash_escape("a/b\\/c"), "a\\/b\\/c");
        assert_eq!(regex_escape("</think>"), "<\\/think>");
        assert_eq!(regex_escape("{\"name\": "), "\\{\"name\": ");
    }
}
