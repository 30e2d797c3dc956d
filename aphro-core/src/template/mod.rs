//! Chat templates on minijinja with the semantics of HF transformers' Jinja2 sandbox:
//! `trim_blocks`/`lstrip_blocks`, `raise_exception`, `strftime_now` (injectable [`Clock`]),
//! Python string/dict methods, transformers' own `tojson`, Python `str()` printing, the
//! `{% generation %}` block and Jinja2's `sequence` test. Compiled once at load.
pub mod json;

use crate::error::{Error, Result};
use minijinja::value::{Kwargs, Rest, Value};
use minijinja::{AutoEscape, Environment, ErrorKind};
use std::collections::HashSet;
use std::sync::Arc;

const TEMPLATE_NAME: &str = "chat_template";

/// Source of "now" for `strftime_now`. Injectable so tests (and reproducible batch renders)
/// can freeze time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Local wall-clock time (transformers uses naive local `datetime.now()`).
    fn now(&self) -> chrono::NaiveDateTime;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> chrono::NaiveDateTime {
        chrono::Local::now().naive_local()
    }
}

/// A frozen clock.
#[derive(Debug, Clone, Copy)]
pub struct FixedClock(pub chrono::NaiveDateTime);

impl Clock for FixedClock {
    fn now(&self) -> chrono::NaiveDateTime {
        self.0
    }
}

/// vLLM's `--chat-template-content-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContentFormat {
    /// Detect from the template (`openai` iff it loops over a message's `content`).
    #[default]
    Auto,
    /// Content is one string (text parts joined with `"\n"`).
    String,
    /// Content is a list of `{"type":"text","text":…}` parts.
    OpenAi,
}

impl std::str::FromStr for ContentFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(ContentFormat::Auto),
            "string" => Ok(ContentFormat::String),
            "openai" => Ok(ContentFormat::OpenAi),
            other => Err(Error::validation(
                format!("unknown chat template content format {other:?} (auto, string, openai)"),
                Some("chat_template_content_format"),
            )),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    variables: HashSet<String>,
    content_format: ContentFormat,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("content_format", &self.content_format)
            .field("variables", &self.variables)
            .finish_non_exhaustive()
    }
}

fn template_error(err: &minijinja::Error) -> Error {
    // `raise_exception` messages are the template's own words: pass them through verbatim.
    if err.kind() == ErrorKind::InvalidOperation {
        if let Some(detail) = err.detail() {
            if let Some(msg) = detail.strip_prefix(RAISE_PREFIX) {
                return Error::Template(msg.to_owned());
            }
        }
    }
    let mut msg = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    Error::Template(msg)
}

const RAISE_PREFIX: &str = "\u{0}raise_exception:";

/// Rewrites `{% generation %}` / `{% endgeneration %}` (transformers' assistant-mask block,
/// a no-op for rendering) into `{% if true %}` / `{% endif %}`, keeping whitespace control.
fn rewrite_generation_blocks(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        let mut i = 2;
        let bytes = tag.as_bytes();
        if i < bytes.len() && (bytes[i] == b'-' || bytes[i] == b'+') {
            i += 1;
        }
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let word_end = tag[i..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(tag.len(), |e| i + e);
        let word = &tag[i..word_end];
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                out.push_str(&tag[..i]);
                out.push_str(r);
                rest = &tag[word_end..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// vLLM's content-format detection: `openai` iff the template iterates over a message's
/// `content` (directly, or through a variable assigned from it).
pub fn detect_content_format(source: &str) -> ContentFormat {
    let tags = block_tags(source);
    let is_content_access = |expr: &str| -> bool {
        let e = expr.trim();
        let ident_end = e
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(e.len());
        if ident_end == 0 {
            return false;
        }
        let tail = e[ident_end..].trim_start();
        tail.starts_with(".content")
            && !tail[".content".len()..]
                .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            || tail.starts_with("['content']")
            || tail.starts_with("[\"content\"]")
    };
    let mut content_vars: Vec<String> = Vec::new();
    for t in &tags {
        if let Some(rest) = t.strip_prefix("set ") {
            if let Some((name, expr)) = rest.split_once('=') {
                let name = name.trim();
                if !name.contains(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    && is_content_access(expr)
                {
                    content_vars.push(name.to_owned());
                }
            }
        }
    }
    for t in &tags {
        if let Some(rest) = t.strip_prefix("for ") {
            if let Some((_, iter)) = rest.split_once(" in ") {
                let iter = iter.trim();
                if is_content_access(iter) {
                    return ContentFormat::OpenAi;
                }
                let ident: String = iter
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let after = iter[ident.len()..].trim_start();
                if content_vars.contains(&ident)
                    && (after.is_empty() || after.starts_with('|') || after.starts_with("if "))
                {
                    return ContentFormat::OpenAi;
                }
            }
        }
    }
    ContentFormat::String
}

/// The inner text of every `{% … %}` tag, whitespace-control markers removed.
fn block_tags(source: &str) -> Vec<String> {
    let mut tags = Vec::new();
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else { break };
        let inner = after[..end]
            .trim_start_matches(['-', '+'])
            .trim_end_matches(['-', '+'])
            .trim();
        tags.push(inner.split_whitespace().collect::<Vec<_>>().join(" "));
        rest = &after[end + 2..];
    }
    tags
}

fn tojson_filter(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let mut opts = json::DumpOptions::default();
    // Positional `indent` as in `x|tojson(2)`.
    let indent_val: Option<Value> = match args.first() {
        Some(v) => Some(v.clone()),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    if let Some(ind) = indent_val {
        if ind.is_none() || ind.is_undefined() {
        } else if let Some(s) = ind.as_str() {
            opts.indent = Some(s.to_owned());
        } else if let Some(n) = ind.as_i64() {
            opts.indent = Some(" ".repeat(usize::try_from(n).unwrap_or(0)));
        }
    }
    if let Some(ea) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        opts.ensure_ascii = ea;
    }
    if let Some(sk) = kwargs.get::<Option<bool>>("sort_keys")? {
        opts.sort_keys = sk;
    }
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")? {
        if !seps.is_none() {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            if let [a, b] = parts.as_slice() {
                opts.separators = Some((
                    a.as_str().unwrap_or(",").to_owned(),
                    b.as_str().unwrap_or(":").to_owned(),
                ));
            }
        }
    }
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(json::dumps(value, &opts)?))
}

impl ChatTemplate {
    /// Compiles `source`. Errors (syntax) become [`Error::Template`].
    pub fn new(source: &str, clock: Arc<dyn Clock>) -> Result<Self> {
        let rewritten = rewrite_generation_blocks(source);
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            out.write_str(&json::py_str(value))
                .map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string()))
        });
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISE_PREFIX}{msg}"),
                ))
            },
        );
        env.add_function(
            "strftime_now",
            move |fmt: String| -> std::result::Result<String, minijinja::Error> {
                use std::fmt::Write as _;
                let now = clock.now();
                let mut s = String::new();
                write!(s, "{}", now.format(&fmt)).map_err(|_| {
                    minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        format!("invalid strftime format {fmt:?}"),
                    )
                })?;
                Ok(s)
            },
        );
        env.add_filter("tojson", tojson_filter);
        // Jinja2: strings are sequences too.
        env.add_test("sequence", |v: &Value| {
            matches!(
                v.kind(),
                minijinja::value::ValueKind::Seq | minijinja::value::ValueKind::String
            )
        });
        // Jinja2: `none is iterable` is false (minijinja iterates none as empty).
        env.add_test("iterable", |v: &Value| {
            !matches!(
                v.kind(),
                minijinja::value::ValueKind::None
                    | minijinja::value::ValueKind::Undefined
                    | minijinja::value::ValueKind::Bool
                    | minijinja::value::ValueKind::Number
            ) && v.try_iter().is_ok()
        });
        env.add_template_owned(TEMPLATE_NAME, rewritten)
            .map_err(|e| template_error(&e))?;
        let tmpl = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&e))?;
        let variables = tmpl.undeclared_variables(false);
        Ok(Self {
            env,
            source: source.to_owned(),
            variables,
            content_format: detect_content_format(source),
        })
    }

    /// The template text as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Top-level variables the template reads (Jinja2's `find_undeclared_variables`).
    pub fn referenced_variables(&self) -> &HashSet<String> {
        &self.variables
    }

    /// Whether the template ever looks `name` up, including `{% if name is defined %}`
    /// tests. Computed once at compile time; a kwarg it does not read cannot change the prompt.
    pub fn reads_variable(&self, name: &str) -> bool {
        self.variables.contains(name)
    }

    /// The auto-detected content format (never `Auto`).
    pub fn detected_content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// Renders with the given context (an object of template variables).
    pub fn render(&self, ctx: &serde_json::Map<String, serde_json::Value>) -> Result<String> {
        self.render_value(&Value::from_serialize(ctx))
    }

    /// Renders with a context already built as template values (a map of variables).
    pub fn render_value(&self, ctx: &Value) -> Result<String> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&e))?;
        tmpl.render(ctx).map_err(|e| template_error(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> Result<String> {
        let clock = Arc::new(FixedClock(
            chrono::NaiveDate::from_ymd_opt(2025, 7, 15)
                .and_then(|d| d.and_hms_opt(10, 30, 0))
                .expect("valid date"),
        ));
        let t = ChatTemplate::new(src, clock)?;
        t.render(ctx.as_object().expect("object"))
    }

    #[test]
    fn python_semantics() {
        let ctx =
            serde_json::json!({"x": {"b": [1, 2.5, "é<"], "a": null, "c": true}, "s": "  Hi  "});
        assert_eq!(
            render("{{ x|tojson }}", ctx.clone()).expect("render"),
            r#"{"b": [1, 2.5, "é<"], "a": null, "c": true}"#
        );
        assert_eq!(
            render("{{ x.b|tojson(indent=2) }}", ctx.clone()).expect("render"),
            "[\n  1,\n  2.5,\n  \"é<\"\n]"
        );
        assert_eq!(
            render("{{ x.b[2]|tojson(ensure_ascii=True) }}", ctx.clone()).expect("render"),
            r#""\u00e9<""#
        );
        assert_eq!(
            render("{{ x.a }} {{ x.c }} {{ x.b }}", ctx.clone()).expect("render"),
            "None True [1, 2.5, 'é<']"
        );
        assert_eq!(
            render("{{ s.strip() }}|{{ s[::-1] }}", ctx.clone()).expect("render"),
            "Hi|  iH  "
        );
        assert_eq!(
            render("{{ strftime_now('%d %b %Y') }}", ctx.clone()).expect("render"),
            "15 Jul 2025"
        );
        assert_eq!(
            render("{{ s is sequence }}", ctx.clone()).expect("render"),
            "True"
        );
        assert_eq!(
            render("{% generation %}a{% endgeneration %}", ctx.clone()).expect("render"),
            "a"
        );
        let err = render("{{ raise_exception('nope!') }}", ctx).expect_err("raises");
        assert_eq!(err.to_string(), "nope!");
    }
}
