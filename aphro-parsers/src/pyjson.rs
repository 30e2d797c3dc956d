//! Python-compatible JSON: `json.dumps(obj, ensure_ascii=False)` output (`", "` and `": "`
//! separators, non-ASCII kept, Python float repr), `raw_decode`, and schema-driven conversion of
//! string parameter values as the XML-style parsers do it.
use serde_json::{Number, Value};

/// `json.dumps(v, ensure_ascii=False)`.
pub fn dumps(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v);
    out
}

fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_str(out, s),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, x);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, k);
                out.push_str(": ");
                write_value(out, x);
            }
            out.push('}');
        }
    }
}

fn write_str(out: &mut String, s: &str) {
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
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_number(out: &mut String, n: &Number) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        out.push_str(&json_float(f));
    } else {
        out.push_str(&n.to_string());
    }
}

/// Python's `repr(float)` (also what an f-string prints): shortest round-trip digits, a
/// `.0` on integral values, exponent form below 1e-4 and from 1e16 with a sign and at least
/// two digits (`1e-05`, `1e+16`), and `nan`, `inf`, `-inf`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    finite_repr(f)
}

/// `json.dumps(float)`: [`float_repr`], but `NaN`, `Infinity` and `-Infinity` for the
/// values JSON has no literal for (Python's `allow_nan` spellings).
pub fn json_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    finite_repr(f)
}

fn finite_repr(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let sci = format!("{f:e}"); // shortest round-trip digits, e.g. "1.5e-5"
    let (mant, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    }
}

/// `json.loads(s)`: one JSON value with optional surrounding whitespace.
pub fn loads(s: &str) -> Option<Value> {
    serde_json::from_str(s).ok()
}

/// `json.JSONDecoder().raw_decode(s)`: the value at the very start of `s` (no leading
/// whitespace allowed, as in Python) and the byte index just after it.
pub fn raw_decode(s: &str) -> Option<(Value, usize)> {
    if s.starts_with(|c: char| c.is_whitespace()) {
        return None;
    }
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    match it.next() {
        Some(Ok(v)) => Some((v, it.byte_offset())),
        _ => None,
    }
}

/// Like [`raw_decode`] but skipping leading whitespace first; returns the end index in `s`.
pub fn decode_prefix(s: &str) -> Option<(Value, usize)> {
    let skip = s.len() - s.trim_start().len();
    raw_decode(&s[skip..]).map(|(v, e)| (v, e + skip))
}

/// Byte length of the balanced JSON object/array starting at `s[0]` (`{` or `[`), honouring
/// strings and escapes; `None` if it is not closed before the end of `s`.
pub fn balanced_len(s: &str) -> Option<usize> {
    Balance::default().feed(s.as_bytes())
}

/// Incremental form of [`balanced_len`]: feed the bytes of a growing text piece by piece; the
/// first call that sees the closing bracket returns its end offset (counted from the first byte
/// ever fed). The streaming tool stages use it so a long object is scanned once, not per delta.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Balance {
    depth: usize,
    in_str: bool,
    esc: bool,
    fed: usize,
}

impl Balance {
    /// Feeds `b` (the bytes following those fed before). `Some(end)` once the bracket opened by
    /// the first byte closes; feeding after that is not meaningful.
    pub fn feed(&mut self, b: &[u8]) -> Option<usize> {
        for (i, &c) in b.iter().enumerate() {
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if c == b'\\' {
                    self.esc = true;
                } else if c == b'"' {
                    self.in_str = false;
                }
                continue;
            }
            match c {
                b'"' => self.in_str = true,
                // Saturating: a restored snapshot may carry any depth.
                b'{' | b'[' => self.depth = self.depth.saturating_add(1),
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        let end = self.fed.saturating_add(i + 1);
                        self.fed = end;
                        return Some(end);
                    }
                }
                _ => {}
            }
        }
        self.fed = self.fed.saturating_add(b.len());
        None
    }

    /// Bytes fed so far.
    pub fn fed(&self) -> usize {
        self.fed
    }
}

/// Arguments as vLLM's JSON-based parsers return them: `json.dumps(arguments)`.
pub fn dumps_arguments(v: &Value) -> String {
    dumps(v)
}

/// The JSON types a parameter schema allows (`type`, `type: [..]`, `anyOf`/`oneOf`), lowercased.
pub fn schema_types(schema: Option<&Value>) -> Vec<String> {
    let mut out = Vec::new();
    fn collect(s: &Value, out: &mut Vec<String>) {
        match s.get("type") {
            Some(Value::String(t)) => out.push(t.to_lowercase()),
            Some(Value::Array(a)) => {
                out.extend(a.iter().filter_map(Value::as_str).map(str::to_lowercase))
            }
            _ => {}
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(a)) = s.get(key) {
                for x in a {
                    collect(x, out);
                }
            }
        }
    }
    if let Some(s) = schema {
        collect(s, &mut out);
    }
    out
}

/// Qwen3-Coder style conversion of a raw parameter string using its schema: `null` → null;
/// integer/number/boolean/object/array parsed when the text fits, else the text stays a string.
pub fn convert_qwen_param(raw: &str, schema: Option<&Value>) -> Value {
    if raw.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let types = schema_types(schema);
    if types.is_empty() {
        return Value::String(raw.to_string());
    }
    for t in types.iter().filter(|t| t.as_str() != "null") {
        match t.as_str() {
            "string" | "str" | "text" | "varchar" | "char" | "enum" => {
                return Value::String(raw.to_string())
            }
            t if t.starts_with("int") || t.starts_with("uint") || t == "long" || t == "short" => {
                if let Ok(i) = raw.trim().parse::<i64>() {
                    return Value::from(i);
                }
            }
            t if t.starts_with("num") || t.starts_with("float") || t == "double" => {
                if let Ok(f) = raw.trim().parse::<f64>() {
                    if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 {
                        // vLLM: `float(v) if float(v) - int(float(v)) != 0 else int(float(v))`
                        return Value::from(f as i64);
                    }
                    if let Some(n) = Number::from_f64(f) {
                        return Value::Number(n);
                    }
                }
            }
            "boolean" | "bool" | "binary" => {
                let l = raw.trim().to_lowercase();
                if l == "true" || l == "false" {
                    return Value::Bool(l == "true");
                }
            }
            "object" | "array" | "dict" | "list" => {
                if let Some(v) = loads(raw) {
                    return v;
                }
            }
            _ => {}
        }
    }
    Value::String(raw.to_string())
}

/// GLM-4.5 / MiniMax-M2 style conversion: the value is a string unless the schema gives a
/// non-string type, in which case it is JSON-decoded (falling back to the string).
pub fn convert_json_param(raw: &str, schema: Option<&Value>) -> Value {
    let types = schema_types(schema);
    if types.is_empty() || types.iter().any(|t| t == "string") {
        return Value::String(raw.to_string());
    }
    loads(raw).unwrap_or_else(|| Value::String(raw.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Expected strings are CPython 3's `repr(v)` / `json.dumps(v)`.
    #[test]
    fn float_forms_match_cpython() {
        for (v, repr) in [
            (1e-05, "1e-05"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (2.0, "2.0"),
            (-0.0, "-0.0"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (9999999999999998.0, "9999999999999998.0"),
            (1.0 / 3.0, "0.3333333333333333"),
            (5e-324, "5e-324"),
        ] {
            assert_eq!(float_repr(v), repr, "{v:?}");
            assert_eq!(json_float(v), repr, "{v:?}");
        }
        assert_eq!(float_repr(f64::NAN), "nan");
        assert_eq!(float_repr(f64::NEG_INFINITY), "-inf");
        assert_eq!(json_float(f64::NAN), "NaN");
        assert_eq!(json_float(f64::INFINITY), "Infinity");
    }

    #[test]
    fn python_spacing() {
        let v = json!({"a": [1, 2.5, "é\n"], "b": {}, "c": null, "d": 1e20, "e": 1.0e-7});
        assert_eq!(
            dumps(&v),
            "{\"a\": [1, 2.5, \"é\\n\"], \"b\": {}, \"c\": null, \"d\": 1e+20, \"e\": 1e-07}"
        );
        assert_eq!(json_float(100000.0), "100000.0");
        assert_eq!(json_float(0.0001), "0.0001");
    }

    #[test]
    fn raw_decode_offsets() {
        assert_eq!(raw_decode("{\"a\": 1} tail").map(|x| x.1), Some(8));
        assert!(raw_decode(" {}").is_none());
        assert_eq!(balanced_len("{\"a\": \"}\"} x"), Some(10));
        assert_eq!(balanced_len("{\"a\": "), None);
    }
}
