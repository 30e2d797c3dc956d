//! Derender cost: streamed chat derender of 1k / 4k / 16k-token outputs with the hermes + qwen3
//! parsers (time per output token should be flat), in-process (`ChatDerenderStream::push`) and
//! through the stateless wire form in 8-token chunks (state serialized to JSON and back on every
//! call; resumed from the server's live copy, and restored from the carried parser snapshot as
//! on another replica), plus one-shot `derender_chat` requests per second.
//!
//! `APHRO_ASSETS=/path/to/.assets cargo bench -p aphro-core --bench derender`
use aphro_core::protocol::{
    ChatCompletionRequest, DerenderChatRequest, DerenderChatStreamRequest, DerenderStreamState,
    GenerateChoice, GenerateResponse, GenerateStreamResponse,
};
use aphro_core::{DerenderOptions, Derenderer, Model};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn derenderer() -> Derenderer {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let dir = assets.join("tokenizers/qwen3");
    let model = match Model::load(&dir.to_string_lossy()) {
        Ok(m) => m,
        Err(e) => panic!(
            "cannot load {} ({e}) — run `scripts/fetch_assets.py` or set APHRO_ASSETS",
            dir.display()
        ),
    };
    match Derenderer::new(
        Arc::new(model),
        DerenderOptions {
            served_model_name: Some("qwen".into()),
            tool_call_parser: Some("hermes".into()),
            reasoning_parser: Some("qwen3".into()),
            enable_auto_tool_choice: true,
            max_model_len: Some(1 << 16),
            ..DerenderOptions::default()
        },
    ) {
        Ok(d) => d,
        Err(e) => panic!("derenderer: {e}"),
    }
}

fn chat_request() -> ChatCompletionRequest {
    match serde_json::from_value(json!({
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    })) {
        Ok(r) => r,
        Err(e) => panic!("chat request: {e}"),
    }
}

/// Reasoning, then ~n tokens of prose content, then one tool call.
fn output_ids(d: &Derenderer, n: usize) -> Vec<u32> {
    let para = "The derenderer turns token ids back into an assistant message: naïve café, \
                你好，世界, emoji 🦀, code `fn main() {}`.\n\n";
    let mut text =
        String::from("<think>\nThe user asks for the weather; call the tool.\n</think>\n\n");
    let enc = |s: &str| d.model().tokenizer.encode(s, false).unwrap_or_default();
    let per = enc(para).len().max(1);
    for _ in 0..n / per {
        text.push_str(para);
    }
    text.push_str("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    enc(&text)
}

fn chunk(ids: &[u32], last: bool) -> GenerateStreamResponse {
    GenerateStreamResponse {
        request_id: "generate-tokens-chatcmpl-bench".into(),
        choices: vec![GenerateChoice {
            token_ids: Some(ids.to_vec()),
            finish_reason: last.then(|| "stop".into()),
            ..GenerateChoice::default()
        }],
        ..GenerateStreamResponse::default()
    }
}

fn streamed(c: &mut Criterion) {
    let d = derenderer();
    let req = chat_request();
    let prompt = d
        .model()
        .tokenizer
        .encode("<|im_start|>assistant\n", false)
        .unwrap_or_default();
    let mut g = c.benchmark_group("derender_stream_in_process");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for n in [1024usize, 4096, 16384] {
        let ids = output_ids(&d, n);
        let chunks: Vec<GenerateStreamResponse> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| chunk(std::slice::from_ref(id), i + 1 == ids.len()))
            .collect();
        g.throughput(Throughput::Elements(ids.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &chunks, |b, chunks| {
            b.iter(|| {
                let mut s = match d.chat_stream(Some(&req), "id", Some(&prompt), 0) {
                    Ok(s) => s,
                    Err(e) => panic!("{e}"),
                };
                for ch in chunks {
                    if let Err(e) = s.push(ch) {
                        panic!("{e}");
                    }
                }
            })
        });
    }
    g.finish();

    // 8-token chunks (a typical stream_interval), state through JSON text each call. `lru`:
    // the state goes back as issued, so the server resumes its live copy; `portable`: the
    // session id is dropped, as if each call reached another replica, so every call restores
    // the parser from the carried snapshot.
    for (name, portable) in [
        ("derender_stream_wire_lru", false),
        ("derender_stream_wire_portable", true),
    ] {
        let mut g = c.benchmark_group(name);
        g.sample_size(10)
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1));
        for n in [1024usize, 4096, 16384] {
            let ids = output_ids(&d, n);
            let chunks: Vec<GenerateStreamResponse> = ids
                .chunks(8)
                .enumerate()
                .map(|(i, c)| chunk(c, (i + 1) * 8 >= ids.len()))
                .collect();
            g.throughput(Throughput::Elements(ids.len() as u64));
            g.bench_with_input(BenchmarkId::from_parameter(n), &chunks, |b, chunks| {
                b.iter(|| {
                    let mut state: Option<DerenderStreamState> = None;
                    for ch in chunks {
                        let r = d.derender_chat_stream(DerenderChatStreamRequest {
                            stream: true,
                            model: None,
                            generate_chunk: ch.clone(),
                            stream_state: state.take(),
                            prompt_tokens: Some(prompt.len() as u64),
                            prompt_token_ids: Some(prompt.clone()),
                            chat_request: Some(req.clone()),
                        });
                        let r = match r {
                            Ok(r) => r,
                            Err(e) => panic!("{e}"),
                        };
                        let text = serde_json::to_string(&r.stream_state).unwrap_or_default();
                        state = serde_json::from_str(&text).ok();
                        if portable {
                            if let Some(a) = state.as_mut().and_then(|s| s.aphro.as_mut()) {
                                a.session = None;
                            }
                        }
                    }
                })
            });
        }
        g.finish();
    }
}

fn one_shot(c: &mut Criterion) {
    let d = derenderer();
    let req = chat_request();
    let ids = output_ids(&d, 256);
    let mut g = c.benchmark_group("derender_one_shot");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(1));
    g.bench_function("chat_256_tokens", |b| {
        b.iter(|| {
            let r = d.derender_chat(DerenderChatRequest {
                stream: false,
                model: None,
                generate_response: GenerateResponse {
                    request_id: "generate-tokens-chatcmpl-bench".into(),
                    choices: vec![GenerateChoice {
                        token_ids: Some(ids.clone()),
                        finish_reason: Some("stop".into()),
                        ..GenerateChoice::default()
                    }],
                    ..GenerateResponse::default()
                },
                prompt_tokens: Some(10),
                prompt_token_ids: None,
                chat_request: Some(req.clone()),
            });
            if let Err(e) = r {
                panic!("{e}");
            }
        })
    });
    g.finish();
}

criterion_group!(benches, streamed, one_shot);
criterion_main!(benches);
