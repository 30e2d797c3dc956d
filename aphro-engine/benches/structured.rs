//! The cost of structured outputs: decode throughput with and without a JSON-schema
//! constraint at batch 1 and 16 on the real model, side by side as a ratio, and the grammar
//! mask time per token. `cargo bench -p aphro-engine --bench structured` (set `APHRO_ASSETS`;
//! `APHRO_BENCH_DECODE` tokens per sequence, default 96).
//!
//! Every sequence decodes exactly `APHRO_BENCH_DECODE` tokens: the unconstrained run ignores
//! EOS, the constrained one asks for an array longer than the budget, so both end on length.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use aphro_core::structured::{Constraint, GrammarCompiler};
use aphro_engine::serving::{parse_generate_request, MaxModelLen, ServingConfig, ServingEngine};
use futures::executor::block_on;
use serde_json::json;

fn main() {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let path = assets.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} missing: run scripts/fetch_assets.py",
        path.display()
    );
    let decode: usize = std::env::var("APHRO_BENCH_DECODE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96);
    let engine = Arc::new(
        ServingEngine::new(ServingConfig {
            model: path.to_string_lossy().into_owned(),
            kv_cache_memory: Some(512 << 20),
            max_model_len: MaxModelLen::Tokens(1024),
            max_num_batched_tokens: 1024,
            max_num_seqs: 16,
            seed: Some(0),
            ..ServingConfig::default()
        })
        .expect("engine starts"),
    );
    let tok = Arc::clone(engine.tokenizer().expect("tokenizer"));
    let prompt = tok
        .encode("<|im_start|>user\nList many short city names as a JSON array.<|im_end|>\n<|im_start|>assistant\n", false)
        .expect("encodes");
    let schema =
        json!({"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 500});

    let run = |batch: usize, constrained: bool| -> (f64, Vec<Vec<u32>>) {
        let reqs: Vec<_> = (0..batch)
            .map(|i| {
                let mut sp = json!({"temperature": 0.8, "seed": i, "max_tokens": decode, "ignore_eos": !constrained});
                if constrained {
                    sp["structured_outputs"] = json!({"json": schema});
                }
                parse_generate_request(&json!({"token_ids": prompt, "sampling_params": sp})).expect("valid")
            })
            .collect();
        let t = Instant::now();
        let outs = block_on(futures::future::join_all(reqs.into_iter().map(|r| {
            let e = Arc::clone(&engine);
            async move { e.generate_full(r, None).await.expect("generates") }
        })));
        let secs = t.elapsed().as_secs_f64();
        let ids: Vec<Vec<u32>> = outs
            .iter()
            .map(|o| o.choices[0].token_ids.clone().unwrap_or_default())
            .collect();
        let total: usize = ids.iter().map(Vec::len).sum();
        assert_eq!(
            total,
            batch * decode,
            "every sequence decodes the whole budget"
        );
        (total as f64 / secs, ids)
    };
    // Warm-up (first grammar compile, caches).
    run(1, true);
    run(1, false);

    println!("| batch | unconstrained tok/s | JSON-schema tok/s | ratio |");
    println!("|------:|--------------------:|------------------:|------:|");
    let mut sample_output = Vec::new();
    for batch in [1usize, 16] {
        let (free, _) = run(batch, false);
        let (constrained, ids) = run(batch, true);
        sample_output = ids;
        println!(
            "| {batch} | {free:.1} | {constrained:.1} | {:.3} |",
            constrained / free
        );
    }

    // Mask time: replay one constrained output through a fresh matcher.
    let info = engine.engine().model_info();
    let compiler =
        GrammarCompiler::new(Arc::clone(&tok), info.vocab_size, &info.eos_token_ids).expect("trie");
    let t = Instant::now();
    let c = Constraint::from_structured_outputs(&json!({"json": schema})).expect("constraint");
    let mut m = compiler.compile(&c).expect("compiles");
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let tokens = &sample_output[0];
    let mut mask_s = 0.0;
    for &t in tokens {
        let s = Instant::now();
        let mask = m.compute_mask().expect("mask");
        mask_s += s.elapsed().as_secs_f64();
        assert!(
            mask.is_allowed(t),
            "the engine sampled a token its own grammar forbids"
        );
        m.consume(t).expect("consumes");
    }
    println!();
    println!("| grammar compile (ms) | mask per token (µs) | tokens replayed |");
    println!("|---------------------:|--------------------:|----------------:|");
    println!(
        "| {compile_ms:.2} | {:.1} | {} |",
        mask_s / tokens.len() as f64 * 1e6,
        tokens.len()
    );
}
