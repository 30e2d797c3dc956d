//! Accept loop: hyper directly (rather than `axum::serve`) so the idle keep-alive timeout is
//! configurable, as vLLM's `--timeout-keep-alive` is.
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::time::Duration;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Serve `app` on `listener` until the process is stopped.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    keep_alive: Duration,
) -> std::io::Result<()> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            // Running out of file descriptors must not kill the server; back off and retry.
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    app.clone().oneshot(req.map(axum::body::Body::new))
                });
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .keep_alive(true)
                // An idle keep-alive connection waits at most this long for the next request.
                .header_read_timeout(keep_alive);
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "connection closed with an error");
            }
        });
    }
}
