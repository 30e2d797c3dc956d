//! The default model's download path ([`fetch_pinned`] with [`HttpClient::from_env`]) against
//! a local HTTPS index whose CA is known only through `SSL_CERT_FILE` / `SSL_CERT_DIR`, the
//! situation behind a TLS-inspecting proxy; and through an `HTTPS_PROXY` CONNECT tunnel.
//!
//! These variables are process-global, so this file holds a single test that sets them in
//! turn; no other test shares its process.
use aphro_core::default_model::{fetch_pinned, DefaultModelError, PinnedFile};
use aphro_core::http_client::HttpClient;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;
use tls_support::{ca, hex, serve_connect_proxy, serve_https, server_config, Route};

mod tls_support;

const PROJECT: &str = "tiny-model";
const FILE: &str = "tiny_model-0.1-py3-none-any.whl";

fn set_env(vars: &[(&str, Option<&Path>)]) {
    for (k, v) in vars {
        match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }
}

fn clear_proxy_env() {
    for k in [
        "https_proxy",
        "HTTPS_PROXY",
        "http_proxy",
        "HTTP_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
    ] {
        std::env::remove_var(k);
    }
}

fn fetch(index: &str, file: &PinnedFile<'_>) -> Result<Vec<u8>, DefaultModelError> {
    let client = HttpClient::from_env().expect("client");
    fetch_pinned(&client, index, file)
}

#[test]
fn download_trusts_ssl_cert_file_and_dir_and_uses_https_proxy() {
    let (ca_issuer, ca_pem) = ca("aphro test CA");
    let (_, other_pem) = ca("some other CA");
    let dir = tempfile::tempdir().expect("tmp");
    let ca_file = dir.path().join("ca.pem");
    let other_file = dir.path().join("other.pem");
    std::fs::write(&ca_file, &ca_pem).expect("write ca");
    std::fs::write(&other_file, &other_pem).expect("write other");
    let ca_dir = dir.path().join("certs");
    std::fs::create_dir(&ca_dir).expect("mkdir");
    std::fs::write(ca_dir.join("aphro-test.pem"), &ca_pem).expect("write ca dir");

    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let sha = hex(&Sha256::digest(&payload));
    let index_json = serde_json::json!({
        "meta": {"api-version": "1.1"},
        "name": PROJECT,
        // Relative, as many mirrors list files; resolves to /files/FILE.
        "files": [{"filename": FILE, "url": format!("../../files/{FILE}#sha256={sha}"),
                   "hashes": {"sha256": sha}}],
    });
    let routes = HashMap::from([
        (
            format!("/simple/{PROJECT}/"),
            Route::new(
                "application/vnd.pypi.simple.v1+json",
                index_json.to_string(),
            ),
        ),
        (
            format!("/files/{FILE}"),
            Route::new("application/octet-stream", payload.clone()),
        ),
    ]);
    let port = serve_https(server_config(&ca_issuer), routes);
    let index = format!("https://127.0.0.1:{port}/simple");
    let file = PinnedFile {
        project: PROJECT,
        filename: FILE,
        sha256: &sha,
    };
    clear_proxy_env();

    // The CA is nowhere the client looks: a certificate error that says what to do.
    set_env(&[
        ("SSL_CERT_FILE", Some(other_file.as_path())),
        ("SSL_CERT_DIR", None),
    ]);
    let err = fetch(&index, &file).expect_err("an untrusted CA must be rejected");
    let msg = err.to_string();
    assert!(
        matches!(err, DefaultModelError::Fetch { what: "index", .. }),
        "{msg}"
    );
    assert!(msg.contains("UnknownIssuer"), "{msg}");
    assert!(msg.contains("SSL_CERT_FILE"), "{msg}");
    eprintln!("untrusted CA: {msg}");

    // SSL_CERT_FILE names the CA: the file downloads and its sha256 verifies.
    set_env(&[
        ("SSL_CERT_FILE", Some(ca_file.as_path())),
        ("SSL_CERT_DIR", None),
    ]);
    assert_eq!(
        fetch(&index, &file).expect("download via SSL_CERT_FILE"),
        payload
    );

    // A wrong pin is a checksum error, not a silent success.
    let wrong = PinnedFile {
        sha256: "00",
        ..file
    };
    let err = fetch(&index, &wrong).expect_err("wrong sha256");
    assert!(matches!(err, DefaultModelError::Checksum { .. }), "{err}");

    // SSL_CERT_DIR alone works too.
    set_env(&[
        ("SSL_CERT_FILE", None),
        ("SSL_CERT_DIR", Some(ca_dir.as_path())),
    ]);
    assert_eq!(
        fetch(&index, &file).expect("download via SSL_CERT_DIR"),
        payload
    );

    // Through an HTTPS_PROXY CONNECT tunnel (TLS end to end with the server).
    let (proxy_port, seen) = serve_connect_proxy();
    set_env(&[
        ("SSL_CERT_FILE", Some(ca_file.as_path())),
        ("SSL_CERT_DIR", None),
    ]);
    std::env::set_var("HTTPS_PROXY", format!("http://127.0.0.1:{proxy_port}"));
    assert_eq!(fetch(&index, &file).expect("download via proxy"), payload);
    let targets = seen.lock().expect("log").clone();
    assert_eq!(
        targets,
        vec![format!("127.0.0.1:{port}"); 2],
        "one CONNECT per request"
    );

    // NO_PROXY bypasses it: a dead proxy does not matter for a listed host.
    std::env::set_var("HTTPS_PROXY", "http://127.0.0.1:9");
    std::env::set_var("NO_PROXY", "localhost,127.0.0.1");
    assert_eq!(
        fetch(&index, &file).expect("download bypassing proxy"),
        payload
    );
    clear_proxy_env();
}
