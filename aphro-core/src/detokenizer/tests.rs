//! Golden parity (testdata/detok/*.jsonl) and property tests against real
//! tokenizers. Run with `APHRO_ASSETS=/path/to/.assets` (defaults to the
//! repository's `.assets`); a missing asset fails with a hint.

use std::path::PathBuf;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use tokenizers::Tokenizer;

use super::*;

const FAMILIES: &[&str] = &[
    "qwen3",
    "llama3",
    "deepseek_v3",
    "deepseek_r1",
    "deepseek_v3_1",
    "gpt_oss",
    "gemma3",
    "glm4_7_flash",
    "mistral7b_spm",
    "smollm2",
];

fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn assets_dir() -> PathBuf {
    std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".assets"))
}

fn tokenizer_path(family: &str) -> PathBuf {
    if family == "smollm2" {
        // Generated from the GGUF metadata; committed in testdata.
        repo_root().join("testdata/tokenizers/smollm2/tokenizer.json")
    } else {
        assets_dir()
            .join("tokenizers")
            .join(family)
            .join("tokenizer.json")
    }
}

fn load_tokenizer(family: &str) -> Arc<Tokenizer> {
    let path = tokenizer_path(family);
    assert!(
        path.exists(),
        "missing test asset {} — run `scripts/fetch_assets.py` (or set APHRO_ASSETS)",
        path.display()
    );
    match Tokenizer::from_file(&path) {
        Ok(t) => Arc::new(t),
        Err(e) => panic!("cannot load {}: {e}", path.display()),
    }
}

#[derive(Debug, Deserialize)]
struct DetokCase {
    id: String,
    kind: String,
    ids: Vec<u32>,
    prefix_ids: Vec<u32>,
    decode_keep_special: String,
    decode_skip_special: String,
    decode_keep_special_tokenizers_lib: Option<String>,
    decode_skip_special_tokenizers_lib: Option<String>,
    stream_keep_special: Vec<Option<String>>,
    stream_skip_special: Vec<Option<String>>,
}

fn load_cases(family: &str) -> Vec<DetokCase> {
    let path = repo_root()
        .join("testdata/detok")
        .join(format!("{family}.jsonl"));
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => panic!("cannot read {}: {e}", path.display()),
    };
    let cases: Vec<DetokCase> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match serde_json::from_str::<DetokCase>(l) {
            Ok(c) => c,
            Err(e) => panic!("{}: bad golden line: {e}", path.display()),
        })
        .filter(|c| c.kind == "detok")
        .collect();
    assert!(!cases.is_empty(), "no detok cases in {}", path.display());
    cases
}

/// Streams `ids` one by one; when `roundtrip`, the state is serialized to
/// JSON and the detokenizer rebuilt from it before every id.
fn stream(
    tok: &Arc<Tokenizer>,
    prefix: &[u32],
    ids: &[u32],
    skip: bool,
    roundtrip: bool,
) -> (Vec<Option<String>>, String) {
    let opts = DetokenizeOptions::skip_special(skip);
    let mut d = IncrementalDetokenizer::with_prefix(Arc::clone(tok), prefix, opts);
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        if roundtrip {
            let json = serde_json::to_string(d.state()).unwrap_or_default();
            let st: DetokenizerState = match serde_json::from_str(&json) {
                Ok(s) => s,
                Err(e) => panic!("state does not round-trip: {e}: {json}"),
            };
            d = match IncrementalDetokenizer::from_state(Arc::clone(tok), st) {
                Ok(d) => d,
                Err(e) => panic!("{e}"),
            };
        }
        out.push(d.push(id));
    }
    let tail = d.finish();
    (out, tail)
}

#[derive(Default, Debug)]
struct Counts {
    batch_keep: (usize, usize),
    batch_skip: (usize, usize),
    stream_keep: (usize, usize),
    stream_skip: (usize, usize),
}

fn tally(slot: &mut (usize, usize), ok: bool) {
    slot.1 += 1;
    if ok {
        slot.0 += 1;
    }
}

#[test]
fn detok_goldens_all_families() {
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for family in FAMILIES {
        let tok = load_tokenizer(family);
        let mut c = Counts::default();
        for case in load_cases(family) {
            for skip in [false, true] {
                let (golden_stream, golden_decode) = if skip {
                    (
                        &case.stream_skip_special,
                        case.decode_skip_special_tokenizers_lib
                            .as_ref()
                            .unwrap_or(&case.decode_skip_special),
                    )
                } else {
                    (
                        &case.stream_keep_special,
                        case.decode_keep_special_tokenizers_lib
                            .as_ref()
                            .unwrap_or(&case.decode_keep_special),
                    )
                };
                let mode = if skip { "skip" } else { "keep" };

                // Streaming, per step, with and without a state round trip.
                let (got, tail) = stream(&tok, &case.prefix_ids, &case.ids, skip, false);
                let (got_rt, tail_rt) = stream(&tok, &case.prefix_ids, &case.ids, skip, true);
                let stream_ok = &got == golden_stream && got_rt == got && tail_rt == tail;
                if !stream_ok {
                    failures.push(format!(
                        "{} stream/{mode}: got {got:?} (roundtrip {got_rt:?}), want {golden_stream:?}",
                        case.id
                    ));
                }

                // Batch: the deltas plus finish() reproduce the decode. With
                // priming, the reference is decode(prefix+ids) minus
                // decode(prefix) (the golden decode has no priming).
                let joined: String =
                    got.iter().flatten().map(String::as_str).collect::<String>() + &tail;
                let want = if case.prefix_ids.is_empty() {
                    golden_decode.clone()
                } else {
                    let all: Vec<u32> = case.prefix_ids.iter().chain(&case.ids).copied().collect();
                    let full = decode(&tok, &all, skip);
                    let pre = decode(&tok, &case.prefix_ids, skip);
                    full.strip_prefix(pre.as_str()).unwrap_or(&full).to_owned()
                };
                // The plain decode helper must equal the golden decode too.
                let batch_ok = joined == want && &decode(&tok, &case.ids, skip) == golden_decode;
                if !batch_ok {
                    failures.push(format!(
                        "{} batch/{mode}: joined {joined:?}, want {want:?}; decode {:?}, golden {golden_decode:?}",
                        case.id,
                        decode(&tok, &case.ids, skip)
                    ));
                }
                if skip {
                    tally(&mut c.stream_skip, stream_ok);
                    tally(&mut c.batch_skip, batch_ok);
                } else {
                    tally(&mut c.stream_keep, stream_ok);
                    tally(&mut c.batch_keep, batch_ok);
                }
            }
        }
        report.push(format!(
            "{family:14} batch keep {}/{} skip {}/{} | stream keep {}/{} skip {}/{}",
            c.batch_keep.0,
            c.batch_keep.1,
            c.batch_skip.0,
            c.batch_skip.1,
            c.stream_keep.0,
            c.stream_keep.1,
            c.stream_skip.0,
            c.stream_skip.1
        ));
    }
    println!("detok golden parity:\n{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Random id sequences from the real vocabularies, and ids of random
/// multi-script text: streaming + finish() equals the batch decode whenever
/// the batch decode is clean.
#[test]
fn random_sequences_stream_equals_batch() {
    let alphabet: Vec<char> = "aZ09 \n\t.,;:!?()[]{}<>\"'-_/\\éèçñßøåäöü€£¥—–…“”‘’\
        你好世界中文字符日本語のテキスト한국어텍스트Ελληνικάкириллица\
        עבריתالعربيةहिन्दी🦀🚀👩‍👧👍🏽🇫🇷𝔘𝔫𝔦ꙮ🫠\u{200d}\u{fe0f}"
        .chars()
        .collect();
    let mut rng = StdRng::seed_from_u64(0x5eed_d37a);
    let mut checked = Vec::new();
    for family in FAMILIES {
        let tok = load_tokenizer(family);
        let vocab = tok.get_vocab_size(true);
        let Ok(vocab) = u32::try_from(vocab) else {
            panic!("vocab size overflows u32");
        };
        let mut n_clean = 0;
        for round in 0..60 {
            let ids: Vec<u32> = if round % 2 == 0 {
                let len = rng.random_range(1..80);
                (0..len).map(|_| rng.random_range(0..vocab)).collect()
            } else {
                let len = rng.random_range(1..60);
                let text: String = (0..len)
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect();
                match tok.encode(text.as_str(), false) {
                    Ok(enc) => enc.get_ids().to_vec(),
                    Err(e) => panic!("{family}: encode failed: {e}"),
                }
            };
            for skip in [false, true] {
                let batch = decode(&tok, &ids, skip);
                if batch.contains(REPLACEMENT) {
                    continue;
                }
                n_clean += 1;
                let mut d = IncrementalDetokenizer::new(
                    Arc::clone(&tok),
                    DetokenizeOptions::skip_special(skip),
                );
                let mut got = String::new();
                for &id in &ids {
                    if let Some(s) = d.push(id) {
                        assert!(
                            !s.contains(REPLACEMENT),
                            "{family}: emitted U+FFFD for {ids:?}"
                        );
                        got.push_str(&s);
                    }
                }
                got.push_str(&d.finish());
                assert_eq!(got, batch, "{family} skip={skip} ids={ids:?}");
                // Window stays bounded.
                assert!(
                    d.state().ids.len() <= 2 * MAX_PENDING_IDS,
                    "{family}: window grew"
                );
            }
        }
        assert!(
            n_clean > 20,
            "{family}: too few clean sequences ({n_clean})"
        );
        checked.push(format!("{family}:{n_clean}"));
    }
    println!("random clean sequences checked: {}", checked.join(" "));
}

/// A long run of ids that never completes (skipped specials) keeps the window
/// bounded instead of re-decoding an ever-growing tail.
#[test]
fn window_stays_bounded_on_long_silent_runs() {
    let tok = load_tokenizer("qwen3");
    let Some(im_end) = tok.token_to_id("<|im_end|>") else {
        panic!("qwen3 has no <|im_end|>");
    };
    let mut d =
        IncrementalDetokenizer::new(Arc::clone(&tok), DetokenizeOptions::skip_special(true));
    let mut out = d.push_many(
        &tok.encode("Hello", false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default(),
    );
    for _ in 0..1000 {
        assert_eq!(d.push(im_end), None);
        assert!(d.state().ids.len() <= 2 * MAX_PENDING_IDS);
    }
    out += &d.push_many(
        &tok.encode(" world", false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default(),
    );
    out += &d.finish();
    assert_eq!(out, "Hello world");
}

#[test]
fn spaces_between_special_tokens_false_emits_raw_added_tokens() {
    let tok = load_tokenizer("mistral7b_spm");
    let ids: Vec<u32> = [1u32, 2, 1].to_vec(); // <s></s><s>
    let opts = DetokenizeOptions {
        skip_special_tokens: false,
        spaces_between_special_tokens: false,
    };
    let mut d = IncrementalDetokenizer::new(Arc::clone(&tok), opts);
    let got: Vec<_> = ids.iter().map(|&id| d.push(id)).collect();
    assert_eq!(
        got,
        vec![Some("<s>".into()), Some("</s>".into()), Some("<s>".into())]
    );
    assert!(d.state().last_special);
}

#[test]
fn seeded_keeps_leading_space_of_first_token() {
    let tok = load_tokenizer("mistral7b_spm");
    let prompt = tok
        .encode("Say hi:", true)
        .map(|e| e.get_ids().to_vec())
        .unwrap_or_default();
    let Some(hello) = tok.token_to_id("\u{2581}Hello") else {
        panic!("no ▁Hello");
    };
    let mut unprimed = IncrementalDetokenizer::new(&*tok, DetokenizeOptions::default());
    assert_eq!(unprimed.push(hello).as_deref(), Some("Hello"));
    let mut primed = IncrementalDetokenizer::seeded(&*tok, &prompt, DetokenizeOptions::default());
    assert_eq!(primed.push(hello).as_deref(), Some(" Hello"));
}

#[test]
fn bad_state_is_rejected() {
    let tok = load_tokenizer("qwen3");
    let st = DetokenizerState {
        ids: vec![1, 2],
        read_offset: 3,
        ..Default::default()
    };
    assert!(matches!(
        IncrementalDetokenizer::from_state(&*tok, st),
        Err(DetokenizerStateError::ReadOffsetOutOfRange { .. })
    ));
    let st = DetokenizerState {
        ids: vec![0; MAX_WINDOW_IDS + 1],
        read_offset: 0,
        ..Default::default()
    };
    assert!(IncrementalDetokenizer::from_state(&*tok, st).is_err());
    let json = r#"{"ids":[9707,11],"read_offset":1,"skip_special_tokens":true}"#;
    let st: DetokenizerState = match serde_json::from_str(json) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    assert!(st.spaces_between_special_tokens);
    let mut d = match IncrementalDetokenizer::from_state(&*tok, st) {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    // "Hello" already read; "," pending; " world" completes both.
    assert_eq!(d.push(1879).as_deref(), Some(", world"));
}

#[test]
fn byte_level_alphabet_inverse_is_a_bijection() {
    // Rebuild GPT-2 bytes_to_unicode and check the inverse on all 256 bytes.
    let mut printable: Vec<u32> = (0x21..=0x7E)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut n = 0;
    let mut map = Vec::new();
    for b in 0u32..256 {
        if printable.contains(&b) {
            map.push((b, b));
        } else {
            map.push((b, 256 + n));
            n += 1;
        }
    }
    printable.clear();
    for (b, c) in map {
        let Some(ch) = char::from_u32(c) else {
            panic!("bad char")
        };
        assert_eq!(byte_level_char_to_byte(ch).map(u32::from), Some(b));
    }
    assert_eq!(byte_level_char_to_byte('\u{144}'), None);
}

#[test]
fn token_bytes_per_family() {
    // ByteLevel: "ĠðŁ" = b" \xF0\x9F"; SentencePiece: "<0xF0>" and "▁Hello".
    let qwen = load_tokenizer("qwen3");
    assert_eq!(token_byte_encoding(&qwen), TokenByteEncoding::ByteLevel);
    assert_eq!(token_bytes(&qwen, 11162), Some(vec![b' ', 0xF0, 0x9F]));
    assert_eq!(token_bytes(&qwen, 151645), Some(b"<|im_end|>".to_vec()));
    assert_eq!(
        token_string(&qwen, 11162).as_deref(),
        Some("\u{120}\u{f0}\u{141}")
    );

    let mistral = load_tokenizer("mistral7b_spm");
    assert_eq!(
        token_byte_encoding(&mistral),
        TokenByteEncoding::SentencePiece
    );
    assert_eq!(token_bytes(&mistral, 243), Some(vec![0xF0]));
    assert_eq!(token_bytes(&mistral, 22557), Some(b" Hello".to_vec()));
    assert_eq!(token_bytes(&mistral, 2), Some(b"</s>".to_vec()));
    assert_eq!(token_bytes(&mistral, u32::MAX), None);

    let gemma = load_tokenizer("gemma3");
    assert_eq!(
        token_byte_encoding(&gemma),
        TokenByteEncoding::SentencePiece
    );

    // For every family, the bytes of a clean sequence's tokens concatenate to
    // the UTF-8 of its decode (no specials, no SentencePiece start strip).
    for family in FAMILIES {
        let tok = load_tokenizer(family);
        let enc = token_byte_encoding(&tok);
        let text = "x naïve café — 你好，世界 🦀🚀 𝔘𝔫 ꙮ\n\tend";
        let ids = match tok.encode(text, false) {
            Ok(e) => e.get_ids().to_vec(),
            Err(e) => panic!("{e}"),
        };
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| token_bytes_with(&tok, enc, id).unwrap_or_default())
            .collect();
        let decoded = decode(&tok, &ids, false);
        let got = String::from_utf8_lossy(&bytes);
        // Metaspace/Prepend tokenizers add a leading "▁" the decoder strips.
        assert!(
            got == decoded || got.strip_prefix(' ') == Some(decoded.as_str()),
            "{family}: bytes {got:?} vs decode {decoded:?}"
        );
    }
}

/// The wire form of the state is part of the API (client-carried streaming
/// state); keep it as documented on `DetokenizerState`.
#[test]
fn state_json_form_is_stable() {
    let tok = load_tokenizer("qwen3");
    let mut d = IncrementalDetokenizer::with_prefix(&*tok, &[9707], DetokenizeOptions::default());
    // "ĠðŁ" then "¦": incomplete, held back.
    assert_eq!(d.push(11162), None);
    assert_eq!(d.push(99), None);
    let json = serde_json::to_string(d.state()).unwrap_or_default();
    assert_eq!(
        json,
        r#"{"ids":[9707,11162,99],"read_offset":1,"skip_special_tokens":true,"spaces_between_special_tokens":true,"last_special":false}"#
    );
    let st: DetokenizerState = serde_json::from_str(&json).unwrap_or_default();
    let mut d2 = match IncrementalDetokenizer::from_state(&*tok, st) {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(d2.push(222).as_deref(), Some(" 🦀"));
}
