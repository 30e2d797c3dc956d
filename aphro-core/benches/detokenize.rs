//! Incremental detokenization cost per token for 1k / 4k / 16k-token outputs.
//! The per-token time should be flat (the detokenizer decodes a bounded
//! window, never the whole sequence).
//!
//! `APHRO_ASSETS=/path/to/.assets cargo bench -p aphro-core --bench detokenize`

use std::path::PathBuf;
use std::time::Duration;

use aphro_core::detokenizer::{DetokenizeOptions, IncrementalDetokenizer};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokenizers::Tokenizer;

fn load(family: &str) -> Tokenizer {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let path = assets
        .join("tokenizers")
        .join(family)
        .join("tokenizer.json");
    match Tokenizer::from_file(&path) {
        Ok(t) => t,
        Err(e) => panic!(
            "cannot load {} ({e}) — run `scripts/fetch_assets.py` or set APHRO_ASSETS",
            path.display()
        ),
    }
}

/// A realistic multi-script output of at least `n` tokens.
fn output_ids(tok: &Tokenizer, n: usize) -> Vec<u32> {
    let para = "The detokenizer turns ids back into text — naïve café, 你好，世界, \
                emoji 🦀🚀👩‍👩‍👧‍👦, math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, code `fn main() { println!(\"hi\"); }`.\n\n";
    let mut ids = Vec::with_capacity(n + 64);
    while ids.len() < n {
        match tok.encode(para, false) {
            Ok(e) => ids.extend_from_slice(e.get_ids()),
            Err(e) => panic!("encode: {e}"),
        }
    }
    ids.truncate(n);
    ids
}

fn bench(c: &mut Criterion) {
    for family in ["qwen3", "mistral7b_spm"] {
        let tok = load(family);
        let mut group = c.benchmark_group(format!("detokenize/{family}"));
        group.warm_up_time(Duration::from_millis(500));
        group.measurement_time(Duration::from_secs(2));
        group.sample_size(10);
        for n in [1024usize, 4096, 16384] {
            let ids = output_ids(&tok, n);
            group.throughput(Throughput::Elements(n as u64));
            group.bench_with_input(BenchmarkId::from_parameter(n), &ids, |b, ids| {
                b.iter(|| {
                    let mut d = IncrementalDetokenizer::new(&tok, DetokenizeOptions::default());
                    let mut bytes = 0usize;
                    for &id in ids {
                        if let Some(s) = d.push(id) {
                            bytes += s.len();
                        }
                    }
                    bytes + d.finish().len()
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
