//! Render latency/throughput on ~1k- and ~8k-token Qwen3 chats with tools. Template compile
//! and tokenizer load happen once, outside the measured loop.
use aphro_core::bench_support::tool_chat;
use aphro_core::{Model, RenderOptions, Renderer};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::sync::Arc;

fn assets_dir() -> std::path::PathBuf {
    std::env::var_os("APHRO_ASSETS")
        .map(Into::into)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets").into())
}

fn bench(c: &mut Criterion) {
    let dir = assets_dir().join("tokenizers/qwen3");
    assert!(
        dir.exists(),
        "{} missing: run scripts/fetch_assets.py",
        dir.display()
    );
    let model = Model::load(dir.to_str().expect("utf-8")).expect("load qwen3");
    let renderer = Renderer::new(
        Arc::new(model),
        RenderOptions {
            max_model_len: Some(40960),
            // The chats offer tools: tool parsing on, as a server rendering them has it.
            tool_call_parser: Some("hermes".into()),
            enable_auto_tool_choice: true,
            ..Default::default()
        },
    )
    .expect("renderer");
    let mut group = c.benchmark_group("render_chat_qwen3_tools");
    for (label, turns) in [("1k", 6), ("8k", 58)] {
        let req = tool_chat(turns);
        let n = renderer.render_chat(&req).expect("render").token_ids.len();
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(format!("{label} ({n} tokens)"), |b| {
            b.iter(|| renderer.render_chat(&req).expect("render"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
