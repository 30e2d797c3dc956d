//! Embeds the coupled OpenAI layer: a chat request rendered, generated and derendered in
//! this process by `aphro_engine::openai::OpenAiServing` (the type `aphro serve` runs), first
//! streamed chunk by chunk, then as one response.
//!
//!     cargo run --release -p aphro-engine --example chat -- "Why is the sky blue?"
//!
//! The model is the embedded default (SmolLM2-135M-Instruct, downloaded once); set
//! `APHRO_MODEL` to a `.gguf` file, an HF model directory or a cached hub id to use another.
use std::sync::Arc;

use aphro_core::derenderer::{DerenderOptions, Derenderer};
use aphro_core::protocol::ChatCompletionRequest;
use aphro_core::renderer::{parse_chat_request, RenderOptions, Renderer};
use aphro_core::Model;
use aphro_engine::model::{ModelDType, EMBEDDED_DEFAULT_DTYPE};
use aphro_engine::openai::OpenAiServing;
use aphro_engine::serving::{MaxModelLen, ServingConfig, ServingEngine};
use futures::executor::block_on;
use futures::StreamExt;
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let question = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let question = if question.is_empty() {
        "Write a haiku about the sea.".to_owned()
    } else {
        question
    };
    // The embedded default runs in float32, as `aphro serve` runs it (its 4-bit weights with
    // 8-bit activations answer badly); another model runs at its own precision.
    let (spec, dtype) = match std::env::var("APHRO_MODEL") {
        Ok(m) => (m, ModelDType::Auto),
        Err(_) => (
            aphro_core::default_model::ensure_default_model()?
                .to_string_lossy()
                .into_owned(),
            EMBEDDED_DEFAULT_DTYPE,
        ),
    };

    // The three stages, over one model: the renderer and derenderer share the tokenizer.
    let model = Arc::new(Model::load(&spec)?);
    let engine = ServingEngine::new(ServingConfig {
        model: spec.clone(),
        dtype,
        max_model_len: MaxModelLen::Auto,
        kv_cache_memory: Some(64 << 20),
        ..ServingConfig::default()
    })?;
    let max_model_len = Some(engine.max_model_len());
    let renderer = Renderer::new(
        model.clone(),
        RenderOptions {
            max_model_len,
            ..RenderOptions::default()
        },
    )?;
    let derenderer = Derenderer::new(
        model,
        DerenderOptions {
            served_model_name: Some(engine.served_model_name().to_owned()),
            max_model_len,
            ..DerenderOptions::default()
        },
    )?;
    let serving = OpenAiServing::new(Arc::new(renderer), Arc::new(derenderer), Arc::new(engine));

    // A request as a client sends it, read with the server's checks.
    let body = json!({
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 64,
        "temperature": 0,
        "stream": true,
    });
    let chat: ChatCompletionRequest = parse_chat_request(&body)?;

    // Streamed: the `data:` objects of the SSE stream.
    let rendered = serving.render_chat(chat.clone(), None)?;
    let mut chunks = serving.stream_chat(rendered, None)?;
    block_on(async {
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            if let Some(text) = chunk
                .pointer("/choices/0/delta/content")
                .and_then(|t| t.as_str())
            {
                print!("{text}");
            }
            if let Some(reason) = chunk
                .pointer("/choices/0/finish_reason")
                .and_then(|r| r.as_str())
            {
                println!("\n[finish_reason={reason}]");
            }
        }
        Ok::<_, aphro_engine::openai::OpenAiError>(())
    })?;

    // Whole: the `chat.completion` response (greedy, so the same text).
    let resp = block_on(serving.chat(
        ChatCompletionRequest {
            stream: false,
            ..chat
        },
        None,
    ))?;
    println!(
        "{} completion tokens: {:?}",
        resp.usage.completion_tokens.unwrap_or(0),
        resp.choices[0].message.content
    );
    Ok(())
}
