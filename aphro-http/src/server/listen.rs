//! Accept loop: hyper directly (rather than `axum::serve`) so connection hygiene is ours to
//! set: the idle/header timeout (vLLM's `--timeout-keep-alive`), a cap on open connections
//! with an explicit 503 for the ones over it, and a graceful drain on SIGTERM/SIGINT.
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Connection settings of one listener.
#[derive(Debug, Clone)]
pub struct ListenConfig {
    /// An idle keep-alive connection waits at most this long for the next request, and a new
    /// connection this long for its request headers (slow or silent clients are closed).
    pub keep_alive: Duration,
    /// Open connections served at once; the ones over it get a 503 and are closed.
    /// `None`: [`default_max_connections`], read after the open-files limit is raised.
    pub max_connections: Option<usize>,
    /// After SIGTERM/SIGINT, running requests get this long to finish before they are
    /// aborted (each stream still ends with its final event).
    pub shutdown_timeout: Duration,
}

/// Connections at most, when the flag is left at its default: what the open-files limit
/// allows with room to spare for the model files, logs and the refusals themselves.
pub fn default_max_connections() -> usize {
    let soft = rlimit::getrlimit(rlimit::Resource::NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    usize::try_from(soft.saturating_sub(128).max(64)).unwrap_or(usize::MAX)
}

/// Raise the soft open-files limit to the hard one, as vLLM does at start-up: every
/// connection is a descriptor, and the usual soft default (1024) is a few hundred clients.
pub fn raise_open_files_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "open-files limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
    }
}

/// The response a connection over `--max-connections` gets before it is closed.
fn over_capacity_response() -> Vec<u8> {
    let body = r#"{"error":{"message":"The server is at its connection limit (--max-connections); retry later.","type":"ServiceUnavailableError","param":null,"code":503}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\nretry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Logs at most one line a second for a repeating condition (accept errors under a
/// descriptor shortage would otherwise fill the log).
struct LogThrottle {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogThrottle {
    fn ready(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Serve `app` on `listener` until `shutdown` resolves, then drain: stop accepting, let
/// running requests finish within `shutdown_timeout`, call `abort_in_flight` for the rest
/// and give their streams a moment to send their final events. Returns when every
/// connection is closed (or the grace after the abort ran out).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    cfg: ListenConfig,
    shutdown: impl Future<Output = ()>,
    abort_in_flight: impl FnOnce(),
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let max_connections = cfg.max_connections.unwrap_or_else(default_max_connections);
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(cfg.keep_alive);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(cfg.keep_alive))
        .keep_alive_timeout(cfg.keep_alive);
    let refusal: Arc<[u8]> = over_capacity_response().into();
    let mut throttle = LogThrottle {
        last: None,
        suppressed: 0,
    };
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            conn = listener.accept() => conn,
            () = &mut shutdown => break,
        };
        let (mut stream, peer) = match accepted {
            Ok(conn) => conn,
            // Running out of file descriptors must not kill the server; back off and retry.
            Err(e) => {
                if let Some(suppressed) = throttle.ready() {
                    tracing::warn!(error = %e, suppressed, "accept failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Over the cap: answer at once rather than leave the client hanging.
            let refusal = refusal.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    let _ = stream.write_all(&refusal).await;
                    let _ = stream.shutdown().await;
                })
                .await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let first_byte = cfg.keep_alive;
        tokio::spawn(async move {
            // hyper's header timeout starts with the first byte (the HTTP/1-or-2 sniff before
            // it waits forever): a client that never sends one is closed here.
            let mut probe = [0u8; 1];
            match tokio::time::timeout(first_byte, stream.peek(&mut probe)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    app.clone().oneshot(req.map(axum::body::Body::new))
                });
            let conn = builder
                .serve_connection(TokioIo::new(stream), service)
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "connection closed with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    let open = graceful.count();
    tracing::info!(
        open_connections = open,
        timeout_s = cfg.shutdown_timeout.as_secs_f64(),
        "shutting down: no new connections; waiting for running requests"
    );
    eprintln!(
        "aphro: shutting down, waiting up to {:.0} s for {open} open connection(s)",
        cfg.shutdown_timeout.as_secs_f64()
    );
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    if tokio::time::timeout(cfg.shutdown_timeout, &mut drained)
        .await
        .is_err()
    {
        tracing::warn!("shutdown timeout reached: aborting the requests still running");
        abort_in_flight();
        // Aborted streams finish with their final event and `[DONE]`; give them a moment.
        let _ = tokio::time::timeout(Duration::from_secs(5), drained).await;
    }
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn termination_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
