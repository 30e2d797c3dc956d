//! The one HTTP client aphro builds for downloads (the default model's index and wheel,
//! image URLs of multimodal requests).
//!
//! Where aphro runs, the network is often a corporate or sandbox egress: a proxy named by
//! `HTTPS_PROXY`, or a TLS-inspecting proxy whose CA only the system trust store knows. So
//! the client trusts, like curl and pip do:
//!
//! - the platform store, or instead the files named by `SSL_CERT_FILE` / `SSL_CERT_DIR` when
//!   either is set (OpenSSL's convention, read by `rustls-native-certs`);
//! - plus the bundled Mozilla roots (`webpki-roots`), so public hosts work where the platform
//!   store is empty or missing;
//!
//! and sends requests through the proxy of `https_proxy` / `HTTPS_PROXY` (`http_proxy` /
//! `HTTP_PROXY` for plain-HTTP URLs), else `all_proxy` / `ALL_PROXY`, unless the host matches
//! `no_proxy` / `NO_PROXY`.
//!
//! Hub downloads go through hf-hub, which builds its own ureq agents; the workspace enables
//! ureq's `native-certs` feature so those trust the platform store / `SSL_CERT_FILE` too, and
//! hf-hub reads the proxy variables itself (not `NO_PROXY`).
use std::sync::Arc;
use std::time::Duration;

/// A download client: one TLS configuration, the proxy settings read once from the
/// environment. Build it with [`HttpClient::from_env`].
#[derive(Clone)]
pub struct HttpClient {
    tls: Arc<rustls::ClientConfig>,
    proxies: Proxies,
    /// Problems met while loading the platform / `SSL_CERT_*` roots, for error messages.
    root_problems: Vec<String>,
}

#[derive(Clone, Default)]
struct Proxies {
    https: Option<ureq::Proxy>,
    http: Option<ureq::Proxy>,
    no_proxy: NoProxy,
}

/// The client could not be set up (a proxy variable that is not a proxy URL).
#[derive(Debug, thiserror::Error)]
#[error("{var}={value:?} is not a usable proxy URL: {detail}")]
pub struct ProxyConfigError {
    pub var: &'static str,
    pub value: String,
    pub detail: String,
}

impl HttpClient {
    /// The client every aphro download uses: trust roots and proxies from the environment.
    pub fn from_env() -> Result<Self, ProxyConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Self, ProxyConfigError> {
        let (roots, root_problems) = trust_roots();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ProxyConfigError {
            var: "(tls)",
            value: String::new(),
            detail: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Self {
            tls: Arc::new(tls),
            proxies: Proxies::from_lookup(env)?,
            root_problems,
        })
    }

    /// A GET request for `url`, through the proxy that applies to it.
    pub fn get(&self, url: &str) -> ureq::Request {
        self.agent_for(url).get(url)
    }

    /// A GET request for `url` that gives up once `timeout` has passed in all (DNS, connect,
    /// headers and body) and returns a redirect instead of following it, so the caller can
    /// vet every hop (media fetches check each target against the allowed domains).
    pub fn get_bounded(&self, url: &str, timeout: Duration) -> ureq::Request {
        self.builder_for(url)
            .timeout(timeout)
            .redirects(0)
            .build()
            .get(url)
    }

    fn agent_for(&self, url: &str) -> ureq::Agent {
        self.builder_for(url)
            .timeout_connect(Duration::from_secs(30))
            .timeout_read(Duration::from_secs(120))
            .build()
    }

    fn builder_for(&self, url: &str) -> ureq::AgentBuilder {
        let mut b = ureq::AgentBuilder::new()
            .tls_config(self.tls.clone())
            .user_agent(concat!("aphro/", env!("CARGO_PKG_VERSION")));
        if let Some(p) = self.proxies.for_url(url) {
            b = b.proxy(p.clone());
        }
        b
    }

    /// `err` as one line, with a hint on what to do when the server's certificate was not
    /// trusted (the usual failure behind a TLS-inspecting proxy).
    pub fn describe(&self, err: &ureq::Error) -> String {
        let mut out = err.to_string();
        if is_certificate_error(err) {
            out.push_str(
                " (the server's certificate is not signed by a trusted CA; aphro trusts the system \
                 store, or SSL_CERT_FILE / SSL_CERT_DIR when set, plus the bundled Mozilla roots: \
                 behind a TLS-inspecting proxy set SSL_CERT_FILE to a PEM bundle holding its CA",
            );
            if !self.root_problems.is_empty() {
                out.push_str("; loading the trust store reported: ");
                out.push_str(&self.root_problems.join("; "));
            }
            out.push(')');
        }
        out
    }
}

/// Platform (or `SSL_CERT_FILE` / `SSL_CERT_DIR`) roots plus the bundled ones, and the
/// problems met loading the former.
fn trust_roots() -> (rustls::RootCertStore, Vec<String>) {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let mut problems: Vec<String> = native.errors.iter().map(|e| e.to_string()).collect();
    let (_, bad) = roots.add_parsable_certificates(native.certs);
    if bad > 0 {
        problems.push(format!("{bad} unparsable certificate(s) skipped"));
    }
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    (roots, problems)
}

/// Whether `err` is rustls rejecting the peer's certificate.
fn is_certificate_error(err: &ureq::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        for cand in [Some(e), inner].into_iter().flatten() {
            if let Some(rustls::Error::InvalidCertificate(_)) = cand.downcast_ref::<rustls::Error>()
            {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

impl Proxies {
    fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Self, ProxyConfigError> {
        // Lower case first, as curl and Python do; empty values count as unset.
        let pick = |names: &[&'static str]| {
            names.iter().find_map(|&n| {
                env(n)
                    .map(|v| v.trim().to_owned())
                    .filter(|v| !v.is_empty())
                    .map(|v| (n, v))
            })
        };
        let parse = |found: Option<(&'static str, String)>| {
            found
                .map(|(var, value)| {
                    ureq::Proxy::new(&value).map_err(|e| ProxyConfigError {
                        var,
                        detail: e.to_string(),
                        value,
                    })
                })
                .transpose()
        };
        let all = ["all_proxy", "ALL_PROXY"];
        let https = pick(&["https_proxy", "HTTPS_PROXY"]).or_else(|| pick(&all));
        let http = pick(&["http_proxy", "HTTP_PROXY"]).or_else(|| pick(&all));
        Ok(Self {
            https: parse(https)?,
            http: parse(http)?,
            no_proxy: NoProxy::parse(&pick(&["no_proxy", "NO_PROXY"]).unwrap_or_default().1),
        })
    }

    fn for_url(&self, url: &str) -> Option<&ureq::Proxy> {
        let (scheme, host) = scheme_and_host(url)?;
        if self.no_proxy.matches(&host) {
            return None;
        }
        if scheme.eq_ignore_ascii_case("https") {
            self.https.as_ref()
        } else {
            self.http.as_ref()
        }
    }
}

/// `NO_PROXY`: comma-separated host names (matching themselves and their subdomains; a
/// leading `.` or `*.` is allowed), IP addresses, or `*` for every host.
#[derive(Clone, Default, Debug)]
struct NoProxy {
    all: bool,
    hosts: Vec<String>,
}

impl NoProxy {
    fn parse(s: &str) -> Self {
        let mut out = Self::default();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == "*" {
                out.all = true;
                continue;
            }
            let entry = entry.trim_start_matches("*.").trim_start_matches('.');
            // `host:port` entries: the port is ignored (aphro only talks to default ports).
            let entry = match entry.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') && p.chars().all(|c| c.is_ascii_digit()) => h,
                _ => entry,
            };
            let entry = entry.trim_start_matches('[').trim_end_matches(']');
            out.hosts.push(entry.to_ascii_lowercase());
        }
        out
    }

    fn matches(&self, host: &str) -> bool {
        if self.all {
            return true;
        }
        let host = host.to_ascii_lowercase();
        self.hosts.iter().any(|h| {
            host == *h
                || (host.len() > h.len()
                    && host.ends_with(h.as_str())
                    && host.as_bytes()[host.len() - h.len() - 1] == b'.')
        })
    }
}

/// `("https", "host")` of `scheme://[user@]host[:port]/...`; IPv6 hosts without brackets.
fn scheme_and_host(url: &str) -> Option<(&str, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        hostport.split(':').next().unwrap_or("")
    };
    Some((scheme, host.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn proxies(vars: &[(&str, &str)]) -> Proxies {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Proxies::from_lookup(|k| env.get(k).cloned()).expect("valid proxies")
    }

    /// The proxy `p` picks for `url`, as the proxy URL it was parsed from.
    fn proxy_of(p: &Proxies, url: &str) -> Option<&'static str> {
        let got = p.for_url(url)?;
        [
            "http://secure:3128",
            "http://any:8080",
            "http://lower:1",
            "http://upper:2",
            "http://proxy:3128",
        ]
        .into_iter()
        .find(|want| ureq::Proxy::new(want).ok().as_ref() == Some(got))
    }

    #[test]
    fn scheme_specific_proxy_wins_over_all_proxy() {
        let p = proxies(&[
            ("HTTPS_PROXY", "http://secure:3128"),
            ("ALL_PROXY", "http://any:8080"),
        ]);
        assert_eq!(
            proxy_of(&p, "https://pypi.org/simple/"),
            Some("http://secure:3128")
        );
        assert_eq!(proxy_of(&p, "http://example.com/"), Some("http://any:8080"));
        let lower = proxies(&[
            ("https_proxy", "http://lower:1"),
            ("HTTPS_PROXY", "http://upper:2"),
        ]);
        assert_eq!(proxy_of(&lower, "https://x/"), Some("http://lower:1"));
        assert!(proxy_of(&proxies(&[]), "https://x/").is_none());
        assert!(proxy_of(&proxies(&[("HTTPS_PROXY", "")]), "https://x/").is_none());
    }

    #[test]
    fn no_proxy_matches_hosts_domains_and_ips() {
        let p = proxies(&[
            ("HTTPS_PROXY", "http://proxy:3128"),
            (
                "NO_PROXY",
                "localhost, .internal.example,127.0.0.1,[::1],mirror.lan:8443",
            ),
        ]);
        for direct in [
            "https://localhost:8443/x",
            "https://a.internal.example/",
            "https://internal.example/",
            "https://127.0.0.1:4443/simple/",
            "https://[::1]:4443/",
            "https://user@MIRROR.lan/simple",
        ] {
            assert!(proxy_of(&p, direct).is_none(), "{direct}");
        }
        for proxied in [
            "https://pypi.org/simple/",
            "https://notinternal.example/",
            "https://127.0.0.10/",
        ] {
            assert!(proxy_of(&p, proxied).is_some(), "{proxied}");
        }
        let all = proxies(&[("HTTPS_PROXY", "http://proxy:3128"), ("no_proxy", "*")]);
        assert!(proxy_of(&all, "https://pypi.org/").is_none());
    }

    #[test]
    fn a_bad_proxy_url_names_the_variable() {
        let env = |k: &str| (k == "HTTPS_PROXY").then(|| "ftp://nope".to_owned());
        let err = Proxies::from_lookup(env)
            .err()
            .expect("ftp is not a proxy scheme");
        assert_eq!(err.var, "HTTPS_PROXY");
        assert!(err.to_string().contains("ftp://nope"), "{err}");
    }
}
