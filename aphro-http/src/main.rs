//! The `aphro` binary: a thin shell over the library crates.
use clap::Parser;
use std::process::ExitCode;

/// mimalloc returns freed pages to the OS shortly after a large request ends; glibc's malloc
/// keeps them in per-thread arenas, so RSS would stay at its peak after a burst.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    aphro_http::logging::init();
    let cli = aphro_http::cli::Cli::parse();
    match aphro_http::cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
