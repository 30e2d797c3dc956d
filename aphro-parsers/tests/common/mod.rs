//! Corpus loading shared by the corpus and streaming tests.
#![allow(dead_code)]
use aphro_parsers::{ParsedMessage, ParserConfig, ParserRegistry, StreamParser};
use serde_json::Value;

pub const CORPUS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/parsers");

pub struct Case {
    pub id: String,
    pub parser: String,
    pub raw: Value,
}

impl Case {
    pub fn kind(&self) -> &str {
        self.raw["kind"].as_str().unwrap_or("tool")
    }
    pub fn model_output(&self) -> &str {
        self.raw["model_output"].as_str().unwrap_or("")
    }
    pub fn names(&self) -> (Option<String>, Option<String>) {
        if self.kind() == "reasoning" {
            (None, Some(self.parser.clone()))
        } else {
            (
                Some(self.parser.clone()),
                self.raw
                    .get("reasoning_parser")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            )
        }
    }
    pub fn ctx(&self) -> ParserConfig {
        ParserConfig::from_request_json(&self.raw).expect("corpus request fields are valid")
    }
    pub fn parser(&self) -> Box<dyn StreamParser> {
        let (t, r) = self.names();
        ParserRegistry::new()
            .new_parser(t.as_deref(), r.as_deref(), &self.ctx())
            .expect("registered parser")
    }
    pub fn one_shot(&self) -> ParsedMessage {
        aphro_parsers::parse(self.parser().as_mut(), self.model_output())
    }
}

pub fn load_corpus() -> Vec<Case> {
    let mut files: Vec<_> = std::fs::read_dir(CORPUS_DIR)
        .expect("testdata/parsers exists")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("readable corpus file");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let raw: Value = serde_json::from_str(line).expect("corpus line is JSON");
            out.push(Case {
                id: raw["id"].as_str().unwrap_or_default().to_string(),
                parser: raw["parser"].as_str().unwrap_or_default().to_string(),
                raw,
            });
        }
    }
    assert!(out.len() > 300, "corpus too small: {}", out.len());
    out
}

/// Streams `text` cut at the given byte offsets (snapped to char boundaries) and aggregates.
pub fn streamed(case: &Case, cuts: &[usize]) -> ParsedMessage {
    let text = case.model_output();
    let mut p = case.parser();
    let mut agg = aphro_parsers::Aggregator::new();
    let mut prev = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
    cuts.sort_unstable();
    for mut c in cuts {
        while !text.is_char_boundary(c) {
            c += 1;
        }
        if c < prev {
            continue;
        }
        agg.add(&p.push(&text[prev..c]));
        prev = c;
    }
    agg.add(&p.push(&text[prev..]));
    agg.add(&p.finish());
    agg.into_message()
}
