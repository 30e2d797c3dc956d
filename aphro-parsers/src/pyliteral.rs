//! A small parser for the Python subset pythonic tool calls use: `[f(a=1, b="x"), g()]` with
//! literal keyword values (strings with either quote, numbers, `True`/`False`/`None`, lists,
//! tuples, dicts), converted to JSON values.
use serde_json::{Map, Number, Value};

pub(crate) struct Py<'a> {
    s: &'a str,
    pos: usize,
}

pub(crate) type Call = (String, Map<String, Value>);

impl<'a> Py<'a> {
    pub(crate) fn new(s: &'a str) -> Self {
        Self { s, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    fn ws(&mut self) {
        let r = self.rest();
        self.pos += r.len() - r.trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        self.ws();
        if self.rest().starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    pub(crate) fn at_end(&mut self) -> bool {
        self.ws();
        self.pos >= self.s.len()
    }

    fn ident(&mut self) -> Option<String> {
        self.ws();
        let r = self.rest();
        let n: usize = r
            .char_indices()
            .take_while(|(i, c)| c.is_alphanumeric() || *c == '_' || (*i > 0 && c.is_ascii_digit()))
            .map(|(_, c)| c.len_utf8())
            .sum();
        if n == 0 || r.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        self.pos += n;
        Some(r[..n].to_string())
    }

    /// `[call, call, …]` covering the whole input.
    pub(crate) fn call_list(&mut self) -> Option<Vec<Call>> {
        if !self.eat('[') {
            return None;
        }
        let mut calls = Vec::new();
        if self.eat(']') {
            return self.at_end().then_some(calls);
        }
        loop {
            calls.push(self.call()?);
            if self.eat(',') {
                if self.eat(']') {
                    break;
                }
                continue;
            }
            if self.eat(']') {
                break;
            }
            return None;
        }
        self.at_end().then_some(calls)
    }

    /// `name(k=v, …)`
    pub(crate) fn call(&mut self) -> Option<Call> {
        let name = self.ident()?;
        if !self.eat('(') {
            return None;
        }
        let mut args = Map::new();
        if self.eat(')') {
            return Some((name, args));
        }
        loop {
            let k = self.ident()?;
            if !self.eat('=') {
                return None;
            }
            let v = self.value()?;
            args.insert(k, v);
            if self.eat(',') {
                if self.eat(')') {
                    break;
                }
                continue;
            }
            if self.eat(')') {
                break;
            }
            return None;
        }
        Some((name, args))
    }

    fn seq(&mut self, close: char) -> Option<Vec<Value>> {
        let mut out = Vec::new();
        if self.eat(close) {
            return Some(out);
        }
        loop {
            out.push(self.value()?);
            if self.eat(',') {
                if self.eat(close) {
                    break;
                }
                continue;
            }
            if self.eat(close) {
                break;
            }
            return None;
        }
        Some(out)
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        let r = self.rest();
        let c = r.chars().next()?;
        match c {
            '[' => {
                self.pos += 1;
                self.seq(']').map(Value::Array)
            }
            '(' => {
                self.pos += 1;
                self.seq(')').map(Value::Array)
            }
            '{' => {
                self.pos += 1;
                let mut m = Map::new();
                if self.eat('}') {
                    return Some(Value::Object(m));
                }
                loop {
                    let k = match self.value()? {
                        Value::String(s) => s,
                        other => crate::pyjson::dumps(&other),
                    };
                    if !self.eat(':') {
                        return None;
                    }
                    let v = self.value()?;
                    m.insert(k, v);
                    if self.eat(',') {
                        if self.eat('}') {
                            break;
                        }
                        continue;
                    }
                    if self.eat('}') {
                        break;
                    }
                    return None;
                }
                Some(Value::Object(m))
            }
            '"' | '\'' => self.string(),
            _ if c == '-' || c == '+' || c == '.' || c.is_ascii_digit() => self.number(),
            _ => {
                let id = self.ident()?;
                match id.as_str() {
                    "True" => Some(Value::Bool(true)),
                    "False" => Some(Value::Bool(false)),
                    "None" => Some(Value::Null),
                    _ => None,
                }
            }
        }
    }

    fn number(&mut self) -> Option<Value> {
        let r = self.rest();
        let n = r
            .char_indices()
            .take_while(|(i, c)| {
                c.is_ascii_digit()
                    || matches!(c, '.' | 'e' | 'E' | '_')
                    || ((*i == 0 || matches!(r.as_bytes()[i - 1], b'e' | b'E'))
                        && matches!(c, '-' | '+'))
            })
            .count();
        let t: String = r[..n].chars().filter(|c| *c != '_').collect();
        self.pos += n;
        let t = t.strip_prefix('+').unwrap_or(&t).to_string();
        if !t.contains(['.', 'e', 'E']) {
            if let Ok(i) = t.parse::<i64>() {
                return Some(Value::from(i));
            }
        }
        let f: f64 = t.parse().ok()?;
        Number::from_f64(f).map(Value::Number)
    }

    fn string(&mut self) -> Option<Value> {
        let r = self.rest();
        let q = r.chars().next()?;
        let triple: String = std::iter::repeat_n(q, 3).collect();
        let (delim, mut i) = if r.starts_with(&triple) {
            (triple.as_str(), 3)
        } else {
            (&r[..1], 1)
        };
        let mut out = String::new();
        loop {
            let tail = &r[i..];
            if tail.starts_with(delim) {
                self.pos += i + delim.len();
                return Some(Value::String(out));
            }
            let c = tail.chars().next()?;
            if c == '\\' {
                let e = tail[1..].chars().next()?;
                i += 1 + e.len_utf8();
                match e {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    '0' => out.push('\0'),
                    'b' => out.push('\u{08}'),
                    'f' => out.push('\u{0c}'),
                    '\n' => {}
                    'x' | 'u' | 'U' => {
                        let len = match e {
                            'x' => 2,
                            'u' => 4,
                            _ => 8,
                        };
                        let hex = tail.get(2..2 + len)?;
                        let cp = u32::from_str_radix(hex, 16).ok()?;
                        out.push(char::from_u32(cp)?);
                        i += len;
                    }
                    '\\' | '\'' | '"' => out.push(e),
                    other => {
                        out.push('\\');
                        out.push(other);
                    }
                }
            } else {
                if c == '\n' && delim.len() == 1 {
                    return None;
                }
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls() {
        let c = Py::new("[f(a='x\\'y', b=[1, 2.5, None], c={'k': True}), g()]").call_list();
        let c = c.unwrap_or_default();
        assert_eq!(c.len(), 2);
        assert_eq!(
            crate::pyjson::dumps(&Value::Object(c[0].1.clone())),
            "{\"a\": \"x'y\", \"b\": [1, 2.5, null], \"c\": {\"k\": true}}"
        );
        assert!(Py::new("[f(a=)]").call_list().is_none());
        assert!(Py::new("[f(a='x'").call_list().is_none());
    }
}
