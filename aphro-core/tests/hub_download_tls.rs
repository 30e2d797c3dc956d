//! Hub downloads (hf-hub, through `Model::load`'s `resolve_hub`) trust a CA named by
//! `SSL_CERT_FILE`: hf-hub's agents use ureq's default TLS config, which the workspace builds
//! with `native-certs`. That config is loaded once per process, so this file holds one test
//! that sets the variables before anything touches ureq.
use aphro_core::model::{resolve_hub, LoadOptions};
use std::collections::HashMap;
use tls_support::{ca, serve_https, server_config, Route};

mod tls_support;

#[test]
fn hub_download_trusts_ssl_cert_file() {
    let (ca_issuer, ca_pem) = ca("aphro test hub CA");
    let dir = tempfile::tempdir().expect("tmp");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).expect("write ca");

    let tokenizer = br#"{"version":"1.0","model":{"type":"BPE"}}"#.to_vec();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let route = Route {
        headers: vec![
            ("ETag", "\"tokenizer-etag\"".to_owned()),
            ("X-Repo-Commit", commit.to_owned()),
            ("Content-Range", format!("bytes 0-0/{}", tokenizer.len())),
        ],
        ..Route::new("application/json", tokenizer.clone())
    };
    let routes = HashMap::from([("/org/tiny/resolve/main/tokenizer.json".to_owned(), route)]);
    let port = serve_https(server_config(&ca_issuer), routes);

    for k in [
        "https_proxy",
        "HTTPS_PROXY",
        "http_proxy",
        "HTTP_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "HF_HUB_OFFLINE",
        "SSL_CERT_DIR",
    ] {
        std::env::remove_var(k);
    }
    std::env::set_var("SSL_CERT_FILE", &ca_file);
    std::env::set_var("HF_ENDPOINT", format!("https://127.0.0.1:{port}"));

    let opts = LoadOptions {
        hub_cache: Some(dir.path().join("hub")),
        ..LoadOptions::default()
    };
    let snapshot = resolve_hub("org/tiny", &opts).unwrap_or_else(|e| panic!("{e}"));
    assert!(snapshot.ends_with(commit), "{}", snapshot.display());
    let got = std::fs::read(snapshot.join("tokenizer.json")).expect("tokenizer.json");
    assert_eq!(got, tokenizer);
}
