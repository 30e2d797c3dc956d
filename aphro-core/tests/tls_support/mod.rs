//! A throwaway CA, an HTTPS server on 127.0.0.1 whose certificate it signs, and a CONNECT
//! proxy: the pieces of the TLS download tests.
#![allow(dead_code)] // each test file uses a different subset

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One response of [`serve_https`]: content type, body, extra headers.
pub struct Route {
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

impl Route {
    pub fn new(content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            content_type,
            body: body.into(),
            headers: Vec::new(),
        }
    }
}

pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A self-signed CA; `server` also gets a certificate for 127.0.0.1 / localhost signed by it.
pub fn ca(name: &str) -> (rcgen::CertifiedIssuer<'static, rcgen::KeyPair>, String) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let key = rcgen::KeyPair::generate().expect("ca key");
    let issuer = rcgen::CertifiedIssuer::self_signed(params, key).expect("ca cert");
    let pem = issuer.pem();
    (issuer, pem)
}

pub fn server_config(issuer: &rcgen::Issuer<'_, rcgen::KeyPair>) -> Arc<rustls::ServerConfig> {
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".into()])
        .expect("server params");
    let key = rcgen::KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, issuer).expect("server cert");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_no_client_auth()
    .with_single_cert(vec![CertificateDer::from(cert.der().to_vec())], key)
    .expect("server config");
    Arc::new(config)
}

/// Serves `routes` (by path) over HTTPS on 127.0.0.1, one thread per
/// connection, `Connection: close`. Returns the port; the server lives until the process ends.
pub fn serve_https(config: Arc<rustls::ServerConfig>, routes: HashMap<String, Route>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let routes = Arc::new(routes);
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (config, routes) = (config.clone(), routes.clone());
            std::thread::spawn(move || {
                // A client that rejects the certificate ends the handshake: not our problem.
                let _ = handle(config, &routes, tcp);
            });
        }
    });
    port
}

fn handle(
    config: Arc<rustls::ServerConfig>,
    routes: &HashMap<String, Route>,
    tcp: TcpStream,
) -> std::io::Result<()> {
    let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tls.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let target = head.split_whitespace().nth(1).unwrap_or("/");
    // Absolute form (`https://host:port/path`), which ureq sends through a proxy tunnel and
    // servers must accept (RFC 9112 §3.2.2).
    let path = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    }
    .to_owned();
    let not_found = Route::new("text/plain", "not found");
    let (status, route) = match routes.get(&path) {
        Some(route) => ("200 OK", route),
        None => ("404 Not Found", &not_found),
    };
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        route.content_type,
        route.body.len()
    );
    for (k, v) in &route.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    tls.write_all(head.as_bytes())?;
    tls.write_all(&route.body)?;
    tls.flush()?;
    tls.conn.send_close_notify();
    tls.flush()?;
    Ok(())
}

/// A plain HTTP CONNECT proxy on 127.0.0.1; records each CONNECT target.
pub fn serve_connect_proxy() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || {
                let _ = tunnel(client, &log);
            });
        }
    });
    (port, seen)
}

fn tunnel(client: TcpStream, log: &Mutex<Vec<String>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["CONNECT", target, _] => target.to_owned(),
        _ => return Ok(()),
    };
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
    }
    log.lock().expect("log").push(target.clone());
    let upstream = TcpStream::connect(&target)?;
    let mut client_w = client.try_clone()?;
    client_w.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    let (mut up_r, mut up_w) = (upstream.try_clone()?, upstream);
    let down = std::thread::spawn(move || {
        let _ = std::io::copy(&mut up_r, &mut client_w);
        let _ = client_w.shutdown(Shutdown::Write);
    });
    // Bytes the BufReader already pulled in belong to the tunnel too.
    up_w.write_all(reader.buffer())?;
    let mut rest = reader.into_inner();
    let _ = std::io::copy(&mut rest, &mut up_w);
    let _ = up_w.shutdown(Shutdown::Write);
    let _ = down.join();
    Ok(())
}
