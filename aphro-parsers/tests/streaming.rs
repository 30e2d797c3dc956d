//! Streaming equals one-shot: every corpus case cut into deltas (every single cut point,
//! char-by-char, and random multi-cuts via proptest, including cuts inside markers and next to
//! multi-byte characters) aggregates to exactly the one-shot result.
mod common;
use common::{load_corpus, streamed, Case};
use proptest::prelude::*;
use std::sync::OnceLock;

fn corpus() -> &'static Vec<Case> {
    static C: OnceLock<Vec<Case>> = OnceLock::new();
    C.get_or_init(load_corpus)
}

/// Ids are random where the format does not define them; compare everything else.
fn strip_ids(mut m: aphro_parsers::ParsedMessage, keep: bool) -> aphro_parsers::ParsedMessage {
    if !keep {
        for c in &mut m.tool_calls {
            c.id.clear();
        }
    }
    m
}

fn deterministic_ids(case: &Case) -> bool {
    case.parser == "kimi_k2" && case.kind() == "tool"
}

fn assert_same(case: &Case, cuts: &[usize]) -> Result<(), String> {
    let keep = deterministic_ids(case);
    let one = strip_ids(case.one_shot(), keep);
    let st = strip_ids(streamed(case, cuts), keep);
    if one == st {
        Ok(())
    } else {
        Err(format!(
            "{} cut at {cuts:?}:\n one-shot {one:?}\n streamed {st:?}",
            case.id
        ))
    }
}

#[test]
fn every_single_cut_point() {
    let mut fails = Vec::new();
    for case in corpus() {
        let text = case.model_output();
        for c in (0..=text.len()).filter(|c| text.is_char_boundary(*c)) {
            if let Err(e) = assert_same(case, &[c]) {
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

#[test]
fn char_by_char() {
    let mut fails = Vec::new();
    for case in corpus() {
        let text = case.model_output();
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|c| text.is_char_boundary(*c))
            .collect();
        if let Err(e) = assert_same(case, &cuts) {
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
fn empty_deltas_change_nothing() {
    for case in corpus() {
        let text = case.model_output();
        let mid = (0..=text.len() / 2)
            .rev()
            .find(|c| text.is_char_boundary(*c))
            .unwrap_or(0);
        assert_same(case, &[0, 0, mid, mid, text.len()]).unwrap_or_else(|e| panic!("{e}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn random_cuts_match_one_shot(idx in 0usize..10_000, cuts in proptest::collection::vec(0usize..4096, 0..24)) {
        let cs = corpus();
        let case = &cs[idx % cs.len()];
        if let Err(e) = assert_same(case, &cuts) {
            prop_assert!(false, "{}", e);
        }
    }
}
