//! Audio uploads to the 16 kHz mono float samples a speech model takes (`endpoints.md` §6.2).
//!
//! [`decode_audio`] reads WAV (PCM, float, ADPCM), FLAC, MP3, Ogg Vorbis and Ogg Opus
//! (symphonia demuxes and decodes; Opus packets go to `opus-decoder`, with the stream's
//! pre-skip and end trim applied), averages the channels to mono and resamples to 16 kHz
//! with rubato when the file has another rate. MP3's LAME/Xing header (encoder delay and padding) is honoured, so an MP3
//! decodes to the samples the encoder was given, as PyAV/FFmpeg decode it for vLLM and
//! faster-whisper. Every failure is an [`AudioError`] with a message a client can act on;
//! nothing here panics on hostile input.
pub mod format;

use std::io::Cursor;

use rubato::audioadapter_buffers::owned::InterleavedOwned;
use rubato::{Fft, FixedSync, Resampler};
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;

/// The rate Whisper's front end expects.
pub const TARGET_SAMPLE_RATE: u32 = 16_000;

/// vLLM's message for an upload its loader cannot read.
pub const INVALID_AUDIO: &str = "Invalid or unsupported audio file.";

/// A decoded upload: mono samples at [`TARGET_SAMPLE_RATE`] in [-1, 1].
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedAudio {
    pub samples: Vec<f32>,
    /// The file's own sample rate (before resampling).
    pub sample_rate_in: u32,
    /// The file's channel count (before averaging to mono).
    pub channels_in: u16,
    /// `samples.len() / 16000`.
    pub duration_s: f64,
}

/// Why an upload could not be turned into samples. Every variant is the client's fault
/// (HTTP 400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AudioError {
    #[error("Invalid or unsupported audio file: the file is empty (0 bytes).")]
    Empty,
    /// Not a container/codec this decoder knows (vLLM's exact message, with the reason after it).
    #[error("Invalid or unsupported audio file. {0}")]
    Unsupported(String),
    /// The stream starts well but ends early or breaks in the middle.
    #[error("Invalid or unsupported audio file: the file is truncated or corrupt ({0}).")]
    Truncated(String),
    #[error("Invalid or unsupported audio file: it contains no audio samples.")]
    NoSamples,
    #[error(
        "The audio is too long: {duration_s:.2} s, and this server accepts at most \
         {max_s:.2} s per request."
    )]
    TooLong { duration_s: f64, max_s: f64 },
}

impl AudioError {
    /// The request parameter a client should fix.
    pub fn param(&self) -> &'static str {
        "file"
    }
}

/// [`decode_audio_limited`] without a duration limit.
pub fn decode_audio(
    bytes: &[u8],
    file_name_hint: Option<&str>,
) -> Result<DecodedAudio, AudioError> {
    decode_audio_limited(bytes, file_name_hint, None)
}

/// Decodes `bytes` (any supported container; `file_name_hint`'s extension helps the probe)
/// to 16 kHz mono. With `max_duration_s`, decoding stops with [`AudioError::TooLong`] as soon
/// as the audio passes the limit, so an hour-long upload costs no more than the limit.
pub fn decode_audio_limited(
    bytes: &[u8],
    file_name_hint: Option<&str>,
    max_duration_s: Option<f64>,
) -> Result<DecodedAudio, AudioError> {
    if bytes.is_empty() {
        return Err(AudioError::Empty);
    }
    let mut hint = Hint::new();
    if let Some(ext) = file_name_hint
        .and_then(|n| std::path::Path::new(n).extension())
        .and_then(|e| e.to_str())
    {
        hint.with_extension(&ext.to_ascii_lowercase());
    }
    let source = MediaSourceStream::new(
        Box::new(Cursor::new(bytes)),
        MediaSourceStreamOptions::default(),
    );
    let mut format = symphonia::default::get_probe()
        .probe(
            &hint,
            source,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| AudioError::Unsupported(probe_reason(&e)))?;
    let track = format
        .default_track(TrackType::Audio)
        .ok_or_else(|| AudioError::Unsupported("The file has no audio track.".into()))?;
    let track_id = track.id;
    let expected_frames = track.num_frames;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| AudioError::Unsupported("The file has no audio track.".into()))?
        .clone();
    let mut sink = MonoSink {
        mono: Vec::new(),
        rate: params.sample_rate.unwrap_or(0),
        max_duration_s,
    };
    if params.codec == symphonia::core::codecs::audio::well_known::CODEC_ID_OPUS {
        let channels = params.channels.as_ref().map_or(0, |c| c.count());
        let pre_skip = track.delay.unwrap_or(0) as usize;
        decode_opus(&mut *format, track_id, channels, pre_skip, &mut sink)?;
        // The last granule position counts the pre-skip too (RFC 7845 §4).
        let expected = expected_frames.map(|n| n.saturating_sub(pre_skip as u64));
        return finish(sink, channels, expected);
    }
    // Gapless (on by default) trims the MP3 encoder delay and padding the LAME header records.
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default().gapless(true))
        .map_err(|e| {
            AudioError::Unsupported(format!(
                "Its codec ({}) is not supported: this server decodes WAV, FLAC, MP3, Ogg Vorbis and Ogg Opus ({e}).",
                codec_name(&params)
            ))
        })?;

    let mut channels = params.channels.as_ref().map_or(0, |c| c.count());
    let mut interleaved: Vec<f32> = Vec::new();
    while let Some(packet) = next_packet(&mut *format)? {
        if packet.track_id != track_id {
            continue;
        }
        let buf = match decoder.decode(&packet) {
            Ok(buf) => buf,
            Err(e) => return Err(AudioError::Truncated(e.to_string())),
        };
        if buf.frames() == 0 {
            continue;
        }
        sink.rate = buf.spec().rate();
        channels = buf.spec().channels().count();
        buf.copy_to_vec_interleaved(&mut interleaved);
        sink.push(&interleaved, channels)?;
    }
    finish(sink, channels, expected_frames)
}

/// The next packet of the stream, `None` at its end; a stream cut inside a packet or broken
/// is [`AudioError::Truncated`].
fn next_packet(
    format: &mut dyn symphonia::core::formats::FormatReader,
) -> Result<Option<symphonia::core::packet::Packet>, AudioError> {
    match format.next_packet() {
        Ok(p) => Ok(p),
        Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(
            AudioError::Truncated("the stream ends in the middle of a packet".into()),
        ),
        Err(SymphoniaError::ResetRequired) => Ok(None),
        Err(e) => Err(AudioError::Truncated(e.to_string())),
    }
}

/// Mono samples at the file's rate as packets decode, with the duration limit checked as
/// they grow.
struct MonoSink {
    mono: Vec<f32>,
    rate: u32,
    max_duration_s: Option<f64>,
}

impl MonoSink {
    /// Appends interleaved frames of `channels`, averaged to mono.
    fn push(&mut self, interleaved: &[f32], channels: usize) -> Result<(), AudioError> {
        if channels == 0 || self.rate == 0 {
            return Err(AudioError::Unsupported(
                "The stream declares no channels or no sample rate.".into(),
            ));
        }
        if channels == 1 {
            self.mono.extend_from_slice(interleaved);
        } else {
            let scale = 1.0 / channels as f32;
            self.mono.extend(
                interleaved
                    .chunks_exact(channels)
                    .map(|frame| frame.iter().sum::<f32>() * scale),
            );
        }
        if let Some(max_s) = self.max_duration_s {
            let duration_s = self.mono.len() as f64 / f64::from(self.rate);
            if duration_s > max_s {
                return Err(AudioError::TooLong { duration_s, max_s });
            }
        }
        Ok(())
    }
}

/// The checks after the last packet, then the resampling to 16 kHz.
fn finish(
    sink: MonoSink,
    channels: usize,
    expected_frames: Option<u64>,
) -> Result<DecodedAudio, AudioError> {
    let MonoSink { mono, rate, .. } = sink;
    if mono.is_empty() {
        return Err(AudioError::NoSamples);
    }
    // A container that states its length (WAV data chunk, FLAC STREAMINFO, MP3 Xing frame
    // count) and delivers fewer frames was cut short.
    if let Some(expected) = expected_frames {
        if (mono.len() as u64) < expected {
            return Err(AudioError::Truncated(format!(
                "{} of the {expected} frames its header announces",
                mono.len()
            )));
        }
    }
    let samples = if rate == TARGET_SAMPLE_RATE {
        mono
    } else {
        resample(mono, rate, TARGET_SAMPLE_RATE)?
    };
    let duration_s = samples.len() as f64 / f64::from(TARGET_SAMPLE_RATE);
    Ok(DecodedAudio {
        samples,
        sample_rate_in: rate,
        channels_in: u16::try_from(channels).unwrap_or(u16::MAX),
        duration_s,
    })
}

/// Ogg Opus (RFC 7845): every packet of the track through `opus-decoder` at 48 kHz, each
/// packet's end trim (the last page's granule position) applied, then the header's
/// `pre_skip` samples dropped from the start, as libopus-based decoders (FFmpeg) do.
fn decode_opus(
    format: &mut dyn symphonia::core::formats::FormatReader,
    track_id: u32,
    channels: usize,
    pre_skip: usize,
    sink: &mut MonoSink,
) -> Result<(), AudioError> {
    if !(1..=2).contains(&channels) {
        return Err(AudioError::Unsupported(format!(
            "Its Opus stream has {channels} channels: this server decodes mono and stereo Opus."
        )));
    }
    sink.rate = 48_000;
    let mut decoder = opus_decoder::OpusDecoder::new(48_000, channels).map_err(|e| {
        AudioError::Unsupported(format!("Its Opus stream cannot be decoded ({e})."))
    })?;
    let mut pcm = vec![0f32; decoder.max_frame_size_per_channel() * channels];
    let mut skip = pre_skip;
    while let Some(packet) = next_packet(&mut *format)? {
        if packet.track_id != track_id || packet.data.is_empty() {
            continue;
        }
        let frames = decoder
            .decode_float(&packet.data, &mut pcm, false)
            .map_err(|e| AudioError::Truncated(format!("a broken Opus packet: {e}")))?;
        let trim_end = (packet.trim_end.get() as usize).min(frames);
        let keep = frames - trim_end;
        let drop = skip.min(keep);
        skip -= drop;
        sink.push(&pcm[drop * channels..keep * channels], channels)?;
    }
    Ok(())
}

/// Band-limited resampling of a mono clip (rubato's synchronous FFT resampler), trimmed to
/// `round(len × to / from)` samples so the duration is kept.
pub fn resample(samples: Vec<f32>, from: u32, to: u32) -> Result<Vec<f32>, AudioError> {
    let len = samples.len();
    let unsupported = |e: &dyn std::fmt::Display| {
        AudioError::Unsupported(format!("Cannot resample {from} Hz audio to {to} Hz: {e}"))
    };
    let mut resampler = Fft::<f32>::new(from as usize, to as usize, 1024, 1, FixedSync::Input)
        .map_err(|e| unsupported(&e))?;
    let input = InterleavedOwned::new_from(samples, 1, len).map_err(|e| unsupported(&e))?;
    let out = resampler
        .process_all(&input, len, None)
        .map_err(|e| unsupported(&e))?;
    let mut out = out.take_data();
    let want = ((len as f64) * f64::from(to) / f64::from(from)).round() as usize;
    out.resize(want, 0.0);
    Ok(out)
}

fn probe_reason(e: &SymphoniaError) -> String {
    match e {
        SymphoniaError::Unsupported(_) => {
            "Its format was not recognized: this server decodes WAV, FLAC, MP3 and Ogg Vorbis."
                .into()
        }
        SymphoniaError::IoError(_) => "The file ends before its header is complete.".into(),
        other => format!("Its header could not be read ({other})."),
    }
}

fn codec_name(params: &symphonia::core::codecs::audio::AudioCodecParameters) -> String {
    use symphonia::core::codecs::audio::well_known::{
        CODEC_ID_AAC, CODEC_ID_ALAC, CODEC_ID_OPUS, CODEC_ID_SPEEX,
    };
    match params.codec {
        CODEC_ID_OPUS => "Opus".into(),
        CODEC_ID_AAC => "AAC".into(),
        CODEC_ID_ALAC => "ALAC".into(),
        CODEC_ID_SPEEX => "Speex".into(),
        other => format!("{other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn testdata(name: &str) -> Vec<u8> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/audio/");
        std::fs::read(format!("{path}{name}")).expect("testdata/audio file")
    }

    /// The fixture's `decoded_*` numbers (PyAV's decode) for case `id`.
    fn golden(id: &str) -> serde_json::Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/audio/transcripts.jsonl"
        );
        std::fs::read_to_string(path)
            .expect("transcripts.jsonl")
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json line"))
            .find(|v| v["id"] == id)
            .expect("case")
    }

    fn rms(x: &[f32]) -> f64 {
        (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64).sqrt()
    }

    fn peak(x: &[f32]) -> f64 {
        x.iter().fold(0.0f64, |m, &v| m.max(f64::from(v.abs())))
    }

    /// A 16-bit PCM WAV of `frames` (interleaved) at `rate`.
    fn wav(rate: u32, channels: u16, frames: &[i16]) -> Vec<u8> {
        let data_len = (frames.len() * 2) as u32;
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data_len).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&channels.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&(rate * u32::from(channels) * 2).to_le_bytes());
        out.extend_from_slice(&(channels * 2).to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&data_len.to_le_bytes());
        for s in frames {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out
    }

    #[test]
    fn wav_decodes_sample_exactly_as_pyav() {
        let g = golden("a01_hello_us");
        let a = decode_audio(&testdata("a01_hello_us.wav"), Some("a01_hello_us.wav")).expect("wav");
        assert_eq!(
            a.samples.len() as u64,
            g["decoded_num_samples"].as_u64().expect("n")
        );
        assert_eq!((a.sample_rate_in, a.channels_in), (16_000, 1));
        assert!((a.duration_s - g["decoded_duration_s"].as_f64().expect("d")).abs() < 1e-6);
        assert!((rms(&a.samples) - g["decoded_rms"].as_f64().expect("rms")).abs() < 1e-6);
        assert!((peak(&a.samples) - g["decoded_peak"].as_f64().expect("peak")).abs() < 1e-6);
    }

    #[test]
    fn flac_equals_the_wav_sample_for_sample() {
        let wav = decode_audio(&testdata("a01_hello_us.wav"), None).expect("wav");
        // No hint: the probe finds the container from its magic bytes.
        let flac = decode_audio(&testdata("a01_hello_us.flac"), None).expect("flac");
        assert_eq!(flac, wav);
    }

    /// The LAME/Xing header's encoder delay and padding are trimmed: exactly the WAV's
    /// 120,628 samples, as PyAV decodes them (a decoder ignoring the header gives 122,688).
    #[test]
    fn mp3_honours_the_gapless_header() {
        let g = golden("a04_slow_female@mp3");
        let a = decode_audio(&testdata("a04_slow_female.mp3"), Some("x.mp3")).expect("mp3");
        assert_eq!(a.samples.len(), 120_628);
        assert_eq!(
            a.samples.len() as u64,
            g["decoded_num_samples"].as_u64().expect("n")
        );
        let (want_rms, want_peak) = (
            g["decoded_rms"].as_f64().expect("rms"),
            g["decoded_peak"].as_f64().expect("peak"),
        );
        // Another MP3 decoder's float output: equal up to rounding, not bit for bit.
        assert!(
            (rms(&a.samples) - want_rms).abs() < 1e-3,
            "{}",
            rms(&a.samples)
        );
        assert!(
            (peak(&a.samples) - want_peak).abs() < 5e-3,
            "{}",
            peak(&a.samples)
        );
    }

    /// Ogg Vorbis (oggenc -q 2 of a01): lossy, so compared in length and level with the WAV.
    #[test]
    fn ogg_vorbis_decodes_to_the_wav_length() {
        let wav = decode_audio(&testdata("a01_hello_us.wav"), None).expect("wav");
        let ogg = decode_audio(&testdata("a01_hello_us.ogg"), Some("a.ogg")).expect("ogg");
        assert_eq!(ogg.samples.len(), wav.samples.len());
        assert!((rms(&ogg.samples) - rms(&wav.samples)).abs() < 0.01);
    }

    /// Ogg Opus (`ffmpeg -c:a libopus` of a10 at 16 kHz): lossy, so compared in length and
    /// level with the WAV it was made from; the pre-skip and end trim leave exactly its frames.
    #[test]
    fn ogg_opus_decodes_to_the_wav_length() {
        let wav = decode_audio(&testdata("a10_yes.wav"), None).expect("wav");
        let opus = decode_audio(&testdata("a10_yes.opus"), Some("a10_yes.opus")).expect("opus");
        assert_eq!(opus.sample_rate_in, 48_000);
        assert_eq!(opus.samples.len(), wav.samples.len());
        assert!(
            (rms(&opus.samples) - rms(&wav.samples)).abs() < 0.01,
            "{} vs {}",
            rms(&opus.samples),
            rms(&wav.samples)
        );
        // A cut file is an error at every length, never a panic or a shorter clip.
        let bytes = testdata("a10_yes.opus");
        for cut in (1..bytes.len()).step_by(97) {
            let r = decode_audio(&bytes[..cut], Some("a10_yes.opus"));
            assert!(
                r.is_err(),
                "cut at {cut}: {} samples",
                r.map_or(0, |a| a.samples.len())
            );
        }
    }

    /// Stereo is averaged to mono and 44.1 kHz resampled to 16 kHz with the duration kept and
    /// the tone intact.
    #[test]
    fn stereo_44k1_is_averaged_and_resampled() {
        let rate = 44_100u32;
        let n = rate as usize; // one second
        let mut frames = Vec::with_capacity(2 * n);
        for i in 0..n {
            let s = (2.0 * std::f64::consts::PI * 440.0 * i as f64 / f64::from(rate)).sin();
            // Left carries the tone at 0.5, right is silent: the mono mix is the tone at 0.25.
            frames.push((s * 0.5 * 32767.0) as i16);
            frames.push(0);
        }
        let a = decode_audio(&wav(rate, 2, &frames), Some("tone.wav")).expect("decodes");
        assert_eq!((a.sample_rate_in, a.channels_in), (44_100, 2));
        assert_eq!(a.samples.len(), 16_000);
        assert!((a.duration_s - 1.0).abs() < 1e-9);
        // A 0.25-amplitude sine has RMS 0.25/√2 away from the edges.
        let mid = &a.samples[1000..15000];
        assert!((rms(mid) - 0.25 / 2f64.sqrt()).abs() < 2e-3, "{}", rms(mid));
    }

    #[test]
    fn bad_uploads_are_typed_errors() {
        assert_eq!(decode_audio(b"", Some("a.wav")), Err(AudioError::Empty));
        let text = decode_audio(b"this is a text file, not audio at all", Some("a.wav"))
            .expect_err("text");
        assert!(matches!(text, AudioError::Unsupported(_)), "{text:?}");
        assert!(text.to_string().starts_with(INVALID_AUDIO));
        // A WAV header with no frames.
        assert_eq!(
            decode_audio(&wav(16_000, 1, &[]), None),
            Err(AudioError::NoSamples)
        );
        // The fixture cut in half: the data chunk announces more than the file holds.
        let whole = testdata("a01_hello_us.wav");
        let cut = decode_audio(&whole[..whole.len() / 2], None).expect_err("truncated");
        assert!(matches!(cut, AudioError::Truncated(_)), "{cut:?}");
        let flac = testdata("a01_hello_us.flac");
        let cut = decode_audio(&flac[..flac.len() / 2], None).expect_err("truncated flac");
        assert!(matches!(cut, AudioError::Truncated(_)), "{cut:?}");
        let mp3 = testdata("a04_slow_female.mp3");
        let cut = decode_audio(&mp3[..mp3.len() / 2], None).expect_err("truncated mp3");
        assert!(matches!(cut, AudioError::Truncated(_)), "{cut:?}");
        // Only the header's first bytes.
        let head = decode_audio(&whole[..20], None).expect_err("header only");
        assert!(
            head.to_string()
                .starts_with("Invalid or unsupported audio file"),
            "{head}"
        );
    }

    #[test]
    fn the_duration_limit_stops_decoding() {
        let e = decode_audio_limited(&testdata("a01_hello_us.wav"), None, Some(2.0))
            .expect_err("too long");
        match e {
            AudioError::TooLong { duration_s, max_s } => {
                assert!(duration_s > 2.0 && duration_s < 2.5, "{duration_s}");
                assert_eq!(max_s, 2.0);
            }
            other => panic!("{other:?}"),
        }
        assert!(decode_audio_limited(&testdata("a01_hello_us.wav"), None, Some(5.0)).is_ok());
    }
}
