//! Parity of the pooling models with sentence-transformers / transformers: the goldens of
//! `testdata/pooling/` (see its README) on all-MiniLM-L6-v2 (`$APHRO_ASSETS/models/
//! all-MiniLM-L6-v2`, from `scripts/fetch_assets.py`) and on the cross-encoder made of
//! MiniLM's encoder and the seeded head of `testdata/pooling/cross_encoder/`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use aphro_engine::pooling::{
    EmbedInput, EmbedOptions, Embedder, PoolingError, PoolingTask, ScoreOptions, TruncationSide,
};
use burn::backend::flex::{Flex, FlexDevice};
use serde_json::Value;

/// Cosine distance allowed between an embedding and its golden (issue 17).
const EMBED_COSINE_TOL: f64 = 1e-5;
/// Absolute difference allowed per embedding component (the fixture README's suggestion).
const EMBED_ABS_TOL: f32 = 1e-5;
/// Scores, rerank scores, logits.
const SCORE_TOL: f32 = 1e-4;

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/pooling")
        .join(name)
}

fn jsonl(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(testdata(name)).expect("pooling golden file");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("golden line is JSON"))
        .collect()
}

fn minilm_dir() -> PathBuf {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.assets"));
    let dir = assets.join("models/all-MiniLM-L6-v2");
    assert!(
        dir.join("model.safetensors").exists(),
        "{} is missing: run `python3 scripts/fetch_assets.py`",
        dir.display()
    );
    dir
}

fn minilm() -> &'static Embedder {
    static M: OnceLock<Embedder> = OnceLock::new();
    M.get_or_init(|| {
        Embedder::load(&minilm_dir())
            .expect("MiniLM loads")
            .with_served_name("all-MiniLM-L6-v2")
    })
}

/// The cross-encoder of [`cross_encoder_dir`] on the CPU.
fn cross_encoder() -> &'static Embedder {
    static M: OnceLock<Embedder> = OnceLock::new();
    M.get_or_init(|| {
        Embedder::load(cross_encoder_dir())
            .expect("cross-encoder loads")
            .with_served_name("minilm-cross-encoder")
    })
}

/// The cross-encoder folder as `compose_model_dir.py` writes it: MiniLM's tensors renamed
/// `bert.X` (the `position_ids` buffer dropped), the head's tensors, the head's config and
/// MiniLM's tokenizer files, and no sentence-transformers files.
fn cross_encoder_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = minilm_dir();
        let out = tempfile::tempdir().expect("tempdir");
        let base = std::fs::read(src.join("model.safetensors")).expect("read MiniLM");
        let head = std::fs::read(testdata("cross_encoder/head.safetensors")).expect("head");
        let base = safetensors::SafeTensors::deserialize(&base).expect("MiniLM safetensors");
        let head = safetensors::SafeTensors::deserialize(&head).expect("head safetensors");
        let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = base
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != "embeddings.position_ids")
            .map(|(n, t)| (format!("bert.{n}"), t))
            .collect();
        tensors.extend(head.tensors());
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(tensors.len(), 105);
        let bytes = safetensors::serialize(tensors, None).expect("serialize");
        std::fs::write(out.path().join("model.safetensors"), bytes).expect("write");
        std::fs::copy(
            testdata("cross_encoder/config.json"),
            out.path().join("config.json"),
        )
        .expect("copy config");
        for f in [
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.txt",
            "special_tokens_map.json",
        ] {
            std::fs::copy(src.join(f), out.path().join(f)).expect("copy tokenizer file");
        }
        out
    })
    .path()
}

fn input_of(case: &Value) -> EmbedInput {
    match &case["input"] {
        Value::String(s) => EmbedInput::Text(s.clone()),
        Value::Array(ids) => EmbedInput::Tokens(
            ids.iter()
                .map(|i| i.as_u64().expect("token id") as u32)
                .collect(),
        ),
        other => panic!("unexpected input {other}"),
    }
}

fn options_of(request: &Value) -> EmbedOptions {
    EmbedOptions {
        truncate_prompt_tokens: request["truncate_prompt_tokens"].as_i64(),
        truncation_side: match request["truncation_side"].as_str() {
            Some("left") => Some(TruncationSide::Left),
            Some("right") => Some(TruncationSide::Right),
            _ => None,
        },
        ..EmbedOptions::default()
    }
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("float list")
        .iter()
        .map(|x| x.as_f64().expect("float") as f32)
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|s| s.as_str().expect("text").to_string())
            .collect(),
        other => panic!("unexpected text field {other}"),
    }
}

fn cosine_distance(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    1.0 - dot / (na * nb)
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The request a case is checked with: its own, or `truncate_prompt_tokens: -1` where vLLM
/// refuses it (those cases are checked for the refusal separately).
fn effective_options(case: &Value) -> EmbedOptions {
    let mut opts = options_of(&case["request"]);
    if case["vllm"]["status"].as_u64() == Some(400) {
        opts.truncate_prompt_tokens = Some(-1);
    }
    opts
}

/// Every embedding golden, each input alone: token ids equal, vector within 1e-5 cosine
/// distance and 1e-5 per component, the un-normalized mean where recorded.
#[test]
fn embeddings_match_sentence_transformers() {
    let m = minilm();
    let cases = jsonl("embeddings.jsonl");
    assert_eq!(cases.len(), 44);
    let (mut worst_cos, mut worst_abs) = (0f64, 0f32);
    for case in &cases {
        let id = case["id"].as_str().expect("id");
        let out = m
            .embed(&[input_of(case)], &effective_options(case))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let e = &out[0];
        assert_eq!(e.token_ids, ids(&case["token_ids"]), "{id}: token ids");
        assert_eq!(
            e.prompt_tokens as u64,
            case["n_tokens"].as_u64().expect("n")
        );
        let golden = floats(&case["embedding"]);
        let (cos, abs) = (
            cosine_distance(&e.embedding, &golden),
            max_abs(&e.embedding, &golden),
        );
        assert!(cos <= EMBED_COSINE_TOL, "{id}: cosine distance {cos:e}");
        assert!(abs <= EMBED_ABS_TOL, "{id}: max abs diff {abs:e}");
        worst_cos = worst_cos.max(cos);
        worst_abs = worst_abs.max(abs);
        if let Some(mean) = case.get("mean_pooled").filter(|v| !v.is_null()) {
            let mut opts = effective_options(case);
            opts.use_activation = Some(false);
            let raw = &m.embed(&[input_of(case)], &opts).expect("embeds")[0].embedding;
            let abs = max_abs(raw, &floats(mean));
            assert!(
                abs <= EMBED_ABS_TOL,
                "{id}: mean_pooled max abs diff {abs:e}"
            );
            let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
            let want = case["mean_pooled_l2_norm"].as_f64().expect("norm") as f32;
            assert!(
                (norm - want).abs() <= 1e-5 * want.max(1.0),
                "{id}: norm {norm} vs {want}"
            );
        }
    }
    eprintln!(
        "embeddings: {} cases, max cosine distance {worst_cos:e}, max abs diff {worst_abs:e}",
        cases.len()
    );
}

/// All cases in one call: batched with padding (and sorted by length), each result equals
/// its golden as when embedded alone, in input order.
#[test]
fn batched_embeddings_match_single_ones() {
    let m = minilm();
    let cases = jsonl("embeddings.jsonl");
    // One request carries one set of options: the cases without request fields.
    let plain: Vec<&Value> = cases
        .iter()
        .filter(|c| c["request"].is_null() || c["request"] == serde_json::json!({}))
        .collect();
    assert!(plain.len() > 30);
    let inputs: Vec<EmbedInput> = plain.iter().map(|c| input_of(c)).collect();
    let out = m
        .embed(
            &inputs,
            &EmbedOptions {
                truncate_prompt_tokens: Some(-1),
                ..EmbedOptions::default()
            },
        )
        .expect("batch embeds");
    assert_eq!(out.len(), plain.len());
    for (case, e) in plain.iter().zip(&out) {
        let id = case["id"].as_str().expect("id");
        assert_eq!(e.token_ids, ids(&case["token_ids"]), "{id}");
        let golden = floats(&case["embedding"]);
        let abs = max_abs(&e.embedding, &golden);
        assert!(abs <= EMBED_ABS_TOL, "{id}: batched max abs diff {abs:e}");
    }
}

/// Concurrent calls (one text each, from many threads at once) are batched into shared
/// forward passes and each still gets its own golden vector, within the tolerance of a
/// single call; a call mixed with an over-long input fails alone.
#[test]
fn concurrent_calls_are_batched_and_equal_single_ones() {
    // Its own instance: the other tests share `minilm()` and would count in its stats.
    let own = Embedder::load(&minilm_dir()).expect("MiniLM loads");
    let m = &own;
    let cases = jsonl("embeddings.jsonl");
    let plain: Vec<&Value> = cases
        .iter()
        .filter(|c| c["request"].is_null() || c["request"] == serde_json::json!({}))
        .filter(|c| c["vllm"]["status"] == 200)
        .take(32)
        .collect();
    assert!(plain.len() >= 24);
    let before = m.batch_stats();
    let barrier = std::sync::Barrier::new(plain.len() + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = plain
            .iter()
            .map(|case| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let out = m
                        .embed(&[input_of(case)], &EmbedOptions::default())
                        .expect("embeds");
                    (case, out)
                })
            })
            .collect();
        // One over-long input among them: refused before it reaches the queue.
        let long = cases
            .iter()
            .find(|c| c["id"] == "long-paragraph")
            .expect("case");
        barrier.wait();
        assert!(m
            .embed(&[input_of(long)], &EmbedOptions::default())
            .is_err());
        for h in handles {
            let (case, out) = h.join().expect("thread");
            let id = case["id"].as_str().expect("id");
            assert_eq!(out[0].token_ids, ids(&case["token_ids"]), "{id}");
            let abs = max_abs(&out[0].embedding, &floats(&case["embedding"]));
            assert!(
                abs <= EMBED_ABS_TOL,
                "{id}: concurrent max abs diff {abs:e}"
            );
        }
    });
    let after = m.batch_stats();
    let calls = after.calls - before.calls;
    let forwards = after.forwards - before.forwards;
    assert_eq!(calls, plain.len() as u64);
    // The first forward runs one call while the others queue behind it: they share later ones.
    assert!(
        forwards >= 1 && forwards < calls,
        "{forwards} forwards for {calls} calls"
    );
}

/// The burn encoder (what the GPU backends run; here on the CPU backend): padded batches
/// with a key mask give the goldens too, in one batched call of mixed lengths; and the
/// cross-encoder's logits through its pooler and classifier.
#[test]
fn burn_encoder_matches_goldens() {
    let m = Embedder::<Flex>::load_on(&minilm_dir(), &FlexDevice).expect("MiniLM loads");
    let cases = jsonl("embeddings.jsonl");
    let plain: Vec<&Value> = cases
        .iter()
        .filter(|c| c["request"].is_null() || c["request"] == serde_json::json!({}))
        .take(12)
        .collect();
    let inputs: Vec<EmbedInput> = plain.iter().map(|c| input_of(c)).collect();
    let opts = EmbedOptions {
        truncate_prompt_tokens: Some(-1),
        ..EmbedOptions::default()
    };
    let out = m.embed(&inputs, &opts).expect("batch embeds");
    for (case, e) in plain.iter().zip(&out) {
        let id = case["id"].as_str().expect("id");
        let abs = max_abs(&e.embedding, &floats(&case["embedding"]));
        assert!(
            abs <= EMBED_ABS_TOL,
            "{id}: burn encoder max abs diff {abs:e}"
        );
    }
    let dir = cross_encoder_dir();
    let ce = Embedder::<Flex>::load_on(dir, &FlexDevice).expect("cross-encoder loads");
    for case in jsonl("cross_encoder_score.jsonl").iter().take(4) {
        let (q, d) = (
            case["query"].as_str().expect("query"),
            case["document"].as_str().expect("document"),
        );
        let logit = ce.pair_logits(q, d).expect("logits")[0];
        let want = case["logit"].as_f64().expect("logit") as f32;
        assert!(
            (logit - want).abs() <= SCORE_TOL,
            "burn cross-encoder logit {logit} vs {want}"
        );
    }
}

/// vLLM's refusals of over-long input carry its message; `-1` truncates instead.
#[test]
fn over_long_input_is_refused_with_vllm_message() {
    let m = minilm();
    let mut refused = 0;
    for case in jsonl("embeddings.jsonl") {
        let id = case["id"].as_str().expect("id");
        let opts = options_of(&case["request"]);
        let got = m.embed(&[input_of(&case)], &opts);
        match case["vllm"]["status"].as_u64() {
            Some(400) => {
                refused += 1;
                let err = got.err().unwrap_or_else(|| panic!("{id}: must be refused"));
                assert!(
                    matches!(err, PoolingError::PromptTooLong { .. }),
                    "{id}: {err:?}"
                );
                assert_eq!(err.status(), 400);
                assert_eq!(
                    err.to_string(),
                    case["vllm"]["error_message"].as_str().expect("message"),
                    "{id}"
                );
            }
            _ => {
                let e = got.unwrap_or_else(|e| panic!("{id}: {e}"));
                let want = case["vllm"]["prompt_tokens"]
                    .as_u64()
                    .unwrap_or(case["n_tokens"].as_u64().expect("n"));
                assert_eq!(e[0].prompt_tokens as u64, want, "{id}");
            }
        }
    }
    assert_eq!(refused, 3);
}

/// The `tokenizer.json` bakes in truncation at 128 and padding to 128; the plain
/// `tokenizers` load shows it, the embedder's tokenizer has both switched off.
#[test]
fn baked_in_truncation_and_padding_are_switched_off() {
    let m = minilm();
    let raw = tokenizers::Tokenizer::from_file(minilm_dir().join("tokenizer.json"))
        .expect("raw tokenizer");
    for case in jsonl("embeddings.jsonl") {
        let Value::String(text) = &case["input"] else {
            continue;
        };
        let raw_len = raw.encode(text.as_str(), true).expect("encodes").len();
        assert_eq!(
            raw_len as u64,
            case["raw_tokenizer_json"]["len"].as_u64().expect("len")
        );
        let ours = m
            .tokenizer()
            .hf()
            .encode(text.as_str(), true)
            .expect("encodes");
        assert_eq!(
            ours.len() as u64,
            case["n_tokens_untruncated"].as_u64().expect("n"),
            "{}",
            case["id"]
        );
    }
}

#[test]
fn config_follows_vllm_rules() {
    let c = minilm().config();
    assert_eq!(c.task, PoolingTask::Embed);
    assert_eq!(c.pooling, aphro_engine::pooling::PoolingType::Mean);
    assert!(c.normalize, "modules.json lists Normalize");
    assert_eq!(c.max_model_len, 256);
    assert_eq!(c.matryoshka, None);
    let ce = cross_encoder().config();
    assert_eq!(ce.task, PoolingTask::Classify);
    assert_eq!(ce.pooling, aphro_engine::pooling::PoolingType::Cls);
    assert_eq!(ce.max_model_len, 512);
    assert_eq!(ce.labels, vec!["LABEL_0".to_string()]);
}

/// Bi-encoder `/score`: cosine of the embeddings, usage = every text's tokens once.
#[test]
fn bi_encoder_scores_match() {
    let m = minilm();
    let mut worst = 0f32;
    for case in jsonl("score.jsonl") {
        let id = case["id"].as_str().expect("id");
        let q = strings(&case["request"]["queries"]);
        let d = strings(&case["request"]["documents"]);
        let mut opts = ScoreOptions::default();
        let (want, usage) = if case["vllm"]["status"].as_u64() == Some(400) {
            let err = m.score(&q, &d, &opts).expect_err("refused");
            let needle = case["vllm"]["error_message_contains"]
                .as_str()
                .expect("msg");
            assert!(err.to_string().contains(needle), "{id}: {err}");
            opts.truncate_prompt_tokens = Some(-1);
            let ok = &case["vllm"]["with_truncate_prompt_tokens_minus1"];
            (
                ok["response_data"].clone(),
                ok["usage_prompt_tokens"].clone(),
            )
        } else {
            (
                case["vllm"]["response_data"].clone(),
                case["vllm"]["usage_prompt_tokens"].clone(),
            )
        };
        let out = m
            .score(&q, &d, &opts)
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let want: Vec<f32> = want
            .as_array()
            .expect("data")
            .iter()
            .map(|r| r["score"].as_f64().expect("score") as f32)
            .collect();
        assert_eq!(want.len(), floats(&case["scores"]).len());
        assert_eq!(out.scores.len(), want.len(), "{id}");
        let diff = max_abs(&out.scores, &want);
        assert!(diff <= SCORE_TOL, "{id}: score diff {diff:e}");
        worst = worst.max(diff);
        assert_eq!(
            out.prompt_tokens as u64,
            usage.as_u64().expect("usage"),
            "{id}"
        );
    }
    eprintln!("bi-encoder scores: max abs diff {worst:e}");
}

/// Cross-encoder pairs: ids and token types equal transformers', the logit, the sigmoid
/// score and the raw logit with `use_activation: false` within 1e-4.
#[test]
fn cross_encoder_matches_transformers() {
    let m = cross_encoder();
    let mut worst = 0f32;
    for case in jsonl("cross_encoder_score.jsonl") {
        let id = case["id"].as_str().expect("id");
        let q = case["query"].as_str().expect("query");
        let d = case["document"].as_str().expect("document");
        let pair = m
            .encode_pair(q, d, &ScoreOptions::default())
            .expect("encodes");
        assert_eq!(pair.token_ids, ids(&case["input_ids"]), "{id}: ids");
        assert_eq!(
            pair.token_type_ids,
            ids(&case["token_type_ids"]),
            "{id}: types"
        );
        let logit = m.pair_logits(q, d).expect("logits")[0];
        let want = case["logit"].as_f64().expect("logit") as f32;
        assert!(
            (logit - want).abs() <= SCORE_TOL,
            "{id}: logit {logit} vs {want}"
        );
        worst = worst.max((logit - want).abs());
        let out = m
            .score(&[q.to_string()], &[d.to_string()], &ScoreOptions::default())
            .expect("scores");
        let want = case["vllm"]["score"].as_f64().expect("score") as f32;
        assert!((out.scores[0] - want).abs() <= SCORE_TOL, "{id}: score");
        assert_eq!(
            out.prompt_tokens as u64,
            case["vllm"]["usage_prompt_tokens"].as_u64().expect("usage"),
            "{id}"
        );
        let raw = m
            .score(
                &[q.to_string()],
                &[d.to_string()],
                &ScoreOptions {
                    use_activation: Some(false),
                    ..ScoreOptions::default()
                },
            )
            .expect("scores");
        let want = case["vllm"]["score_with_use_activation_false"]
            .as_f64()
            .expect("logit") as f32;
        assert!((raw.scores[0] - want).abs() <= SCORE_TOL, "{id}: raw score");
    }
    eprintln!("cross-encoder logits: max abs diff {worst:e}");
}

/// `/rerank` on both kinds: order (ties in input order), `top_n`, scores, usage.
#[test]
fn rerank_matches() {
    for case in jsonl("rerank.jsonl") {
        let id = case["id"].as_str().expect("id");
        let m = match case["model"].as_str() {
            Some("bi-encoder") => minilm(),
            Some("cross-encoder") => cross_encoder(),
            other => panic!("{id}: model {other:?}"),
        };
        let req = &case["request"];
        let docs = strings(&req["documents"]);
        let out = m
            .rerank(
                req["query"].as_str().expect("query"),
                &docs,
                req["top_n"].as_u64().unwrap_or(0) as usize,
                &ScoreOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let want = case["results"].as_array().expect("results");
        let got_idx: Vec<u64> = out.results.iter().map(|r| r.index as u64).collect();
        let want_idx: Vec<u64> = want
            .iter()
            .map(|r| r["index"].as_u64().expect("index"))
            .collect();
        assert_eq!(got_idx, want_idx, "{id}: order");
        for (g, w) in out.results.iter().zip(want) {
            let w = w["relevance_score"].as_f64().expect("score") as f32;
            assert!((g.relevance_score - w).abs() <= SCORE_TOL, "{id}: score");
        }
        assert_eq!(
            out.prompt_tokens as u64,
            case["usage"]["prompt_tokens"].as_u64().expect("usage"),
            "{id}"
        );
    }
}

/// `/classify` with the cross-encoder: label, sigmoid probability, raw logit.
#[test]
fn classify_matches() {
    let m = cross_encoder();
    let cases = jsonl("classify.jsonl");
    let inputs: Vec<EmbedInput> = cases.iter().map(input_of).collect();
    let out = m
        .classify(&inputs, &ScoreOptions::default())
        .expect("classifies");
    let raw = m
        .classify(
            &inputs,
            &ScoreOptions {
                use_activation: Some(false),
                ..ScoreOptions::default()
            },
        )
        .expect("classifies");
    for ((case, c), r) in cases.iter().zip(&out).zip(&raw) {
        let id = case["id"].as_str().expect("id");
        let data = &case["vllm"]["data"];
        assert_eq!(c.label.as_deref(), data["label"].as_str(), "{id}");
        assert_eq!(
            c.num_classes as u64,
            data["num_classes"].as_u64().expect("n")
        );
        let diff = max_abs(&c.probs, &floats(&data["probs"]));
        assert!(diff <= SCORE_TOL, "{id}: probs diff {diff:e}");
        let diff = max_abs(
            &r.probs,
            &floats(&case["vllm"]["probs_with_use_activation_false"]),
        );
        assert!(diff <= SCORE_TOL, "{id}: logit diff {diff:e}");
        assert_eq!(
            c.prompt_tokens as u64,
            case["n_tokens"].as_u64().expect("n")
        );
    }
}

/// Requests vLLM refuses, refused with its messages and statuses.
#[test]
fn refusals() {
    let m = minilm();
    let hello = [EmbedInput::from("hello")];
    let err = m
        .embed(
            &hello,
            &EmbedOptions {
                dimensions: Some(8),
                ..EmbedOptions::default()
            },
        )
        .expect_err("not a Matryoshka model");
    assert_eq!(
        err.to_string(),
        "Model \"all-MiniLM-L6-v2\" does not support matryoshka representation, changing \
         output dimensions will lead to poor results."
    );
    assert_eq!((err.status(), err.param()), (400, Some("dimensions")));
    let err = m
        .embed(
            &hello,
            &EmbedOptions {
                truncate_prompt_tokens: Some(257),
                ..EmbedOptions::default()
            },
        )
        .expect_err("above max_model_len");
    assert!(err
        .to_string()
        .starts_with("truncate_prompt_tokens value is greater"));
    let err = m
        .embed(&[EmbedInput::Tokens(vec![])], &EmbedOptions::default())
        .expect_err("empty");
    assert_eq!(err.status(), 400);
    let err = m
        .embed(
            &[EmbedInput::Tokens(vec![101, 30522])],
            &EmbedOptions::default(),
        )
        .expect_err("out of vocabulary");
    assert_eq!(err.to_string(), "Token id 30522 is out of vocabulary");
    let long: Vec<u32> = vec![1996; 300];
    let err = m
        .embed(&[EmbedInput::Tokens(long)], &EmbedOptions::default())
        .expect_err("too long");
    assert!(
        err.to_string()
            .contains("your prompt contains 300 input tokens"),
        "{err}"
    );
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let o = ScoreOptions::default();
    let err = m
        .score(&s(&["a", "b"]), &s(&["a", "b", "c"]), &o)
        .expect_err("2:3");
    assert_eq!(
        err.to_string(),
        "Input lengths must be either 1:1, 1:N or N:N"
    );
    let err = m.score(&[], &s(&["a"]), &o).expect_err("empty queries");
    assert_eq!(err.to_string(), "At least one text element must be given");
    let err = m.score(&s(&["a"]), &[], &o).expect_err("empty documents");
    assert_eq!(
        err.to_string(),
        "At least one text_pair element must be given"
    );
    let err = m.classify(&hello, &o).expect_err("not a classifier");
    assert_eq!(err.status(), 501);
    let err = cross_encoder()
        .embed(&hello, &EmbedOptions::default())
        .expect_err("not an embedding model");
    assert_eq!(err.to_string(), "The model does not support Embeddings API");
}

/// Truncation keeps `[CLS]` … `[SEP]` on the right, the last ids on the left, and
/// pre-tokenized ids are used as given.
#[test]
fn truncation_sides_and_token_inputs() {
    let m = minilm();
    let text = EmbedInput::from("one two three four five six seven eight nine ten");
    let right = m.tokenize(&text, Some(5), None).expect("right");
    assert_eq!(right.len(), 5);
    assert_eq!((right[0], right[4]), (101, 102));
    let full = m.tokenize(&text, None, None).expect("full");
    let left = m
        .tokenize(&text, Some(5), Some(TruncationSide::Left))
        .expect("left");
    assert_eq!(left, full[full.len() - 5..].to_vec());
    let ids = EmbedInput::Tokens(vec![7592, 2088, 999]);
    assert_eq!(
        m.tokenize(&ids, Some(2), None).expect("ids"),
        vec![7592, 2088]
    );
    assert_eq!(
        m.tokenize(&ids, Some(2), Some(TruncationSide::Left))
            .expect("ids"),
        vec![2088, 999]
    );
}

/// `EmbedInput::RawText` (vLLM's `add_special_tokens: false`): the text's ids without
/// `[CLS]` / `[SEP]`, so "Hello world" is the golden of its bare ids; truncation keeps the
/// first ids with no room reserved for special tokens.
#[test]
fn raw_text_has_no_special_tokens() {
    let m = minilm();
    let bare = jsonl("embeddings.jsonl")
        .into_iter()
        .find(|c| c["id"] == "ids-no-specials")
        .expect("golden");
    let out = m
        .embed(
            &[EmbedInput::RawText("Hello world".into())],
            &EmbedOptions::default(),
        )
        .expect("embeds");
    assert_eq!(out[0].token_ids, ids(&bare["input"]));
    let diff = max_abs(&out[0].embedding, &floats(&bare["embedding"]));
    assert!(diff <= EMBED_ABS_TOL, "{diff:e}");
    let raw = EmbedInput::RawText("one two three".into());
    assert_eq!(m.tokenize(&raw, Some(1), None).expect("right"), vec![2028]);
    let text = EmbedInput::Text("one two three".into());
    let err = m.tokenize(&text, Some(1), None).expect_err("no room");
    assert_eq!(err.status(), 400);
}
