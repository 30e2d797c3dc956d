//! Structural request errors in the shape vLLM's `RequestValidationError` handler gives them
//! (`vllm/entrypoints/serve/exception_handling/handlers/validation.py`, `api.md` §1.3):
//!
//! ```text
//! 1 validation error:
//!   {'type': 'float_parsing', 'loc': 'body.temperature', 'msg': 'Input should be a valid number, unable to parse string as a number', 'input': 'hot'}
//! ```
//!
//! with `param` the first error's dotted location (`body.temperature`,
//! `body.messages.0.content`). Each entry is pydantic's error dict as Python prints it: the
//! pydantic error `type`, the location with union-branch markers removed, pydantic's `msg`
//! and the offending `input` summarized as vLLM does (strings cut at 200 characters, lists
//! and objects as `<list of N items>`, everything else through `str()`).
//!
//! The location comes from `serde_path_to_error`; the expected type from serde's message
//! ("expected f64", "expected a string", …) and the input from the body itself. Untagged
//! enums (a field that is a string *or* a list) report one error per branch, in the order
//! vLLM's type annotation lists them, as pydantic does for a union.
use crate::error::Error;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Errors listed in full; more are counted (`...and N more errors`).
const MAX_REPORTED_ERRORS: usize = 10;
/// A string input longer than this is cut and marked `...[truncated]`.
const MAX_ERROR_INPUT_CHARS: usize = 200;
/// One rendered error entry longer than this is cut and marked `...[truncated]`.
const MAX_ERROR_CHARS: usize = 1000;

/// One segment of a pydantic error location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loc {
    Key(String),
    Index(usize),
}

/// One pydantic error entry.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// pydantic's error type (`string_type`, `missing`, `float_parsing`, …).
    pub kind: &'static str,
    /// Location below `body`.
    pub loc: Vec<Loc>,
    /// pydantic's message.
    pub msg: String,
    /// The offending value (for `missing`: the object the field is missing from).
    pub input: Value,
    /// pydantic's `ctx`, already in Python notation (`{'ge': 0}`).
    pub ctx: Option<String>,
}

impl FieldError {
    pub fn new(kind: &'static str, loc: &[Loc], msg: impl Into<String>, input: &Value) -> Self {
        FieldError {
            kind,
            loc: loc.to_vec(),
            msg: msg.into(),
            input: input.clone(),
            ctx: None,
        }
    }

    /// `body.a.0.b`, as vLLM's `clean_loc_for_param` joins it.
    pub fn param(&self) -> String {
        let mut s = String::from("body");
        for l in &self.loc {
            s.push('.');
            match l {
                Loc::Key(k) => s.push_str(k),
                Loc::Index(i) => s.push_str(&i.to_string()),
            }
        }
        s
    }

    /// The entry as vLLM prints it: `str()` of the error dict, bounded in size.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{{'type': {}, 'loc': {}, 'msg': {}, 'input': {}",
            py_repr(self.kind),
            py_repr(&self.param()),
            py_repr(&self.msg),
            py_repr(&summarize_input(&self.input)),
        );
        if let Some(ctx) = &self.ctx {
            s.push_str(", 'ctx': ");
            s.push_str(ctx);
        }
        s.push('}');
        truncate_chars(&s, MAX_ERROR_CHARS)
    }
}

/// The 400 (`type: "Bad Request"`) for a list of structural errors.
pub fn validation_error(errors: &[FieldError]) -> Error {
    let count = errors.len();
    let label = if count == 1 { "error" } else { "errors" };
    let mut message = format!("{count} validation {label}:\n");
    for e in errors.iter().take(MAX_REPORTED_ERRORS) {
        message.push_str("  ");
        message.push_str(&e.render());
        message.push('\n');
    }
    if count > MAX_REPORTED_ERRORS {
        message.push_str(&format!(
            "  ...and {} more {label}\n",
            count - MAX_REPORTED_ERRORS
        ));
    }
    Error::Validation {
        message: message.trim_end().to_owned(),
        param: errors.first().map(FieldError::param),
    }
}

/// A `literal_error` (a string outside an enumerated set), e.g. `reasoning_effort`.
pub fn literal_error(loc: &[Loc], allowed: &[&str], input: &Value) -> FieldError {
    let quoted: Vec<String> = allowed.iter().map(|a| py_repr(a)).collect();
    let expected = match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    };
    let mut e = FieldError::new(
        "literal_error",
        loc,
        format!("Input should be {expected}"),
        input,
    );
    e.ctx = Some(format!("{{'expected': {}}}", py_repr(&expected)));
    e
}

/// Deserializes a request body; a failure becomes vLLM's structural 400.
pub fn from_body<T: DeserializeOwned>(body: &Value) -> Result<T, Error> {
    diagnose::<T>(body, &[]).map_err(|errors| validation_error(&errors))
}

/// Deserializes `value` (found at `base` in the body) or says why not.
fn diagnose<T: DeserializeOwned>(value: &Value, base: &[Loc]) -> Result<T, Vec<FieldError>> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|err| {
        let mut loc = base.to_vec();
        for seg in err.path() {
            match seg {
                serde_path_to_error::Segment::Seq { index } => loc.push(Loc::Index(*index)),
                serde_path_to_error::Segment::Map { key } => loc.push(Loc::Key(key.clone())),
                serde_path_to_error::Segment::Enum { .. }
                | serde_path_to_error::Segment::Unknown => {}
            }
        }
        let input = lookup(value, &loc[base.len()..]).unwrap_or(&Value::Null);
        classify(&err.into_inner().to_string(), &loc, input)
    })
}

/// The value at `loc` below `root`.
fn lookup<'a>(root: &'a Value, loc: &[Loc]) -> Option<&'a Value> {
    loc.iter().try_fold(root, |v, l| match l {
        Loc::Key(k) => v.get(k.as_str()),
        Loc::Index(i) => v.get(*i),
    })
}

/// serde's message for a failure at `loc` (whose value is `input`) → pydantic's errors.
fn classify(msg: &str, loc: &[Loc], input: &Value) -> Vec<FieldError> {
    if let Some(field) = msg
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
    {
        let mut at = loc.to_vec();
        at.push(Loc::Key(field.to_owned()));
        return vec![FieldError::new("missing", &at, "Field required", input)];
    }
    if let Some(name) = msg.strip_prefix("data did not match any variant of untagged enum ") {
        if let Some(errors) = union_errors(name.trim(), loc, input) {
            return errors;
        }
    }
    let expected = msg
        .rfind(", expected ")
        .map(|i| &msg[i + ", expected ".len()..]);
    match expected {
        Some(exp) => {
            vec![type_error(exp, loc, input).unwrap_or_else(|| value_error(msg, loc, input))]
        }
        None => vec![value_error(msg, loc, input)],
    }
}

/// A failure serde describes only in words.
fn value_error(msg: &str, loc: &[Loc], input: &Value) -> FieldError {
    FieldError::new("value_error", loc, format!("Value error, {msg}"), input)
}

/// Messages of pydantic for a value of the wrong type, by serde's "expected …" text.
fn type_error(expected: &str, loc: &[Loc], input: &Value) -> Option<FieldError> {
    let e = |kind, msg: &str| Some(FieldError::new(kind, loc, msg, input));
    match expected {
        "f64" | "f32" => {
            if input.is_string() {
                e(
                    "float_parsing",
                    "Input should be a valid number, unable to parse string as a number",
                )
            } else {
                e("float_type", "Input should be a valid number")
            }
        }
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" | "u8" | "u16" | "u32" | "u64" | "u128"
        | "usize" => {
            let unsigned = expected.starts_with('u');
            match input {
                Value::String(_) => e(
                    "int_parsing",
                    "Input should be a valid integer, unable to parse string as an integer",
                ),
                Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() != 0.0) => e(
                    "int_from_float",
                    "Input should be a valid integer, got a number with a fractional part",
                ),
                Value::Number(n) if unsigned && n.as_i64().is_some_and(|i| i < 0) => {
                    let mut err = FieldError::new(
                        "greater_than_equal",
                        loc,
                        "Input should be greater than or equal to 0",
                        input,
                    );
                    err.ctx = Some("{'ge': 0}".into());
                    Some(err)
                }
                _ => e("int_type", "Input should be a valid integer"),
            }
        }
        "a boolean" => match input {
            Value::String(_) | Value::Number(_) => e(
                "bool_parsing",
                "Input should be a valid boolean, unable to interpret input",
            ),
            _ => e("bool_type", "Input should be a valid boolean"),
        },
        "a string" | "a borrowed string" | "a character" => {
            e("string_type", "Input should be a valid string")
        }
        "a sequence" => e("list_type", "Input should be a valid list"),
        "a map" => e("dict_type", "Input should be a valid dictionary"),
        s if s.starts_with("struct ") => {
            // vLLM's messages, content parts and history tool calls are `TypedDict`s (a plain
            // dictionary check); the other objects are pydantic models, validated with
            // `from_attributes` as FastAPI does.
            let name = &s["struct ".len()..];
            if matches!(
                name,
                "ChatMessage" | "ContentPart" | "ToolCallParam" | "FunctionCallParam"
            ) {
                e("dict_type", "Input should be a valid dictionary")
            } else {
                e(
                    "model_attributes_type",
                    "Input should be a valid dictionary or object to extract fields from",
                )
            }
        }
        _ => None,
    }
}

/// The branches of the request's untagged enums, in the order of vLLM's annotation, each
/// diagnosed on its own (pydantic reports every branch of a failed union).
fn union_errors(name: &str, loc: &[Loc], input: &Value) -> Option<Vec<FieldError>> {
    use crate::protocol::ContentPart;
    fn branch<T: DeserializeOwned>(out: &mut Vec<FieldError>, value: &Value, loc: &[Loc]) {
        if let Err(e) = diagnose::<T>(value, loc) {
            out.extend(e);
        }
    }
    let mut out = Vec::new();
    match name {
        // `content: str | list[ChatCompletionContentPartParam]` (CustomChatCompletionMessageParam)
        "MessageContent" => {
            branch::<String>(&mut out, input, loc);
            branch::<Vec<ContentPart>>(&mut out, input, loc);
        }
        // `stop: str | list[str] | None`
        "StopSpec" => {
            branch::<String>(&mut out, input, loc);
            branch::<Vec<String>>(&mut out, input, loc);
        }
        // `prompt: list[int] | list[list[int]] | str | list[str] | None`, and the pooling
        // routes' `input` (the same union)
        "PromptInput" | "EmbeddingInput" => {
            branch::<Vec<i64>>(&mut out, input, loc);
            branch::<Vec<Vec<i64>>>(&mut out, input, loc);
            branch::<String>(&mut out, input, loc);
            branch::<Vec<String>>(&mut out, input, loc);
        }
        // A pooling request's completion-style `input` | chat `messages` (flattened into the
        // body, so each branch reads the whole body).
        "PoolingInput" => {
            branch::<crate::protocol::CompletionInput>(&mut out, input, loc);
            branch::<crate::protocol::ChatInput>(&mut out, input, loc);
        }
        _ => return None,
    }
    (!out.is_empty()).then_some(out)
}

/// vLLM's `_summarize_error_input`, then `str()`: what the `input` of an entry shows.
fn summarize_input(v: &Value) -> String {
    match v {
        Value::String(s) => {
            if s.chars().count() > MAX_ERROR_INPUT_CHARS {
                let cut: String = s.chars().take(MAX_ERROR_INPUT_CHARS).collect();
                format!("{cut}...[truncated]")
            } else {
                s.clone()
            }
        }
        Value::Array(a) => format!("<list of {} items>", a.len()),
        Value::Object(o) => format!("<dict of {} items>", o.len()),
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => {
            let text = match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => i.to_string(),
                (None, Some(u), _) => u.to_string(),
                (None, None, Some(f)) => float_repr(f),
                _ => n.to_string(),
            };
            truncate_chars(&text, MAX_ERROR_INPUT_CHARS)
        }
    }
}

fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...[truncated]", &s[..i]),
        None => s.to_owned(),
    }
}

use aphro_parsers::pyjson::float_repr;

/// Python's `repr(str)`.
pub(crate) fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                let v = u32::from(c);
                if v <= 0xff {
                    out.push_str(&format!("\\x{v:02x}"));
                } else if v <= 0xffff {
                    out.push_str(&format!("\\u{v:04x}"));
                } else {
                    out.push_str(&format!("\\U{v:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_reprs() {
        assert_eq!(py_repr("hot"), "'hot'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a\"b'c\n"), "'a\"b\\'c\\n'");
        assert_eq!(py_repr("a\u{a0}b\u{1}"), "'a\\xa0b\\x01'");
        assert_eq!(float_repr(1.5), "1.5");
        assert_eq!(float_repr(2.0), "2.0");
        assert_eq!(float_repr(1e20), "1e+20");
        assert_eq!(float_repr(1.5e-7), "1.5e-07");
        assert_eq!(float_repr(0.0001), "0.0001");
        assert_eq!(summarize_input(&json!(123)), "123");
        assert_eq!(summarize_input(&json!([1, 2])), "<list of 2 items>");
        assert_eq!(summarize_input(&json!({})), "<dict of 0 items>");
        assert_eq!(summarize_input(&json!(true)), "True");
        let long = "x".repeat(201);
        assert_eq!(
            summarize_input(&json!(long)),
            format!("{}...[truncated]", "x".repeat(200))
        );
    }

    #[test]
    fn literal_errors_list_the_choices_as_pydantic_does() {
        let e = literal_error(
            &[Loc::Key("reasoning_effort".into())],
            &["low", "high", "max"],
            &json!("extreme"),
        );
        assert_eq!(
            e.render(),
            "{'type': 'literal_error', 'loc': 'body.reasoning_effort', 'msg': \"Input should be \
             'low', 'high' or 'max'\", 'input': 'extreme', 'ctx': {'expected': \"'low', 'high' \
             or 'max'\"}}"
        );
    }

    #[test]
    fn many_errors_are_counted_past_ten() {
        let errors: Vec<FieldError> = (0..12)
            .map(|i| {
                FieldError::new(
                    "string_type",
                    &[Loc::Index(i)],
                    "Input should be a valid string",
                    &json!(i),
                )
            })
            .collect();
        let Error::Validation { message, param } = validation_error(&errors) else {
            panic!("validation error expected");
        };
        assert!(message.starts_with("12 validation errors:\n  {'type': 'string_type'"));
        assert!(message.ends_with("\n  ...and 2 more errors"), "{message}");
        assert_eq!(param.as_deref(), Some("body.0"));
    }
}
