//! The `aphro` binary: a thin shell over the library crates.
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = aphro_http::cli::Cli::parse();
    match aphro_http::cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
