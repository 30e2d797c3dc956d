//! Helpers for tests that start the real `aphro` binary on a loopback port.
#![allow(dead_code)]
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn assets() -> PathBuf {
    let dir = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    assert!(
        dir.join("tokenizers").is_dir(),
        "test assets missing at {}: run scripts/fetch_assets.py",
        dir.display()
    );
    dir
}

/// A running server, killed on drop.
pub struct Server {
    child: Child,
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

impl Server {
    /// Start `aphro <args> --port P` and wait until `/health` answers.
    pub fn start(args: &[&str]) -> Server {
        Self::start_logging_to(args, None)
    }

    /// As [`Self::start`], with the server's stderr (its log) written to `log`.
    pub fn start_logging_to(args: &[&str], log: Option<&std::path::Path>) -> Server {
        let port = free_port();
        let stderr = match log {
            Some(p) => Stdio::from(std::fs::File::create(p).expect("log file")),
            None => Stdio::inherit(),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_aphro"))
            .args(args)
            .args(["--port", &port.to_string()])
            .env("APHRO_ASSETS", assets())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn aphro");
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if ureq::get(&format!("{}/health", server.base)).call().is_ok() {
                return server;
            }
            assert!(Instant::now() < deadline, "server did not become healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `host:port` of the listener.
    pub fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_owned()
    }

    /// Send SIGTERM and wait (up to `within`) for the process to exit; its exit code.
    pub fn terminate(&mut self, within: Duration) -> Option<i32> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -TERM failed");
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st.code();
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POST JSON; returns (status, body text) for success and error statuses alike.
    pub fn post(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = ureq::post(&self.url(path)).set("content-type", "application/json");
        for (k, v) in headers {
            req = req.set(k, v);
        }
        respond(req.send_string(&body.to_string()))
    }

    pub fn post_raw(&self, path: &str, content_type: &str, body: &str) -> (u16, String) {
        respond(
            ureq::post(&self.url(path))
                .set("content-type", content_type)
                .send_string(body),
        )
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = ureq::get(&self.url(path));
        for (k, v) in headers {
            req = req.set(k, v);
        }
        respond(req.call())
    }
}

fn respond(r: Result<ureq::Response, ureq::Error>) -> (u16, String) {
    match r {
        Ok(resp) => (resp.status(), resp.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap_or_default()),
        Err(e) => panic!("transport error: {e}"),
    }
}

pub fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}
