//! Embedding throughput of the pooling engine: embeddings/s at batch 1 (one text per call,
//! calls one after another) and under 32 concurrent callers (one text per call, batched by
//! the engine's dynamic batcher), printed as a Markdown table (`--json`: one JSON object).
//!
//!     cargo run -p aphro-engine --example bench_pooling -- MODEL_DIR TEXTS.json [--json]
//!
//! `TEXTS.json` is a JSON list of strings (`scripts/bench_pooling.sh` writes it and runs
//! sentence-transformers on the same texts). Over-long texts are truncated to the model's
//! length, as sentence-transformers truncates them. aphro-engine is optimized in the dev
//! profile (Cargo.toml), so this needs no release build.
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use aphro_engine::pooling::{EmbedInput, EmbedOptions, Embedder};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    if pos.len() != 2 {
        return Err("usage: bench_pooling MODEL_DIR TEXTS.json [--json]".into());
    }
    let model = Embedder::load(&PathBuf::from(pos[0]))?;
    let texts: Vec<String> = serde_json::from_str(&std::fs::read_to_string(pos[1])?)?;
    if texts.is_empty() {
        return Err("no texts".into());
    }
    let opts = EmbedOptions {
        truncate_prompt_tokens: Some(-1),
        ..EmbedOptions::default()
    };
    let one = |t: &String| model.embed(&[EmbedInput::Text(t.clone())], &opts);
    // Warm-up.
    for t in texts.iter().take(4) {
        one(t)?;
    }

    let (start, cpu0) = (Instant::now(), cpu_seconds());
    for t in &texts {
        one(t)?;
    }
    let batch1 = texts.len() as f64 / start.elapsed().as_secs_f64();
    let batch1_cpu = cpu_ms_per_embedding(cpu0, texts.len());

    let concurrency = 32;
    let before = model.batch_stats();
    let next = AtomicUsize::new(0);
    let (start, cpu0) = (Instant::now(), cpu_seconds());
    std::thread::scope(|s| -> Result<(), Error> {
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                s.spawn(|| -> Result<(), Error> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(t) = texts.get(i) else {
                            return Ok(());
                        };
                        one(t)?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| Error::from("worker panicked"))??;
        }
        Ok(())
    })?;
    let concurrent = texts.len() as f64 / start.elapsed().as_secs_f64();
    let concurrent_cpu = cpu_ms_per_embedding(cpu0, texts.len());
    let after = model.batch_stats();
    let forwards = after.forwards - before.forwards;
    let calls = after.calls - before.calls;

    if json {
        println!(
            "{}",
            serde_json::json!({"texts": texts.len(), "batch1_emb_s": batch1,
                "batch1_cpu_ms": batch1_cpu, "concurrent_cpu_ms": concurrent_cpu,
                "concurrent": concurrency, "concurrent_emb_s": concurrent,
                "calls": calls, "forwards": forwards})
        );
    } else {
        println!("| aphro (CPU) | embeddings/s | CPU ms per embedding |");
        println!("| --- | ---: | ---: |");
        println!(
            "| batch 1 ({} texts, one call each) | {batch1:.1} | {batch1_cpu:.1} |",
            texts.len()
        );
        println!(
            "| {concurrency} concurrent callers ({calls} calls in {forwards} forward passes) | {concurrent:.1} | {concurrent_cpu:.1} |"
        );
    }
    Ok(())
}

/// CPU time of this process so far (user + system, all threads) from `/proc/self/stat`, in
/// seconds; 0 where it cannot be read. On a shared machine wall-clock throughput depends on
/// the other load, CPU time per embedding much less.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesized command name: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    // Clock ticks: 100 per second on Linux.
    f.iter().sum::<f64>() / 100.0
}

fn cpu_ms_per_embedding(cpu0: f64, n: usize) -> f64 {
    (cpu_seconds() - cpu0) * 1000.0 / n as f64
}
