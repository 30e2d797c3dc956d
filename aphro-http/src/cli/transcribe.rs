//! `aphro transcribe --model M FILE`: one audio file to text on a speech model, offline — the
//! same decode, options and response bodies as `/v1/audio/transcriptions`
//! (`aphro_engine::transcription`), without a server.
use anyhow::Context;
use aphro_core::audio::format::ResponseFormat;
use aphro_engine::speech::{TranscribeOptions, Transcriber, TranscriberConfig};
use aphro_engine::transcription::{decode_upload, render, TranscriptionBody, UploadLimits};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A speech model folder (Whisper, CTranslate2 or HF layout).
    #[arg(long)]
    pub model: String,
    /// The audio file: WAV, FLAC, MP3 or Ogg Vorbis.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// json, text, verbose_json, srt or vtt.
    #[arg(long, default_value = "text")]
    pub response_format: String,
    /// ISO-639-1 code of the spoken language (default: the model's detection).
    #[arg(long)]
    pub language: Option<String>,
    /// Text the transcript continues from.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Threads the model computes on (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the model runs: `auto` (CUDA when built in and usable, else the CPU), `cpu`,
    /// `cuda` or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub device: aphro_engine::backend::Device,
    /// Benchmark: after one warm-up run, time N more and print the fastest compute time and
    /// the real-time factor (audio seconds per compute second) as JSON on stderr.
    #[arg(long, value_name = "N")]
    pub bench_runs: Option<usize>,
    /// Benchmark: each timed run transcribes the file this many times at once, on as many
    /// threads (their decoding steps are batched); the real-time factor is then the audio of
    /// all copies over the wall time.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "bench_runs")]
    pub bench_concurrency: usize,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let format = ResponseFormat::parse(&args.response_format).map_err(anyhow::Error::msg)?;
    let dir = aphro_engine::model::resolve_model_path(Path::new(&args.model))?;
    let transcriber = Transcriber::load(
        &dir,
        TranscriberConfig {
            num_threads: args.threads,
            device: args.device,
        },
    )
    .with_context(|| format!("loading speech model `{}`", args.model))?;
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let name = args.file.file_name().and_then(|n| n.to_str());
    let limits = UploadLimits {
        max_filesize_mb: f64::INFINITY,
        max_duration_s: None,
    };
    let audio = decode_upload(&bytes, name, &limits)?;
    let options = TranscribeOptions {
        language: args.language.clone(),
        prompt: args.prompt.clone(),
        ..TranscribeOptions::default()
    };
    let mut transcription = transcriber.transcribe(&audio.samples, &options)?;
    if let Some(runs) = args.bench_runs {
        let copies = args.bench_concurrency.max(1);
        let mut best = f64::INFINITY;
        for _ in 0..runs.max(1) {
            let t0 = Instant::now();
            let results: Vec<_> = std::thread::scope(|scope| {
                let runs: Vec<_> = (0..copies)
                    .map(|_| scope.spawn(|| transcriber.transcribe(&audio.samples, &options)))
                    .collect();
                runs.into_iter()
                    .map(|r| r.join().expect("a transcription thread panicked"))
                    .collect()
            });
            best = best.min(t0.elapsed().as_secs_f64());
            for r in results {
                transcription = r?;
            }
        }
        let stats = transcriber.batch_stats();
        let audio_s = audio.duration_s * copies as f64;
        eprintln!(
            "{}",
            serde_json::json!({
                "audio_s": audio_s,
                "compute_s": best,
                "rtf": audio_s / best,
                "threads": args.threads,
                "concurrency": copies,
                "batched_steps": stats.steps,
                "batched_tokens": stats.tokens,
                "largest_batch": stats.largest,
            })
        );
    }
    let mut out = std::io::stdout().lock();
    match render(&transcription, format, true) {
        TranscriptionBody::Json(v) => writeln!(out, "{v}")?,
        TranscriptionBody::Text { body, .. } if format == ResponseFormat::Text => {
            writeln!(out, "{}", body.trim())?
        }
        TranscriptionBody::Text { body, .. } => write!(out, "{body}")?,
    }
    Ok(ExitCode::SUCCESS)
}
