//! Mounts aphro inside an existing axum application with `Server::builder()`: the host app
//! keeps its own routes, aphro's OpenAI API lives under `/llm`. The example answers one chat
//! through the mounted router in process and exits; with `--serve ADDR` it keeps serving.
//!
//!     cargo run --release -p aphro-http --example embed
//!     cargo run --release -p aphro-http --example embed -- --serve 127.0.0.1:8000
//!     curl localhost:8000/llm/v1/chat/completions -H 'content-type: application/json' \
//!          -d '{"messages": [{"role": "user", "content": "Hi"}]}'
//!
//! `APHRO_MODEL` picks another model (a `.gguf`, an HF directory or a cached hub id).
use aphro_engine::serving::{MaxModelLen, ServingConfig};
use aphro_http::server::Server;
use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use axum::Router;
use tower::ServiceExt;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut builder = Server::builder()
        .served_model_name("assistant")
        .engine(ServingConfig {
            max_model_len: MaxModelLen::Auto,
            kv_cache_memory: Some(64 << 20),
            ..ServingConfig::default()
        })
        .base_path("/llm")
        .docs(false);
    if let Ok(model) = std::env::var("APHRO_MODEL") {
        builder = builder.model(model);
    }
    // Loading reads the model files and starts the engine thread: off the async runtime.
    let aphro = tokio::task::spawn_blocking(move || builder.build()).await??;

    let app = Router::new()
        .route("/", get(|| async { "the host application" }))
        .merge(aphro.router());

    let request = Request::post("/llm/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            r#"{"messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 32, "temperature": 0}"#,
        ))?;
    let response = app.clone().oneshot(request).await?;
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    println!(
        "{status} {}: {}",
        v["model"], v["choices"][0]["message"]["content"]
    );

    let mut args = std::env::args().skip(1);
    if let (Some(flag), Some(addr)) = (args.next(), args.next()) {
        anyhow::ensure!(flag == "--serve", "usage: embed [--serve ADDR]");
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        println!("serving on http://{addr} (aphro under /llm)");
        axum::serve(listener, app).await?;
    }
    Ok(())
}
