//! Image URLs other than `data:` URLs, loaded as vLLM 0.33.0's `MediaConnector.load_from_url`
//! loads them (`vllm/multimodal/media/connector.py`, `vllm/connections.py`), with vLLM's flags,
//! environment variables, statuses and messages:
//!
//! - `http(s)` from the hosts of `--allowed-media-domains` only. Unlike vLLM, which fetches from
//!   anywhere when the flag is unset, aphro fetches nothing then (a render server that fetches
//!   what clients name is an SSRF hole); `*` opts into any host. Redirects are followed
//!   (`VLLM_MEDIA_URL_ALLOW_REDIRECTS`) and each target is checked against the list too.
//! - Each attempt has `VLLM_IMAGE_FETCH_TIMEOUT` seconds (default 5) for the whole response;
//!   transient failures (timeouts, connection errors, 5xx, 408, 429) are retried up to
//!   `VLLM_MEDIA_FETCH_MAX_RETRIES` attempts (default 3), each with 4× the timeout of the last,
//!   after sleeping 4^attempt s, and then answer 500 as in vLLM.
//! - A download is capped at `VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB` (default 256): over it, and on a
//!   4xx answer, 422 `Failed to fetch media from URL: …`.
//! - `file://` under `--allowed-local-media-path` only.
use super::image_io::{decode_data_url, EncodedImage};
use crate::error::{Error, Result};
use crate::http_client::HttpClient;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// vLLM's `_RETRY_BACKOFF_FACTOR`: timeout and sleep grow by this per retry.
const RETRY_BACKOFF_FACTOR: u32 = 4;
/// aiohttp's default `max_redirects`.
const MAX_REDIRECTS: usize = 10;
const MIB: u64 = 1024 * 1024;

/// Where and how image URLs may be loaded from (vLLM's flags and environment variables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaFetchOptions {
    /// `--allowed-media-domains`: hosts (exact, lowercase) http(s) images may come from;
    /// `*` allows any. Empty: http(s) fetching is off.
    pub allowed_media_domains: Vec<String>,
    /// `--allowed-local-media-path`: the directory `file://` images may come from.
    pub allowed_local_media_path: Option<PathBuf>,
    /// `VLLM_IMAGE_FETCH_TIMEOUT`: the first attempt's time limit.
    pub timeout: Duration,
    /// `VLLM_MEDIA_FETCH_MAX_RETRIES`: attempts in all (at least one).
    pub max_attempts: u32,
    /// `VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB`; 0 means no limit.
    pub max_download_mb: u64,
    /// `VLLM_MEDIA_URL_ALLOW_REDIRECTS`.
    pub allow_redirects: bool,
}

impl Default for MediaFetchOptions {
    /// vLLM's defaults, with fetching off.
    fn default() -> Self {
        MediaFetchOptions {
            allowed_media_domains: Vec::new(),
            allowed_local_media_path: None,
            timeout: Duration::from_secs(5),
            max_attempts: 3,
            max_download_mb: 256,
            allow_redirects: true,
        }
    }
}

impl MediaFetchOptions {
    /// The defaults with vLLM's environment variables applied (unparsable values are an error
    /// naming the variable).
    pub fn from_env() -> std::result::Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    fn from_lookup(env: impl Fn(&str) -> Option<String>) -> std::result::Result<Self, String> {
        let int = |name: &str| -> std::result::Result<Option<i64>, String> {
            env(name)
                .map(|v| {
                    v.trim()
                        .parse::<i64>()
                        .map_err(|_| format!("{name}={v:?} is not an integer"))
                })
                .transpose()
        };
        let mut o = Self::default();
        if let Some(t) = int("VLLM_IMAGE_FETCH_TIMEOUT")? {
            o.timeout = Duration::from_secs(t.max(0) as u64);
        }
        if let Some(n) = int("VLLM_MEDIA_FETCH_MAX_RETRIES")? {
            o.max_attempts = n.max(1) as u32;
        }
        if let Some(mb) = int("VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB")? {
            o.max_download_mb = mb.max(0) as u64;
        }
        if let Some(r) = int("VLLM_MEDIA_URL_ALLOW_REDIRECTS")? {
            o.allow_redirects = r != 0;
        }
        Ok(o)
    }
}

/// Loads image URLs: `data:` URLs always, the rest as [`MediaFetchOptions`] allow.
#[derive(Clone)]
pub struct MediaFetcher {
    options: MediaFetchOptions,
    client: Option<HttpClient>,
}

impl std::fmt::Debug for MediaFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaFetcher")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// How one fetch attempt failed: worth another attempt or not.
enum Failure {
    Transient(Error),
    Permanent(Error),
}

impl MediaFetcher {
    /// Builds the HTTP client (trust roots, proxies) when any domain is allowed. The local
    /// media path must be an existing directory, as vLLM checks at startup.
    pub fn new(mut options: MediaFetchOptions) -> Result<Self> {
        for d in &mut options.allowed_media_domains {
            *d = d.trim().to_ascii_lowercase();
        }
        if let Some(p) = &options.allowed_local_media_path {
            let resolved = p.canonicalize().map_err(|_| {
                Error::ModelFiles(format!(
                    "Invalid `--allowed-local-media-path`: The path {} does not exist.",
                    p.display()
                ))
            })?;
            if !resolved.is_dir() {
                return Err(Error::ModelFiles(format!(
                    "Invalid `--allowed-local-media-path`: The path {} must be a directory.",
                    resolved.display()
                )));
            }
            options.allowed_local_media_path = Some(resolved);
        }
        let client = if options.allowed_media_domains.is_empty() {
            None
        } else {
            Some(HttpClient::from_env().map_err(|e| Error::ModelFiles(e.to_string()))?)
        };
        Ok(MediaFetcher { options, client })
    }

    pub fn options(&self) -> &MediaFetchOptions {
        &self.options
    }

    /// The image file an `image_url` names.
    pub fn load(&self, url: &str) -> Result<EncodedImage> {
        load_image_url(url, Some(self))
    }

    fn check_domain(&self, url: &url::Url) -> Result<()> {
        let domains = &self.options.allowed_media_domains;
        let host = host_of(url);
        if domains.iter().any(|d| d == "*" || *d == host) {
            return Ok(());
        }
        // vLLM prints the Python list.
        let list: Vec<String> = domains.iter().map(|d| format!("'{d}'")).collect();
        Err(Error::bad_request(format!(
            "The URL must be from one of the allowed domains: [{}]. Input URL domain: {host}",
            list.join(", ")
        )))
    }

    fn fetch_http(&self, url: &str) -> Result<Vec<u8>> {
        let mut attempt = 0u32;
        loop {
            let timeout = self
                .options
                .timeout
                .saturating_mul(RETRY_BACKOFF_FACTOR.saturating_pow(attempt));
            match self.fetch_once(url, timeout) {
                Ok(bytes) => return Ok(bytes),
                Err(Failure::Permanent(e)) => return Err(e),
                Err(Failure::Transient(e)) if attempt + 1 >= self.options.max_attempts.max(1) => {
                    return Err(e)
                }
                Err(Failure::Transient(_)) => {
                    std::thread::sleep(Duration::from_secs(
                        u64::from(RETRY_BACKOFF_FACTOR).saturating_pow(attempt),
                    ));
                    attempt += 1;
                }
            }
        }
    }

    /// One attempt: the request and every redirect within `timeout`.
    fn fetch_once(
        &self,
        original: &str,
        timeout: Duration,
    ) -> std::result::Result<Vec<u8>, Failure> {
        let Some(client) = &self.client else {
            return Err(Failure::Permanent(fetching_off()));
        };
        let deadline = Instant::now() + timeout;
        let timed_out = || {
            Failure::Transient(Error::MediaFetch(format!(
                "Timed out fetching media from URL {original}: no complete response within {}s \
                 (VLLM_IMAGE_FETCH_TIMEOUT)",
                timeout.as_secs_f64()
            )))
        };
        let mut current = parse(original).map_err(Failure::Permanent)?;
        for _ in 0..=MAX_REDIRECTS {
            self.check_domain(&current).map_err(Failure::Permanent)?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(timed_out());
            }
            let resp = match client.get_bounded(current.as_str(), remaining).call() {
                Ok(r) => r,
                Err(ureq::Error::Status(code, r)) => {
                    return Err(status_failure(original, code, r.status_text()))
                }
                Err(e @ ureq::Error::Transport(_)) => {
                    if is_timeout(&e) {
                        return Err(timed_out());
                    }
                    return Err(Failure::Transient(Error::MediaFetch(format!(
                        "Cannot fetch media from URL {original}: {}",
                        client.describe(&e)
                    ))));
                }
            };
            if (300..400).contains(&resp.status()) {
                let location = resp.header("location").map(str::to_owned);
                match location {
                    Some(loc) if self.options.allow_redirects => {
                        current = current.join(&loc).map_err(|_| {
                            Failure::Permanent(unprocessable(original, "Invalid URL".into()))
                        })?;
                        continue;
                    }
                    // Not following: the 3xx itself is the (non-error) answer, whose body is
                    // no image; aiohttp's `raise_for_status` lets it pass the same way.
                    _ => {
                        return self
                            .read_body(original, resp)
                            .map_err(|e| map_read(e, &timed_out))
                    }
                }
            }
            return self
                .read_body(original, resp)
                .map_err(|e| map_read(e, &timed_out));
        }
        Err(Failure::Permanent(unprocessable(
            original,
            format!("Too many redirects (more than {MAX_REDIRECTS})"),
        )))
    }

    /// The body, refused as soon as it is known to exceed the download limit.
    fn read_body(
        &self,
        url: &str,
        resp: ureq::Response,
    ) -> std::result::Result<Vec<u8>, ReadError> {
        let limit = (self.options.max_download_mb > 0).then(|| self.options.max_download_mb * MIB);
        let too_big = |received: u64| {
            ReadError::Refused(unprocessable(
                url,
                format!(
                    "Remote media download exceeds VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB={} \
                     (received at least {received} bytes)",
                    self.options.max_download_mb
                ),
            ))
        };
        if let (Some(limit), Some(len)) = (
            limit,
            resp.header("content-length")
                .and_then(|v| v.trim().parse::<u64>().ok()),
        ) {
            if len > limit {
                return Err(too_big(len));
            }
        }
        let mut out = Vec::new();
        let reader = resp.into_reader();
        let read = match limit {
            Some(limit) => reader.take(limit + 1).read_to_end(&mut out),
            None => { reader }.read_to_end(&mut out),
        };
        read.map_err(ReadError::Io)?;
        if let Some(limit) = limit {
            if out.len() as u64 > limit {
                return Err(too_big(out.len() as u64));
            }
        }
        Ok(out)
    }

    fn load_file(&self, url: &url::Url) -> Result<EncodedImage> {
        let Some(allowed) = &self.options.allowed_local_media_path else {
            return Err(local_files_off());
        };
        // `url2pathname(netloc + path)`: the host part, if any, joins the path.
        let raw = format!(
            "{}{}",
            url.host_str().unwrap_or(""),
            percent_decode(url.path())
        );
        let path = PathBuf::from(&raw);
        let inside = path
            .canonicalize()
            .ok()
            .is_some_and(|p| p.ancestors().skip(1).any(|a| a == allowed.as_path()));
        if !inside {
            return Err(Error::bad_request(format!(
                "The file path {raw} must be a subpath of `--allowed-local-media-path {}`.",
                allowed.display()
            )));
        }
        read_file(&path)
    }
}

enum ReadError {
    Refused(Error),
    Io(std::io::Error),
}

fn map_read(e: ReadError, timed_out: &dyn Fn() -> Failure) -> Failure {
    match e {
        ReadError::Refused(e) => Failure::Permanent(e),
        ReadError::Io(io) if is_io_timeout(&io) => timed_out(),
        ReadError::Io(io) => Failure::Transient(Error::MediaFetch(format!(
            "Cannot read media from URL: {io}"
        ))),
    }
}

fn is_io_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    )
}

fn is_timeout(e: &ureq::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(is_io_timeout)
        {
            return true;
        }
        cur = err.source();
    }
    e.to_string().contains("timed out")
}

/// aiohttp's `raise_for_status` outcome as vLLM's `_wrap_media_fetch_error` sorts it.
fn status_failure(url: &str, code: u16, reason: &str) -> Failure {
    if code >= 500 || code == 408 || code == 429 {
        // aiohttp's `ClientResponseError` text, which vLLM passes through.
        Failure::Transient(Error::MediaFetch(format!(
            "{code}, message='{reason}', url='{url}'"
        )))
    } else {
        Failure::Permanent(unprocessable(url, format!("HTTP {code} error")))
    }
}

/// vLLM's `VLLMUnprocessableEntityError("Failed to fetch media from URL: …",
/// parameter="image_url", value=url)`.
fn unprocessable(url: &str, what: String) -> Error {
    Error::Unprocessable {
        message: format!(
            "Failed to fetch media from URL: {what} (parameter=image_url, value={url})"
        ),
        param: Some("image_url".into()),
    }
}

fn fetching_off() -> Error {
    Error::MediaFetch(
        "Cannot load media from http(s) URLs without `--allowed-media-domains`: start the \
         server with --allowed-media-domains <host>... to fetch images from those hosts, or send \
         the image as a base64 data: URL."
            .into(),
    )
}

fn local_files_off() -> Error {
    // vLLM's `RuntimeError` (a 500).
    Error::MediaFetch("Cannot load local files without `--allowed-local-media-path`.".into())
}

fn parse(url: &str) -> Result<url::Url> {
    url::Url::parse(url)
        .map_err(|_| Error::bad_request("The URL must be either a HTTP, data or file URL."))
}

/// urllib3's `hostname`: lowercase, IPv6 in brackets.
fn host_of(url: &url::Url) -> String {
    match url.host() {
        Some(url::Host::Ipv6(a)) => format!("[{a}]"),
        Some(h) => h.to_string().to_ascii_lowercase(),
        None => String::new(),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read_file(path: &Path) -> Result<EncodedImage> {
    std::fs::read(path)
        .map(|bytes| EncodedImage { bytes })
        .map_err(|e| Error::MediaFetch(format!("{e}: '{}'", path.display())))
}

/// The image file an `image_url` names: a `data:` URL always; `http(s)` and `file` URLs
/// through `fetcher` (`None`: neither is allowed).
pub fn load_image_url(url: &str, fetcher: Option<&MediaFetcher>) -> Result<EncodedImage> {
    if url.len() >= 5 && url[..5].eq_ignore_ascii_case("data:") {
        return decode_data_url(&format!("data:{}", &url[5..]));
    }
    let parsed = parse(url)?;
    match parsed.scheme() {
        "http" | "https" => {
            let Some(f) = fetcher.filter(|f| f.client.is_some()) else {
                return Err(fetching_off());
            };
            f.check_domain(&parsed)?;
            f.fetch_http(url).map(|bytes| EncodedImage { bytes })
        }
        "file" => match fetcher {
            Some(f) => f.load_file(&parsed),
            None => Err(local_files_off()),
        },
        _ => Err(Error::bad_request(
            "The URL must be either a HTTP, data or file URL.",
        )),
    }
}

/// Whether loading `url` may go to the network or the disk (not a `data:` URL): such a
/// request belongs on a blocking thread, not an async reactor.
pub fn is_remote_url(url: &str) -> bool {
    !(url.len() >= 5 && url[..5].eq_ignore_ascii_case("data:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_variables_are_vllms() {
        let env = |k: &str| match k {
            "VLLM_IMAGE_FETCH_TIMEOUT" => Some("2".to_owned()),
            "VLLM_MEDIA_FETCH_MAX_RETRIES" => Some("0".to_owned()),
            "VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB" => Some("7".to_owned()),
            "VLLM_MEDIA_URL_ALLOW_REDIRECTS" => Some("0".to_owned()),
            _ => None,
        };
        let o = MediaFetchOptions::from_lookup(env).expect("valid");
        assert_eq!(o.timeout, Duration::from_secs(2));
        assert_eq!(o.max_attempts, 1);
        assert_eq!(o.max_download_mb, 7);
        assert!(!o.allow_redirects);
        let bad = MediaFetchOptions::from_lookup(|k| {
            (k == "VLLM_IMAGE_FETCH_TIMEOUT").then(|| "soon".to_owned())
        });
        assert!(bad
            .expect_err("not an int")
            .contains("VLLM_IMAGE_FETCH_TIMEOUT"));
        assert_eq!(
            MediaFetchOptions::from_lookup(|_| None).expect("defaults"),
            MediaFetchOptions::default()
        );
    }

    #[test]
    fn urls_without_a_fetcher_are_refused_as_vllm_words_it() {
        let e = load_image_url("https://example.com/cat.png", None).expect_err("off");
        assert_eq!(e.status(), 500);
        assert!(e.to_string().contains("--allowed-media-domains"), "{e}");
        let e = load_image_url("file:///etc/passwd", None).expect_err("off");
        assert_eq!(
            (e.status(), e.to_string().as_str()),
            (
                500,
                "Cannot load local files without `--allowed-local-media-path`."
            )
        );
        let e = load_image_url("ftp://example.com/cat.png", None).expect_err("scheme");
        assert_eq!(
            (e.status(), e.to_string().as_str()),
            (400, "The URL must be either a HTTP, data or file URL.")
        );
        assert!(load_image_url("DATA:image/png;base64,aGVsbG8=", None).is_ok());
    }

    #[test]
    fn local_files_only_under_the_allowed_path() {
        let dir = std::env::temp_dir().join(format!("aphro-media-{}", std::process::id()));
        let inside = dir.join("ok");
        std::fs::create_dir_all(&inside).expect("dir");
        std::fs::write(inside.join("img.png"), b"png bytes").expect("file");
        std::fs::write(dir.join("secret.png"), b"secret").expect("file");
        let f = MediaFetcher::new(MediaFetchOptions {
            allowed_local_media_path: Some(inside.clone()),
            ..MediaFetchOptions::default()
        })
        .expect("fetcher");
        let got = f
            .load(&format!("file://{}", inside.join("img.png").display()))
            .expect("inside");
        assert_eq!(got.bytes, b"png bytes");
        let escape = format!("file://{}/../secret.png", inside.display());
        let e = f.load(&escape).expect_err("outside");
        assert_eq!(e.status(), 400);
        assert!(
            e.to_string()
                .contains("must be a subpath of `--allowed-local-media-path"),
            "{e}"
        );
        // Fetching over http stays off: no domain was allowed.
        assert_eq!(
            f.load("http://127.0.0.1:1/x.png")
                .expect_err("off")
                .status(),
            500
        );
        let missing = MediaFetcher::new(MediaFetchOptions {
            allowed_local_media_path: Some(dir.join("nope")),
            ..MediaFetchOptions::default()
        });
        assert!(missing
            .expect_err("no dir")
            .to_string()
            .contains("does not exist"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
