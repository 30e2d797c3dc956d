//! Structured outputs: vLLM's `structured_outputs` constraints (`json`, `json_object`,
//! `regex`, `choice`, `grammar`, `structural_tag`) compiled with llguidance into a per-sequence
//! [`GrammarMatcher`] that gives the allowed-token mask at every decoding step.
//!
//! A constraint becomes the grammar vLLM's `guidance` backend builds
//! (`v1/structured_output/backend_guidance.py:serialize_guidance_grammar`, see
//! `docs/structured-outputs.md`): JSON schemas get `x-guidance` defaults
//! (`whitespace_flexible = !disable_any_whitespace`), `disable_additional_properties` closes
//! every object that lists properties, `json_object` is the schema `{"type": "object"}`,
//! `choice` is a Lark alternation of the literal strings, `grammar` is Lark (llguidance's
//! dialect) or GBNF, converted to Lark here.
//!
//! [`GrammarCompiler`] holds the token trie of one tokenizer and caches compiled grammars by
//! their text, so the same schema sent again costs a clone, not a compile.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::structural_tag;
use crate::tokenizer::Tokenizer;

/// The largest constraint (schema, regex, grammar or choices, as JSON text) a request may
/// carry. Larger ones are refused before anything is compiled: a compile is CPU time on the
/// serving path, and no real schema comes near this.
pub const MAX_CONSTRAINT_BYTES: usize = 256 * 1024;

/// The whitespace a JSON constraint allows between tokens when the request sets no
/// `whitespace_pattern`: flexible as vLLM's default (`whitespace_flexible`), but bounded, so
/// a model cannot spend its whole budget on newlines inside an otherwise valid document.
pub const DEFAULT_JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,32}";

/// Compiled grammars kept per compiler (least recently compiled dropped first).
const CACHE_ENTRIES: usize = 256;

const PARAM: &str = "structured_outputs";

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintKind {
    /// A JSON schema (an object or a boolean).
    Json(Value),
    /// Any JSON object.
    JsonObject,
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark (llguidance dialect) or GBNF grammar.
    Grammar(String),
    /// vLLM's `structural_tag` (a JSON string or object), see [`crate::structural_tag`].
    StructuralTag(Value),
}

/// One request's constraint with vLLM's options.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    pub kind: ConstraintKind,
    pub disable_any_whitespace: bool,
    pub disable_additional_properties: bool,
    pub whitespace_pattern: Option<String>,
}

impl Constraint {
    pub fn new(kind: ConstraintKind) -> Self {
        Self {
            kind,
            disable_any_whitespace: false,
            disable_additional_properties: false,
            whitespace_pattern: None,
        }
    }

    /// Read a wire `structured_outputs` object (already checked to name exactly one kind).
    pub fn from_structured_outputs(v: &Value) -> Result<Self> {
        let obj = v
            .as_object()
            .ok_or_else(|| Error::for_param("structured_outputs must be an object.", PARAM))?;
        let size = v.to_string().len();
        if size > MAX_CONSTRAINT_BYTES {
            return Err(Error::for_param(
                format!(
                    "The structured outputs constraint is {size} bytes; this server accepts at \
                     most {MAX_CONSTRAINT_BYTES}."
                ),
                PARAM,
            ));
        }
        let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
        let string = |k: &str, v: &Value| -> Result<String> {
            v.as_str().map(str::to_owned).ok_or_else(|| {
                Error::for_param(
                    format!("Invalid grammar specification: `{k}` must be a string."),
                    PARAM,
                )
            })
        };
        let kind = if let Some(j) = get("json") {
            let schema = match j {
                Value::String(s) => serde_json::from_str(s).map_err(|e| {
                    Error::for_param(
                        format!("Invalid grammar specification: `json` is not valid JSON: {e}"),
                        PARAM,
                    )
                })?,
                other => other.clone(),
            };
            if !schema.is_object() && !schema.is_boolean() {
                return Err(Error::for_param(
                    "Invalid grammar specification: a JSON schema must be an object or a boolean.",
                    PARAM,
                ));
            }
            ConstraintKind::Json(schema)
        } else if get("json_object").is_some() {
            ConstraintKind::JsonObject
        } else if let Some(r) = get("regex") {
            ConstraintKind::Regex(string("regex", r)?)
        } else if let Some(c) = get("choice") {
            let items = c.as_array().ok_or_else(|| {
                Error::for_param(
                    "Invalid grammar specification: `choice` must be a list of strings.",
                    PARAM,
                )
            })?;
            let choices = items
                .iter()
                .map(|i| string("choice", i))
                .collect::<Result<Vec<_>>>()?;
            if choices.is_empty() {
                return Err(Error::for_param(
                    "Invalid grammar specification: `choice` must name at least one string.",
                    PARAM,
                ));
            }
            ConstraintKind::Choice(choices)
        } else if let Some(g) = get("grammar") {
            ConstraintKind::Grammar(string("grammar", g)?)
        } else if let Some(t) = get("structural_tag") {
            if !t.is_string() && !t.is_object() {
                return Err(Error::for_param(
                    "Invalid structural_tag specification: it must be a JSON string or object.",
                    PARAM,
                ));
            }
            ConstraintKind::StructuralTag(t.clone())
        } else {
            return Err(Error::for_param(
                "You must use one kind of structured outputs constraint but none are specified.",
                PARAM,
            ));
        };
        let flag = |k: &str| get(k).and_then(Value::as_bool).unwrap_or(false);
        Ok(Self {
            kind,
            disable_any_whitespace: flag("disable_any_whitespace"),
            disable_additional_properties: flag("disable_additional_properties"),
            whitespace_pattern: get("whitespace_pattern")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    /// The llguidance grammar this constraint stands for.
    pub fn to_grammar(&self) -> Result<TopLevelGrammar> {
        Ok(match &self.kind {
            ConstraintKind::Json(schema) => TopLevelGrammar::from_json_schema(self.schema(schema)),
            ConstraintKind::JsonObject => {
                TopLevelGrammar::from_json_schema(self.schema(&json!({"type": "object"})))
            }
            ConstraintKind::Regex(rx) => TopLevelGrammar::from_regex(rx),
            ConstraintKind::Choice(choices) => {
                let alts: Vec<String> = choices
                    .iter()
                    .map(|c| Value::from(c.as_str()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            ConstraintKind::Grammar(g) => {
                let first = g.trim_start().chars().next();
                if first.is_none() {
                    return Err(Error::for_param(
                        "Grammar error: the grammar is empty.",
                        PARAM,
                    ));
                }
                if first == Some('{') {
                    TopLevelGrammar::from_lark_or_grammar_list(g).map_err(|e| {
                        Error::for_param(format!("Invalid grammar specification: {e}"), PARAM)
                    })?
                } else if is_gbnf(g) {
                    TopLevelGrammar::from_lark(gbnf_to_lark(g).map_err(|e| {
                        Error::for_param(format!("Invalid grammar specification: {e}"), PARAM)
                    })?)
                } else {
                    TopLevelGrammar::from_lark(g.clone())
                }
            }
            ConstraintKind::StructuralTag(tag) => TopLevelGrammar::from_lark(
                structural_tag::to_lark(tag, &|s| self.schema(s)).map_err(|e| {
                    Error::for_param(format!("Invalid structural_tag specification: {e}"), PARAM)
                })?,
            ),
        })
    }

    /// The schema with vLLM's options folded in (`grammar_from_json_schema(schema,
    /// defaults={"whitespace_flexible": ...})`: a schema's own `x-guidance` wins).
    fn schema(&self, schema: &Value) -> Value {
        let mut schema = schema.clone();
        if self.disable_additional_properties {
            close_objects(&mut schema);
        }
        if let Value::Object(o) = &mut schema {
            if !o.contains_key("x-guidance") {
                let mut opts = Map::new();
                opts.insert(
                    "whitespace_flexible".into(),
                    Value::Bool(!self.disable_any_whitespace),
                );
                if !self.disable_any_whitespace {
                    let p = self
                        .whitespace_pattern
                        .as_deref()
                        .unwrap_or(DEFAULT_JSON_WHITESPACE);
                    opts.insert("whitespace_pattern".into(), Value::String(p.to_owned()));
                }
                o.insert("x-guidance".into(), Value::Object(opts));
            }
        }
        schema
    }

    /// Cache key: the constraint's full text with its options.
    fn cache_key(&self) -> String {
        let kind = match &self.kind {
            ConstraintKind::Json(s) => json!({"json": s}),
            ConstraintKind::JsonObject => json!({"json_object": true}),
            ConstraintKind::Regex(r) => json!({"regex": r}),
            ConstraintKind::Choice(c) => json!({"choice": c}),
            ConstraintKind::Grammar(g) => json!({"grammar": g}),
            ConstraintKind::StructuralTag(t) => json!({"structural_tag": t}),
        };
        json!([
            kind,
            self.disable_any_whitespace,
            self.disable_additional_properties,
            self.whitespace_pattern
        ])
        .to_string()
    }
}

/// `_walk_json_for_additional_properties`: every (sub)schema with `properties` or
/// `patternProperties` and no `additionalProperties` gets `additionalProperties: false`.
fn close_objects(v: &mut Value) {
    const MAPS: [&str; 6] = [
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
        "dependencies",
    ];
    const SUBS: [&str; 16] = [
        "additionalProperties",
        "unevaluatedProperties",
        "propertyNames",
        "contains",
        "additionalItems",
        "unevaluatedItems",
        "not",
        "if",
        "then",
        "else",
        "contentSchema",
        "items",
        "prefixItems",
        "allOf",
        "anyOf",
        "oneOf",
    ];
    match v {
        Value::Object(o) => {
            for k in MAPS {
                if let Some(Value::Object(m)) = o.get_mut(k) {
                    for sub in m.values_mut() {
                        if sub.is_object() {
                            close_objects(sub);
                        }
                    }
                }
            }
            for k in SUBS {
                if let Some(sub) = o.get_mut(k) {
                    if sub.is_object() || sub.is_array() {
                        close_objects(sub);
                    }
                }
            }
            let lists_properties = o.get("properties").is_some_and(Value::is_object)
                || o.get("patternProperties").is_some_and(Value::is_object);
            if lists_properties && !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .filter(|i| i.is_object())
            .for_each(close_objects),
        _ => {}
    }
}

/// A grammar is GBNF when its first rule is written `name ::= ...`.
fn is_gbnf(g: &str) -> bool {
    g.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("//"))
        .is_some_and(|l| l.contains("::="))
}

/// GBNF (llama.cpp's grammar format) → llguidance Lark. Rules become lowercase Lark rules
/// (`root` is `start`), string literals stay literals, character classes and `.` become
/// regexes; grouping, alternation, `* + ?` and `{m,n}` carry over as they are.
pub fn gbnf_to_lark(src: &str) -> std::result::Result<String, String> {
    #[derive(Debug, Clone, PartialEq)]
    enum Tok {
        Name(String),
        Define,
        Lit(String),
        Class(String),
        Any,
        Punct(String),
    }
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    let err_at = |i: usize, m: &str| {
        let line = chars[..i.min(chars.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count()
            + 1;
        format!("GBNF line {line}: {m}")
    };
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == ':' && chars.get(i + 1) == Some(&':') && chars.get(i + 2) == Some(&'=') {
            toks.push(Tok::Define);
            i += 3;
        } else if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '-')
            {
                i += 1;
            }
            toks.push(Tok::Name(chars[start..i].iter().collect()));
        } else if c == '"' {
            i += 1;
            let mut s = String::new();
            loop {
                match chars.get(i) {
                    None => return Err(err_at(i, "unterminated string literal")),
                    Some('"') => {
                        i += 1;
                        break;
                    }
                    Some('\\') => {
                        let (ch, n) =
                            gbnf_escape(&chars, i).ok_or_else(|| err_at(i, "bad escape"))?;
                        s.push(ch);
                        i += n;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            toks.push(Tok::Lit(s));
        } else if c == '[' {
            i += 1;
            let mut s = String::new();
            loop {
                match chars.get(i) {
                    None => return Err(err_at(i, "unterminated character class")),
                    Some(']') if !s.is_empty() && s != "^" => {
                        i += 1;
                        break;
                    }
                    Some('\\') => {
                        let (ch, n) =
                            gbnf_escape(&chars, i).ok_or_else(|| err_at(i, "bad escape"))?;
                        s.push_str(&regex_char(ch));
                        i += n;
                    }
                    Some(&ch) => {
                        match ch {
                            '/' => s.push_str("\\/"),
                            '[' => s.push_str("\\["),
                            _ => s.push(ch),
                        }
                        i += 1;
                    }
                }
            }
            toks.push(Tok::Class(s));
        } else if c == '.' {
            toks.push(Tok::Any);
            i += 1;
        } else if c == '{' {
            let start = i;
            while i < chars.len() && chars[i] != '}' {
                i += 1;
            }
            if i == chars.len() {
                return Err(err_at(start, "unterminated repetition"));
            }
            i += 1;
            let rep: String = chars[start..i]
                .iter()
                .filter(|c| !c.is_whitespace())
                .collect();
            toks.push(Tok::Punct(rep));
        } else if "()|*+?".contains(c) {
            toks.push(Tok::Punct(c.to_string()));
            i += 1;
        } else {
            return Err(err_at(i, &format!("unexpected character {c:?}")));
        }
    }
    // Rule names: lowercase, unique, `root` → `start`.
    let mut names: HashMap<String, String> = HashMap::new();
    let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
    for w in toks.windows(2) {
        if let [Tok::Name(n), Tok::Define] = w {
            if names.contains_key(n) {
                continue;
            }
            let mapped = if n == "root" {
                "start".to_owned()
            } else {
                let base = format!("r_{}", n.to_ascii_lowercase().replace('-', "_"));
                let mut m = base.clone();
                let mut k = 1;
                while taken.contains(&m) {
                    k += 1;
                    m = format!("{base}_{k}");
                }
                m
            };
            taken.insert(mapped.clone());
            names.insert(n.clone(), mapped);
        }
    }
    if !names.contains_key("root") {
        return Err("GBNF grammar has no `root` rule".into());
    }
    let mut out = String::new();
    let mut j = 0;
    while j < toks.len() {
        let is_rule_start = matches!(
            (&toks[j], toks.get(j + 1)),
            (Tok::Name(_), Some(Tok::Define))
        );
        if !is_rule_start {
            return Err(format!("GBNF: expected `name ::=`, found {:?}", toks[j]));
        }
        let Tok::Name(n) = &toks[j] else {
            unreachable!()
        };
        out.push_str(&names[n]);
        out.push(':');
        j += 2;
        let mut empty = true;
        while j < toks.len()
            && !matches!(
                (&toks[j], toks.get(j + 1)),
                (Tok::Name(_), Some(Tok::Define))
            )
        {
            out.push(' ');
            empty = false;
            match &toks[j] {
                Tok::Name(r) => match names.get(r) {
                    Some(m) => out.push_str(m),
                    None => return Err(format!("GBNF: rule `{r}` is used but never defined")),
                },
                Tok::Lit(s) if s.is_empty() => out.push_str("\"\""),
                Tok::Lit(s) => out.push_str(&Value::from(s.as_str()).to_string()),
                Tok::Class(c) => {
                    out.push_str("/[");
                    out.push_str(c);
                    out.push_str("]/");
                }
                Tok::Any => out.push_str("/(?s:.)/"),
                Tok::Punct(p) => out.push_str(p),
                Tok::Define => return Err("GBNF: misplaced `::=`".into()),
            }
            j += 1;
        }
        if empty {
            out.push_str(" \"\"");
        }
        out.push('\n');
    }
    Ok(out)
}

/// One GBNF escape at `chars[i] == '\\'`: the character and how many chars it spans.
fn gbnf_escape(chars: &[char], i: usize) -> Option<(char, usize)> {
    let hex = |n: usize| -> Option<(char, usize)> {
        let s: String = chars.get(i + 2..i + 2 + n)?.iter().collect();
        char::from_u32(u32::from_str_radix(&s, 16).ok()?).map(|c| (c, 2 + n))
    };
    match chars.get(i + 1)? {
        'n' => Some(('\n', 2)),
        'r' => Some(('\r', 2)),
        't' => Some(('\t', 2)),
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        &c => Some((c, 2)),
    }
}

/// A character as it is written inside a regex character class.
fn regex_char(c: char) -> String {
    match c {
        '\\' | ']' | '[' | '^' | '-' | '/' => format!("\\{c}"),
        c if (c as u32) < 0x20 || c == '\u{7f}' => format!("\\x{:02X}", c as u32),
        c => c.to_string(),
    }
}

/// The allowed next tokens of one sequence.
pub struct TokenMask(SimpleVob);

impl TokenMask {
    pub fn is_allowed(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token as TokenId)
    }

    pub fn num_allowed(&self) -> usize {
        self.0.num_set()
    }

    /// Sets every disallowed logit to -inf (vLLM applies the grammar bitmask to the raw
    /// logits before any other processing).
    pub fn apply(&self, logits: &mut [f32]) {
        let words = self.0.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, x) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// One sequence's position in its grammar. Cloning forks the state (for `n > 1`).
pub struct GrammarMatcher {
    matcher: Matcher,
    key: Arc<str>,
}

impl GrammarMatcher {
    /// The tokens allowed next (only EOS once the grammar is complete).
    pub fn compute_mask(&mut self) -> std::result::Result<TokenMask, String> {
        self.matcher
            .compute_mask_or_eos()
            .map(TokenMask)
            .map_err(|e| e.to_string())
    }

    /// Advance by the sampled token.
    pub fn consume(&mut self, token: u32) -> std::result::Result<(), String> {
        self.matcher
            .consume_token(token as TokenId)
            .map_err(|e| e.to_string())
    }

    /// The tokens the grammar forces next (at most `limit`), consumed into the state: the
    /// engine appends them without sampling, so they cost one forward pass together.
    pub fn consume_forced(&mut self, limit: usize) -> std::result::Result<Vec<u32>, String> {
        if limit == 0 || self.matcher.is_stopped() {
            return Ok(Vec::new());
        }
        let mut forced = self.matcher.compute_ff_tokens();
        forced.truncate(limit);
        if !forced.is_empty() {
            self.matcher
                .consume_tokens(&forced)
                .map_err(|e| e.to_string())?;
        }
        Ok(forced)
    }

    /// True once the grammar allows nothing but EOS.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// True when the output so far is a complete match.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

impl Clone for GrammarMatcher {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            key: Arc::clone(&self.key),
        }
    }
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("grammar", &self.key)
            .finish()
    }
}

/// Two matchers are equal when they run the same grammar (their states are not compared).
impl PartialEq for GrammarMatcher {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

/// The token environment of one tokenizer: the trie of every token's bytes, and the
/// tokenizer itself for text llguidance needs tokenized.
struct ByteTokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for ByteTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |s| {
            self.tokenizer.encode(s, false).unwrap_or_default()
        })
    }
}

/// Token bytes as llguidance's trie wants them: byte-level BPE symbols mapped back to
/// bytes, SentencePiece `▁` to a space and `<0xNN>` to its byte, special tokens prefixed
/// with 0xFF so no grammar text can produce them (`toktrie_hf_tokenizers::ByteTokenizer`).
/// Added tokens that are not special (`<tool_call>`, `<think>`, DeepSeek's tool markers) are
/// their text, as xgrammar sees them: a grammar that spells `<tool_call>` lets the model emit
/// the one token it was trained on rather than forcing the text out piece by piece.
fn token_bytes(tok: &Tokenizer, vocab_size: usize) -> Result<Vec<Vec<u8>>> {
    let hf = tok.hf();
    let decoder = hf
        .get_decoder()
        .map(|d| serde_json::to_value(d).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    let mut byte_level = false;
    let mut byte_fallback = false;
    let mut space = '▁';
    fn scan(d: &Value, bl: &mut bool, bf: &mut bool, space: &mut char) {
        match d.get("type").and_then(Value::as_str) {
            Some("ByteLevel") => *bl = true,
            Some("ByteFallback") => *bf = true,
            Some("Replace") if d.get("content").and_then(Value::as_str) == Some(" ") => {
                if let Some(s) = d.pointer("/pattern/String").and_then(Value::as_str) {
                    let mut cs = s.chars();
                    if let (Some(c), None) = (cs.next(), cs.next()) {
                        *space = c;
                    }
                }
            }
            Some("Sequence") => {
                for d in d
                    .get("decoders")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    scan(d, bl, bf, space);
                }
            }
            _ => {}
        }
    }
    scan(&decoder, &mut byte_level, &mut byte_fallback, &mut space);
    if !byte_level && !byte_fallback {
        return Err(Error::bad_request(
            "structured outputs need a byte-level BPE or byte-fallback tokenizer; this model's \
             decoder is neither",
        ));
    }
    let n = tok.vocab_size().max(vocab_size);
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(n);
    let specials: std::collections::HashSet<u32> = hf
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special)
        .map(|(id, _)| id)
        .collect();
    let char_map = byte_level_char_map();
    for id in 0..n as u32 {
        let Some(name) = tok.id_to_token(id) else {
            // Ids past the tokenizer (padding rows of the embedding) are never grammar text.
            let mut b = format!(".<[{id}]>").into_bytes();
            b[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            out.push(b);
            continue;
        };
        let bytes = if specials.contains(&id) {
            let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            b.extend_from_slice(name.as_bytes());
            b
        } else if byte_fallback && name.len() == 6 && name.starts_with("<0x") && name.ends_with('>')
        {
            vec![u8::from_str_radix(&name[3..5], 16).unwrap_or(0)]
        } else if byte_fallback {
            name.replace(space, " ").into_bytes()
        } else {
            match name
                .chars()
                .map(|c| char_map.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
            {
                Some(b) => b,
                // An added (non-special) token written as plain text.
                None => name.into_bytes(),
            }
        };
        out.push(bytes);
    }
    Ok(out)
}

/// GPT-2's byte ↔ unicode table, reversed.
fn byte_level_char_map() -> HashMap<char, u8> {
    let mut m = HashMap::new();
    let mut k = 0x100u32;
    for b in 0..=255u8 {
        let c = b as char;
        let printable = matches!(c, '!'..='~' | '\u{A1}'..='\u{AC}' | '\u{AE}'..='\u{FF}');
        if printable {
            m.insert(c, b);
        } else {
            m.insert(char::from_u32(k).unwrap_or(c), b);
            k += 1;
        }
    }
    m
}

/// Compiles constraints for one tokenizer, with a cache of compiled grammars.
pub struct GrammarCompiler {
    factory: ParserFactory,
    cache: Mutex<(HashMap<String, Matcher>, VecDeque<String>)>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// `vocab_size` is the model's logits width (at least the tokenizer's); `eos_token_ids`
    /// are the ids a complete grammar allows (the model's EOS list).
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        vocab_size: usize,
        eos_token_ids: &[u32],
    ) -> Result<Self> {
        let words = token_bytes(&tokenizer, vocab_size)?;
        let eos = eos_token_ids.first().copied().unwrap_or(0);
        let info = TokRxInfo::new(words.len() as u32, eos);
        let mut trie = TokTrie::from(&info, &words);
        if eos_token_ids.len() > 1 {
            trie = trie.with_eos_tokens(eos_token_ids);
        }
        let env: TokEnv = Arc::new(ByteTokEnv { trie, tokenizer });
        let mut factory = ParserFactory::new(
            &env,
            Default::default(),
            &SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| {
            Error::bad_request(format!("building the structured-outputs token trie: {e}"))
        })?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(Self {
            factory,
            cache: Mutex::new((HashMap::new(), VecDeque::new())),
        })
    }

    /// A fresh matcher for `c`; a constraint that does not compile is a 400 naming
    /// `structured_outputs` with llguidance's reason.
    pub fn compile(&self, c: &Constraint) -> Result<GrammarMatcher> {
        let key = c.cache_key();
        if let Some(m) = self.lock().0.get(&key) {
            return Ok(GrammarMatcher {
                matcher: m.deep_clone(),
                key: key.into(),
            });
        }
        let grammar = c.to_grammar()?;
        let parser = self.factory.create_parser(grammar);
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(Error::for_param(
                format!("Grammar error: {}", first_line(&e)),
                PARAM,
            ));
        }
        let mut cache = self.lock();
        if cache.0.len() >= CACHE_ENTRIES {
            if let Some(old) = cache.1.pop_front() {
                cache.0.remove(&old);
            }
        }
        cache.0.insert(key.clone(), matcher.deep_clone());
        cache.1.push_back(key.clone());
        Ok(GrammarMatcher {
            matcher,
            key: key.into(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<String, Matcher>, VecDeque<String>)> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// llguidance errors can carry the whole grammar after the reason; the reason is enough.
fn first_line(e: &str) -> String {
    let s = e.lines().next().unwrap_or(e).trim();
    const MAX: usize = 500;
    if s.len() > MAX {
        let mut end = MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gbnf_becomes_lark() {
        let lark = gbnf_to_lark(
            "root ::= answer-word (\" \" answer-word)*\n# comment\nanswer-word ::= [a-z]+ | \"n/a\"\n",
        )
        .expect("valid");
        assert_eq!(
            lark,
            "start: r_answer_word ( \" \" r_answer_word ) *\nr_answer_word: /[a-z]/ + | \"n/a\"\n"
        );
        assert!(gbnf_to_lark("x ::= \"a\"")
            .expect_err("refused")
            .contains("root"));
        assert!(gbnf_to_lark("root ::= missing")
            .expect_err("refused")
            .contains("missing"));
        assert!(gbnf_to_lark("root ::= \"a")
            .expect_err("refused")
            .contains("unterminated"));
    }

    fn smollm2_compiler() -> GrammarCompiler {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/tokenizers/smollm2/tokenizer.json");
        let tok = Arc::new(Tokenizer::from_file(&path).expect("tokenizer"));
        GrammarCompiler::new(tok, 49152, &[2]).expect("compiler")
    }

    /// Whether `text` (tokenized by the model's tokenizer) is a complete match of `c`.
    fn accepts(compiler: &GrammarCompiler, c: &Constraint, text: &str) -> bool {
        let mut m = compiler
            .compile(c)
            .unwrap_or_else(|e| panic!("{:?}: {e}", c.kind));
        let ids = compiler.factory.tok_env().tokenize_bytes(text.as_bytes());
        for id in ids {
            let mask = m.compute_mask().expect("mask");
            if !mask.0.is_allowed(id) || m.consume(id).is_err() {
                return false;
            }
        }
        m.is_accepting()
    }

    fn tag(format: Value) -> Constraint {
        Constraint::new(ConstraintKind::StructuralTag(
            json!({"type": "structural_tag", "format": format}),
        ))
    }

    #[test]
    fn structural_tags_match_what_they_describe() {
        let c = smollm2_compiler();
        let any =
            json!({"type": "any_text", "excludes": [], "max_tokens": null, "max_chars": null});
        let obj = |schema: Value| {
            json!({"type": "json_schema", "json_schema": schema, "style": "json",
            "any_order": false, "max_whitespace_cnt": null, "excludes": []})
        };
        // Reasoning, optional, then the answer (what a reasoning parser builds).
        let think = tag(json!({"type": "sequence", "elements": [
            {"type": "optional", "content": {"type": "sequence", "elements": [
                {"type": "tag", "begin": "<think>", "content": any, "end": "</think>"},
                {"type": "const_string", "value": "\n\n"}]}},
            obj(json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}))]}));
        assert!(accepts(
            &c,
            &think,
            "<think>Hmm, {ok} or not?</think>\n\n{\"ok\": true}"
        ));
        assert!(accepts(&c, &think, "{\"ok\": false}"));
        assert!(!accepts(&c, &think, "<think>x</think>{\"ok\": true}"));
        assert!(!accepts(&c, &think, "{\"ok\": 1}"));
        // Inside reasoning already: the block starts without its marker and is mandatory.
        let inside = tag(json!({"type": "sequence", "elements": [
            {"type": "tag", "begin": "", "content": any, "end": "</think>"},
            {"type": "regex", "pattern": "[0-9]+"}]}));
        assert!(accepts(&c, &inside, "let me count</think>42"));
        assert!(!accepts(&c, &inside, "42"));

        // Hermes-style calls: text, then calls; text between; the trigger only opens a call.
        let call = |name: &str| {
            json!({"type": "tag",
            "begin": format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": "),
            "content": obj(json!({"type": "object", "properties": {"city": {"type": "string"}},
                                  "required": ["city"], "additionalProperties": false})),
            "end": "}\n</tool_call>"})
        };
        let auto = tag(
            json!({"type": "triggered_tags", "triggers": ["<tool_call>"],
            "tags": [call("get_weather"), call("get_time")], "at_least_one": false,
            "stop_after_first": false, "excludes": []}),
        );
        let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        assert!(accepts(&c, &auto, "Just text."));
        assert!(accepts(
            &c,
            &auto,
            &format!("Let me check. {one} and {one} done")
        ));
        assert!(!accepts(
            &c,
            &auto,
            "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"
        ));
        assert!(!accepts(
            &c,
            &auto,
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": 1}}\n</tool_call>"
        ));
        let required = tag(
            json!({"type": "tags_with_separator", "tags": [call("get_weather")],
            "separator": "", "at_least_one": true, "stop_after_first": true}),
        );
        assert!(accepts(&c, &required, one));
        assert!(!accepts(&c, &required, "Sure."));
        assert!(!accepts(&c, &required, &format!("{one}{one}")));
        // Llama: at least one call first, excluded strings never in the text around them.
        let llama = tag(
            json!({"type": "triggered_tags", "triggers": ["{\"name\": "],
            "tags": [{"type": "tag", "begin": "{\"name\": \"f\", \"parameters\": ",
                      "content": obj(json!(true)), "end": "}"}],
            "at_least_one": true, "stop_after_first": false, "excludes": ["<think>", "</think>"]}),
        );
        assert!(accepts(
            &c,
            &llama,
            "{\"name\": \"f\", \"parameters\": {\"a\": [1, 2]}}"
        ));
        assert!(accepts(
            &c,
            &llama,
            "{\"name\": \"f\", \"parameters\": 3} then text"
        ));
        assert!(!accepts(
            &c,
            &llama,
            "text first {\"name\": \"f\", \"parameters\": 3}"
        ));
        assert!(!accepts(
            &c,
            &llama,
            "{\"name\": \"f\", \"parameters\": 3} <think>"
        ));
        // Choice as `or`, a Lark grammar inside, repeat, and the legacy shape.
        let or = tag(json!({"type": "sequence", "elements": [
            {"type": "or", "elements": [{"type": "const_string", "value": "yes"}, {"type": "const_string", "value": "no"}]},
            {"type": "repeat", "min": 1, "max": 2, "content": {"type": "const_string", "value": "!"}},
            {"type": "grammar", "grammar": "start: /[a-c]+/"}]}));
        assert!(accepts(&c, &or, "no!!abc"));
        assert!(!accepts(&c, &or, "no!!!abc"));
        let legacy = Constraint::new(ConstraintKind::StructuralTag(
            json!({"type": "structural_tag",
            "triggers": ["<f="], "structures": [{"begin": "<f=a>", "schema": {"type": "integer"}, "end": "</f>"}]}),
        ));
        assert!(accepts(&c, &legacy, "x <f=a>12</f> y"));
        assert!(!accepts(&c, &legacy, "x <f=a>1.5</f>"));
        // Bounded text.
        let short = tag(json!({"type": "any_text", "max_chars": 3}));
        assert!(accepts(&c, &short, "abc"));
        assert!(!accepts(&c, &short, "abcd"));
    }

    #[test]
    fn non_special_added_tokens_are_grammar_text() {
        let dir = std::env::var_os("APHRO_ASSETS")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.assets"));
        let path = dir.join("tokenizers/qwen3/tokenizer.json");
        assert!(
            path.exists(),
            "{} is missing: run scripts/fetch_assets.py",
            path.display()
        );
        let tok = Arc::new(Tokenizer::from_file(&path).expect("tokenizer"));
        let call = tok
            .token_to_id("<tool_call>")
            .expect("Qwen3 has <tool_call>");
        let im_start = tok.token_to_id("<|im_start|>").expect("and <|im_start|>");
        let c = GrammarCompiler::new(tok, 151936, &[151645]).expect("compiler");
        let mut m = c
            .compile(&tag(
                json!({"type": "tags_with_separator", "separator": "", "at_least_one": true,
                "tags": [{"type": "tag", "begin": "<tool_call>", "end": "</tool_call>",
                          "content": {"type": "const_string", "value": "x"}}]}),
            ))
            .expect("compiles");
        let mask = m.compute_mask().expect("mask");
        // The added token itself (not special) can open the call; a special token never can.
        assert!(mask.0.is_allowed(call));
        assert!(!mask.0.is_allowed(im_start));
    }

    #[test]
    fn additional_properties_are_closed_recursively() {
        let mut s = json!({"type": "object", "properties": {"a": {"type": "object", "properties": {}}},
                           "items": [{"properties": {}}], "additionalProperties": true});
        close_objects(&mut s);
        assert_eq!(s["additionalProperties"], true);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert_eq!(s["items"][0]["additionalProperties"], false);
    }

    #[test]
    fn wire_object_is_read_and_refused_clearly() {
        let c = Constraint::from_structured_outputs(
            &json!({"json": "{\"type\": \"string\"}", "disable_any_whitespace": true}),
        )
        .expect("valid");
        assert_eq!(c.kind, ConstraintKind::Json(json!({"type": "string"})));
        assert!(c.disable_any_whitespace);
        let e = Constraint::from_structured_outputs(&json!({"json": "{not json"}))
            .expect_err("refused");
        assert!(e.to_string().contains("not valid JSON"), "{e}");
        let e = Constraint::from_structured_outputs(&json!({"choice": []})).expect_err("refused");
        assert!(e.to_string().contains("at least one"), "{e}");
        let big = "a".repeat(MAX_CONSTRAINT_BYTES);
        let e = Constraint::from_structured_outputs(&json!({"regex": big})).expect_err("refused");
        assert!(e.to_string().contains("this server accepts at most"), "{e}");
        assert_eq!(e.param(), Some("structured_outputs"));
    }
}
