//! Python-compatible text forms of template values: `json.dumps` (transformers' own `tojson`
//! filter) and `str()` (what Jinja2 prints for `{{ value }}`).
use minijinja::value::{Value, ValueKind};
use std::fmt::Write;

/// Options of `json.dumps` that templates pass through `tojson`.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    pub indent: Option<String>,
    pub ensure_ascii: bool,
    pub sort_keys: bool,
    /// `(item_separator, key_separator)`; `None` = Python's defaults for the indent mode.
    pub separators: Option<(String, String)>,
}

/// `json.dumps(value, **opts)`.
pub fn dumps(v: &Value, opts: &DumpOptions) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    let (item_sep, key_sep) = match &opts.separators {
        Some((a, b)) => (a.clone(), b.clone()),
        None if opts.indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    write_json(&mut out, v, opts, &item_sep, &key_sep, 0)?;
    Ok(out)
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn newline_indent(out: &mut String, indent: &str, level: usize) {
    out.push('\n');
    for _ in 0..level {
        out.push_str(indent);
    }
}

fn map_key_string(k: &Value) -> String {
    match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.to_owned(),
        ValueKind::None | ValueKind::Undefined => "null".to_owned(),
        _ => py_str(k),
    }
}

fn write_json(
    out: &mut String,
    v: &Value,
    opts: &DumpOptions,
    item_sep: &str,
    key_sep: &str,
    level: usize,
) -> Result<(), minijinja::Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&py_number(v)),
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Bytes => {
            return Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                "Object of type bytes is not JSON serializable",
            ))
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort_by_key(map_key_string);
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                if let Some(ind) = &opts.indent {
                    newline_indent(out, ind, level + 1);
                }
                write_json_str(out, &map_key_string(k), opts.ensure_ascii);
                out.push_str(key_sep);
                let item = v.get_item(k)?;
                write_json(out, &item, opts, item_sep, key_sep, level + 1)?;
            }
            if let Some(ind) = &opts.indent {
                newline_indent(out, ind, level);
            }
            out.push('}');
        }
        _ => {
            // Sequences and other iterables (tuples, loops) serialize as arrays.
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                if let Some(ind) = &opts.indent {
                    newline_indent(out, ind, level + 1);
                }
                write_json(out, item, opts, item_sep, key_sep, level + 1)?;
            }
            if let Some(ind) = &opts.indent {
                newline_indent(out, ind, level);
            }
            out.push(']');
        }
    }
    Ok(())
}

fn py_number(v: &Value) -> String {
    if v.is_integer() {
        v.to_string()
    } else {
        match f64::try_from(v.clone()) {
            Ok(f) => aphro_parsers::pyjson::json_float(f),
            Err(_) => v.to_string(),
        }
    }
}

/// Python `repr(str)`.
fn py_repr_str(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
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
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn py_repr_into(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::String => py_repr_str(out, v.as_str().unwrap_or_default()),
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = v.try_iter() {
                for (i, k) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr_into(out, &k);
                    out.push_str(": ");
                    py_repr_into(out, &v.get_item(&k).unwrap_or_default());
                }
            }
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(iter) = v.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr_into(out, &item);
                }
            }
            out.push(']');
        }
        _ => out.push_str(&py_str(v)),
    }
}

/// Python `str(value)` of a JSON value (as `json.loads` would give it to Python).
pub fn py_str_json(v: &serde_json::Value) -> String {
    py_str(&Value::from_serialize(v))
}

/// Python `str(value)` as Jinja2 prints it.
pub fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => py_number(v),
        ValueKind::String => v.as_str().unwrap_or_default().to_owned(),
        ValueKind::Map | ValueKind::Seq | ValueKind::Iterable => {
            let mut s = String::new();
            py_repr_into(&mut s, v);
            s
        }
        _ => v.to_string(),
    }
}
