//! Shared test helpers: the asset cache and the repo's testdata.
#![allow(dead_code)]
use std::path::PathBuf;

/// `APHRO_ASSETS` if set, else `<workspace>/.assets`.
pub fn assets_dir() -> PathBuf {
    std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")))
}

/// Path of an asset; panics with the fix if it is missing (never skip silently).
pub fn asset(rel: &str) -> PathBuf {
    let p = assets_dir().join(rel);
    assert!(
        p.exists(),
        "test asset {} is missing: run `python3 scripts/fetch_assets.py` (or set APHRO_ASSETS)",
        p.display()
    );
    p
}

pub fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata")).join(rel)
}

pub const SMOLLM2_GGUF: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
