//! Suspend/resume: streaming with `snapshot()` → JSON → `restore()` between every delta gives
//! exactly the deltas of uninterrupted streaming (hence the one-shot result), for every corpus
//! case and every way of cutting it; snapshots of ordinary answers stay small; forged snapshots
//! are errors, never panics.
mod common;
use aphro_parsers::{
    Aggregator, DeltaMessage, ParsedMessage, ParserConfig, ParserRegistry, ParserSnapshot,
    StreamParser,
};
use common::{load_corpus, Case};
use proptest::prelude::*;
use serde_json::Value;
use std::sync::OnceLock;

fn corpus() -> &'static Vec<Case> {
    static C: OnceLock<Vec<Case>> = OnceLock::new();
    C.get_or_init(load_corpus)
}

/// The text cut at `cuts` (snapped to char boundaries, sorted), as pieces.
fn pieces<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut prev = 0;
    for mut c in cuts {
        while !text.is_char_boundary(c) {
            c += 1;
        }
        if c < prev {
            continue;
        }
        out.push(&text[prev..c]);
        prev = c;
    }
    out.push(&text[prev..]);
    out
}

/// Deltas with generated ids blanked (they are random where the format does not define them).
fn norm(mut d: DeltaMessage, keep_ids: bool) -> DeltaMessage {
    if !keep_ids {
        for c in &mut d.tool_calls {
            if c.id.is_some() {
                c.id = Some(String::new());
            }
        }
    }
    d
}

fn through_json(s: &ParserSnapshot) -> ParserSnapshot {
    let text = serde_json::to_string(s).expect("snapshot serializes");
    serde_json::from_str(&text).expect("snapshot deserializes")
}

fn restore(case: &Case, s: ParserSnapshot) -> Box<dyn StreamParser> {
    let (t, r) = case.names();
    ParserRegistry::new()
        .restore(t.as_deref(), r.as_deref(), &case.ctx(), s)
        .unwrap_or_else(|e| panic!("{}: restore failed: {e}", case.id))
}

/// (deltas, message) streaming the pieces; with `resume`, each piece goes to a parser restored
/// from the JSON snapshot of the previous one (and so does `finish`).
fn run(case: &Case, parts: &[&str], resume: bool) -> (Vec<DeltaMessage>, ParsedMessage) {
    let keep = case.parser == "kimi_k2" && case.kind() == "tool";
    let mut p = case.parser();
    let mut deltas = Vec::new();
    let mut agg = Aggregator::new();
    for part in parts {
        if resume {
            let s = p.snapshot().expect("registry parsers can be suspended");
            p = restore(case, through_json(&s));
        }
        let d = p.push(part);
        agg.add(&d);
        deltas.push(norm(d, keep));
    }
    if resume {
        let s = p.snapshot().expect("snapshot");
        p = restore(case, through_json(&s));
    }
    let d = p.finish();
    agg.add(&d);
    deltas.push(norm(d, keep));
    let mut m = agg.into_message();
    if !keep {
        for c in &mut m.tool_calls {
            c.id.clear();
        }
    }
    (deltas, m)
}

fn check(case: &Case, cuts: &[usize]) -> Result<(), String> {
    let text = case.model_output();
    let parts = pieces(text, cuts);
    let (plain, _) = run(case, &parts, false);
    let (resumed, msg) = run(case, &parts, true);
    let (_, one) = run(case, &[text], false);
    if plain != resumed {
        return Err(format!(
            "{} cut at {cuts:?}: deltas differ\n plain   {plain:?}\n resumed {resumed:?}",
            case.id
        ));
    }
    if msg != one {
        return Err(format!(
            "{} cut at {cuts:?}: message differs from one-shot\n one-shot {one:?}\n resumed  {msg:?}",
            case.id
        ));
    }
    Ok(())
}

#[test]
fn resume_at_every_char_equals_uninterrupted_streaming() {
    let mut fails = Vec::new();
    for case in corpus() {
        let text = case.model_output();
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|c| text.is_char_boundary(*c))
            .collect();
        if let Err(e) = check(case, &cuts) {
            fails.push(e);
        }
    }
    assert!(
        fails.is_empty(),
        "{} failures, first: {}",
        fails.len(),
        fails[0]
    );
}

#[test]
fn resume_at_every_single_cut_point() {
    let mut fails = Vec::new();
    for case in corpus() {
        let text = case.model_output();
        for c in (0..=text.len()).filter(|c| text.is_char_boundary(*c)) {
            if let Err(e) = check(case, &[c]) {
                fails.push(e);
            }
        }
    }
    assert!(
        fails.is_empty(),
        "{} failures, first: {}",
        fails.len(),
        fails[0]
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn resume_at_random_cuts(idx in 0usize..10_000, cuts in proptest::collection::vec(0usize..4096, 0..24)) {
        let cs = corpus();
        let case = &cs[idx % cs.len()];
        if let Err(e) = check(case, &cuts) {
            prop_assert!(false, "{}", e);
        }
    }
}

fn ctx(req: Value) -> ParserConfig {
    ParserConfig::from_request_json(&req).expect("valid request fields")
}

/// An ordinary answer (reasoning, then prose, no call) suspended every few bytes: the snapshot
/// holds a bounded amount of text however long the answer grows. (The stripping formats get an
/// answer that does not open with whitespace: theirs is held to the end, since it is stripped if
/// a call follows and kept if none does.)
#[test]
fn snapshot_of_an_ordinary_answer_stays_small() {
    let cfgs: &[(Option<&str>, Option<&str>, &str)] = &[
        (Some("hermes"), Some("qwen3"), "\n\n"),
        (Some("qwen3_coder"), Some("qwen3"), ""),
        (Some("mistral"), None, "\n\n"),
        (Some("kimi_k2"), Some("kimi_k2"), "\n\n"),
        (Some("deepseek_v31"), Some("deepseek_r1"), "\n\n"),
        (Some("glm45"), Some("glm45"), ""),
        (Some("minimax_m2"), Some("minimax_m2"), ""),
        (None, Some("deepseek_r1"), "\n\n"),
        (Some("granite"), None, "\n\n"),
        (Some("llama3_json"), None, "\n\n"),
    ];
    let reg = ParserRegistry::new();
    let c = ctx(serde_json::json!({"tool_choice": "none"}));
    let auto = ctx(serde_json::json!({}));
    for (tool, reasoning, lead) in cfgs {
        let mut text = String::from("Let me think about it. ");
        for i in 0..400 {
            text.push_str(&format!("Step {i}: weigh <b>this</b> and [that]. "));
        }
        text.push_str("</think>");
        text.push_str(lead);
        text.push_str("The answer is 42. ");
        for i in 0..400 {
            text.push_str(&format!("Point {i} < {}; see {{x}} [y].\n", i + 1));
        }
        // llama3_json holds everything under `auto` (a later call drops all prose); it streams
        // with `tool_choice: "none"`.
        let c = if *tool == Some("llama3_json") {
            &c
        } else {
            &auto
        };
        let mut p = reg.new_parser(*tool, *reasoning, c).expect("parser");
        let mut max_json = 0usize;
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let mut n = 24.min(rest.len());
            while !rest.is_char_boundary(n) {
                n += 1;
            }
            let (piece, tail) = rest.split_at(n);
            rest = tail;
            let _ = p.push(piece);
            let s = p.snapshot().expect("snapshot");
            let json = serde_json::to_string(&s).expect("json");
            max_json = max_json.max(json.len());
            assert!(
                s.held_bytes() <= 64,
                "{tool:?}/{reasoning:?} holds {} bytes",
                s.held_bytes()
            );
            p = reg
                .restore(*tool, *reasoning, c, through_json(&s))
                .expect("restore");
        }
        assert!(
            max_json < 600,
            "{tool:?}/{reasoning:?}: snapshot JSON reached {max_json} bytes"
        );
    }
}

#[test]
fn foreign_or_malformed_snapshots_are_errors() {
    let reg = ParserRegistry::new();
    let c = ctx(serde_json::json!({}));
    let mut p = reg
        .new_parser(Some("hermes"), Some("qwen3"), &c)
        .expect("parser");
    let _ = p.push("<think>a</think>Hi <tool_call>{\"name\": \"f\"");
    let s = p.snapshot().expect("snapshot");
    // Another tool parser, another reasoning parser, no parser at all.
    for (t, r) in [
        (Some("mistral"), Some("qwen3")),
        (Some("hermes"), Some("granite")),
        (None, Some("qwen3")),
        (Some("kimi_k2"), Some("qwen3")),
    ] {
        assert!(
            reg.restore(t, r, &c, s.clone()).is_err(),
            "{t:?}/{r:?} accepted"
        );
    }
    // Offsets past the held text, and another version.
    let mut v = serde_json::to_value(&s).expect("json");
    v["tool"]["emitted"] = Value::from(1_000_000u64);
    let bad: ParserSnapshot = serde_json::from_value(v).expect("still the right shape");
    assert!(reg.restore(Some("hermes"), Some("qwen3"), &c, bad).is_err());
    let mut v = serde_json::to_value(&s).expect("json");
    v["v"] = Value::from(99u64);
    let bad: ParserSnapshot = serde_json::from_value(v).expect("still the right shape");
    assert!(reg.restore(Some("hermes"), Some("qwen3"), &c, bad).is_err());
}

/// Every number in a snapshot replaced by arbitrary values: restoring is an error or a parser
/// that keeps working — never a panic.
fn tamper(v: &mut Value, vals: &mut impl Iterator<Item = u64>) {
    match v {
        Value::Number(_) => {
            if let Some(x) = vals.next() {
                *v = Value::from(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| tamper(x, vals)),
        Value::Object(o) => o.values_mut().for_each(|x| tamper(x, vals)),
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn tampered_offsets_never_panic(idx in 0usize..10_000, cut in 0usize..4096,
                                    vals in proptest::collection::vec(
                                        prop_oneof![0u64..64, 0u64..4096, Just(u64::MAX)], 0..12)) {
        let cs = corpus();
        let case = &cs[idx % cs.len()];
        let text = case.model_output();
        let mut c = cut % (text.len() + 1);
        while !text.is_char_boundary(c) {
            c += 1;
        }
        let mut p = case.parser();
        let _ = p.push(&text[..c]);
        let mut v = serde_json::to_value(p.snapshot().expect("snapshot")).expect("json");
        if v["v"] == 1 {
            let mut it = vals.into_iter();
            if let Some(o) = v.as_object_mut() {
                for (k, x) in o.iter_mut() {
                    if k != "v" {
                        tamper(x, &mut it);
                    }
                }
            }
        }
        if let Ok(s) = serde_json::from_value::<ParserSnapshot>(v) {
            let (t, r) = case.names();
            if let Ok(mut q) = ParserRegistry::new().restore(t.as_deref(), r.as_deref(), &case.ctx(), s) {
                let _ = q.push(&text[c..]);
                let _ = q.finish();
            }
        }
    }
}
