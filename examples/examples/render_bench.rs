//! Prints a table of render latency and throughput on ~1k- and ~8k-token Qwen3 chats with
//! tools. `cargo run --release -p aphro-examples --example render_bench [-- MODEL_DIR]`.
use aphro_core::bench_support::tool_chat;
use aphro_core::{Model, RenderOptions, Renderer};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| {
        let assets = std::env::var("APHRO_ASSETS")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets").into());
        format!("{assets}/tokenizers/qwen3")
    });
    let t0 = Instant::now();
    let model = Model::load(&dir)?;
    let load = t0.elapsed();
    let t1 = Instant::now();
    let renderer = Renderer::new(
        Arc::new(model),
        RenderOptions {
            max_model_len: Some(40960),
            // The chats offer tools: tool parsing on, as a server rendering them has it.
            tool_call_parser: Some("hermes".into()),
            enable_auto_tool_choice: true,
            ..Default::default()
        },
    )?;
    println!(
        "tokenizer load {:.1} ms, template compile {:.2} ms (once)",
        ms(load),
        ms(t1.elapsed())
    );
    println!(
        "{:<6} {:>8} {:>10} {:>10} {:>10} {:>12} {:>14}",
        "chat", "tokens", "p50 ms", "p90 ms", "mean ms", "req/s (1 th)", "tokens/s"
    );
    for (label, turns) in [("1k", 6), ("8k", 58)] {
        let req = tool_chat(turns);
        let n = renderer.render_chat(&req)?.token_ids.len();
        let mut samples = Vec::new();
        let budget = Instant::now();
        while budget.elapsed() < Duration::from_secs(3) || samples.len() < 20 {
            let t = Instant::now();
            std::hint::black_box(renderer.render_chat(&req)?);
            samples.push(t.elapsed());
        }
        samples.sort();
        let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
        let p = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
        println!(
            "{:<6} {:>8} {:>10.3} {:>10.3} {:>10.3} {:>12.0} {:>14.0}",
            label,
            n,
            ms(p(0.5)),
            ms(p(0.9)),
            ms(mean),
            1.0 / mean.as_secs_f64(),
            n as f64 / mean.as_secs_f64()
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
