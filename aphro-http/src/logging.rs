//! Log set-up for the `aphro` binary, with client-supplied text made harmless.
//!
//! Request ids, model names and paths come from clients and end up in log lines. A CR/LF in
//! one would forge a second log line, a NUL or an escape sequence would corrupt a terminal or
//! a log shipper. Every byte below 0x20 (and DEL) that is not the line's own final newline is
//! written as an escape instead, whichever event or field it came from.
use std::io::{self, Write};
use tracing_subscriber::fmt::MakeWriter;

/// Wraps a writer; each `write` call carries one formatted event (tracing-subscriber's fmt
/// layer formats an event into a buffer and writes it at once).
pub struct EscapeControls<W>(pub W);

/// Append `line` to `out` with control characters escaped, keeping one final `\n`.
pub fn escape_controls(line: &[u8], out: &mut Vec<u8>) {
    let (body, newline) = match line.strip_suffix(b"\n") {
        Some(b) => (b, true),
        None => (line, false),
    };
    for &b in body {
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0..=0x1f | 0x7f => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            _ => out.push(b),
        }
    }
    if newline {
        out.push(b'\n');
    }
}

impl<W: Write> Write for EscapeControls<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut out = Vec::with_capacity(buf.len() + 8);
        escape_controls(buf, &mut out);
        self.0.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// A [`MakeWriter`] for stderr through [`EscapeControls`].
#[derive(Clone, Copy, Default)]
pub struct SafeStderr;

impl<'a> MakeWriter<'a> for SafeStderr {
    type Writer = EscapeControls<io::Stderr>;
    fn make_writer(&'a self) -> Self::Writer {
        EscapeControls(io::stderr())
    }
}

/// `RUST_LOG` filters (default: info for aphro, warn elsewhere); `APHRO_LOG_FORMAT=json`
/// switches to one JSON object per line for log pipelines. Logs go to stderr so stdout stays
/// the command's output (the offline commands print JSON there). Colours are off: their
/// escape sequences would be escaped like any other control character.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,aphro_http=info,aphro_engine=info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(SafeStderr);
    if std::env::var("APHRO_LOG_FORMAT").is_ok_and(|v| v == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forged_lines_and_control_bytes_are_escaped() {
        let mut out = Vec::new();
        escape_controls(
            b"INFO generate request_id=a\r\nERROR forged\x00\x1b[31m\n",
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            "INFO generate request_id=a\\r\\nERROR forged\\x00\\x1b[31m\n"
        );
    }

    #[test]
    fn a_real_subscriber_writes_one_line_per_event() {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().expect("lock").extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || EscapeControls(Shared(sink.clone())))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(request_id = %"evil\nWARN injected", "generate");
        });
        let text = String::from_utf8(buf.lock().expect("lock").clone()).expect("utf8");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("evil\\nWARN injected"), "{text}");
    }
}
