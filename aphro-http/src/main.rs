//! The `aphro` binary: a thin shell over the library crates.
use clap::Parser;
use std::process::ExitCode;

fn init_logging() {
    // `RUST_LOG` filters (default: info for aphro, warn elsewhere); `APHRO_LOG_FORMAT=json`
    // switches to one JSON object per line for log pipelines. Logs go to stderr so stdout stays
    // the command's output (the offline commands print JSON there).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,aphro_http=info,aphro_engine=info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("APHRO_LOG_FORMAT").is_ok_and(|v| v == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    init_logging();
    let cli = aphro_http::cli::Cli::parse();
    match aphro_http::cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
