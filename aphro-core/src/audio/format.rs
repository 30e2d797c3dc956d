//! The response formats of `/v1/audio/transcriptions` and `/translations` (`endpoints.md` §6.2,
//! §6.3): the `response_format` field and the subtitle renderers. SRT and WebVTT follow
//! vLLM's later `subtitle_formats.py`: milliseconds rounded with carry, `-->` inside a cue
//! made `->`, and WebVTT's `&` / `<` escaped.
use std::fmt::Write as _;

/// `response_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResponseFormat {
    /// `{"text", "usage"}`.
    #[default]
    Json,
    /// The transcript alone, `text/plain` (as OpenAI's API; vLLM's baseline sends JSON).
    Text,
    /// The text with language, duration and timed segments.
    VerboseJson,
    /// SubRip subtitles.
    Srt,
    /// WebVTT subtitles.
    Vtt,
}

impl ResponseFormat {
    pub const ALL: [ResponseFormat; 5] = [
        ResponseFormat::Json,
        ResponseFormat::Text,
        ResponseFormat::VerboseJson,
        ResponseFormat::Srt,
        ResponseFormat::Vtt,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResponseFormat::Json => "json",
            ResponseFormat::Text => "text",
            ResponseFormat::VerboseJson => "verbose_json",
            ResponseFormat::Srt => "srt",
            ResponseFormat::Vtt => "vtt",
        }
    }

    /// The value, or the pydantic-style message naming the allowed ones.
    pub fn parse(value: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == value)
            .ok_or_else(|| {
                format!(
                    "Input should be 'json', 'text', 'srt', 'verbose_json' or 'vtt' \
                     (parameter=response_format, value={value})"
                )
            })
    }

    /// The body's media type.
    pub fn content_type(self) -> &'static str {
        match self {
            ResponseFormat::Json | ResponseFormat::VerboseJson => "application/json",
            ResponseFormat::Text | ResponseFormat::Srt => "text/plain; charset=utf-8",
            ResponseFormat::Vtt => "text/vtt; charset=utf-8",
        }
    }

    /// Whether the body is built from timed segments.
    pub fn needs_timestamps(self) -> bool {
        matches!(
            self,
            ResponseFormat::VerboseJson | ResponseFormat::Srt | ResponseFormat::Vtt
        )
    }
}

/// `HH:MM:SS<sep>mmm`, milliseconds rounded half away from zero with the carry into the
/// seconds (0.9995 → `00:00:01,000`); negative times clamp to zero.
pub fn timestamp(seconds: f64, ms_sep: char) -> String {
    let total_ms = (seconds.max(0.0) * 1000.0).round() as u64;
    let (h, rest) = (total_ms / 3_600_000, total_ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, ms) = (rest / 1000, rest % 1000);
    format!("{h:02}:{m:02}:{s:02}{ms_sep}{ms:03}")
}

/// SubRip: numbered cues from 1, blocks separated by a blank line, a final newline; `""`
/// when there are no cues.
pub fn srt<'a>(cues: impl IntoIterator<Item = (f64, f64, &'a str)>) -> String {
    let blocks: Vec<String> = cues
        .into_iter()
        .enumerate()
        .map(|(i, (start, end, text))| {
            format!(
                "{}\n{} --> {}\n{}",
                i + 1,
                timestamp(start, ','),
                timestamp(end, ','),
                text.trim().replace("-->", "->")
            )
        })
        .collect();
    if blocks.is_empty() {
        return String::new();
    }
    let mut out = blocks.join("\n\n");
    out.push('\n');
    out
}

/// WebVTT: the `WEBVTT` header, then one block per cue, a final newline.
pub fn vtt<'a>(cues: impl IntoIterator<Item = (f64, f64, &'a str)>) -> String {
    let mut out = String::from("WEBVTT");
    for (start, end, text) in cues {
        let text = text
            .trim()
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace("-->", "->");
        let _ = write!(
            out,
            "\n\n{} --> {}\n{text}",
            timestamp(start, '.'),
            timestamp(end, '.')
        );
    }
    out.push('\n');
    out
}

/// `usage.seconds` of a transcription: the audio's duration rounded up to whole seconds.
pub fn usage_seconds(duration_s: f64) -> u64 {
    duration_s.max(0.0).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_milliseconds_with_carry() {
        assert_eq!(timestamp(11.54, ','), "00:00:11,540");
        assert_eq!(timestamp(0.9995, ','), "00:00:01,000");
        assert_eq!(timestamp(59.9996, '.'), "00:01:00.000");
        assert_eq!(timestamp(3725.0125, '.'), "01:02:05.013");
        assert_eq!(timestamp(-0.5, ','), "00:00:00,000");
    }

    #[test]
    fn srt_blocks_are_numbered_and_escaped() {
        assert_eq!(srt([]), "");
        let out = srt([(0.0, 4.0, " Hello --> world. "), (4.0, 7.5, " Second.")]);
        assert_eq!(
            out,
            "1\n00:00:00,000 --> 00:00:04,000\nHello -> world.\n\n\
             2\n00:00:04,000 --> 00:00:07,500\nSecond.\n"
        );
    }

    #[test]
    fn vtt_has_its_header_and_escapes() {
        assert_eq!(vtt([]), "WEBVTT\n");
        let out = vtt([(1.0, 2.25, " a < b & c --> d")]);
        assert_eq!(
            out,
            "WEBVTT\n\n00:00:01.000 --> 00:00:02.250\na &lt; b &amp; c -> d\n"
        );
    }

    #[test]
    fn response_format_names() {
        for f in ResponseFormat::ALL {
            assert_eq!(ResponseFormat::parse(f.as_str()), Ok(f));
        }
        let e = ResponseFormat::parse("xml").expect_err("unknown");
        assert!(
            e.contains("'verbose_json'") && e.contains("value=xml"),
            "{e}"
        );
        assert_eq!(usage_seconds(4.140437), 5);
        assert_eq!(usage_seconds(5.0), 5);
    }
}
