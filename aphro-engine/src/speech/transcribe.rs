//! [`Transcriber`]: loading a Whisper folder and faster-whisper 1.2.1's `generate_segments`
//! over the whole clip — sequential 30 s windows of the clip's log-mel (computed once, with
//! 160 trailing zero samples; each window zero-padded in the feature domain), the previous
//! windows' text as the prompt, segments cut at timestamp pairs, the next window starting at
//! the last complete timestamp, and windows dropped as silence by `no_speech_prob`.

use std::path::Path;

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::batch::StepBatcher;
use super::burn_model::BurnWhisper;
use super::ct2::Ct2Model;
use super::decode::{decode_window, DecodeRules, Stepper, WindowResult};
use super::mel::{LogMel, MelFrontEnd, HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE};
use super::model::{WhisperModel, WhisperNetwork};
use super::tokens::{unsupported_language, WhisperTokenizer, WHISPER_LANGUAGES};
use crate::sampler::{Penalties, Truncation};
use aphro_core::protocol::{verify_sampling_args, SamplingArgs};

use super::{
    GenerateRequest, Segment, SpeechError, SpeechTask, TranscribeOptions, Transcriber,
    TranscriberConfig, Transcription, WhisperInfo,
};

/// What conditions every window besides the audio: the text so far (the initial prompt first)
/// and the hotwords, both already tokenized.
struct PromptContext {
    previous: Vec<u32>,
    hotwords: Vec<u32>,
}

/// faster-whisper's defaults (`WhisperModel.transcribe`).
const NO_SPEECH_THRESHOLD: f64 = 0.6;
const LOG_PROB_THRESHOLD: f64 = -1.0;
const MAX_INITIAL_TIMESTAMP: f64 = 1.0;
const PROMPT_RESET_ON_TEMPERATURE: f32 = 0.5;
/// Seconds per timestamp step, and mel frames per encoder position.
const TIME_PRECISION: f64 = 0.02;
const INPUT_STRIDE: usize = 2;
const TIME_PER_FRAME: f64 = HOP_LENGTH as f64 / SAMPLE_RATE as f64;

/// What [`Transcriber::load`] reads from the folder.
pub(super) struct Loaded {
    pub model: Box<dyn WhisperNetwork>,
    pub tokenizer: WhisperTokenizer,
    pub front_end: MelFrontEnd,
    pub suppress: Vec<u32>,
    pub suppress_begin: Vec<u32>,
    pub info: WhisperInfo,
    pub pool: rayon::ThreadPool,
    /// Shares decoding steps among concurrent transcriptions.
    pub batcher: StepBatcher,
}

fn config_ids(cfg: &serde_json::Value, key: &str) -> Result<Option<Vec<u32>>, SpeechError> {
    let Some(v) = cfg.get(key) else {
        return Ok(None);
    };
    let ids = v
        .as_array()
        .ok_or_else(|| SpeechError::Config(format!("config.json: {key} is not a list")))?
        .iter()
        .map(|x| {
            x.as_u64()
                .map(|i| i as u32)
                .ok_or_else(|| SpeechError::Config(format!("config.json: {key} has {x}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(ids))
}

/// Which network a folder's weights become.
pub(super) type BuildNetwork<'a> =
    Box<dyn FnOnce(&Ct2Model) -> Result<Box<dyn WhisperNetwork>, SpeechError> + 'a>;

/// The host network ([`WhisperModel`]).
pub(super) fn host_network<'a>() -> BuildNetwork<'a> {
    Box::new(|ct2| Ok(Box::new(WhisperModel::from_ct2(ct2)?)))
}

/// The burn network on `device` of backend `B`.
pub(super) fn burn_network<B: burn::tensor::backend::Backend>(
    device: &B::Device,
) -> BuildNetwork<'_> {
    Box::new(move |ct2| Ok(Box::new(BurnWhisper::<B>::from_ct2(ct2, device)?)))
}

pub(super) fn load(
    model_dir: &Path,
    config: &TranscriberConfig,
    network: BuildNetwork<'_>,
) -> Result<Loaded, SpeechError> {
    let cfg_path = model_dir.join("config.json");
    let cfg_text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| SpeechError::Config(format!("{}: {e}", cfg_path.display())))?;
    let cfg: serde_json::Value = serde_json::from_str(&cfg_text)
        .map_err(|e| SpeechError::Config(format!("{}: {e}", cfg_path.display())))?;
    let bin = model_dir.join("model.bin");
    if !bin.is_file() {
        return Err(SpeechError::Config(format!(
            "{}: only CTranslate2 Whisper folders (model.bin + config.json) are supported",
            model_dir.display()
        )));
    }
    let ct2 = Ct2Model::open(&bin)?;
    if ct2.spec != "WhisperSpec" {
        return Err(SpeechError::Config(format!(
            "{} holds a {:?}, not a WhisperSpec",
            bin.display(),
            ct2.spec
        )));
    }
    let model = network(&ct2)?;
    drop(ct2);
    let dims = model.dims();
    // CTranslate2's rule: a multilingual Whisper has 51865 or more outputs.
    let is_multilingual = dims.n_vocab >= 51865;
    let tokenizer = WhisperTokenizer::load(
        &model_dir.join("tokenizer.json"),
        dims.n_vocab,
        is_multilingual,
    )?;
    let front_end = MelFrontEnd::new(dims.n_mels).ok_or_else(|| {
        SpeechError::Config(format!(
            "a {}-bin mel front end is not available (80 bins only)",
            dims.n_mels
        ))
    })?;
    if dims.n_audio_ctx * INPUT_STRIDE != N_FRAMES {
        return Err(SpeechError::Config(format!(
            "{} audio positions; Whisper windows have {}",
            dims.n_audio_ctx,
            N_FRAMES / INPUT_STRIDE
        )));
    }
    let sp = &tokenizer.special;
    // faster-whisper's `suppress_tokens=[-1]`: the non-speech symbols (config.json's
    // `suppress_ids`) plus the task and control tokens.
    let mut suppress = config_ids(&cfg, "suppress_ids")?.unwrap_or_default();
    suppress.extend([
        sp.transcribe,
        sp.translate,
        sp.sot,
        sp.sot_prev,
        sp.sot_lm,
        sp.no_speech,
    ]);
    suppress.sort_unstable();
    suppress.dedup();
    let suppress_begin =
        config_ids(&cfg, "suppress_ids_begin")?.unwrap_or_else(|| vec![220, sp.eot]);
    let languages = if is_multilingual {
        sp.languages.iter().map(|&(c, _)| c).collect()
    } else {
        vec!["en"]
    };
    let name = model_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| model_dir.display().to_string());
    let info = WhisperInfo {
        name,
        is_multilingual,
        n_mels: dims.n_mels,
        languages,
        max_target_positions: dims.n_text_ctx,
    };
    let mut pool = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("whisper-{i}"));
    if let Some(n) = config.num_threads {
        if n == 0 {
            return Err(SpeechError::Config("num_threads must be at least 1".into()));
        }
        pool = pool.num_threads(n);
    }
    let pool = pool
        .build()
        .map_err(|e| SpeechError::Config(format!("thread pool: {e}")))?;
    Ok(Loaded {
        model,
        tokenizer,
        front_end,
        suppress,
        suppress_begin,
        info,
        pool,
        batcher: StepBatcher::default(),
    })
}

/// faster-whisper's `get_compression_ratio`: UTF-8 length over zlib-compressed length.
pub(crate) fn compression_ratio(text: &str) -> f64 {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(text.as_bytes()).expect("writing to a Vec");
    let compressed = z.finish().expect("writing to a Vec");
    text.len() as f64 / compressed.len() as f64
}

/// `max_initial_timestamp` in timestamp steps.
fn max_initial_timestamp_index() -> u32 {
    (MAX_INITIAL_TIMESTAMP / TIME_PRECISION).round() as u32
}

/// CTranslate2's generation length after a prompt: at most half the context and what the
/// context leaves (`min(448 / 2, 448 − (prompt − 1))`), within the request's cap.
fn max_new_tokens(prompt_len: usize, n_text_ctx: usize, cap: Option<usize>) -> usize {
    let start_step = prompt_len.saturating_sub(1);
    let n = (n_text_ctx / 2).min(n_text_ctx.saturating_sub(start_step));
    cap.map_or(n, |c| n.min(c))
}

/// One segment before numbering: faster-whisper's `_split_segments_by_timestamps` output.
struct RawSegment {
    start: f64,
    end: f64,
    tokens: Vec<u32>,
}

/// Cut a window's tokens at consecutive timestamps; returns the segments and the next seek.
fn split_segments(
    tokens: &[u32],
    ts_begin: u32,
    time_offset: f64,
    seek: usize,
    segment_size: usize,
) -> (Vec<RawSegment>, usize) {
    let is_ts = |t: u32| t >= ts_begin;
    let n = tokens.len();
    let single_timestamp_ending = n >= 2 && !is_ts(tokens[n - 2]) && is_ts(tokens[n - 1]);
    let consecutive: Vec<usize> = (1..n)
        .filter(|&i| is_ts(tokens[i]) && is_ts(tokens[i - 1]))
        .collect();
    let mut out = Vec::new();
    if !consecutive.is_empty() {
        let mut slices = consecutive;
        if single_timestamp_ending {
            slices.push(n);
        }
        let mut last = 0;
        for &cut in &slices {
            let s = &tokens[last..cut];
            let pos = |t: u32| t.saturating_sub(ts_begin) as f64 * TIME_PRECISION;
            out.push(RawSegment {
                start: time_offset + pos(s[0]),
                end: time_offset + pos(s[s.len() - 1]),
                tokens: s.to_vec(),
            });
            last = cut;
        }
        let next = if single_timestamp_ending {
            seek + segment_size
        } else {
            // Drop the unfinished segment: the next window starts at the last timestamp.
            seek + (tokens[last - 1] - ts_begin) as usize * INPUT_STRIDE
        };
        (out, next)
    } else {
        let mut duration = segment_size as f64 * TIME_PER_FRAME;
        if let Some(&t) = tokens.iter().rev().find(|&&t| is_ts(t)) {
            if t != ts_begin {
                duration = (t - ts_begin) as f64 * TIME_PRECISION;
            }
        }
        out.push(RawSegment {
            start: time_offset,
            end: time_offset + duration,
            tokens: tokens.to_vec(),
        });
        (out, seek + segment_size)
    }
}

impl Transcriber {
    pub(super) fn run(
        &self,
        samples: &[f32],
        opts: &TranscribeOptions,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<Transcription, SpeechError> {
        if let Some(i) = samples.iter().position(|s| !s.is_finite()) {
            return Err(SpeechError::InvalidRequest(format!(
                "audio sample {i} is not a finite number"
            )));
        }
        // vLLM's sampling checks, through the one function the LLM path uses too.
        let trunc = opts.truncation;
        verify_sampling_args(&SamplingArgs {
            n: 1,
            presence_penalty: opts.penalties.presence as f64,
            frequency_penalty: opts.penalties.frequency as f64,
            repetition_penalty: opts.penalties.repetition as f64,
            temperature: opts.temperature as f64,
            top_p: trunc.top_p as f64,
            top_k: i64::try_from(trunc.top_k).unwrap_or(i64::MAX),
            min_p: trunc.min_p as f64,
            max_tokens: None,
            min_tokens: 0,
            stream_interval: None,
            logprobs: None,
            prompt_logprobs: None,
        })
        .map_err(|e| SpeechError::InvalidRequest(e.message))?;
        if opts.max_new_tokens == Some(0) {
            return Err(SpeechError::InvalidRequest(
                "max_new_tokens must be at least 1".into(),
            ));
        }
        let l = &self.loaded;
        let language = self.resolve_language(opts.language.as_deref())?;
        let mut initial: Vec<u32> = Vec::new();
        if let Some(p) = opts.prompt.as_deref() {
            if !p.trim().is_empty() {
                initial = l.tokenizer.encode(&format!(" {}", p.trim()))?;
            }
        }
        let mut hotwords: Vec<u32> = Vec::new();
        if let Some(h) = opts.hotwords.as_deref() {
            if !h.trim().is_empty() {
                hotwords = l.tokenizer.encode(&format!(" {}", h.trim()))?;
            }
        }
        let mel = l.pool.install(|| l.front_end.log_mel(samples, HOP_LENGTH));
        // Segments are handed out on the calling thread; the compute of each window runs
        // on the transcriber's pool.
        let context = PromptContext {
            previous: initial,
            hotwords,
        };
        self.generate_segments(&mel, samples.len(), language, context, opts, on_segment)
    }

    pub(super) fn generate_window(
        &self,
        samples: &[f32],
        requests: &[GenerateRequest],
    ) -> Result<Vec<Vec<u32>>, SpeechError> {
        let l = &self.loaded;
        let sp = &l.tokenizer.special;
        let n_text_ctx = l.model.dims().n_text_ctx;
        if samples.len() > N_SAMPLES {
            return Err(SpeechError::InvalidRequest(format!(
                "generate takes at most 30 s of audio, got {} samples",
                samples.len()
            )));
        }
        if let Some(i) = samples.iter().position(|s| !s.is_finite()) {
            return Err(SpeechError::InvalidRequest(format!(
                "audio sample {i} is not a finite number"
            )));
        }
        for r in requests {
            if r.prompt.len() >= n_text_ctx {
                return Err(SpeechError::InvalidRequest(format!(
                    "a prompt of {} tokens leaves no room in the decoder's {n_text_ctx} positions",
                    r.prompt.len()
                )));
            }
            if let Some(&bad) = r.prompt.iter().find(|&&t| t >= sp.n_vocab) {
                return Err(SpeechError::InvalidRequest(format!(
                    "prompt token {bad} is out of the vocabulary"
                )));
            }
            if !r.prompt.contains(&sp.sot) {
                return Err(SpeechError::InvalidRequest(
                    "the prompt has no <|startoftranscript|> token".into(),
                ));
            }
        }
        l.pool.install(|| {
            let mel = l.front_end.log_mel(samples, N_SAMPLES - samples.len());
            let mut window = Vec::new();
            mel.window_into(0, N_FRAMES, &mut window);
            let audio = l.model.encode(&window);
            let mut state = l.model.new_state();
            l.model.begin_window(&mut state, &audio);
            let mut rng = ChaCha8Rng::seed_from_u64(0);
            let out: Vec<Vec<u32>> = requests
                .iter()
                .map(|r| {
                    let sot_index = r.prompt.iter().position(|&t| t == sp.sot).unwrap_or(0);
                    let none: &[u32] = &[];
                    let rules = DecodeRules {
                        special: sp,
                        suppress: if r.suppress_tokens { &l.suppress } else { none },
                        suppress_begin: if r.suppress_blank {
                            &l.suppress_begin
                        } else {
                            none
                        },
                        timestamps: r.prompt.last() != Some(&sp.no_timestamps),
                        max_initial_timestamp_index: max_initial_timestamp_index(),
                        max_new_tokens: max_new_tokens(
                            r.prompt.len(),
                            n_text_ctx,
                            r.max_new_tokens,
                        ),
                        temperature: 0.0,
                        truncation: Truncation::NONE,
                        penalties: Penalties::NONE,
                    };
                    let stepper = Stepper {
                        pool: &l.pool,
                        batcher: None,
                    };
                    decode_window(
                        &*l.model, &mut state, &r.prompt, sot_index, &rules, &mut rng, &stepper,
                    )
                    .tokens
                })
                .collect();
            Ok(out)
        })
    }

    /// The request's language: validated as vLLM does; English-only checkpoints always
    /// decode English (faster-whisper), `None` on a multilingual one means detection.
    /// Servers call it before they answer, so a bad code is a 400 and not a broken stream.
    pub fn resolve_language(
        &self,
        code: Option<&str>,
    ) -> Result<Option<&'static str>, SpeechError> {
        let Some(code) = code else {
            return Ok(if self.loaded.info.is_multilingual {
                None
            } else {
                Some("en")
            });
        };
        let known = WHISPER_LANGUAGES
            .iter()
            .copied()
            .find(|&l| l == code)
            .ok_or_else(|| unsupported_language(code))?;
        if !self.loaded.info.is_multilingual {
            return Ok(Some("en"));
        }
        if self
            .loaded
            .tokenizer
            .special
            .language_token(known)
            .is_none()
        {
            return Err(unsupported_language(code));
        }
        Ok(Some(known))
    }

    fn generate_segments(
        &self,
        mel: &LogMel,
        num_samples: usize,
        language: Option<&'static str>,
        context: PromptContext,
        opts: &TranscribeOptions,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<Transcription, SpeechError> {
        let PromptContext {
            previous: mut all_tokens,
            hotwords,
        } = context;
        let l = &self.loaded;
        let model = &*l.model;
        let sp = &l.tokenizer.special;
        let n_text_ctx = model.dims().n_text_ctx;
        let content_frames = mel.n_frames.saturating_sub(1);
        let mut state = model.new_state();
        let mut rng = ChaCha8Rng::seed_from_u64(opts.seed.unwrap_or(0));
        let mut window = Vec::new();
        let mut seek = 0usize;
        let mut prompt_reset_since = 0usize;
        let mut segments: Vec<Segment> = Vec::new();
        let mut language = language;
        // Known up front (asked for, or an English-only model): certain.
        let mut language_probability = 1.0;
        let (mut prompt_tokens, mut completion_tokens) = (0usize, 0usize);
        if language.is_none() {
            // faster-whisper detects on the clip's first 3000 frames, its last frame
            // included (the windows below stop one frame short), in an encoder pass of
            // its own.
            mel.window_into(0, N_FRAMES.min(mel.n_frames), &mut window);
            let (lang, probability) = l.pool.install(|| {
                let audio = model.encode(&window);
                model.begin_window(&mut state, &audio);
                self.detect_language(&mut state)
            });
            language = Some(lang);
            language_probability = probability;
        }
        while seek < content_frames {
            let time_offset = seek as f64 * TIME_PER_FRAME;
            let segment_size = N_FRAMES.min(content_frames - seek);
            mel.window_into(seek, segment_size, &mut window);
            let previous = &all_tokens[prompt_reset_since..];
            // The encoder and the prompt run on the pool; the token loop runs here, each
            // step on the pool and batched with other transcriptions' steps.
            let lang = l.pool.install(|| {
                let audio = model.encode(&window);
                model.begin_window(&mut state, &audio);
                language.unwrap_or("en")
            });
            let (prompt, result) = {
                // The prompt: <|startofprev|> + the last 223 previous text tokens, then the
                // start-of-transcript sequence.
                let mut prompt = Vec::with_capacity(n_text_ctx);
                let keep = n_text_ctx / 2 - 1;
                if !previous.is_empty() || !hotwords.is_empty() {
                    prompt.push(sp.sot_prev);
                    prompt.extend_from_slice(&hotwords[..hotwords.len().min(keep)]);
                    prompt.extend_from_slice(&previous[previous.len().saturating_sub(keep)..]);
                }
                let sot_index = prompt.len();
                prompt.push(sp.sot);
                if l.info.is_multilingual {
                    prompt.push(sp.language_token(lang).unwrap_or(sp.sot));
                    prompt.push(match opts.task {
                        SpeechTask::Transcribe => sp.transcribe,
                        SpeechTask::Translate => sp.translate,
                    });
                }
                if !opts.with_timestamps {
                    prompt.push(sp.no_timestamps);
                }
                let rules = DecodeRules {
                    special: sp,
                    suppress: &l.suppress,
                    suppress_begin: &l.suppress_begin,
                    timestamps: opts.with_timestamps,
                    max_initial_timestamp_index: max_initial_timestamp_index(),
                    max_new_tokens: max_new_tokens(prompt.len(), n_text_ctx, opts.max_new_tokens),
                    temperature: opts.temperature,
                    truncation: opts.truncation,
                    penalties: opts.penalties,
                };
                let stepper = Stepper {
                    pool: &l.pool,
                    batcher: Some(&l.batcher),
                };
                let result = decode_window(
                    model, &mut state, &prompt, sot_index, &rules, &mut rng, &stepper,
                );
                (prompt, result)
            };
            language = Some(lang);
            let WindowResult {
                tokens,
                sum_logprob,
                no_speech_prob,
            } = result;
            prompt_tokens += prompt.len();
            completion_tokens += tokens.len() + 1;
            let avg_logprob = sum_logprob / (tokens.len() + 1) as f64;
            let window_text = l.tokenizer.decode_text(&tokens)?;
            let compression_ratio = compression_ratio(window_text.trim());
            // Silence: a likely no-speech window whose text is not confident either.
            if no_speech_prob > NO_SPEECH_THRESHOLD && avg_logprob <= LOG_PROB_THRESHOLD {
                seek += segment_size;
                continue;
            }
            let previous_seek = seek;
            let (raw, next_seek) =
                split_segments(&tokens, sp.timestamp_begin, time_offset, seek, segment_size);
            // A window whose only complete timestamp is <|0.00|> would be decoded again
            // forever; move on to the next window instead.
            seek = if next_seek > seek {
                next_seek
            } else {
                seek + segment_size
            };
            for s in raw {
                let text = l.tokenizer.decode_text(&s.tokens)?;
                if s.start == s.end || text.trim().is_empty() {
                    continue;
                }
                all_tokens.extend_from_slice(&s.tokens);
                let seg = Segment {
                    id: segments.len() + 1,
                    seek: previous_seek,
                    start: s.start,
                    end: s.end,
                    text,
                    tokens: s.tokens,
                    avg_logprob,
                    compression_ratio,
                    no_speech_prob,
                    temperature: opts.temperature,
                };
                on_segment(&seg);
                segments.push(seg);
            }
            if opts.temperature > PROMPT_RESET_ON_TEMPERATURE {
                prompt_reset_since = all_tokens.len();
            }
        }
        Ok(Transcription {
            text: segments.iter().map(|s| s.text.as_str()).collect(),
            language: language.unwrap_or("en").to_string(),
            language_probability,
            duration: num_samples as f64 / SAMPLE_RATE as f64,
            segments,
            prompt_tokens,
            completion_tokens,
        })
    }

    /// The most likely language token after `<|startoftranscript|>` on the current window
    /// (CTranslate2's `detect_language`: the softmax restricted to the language tokens).
    /// Returns the language and its probability among the languages.
    fn detect_language(&self, state: &mut super::model::DecoderState) -> (&'static str, f64) {
        let l = &self.loaded;
        let sp = &l.tokenizer.special;
        l.model.truncate(state, 0);
        l.model.decode(state, &[sp.sot]);
        l.model.logits(state, 0);
        let logit = |id: u32| state.logits[id as usize] as f64;
        let Some(&(best, best_id)) = sp
            .languages
            .iter()
            .max_by(|a, b| logit(a.1).total_cmp(&logit(b.1)))
        else {
            return ("en", 1.0);
        };
        let top = logit(best_id);
        let sum: f64 = sp
            .languages
            .iter()
            .map(|&(_, id)| (logit(id) - top).exp())
            .sum();
        (best, 1.0 / sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_timestamp_pairs_and_seeks_to_the_last_complete_one() {
        let tb = 100;
        // <|0.00|> a b <|1.00|><|1.00|> c <|2.00|><|2.00|> d   (unfinished last segment)
        let toks = [tb, 1, 2, tb + 50, tb + 50, 3, tb + 100, tb + 100, 4];
        let (segs, seek) = split_segments(&toks, tb, 10.0, 1000, 3000);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert_eq!(segs.len(), 2);
        assert!(close(segs[0].start, 10.0) && close(segs[0].end, 11.0));
        assert_eq!(segs[1].tokens, vec![tb + 50, 3, tb + 100]);
        assert_eq!(seek, 1000 + 100 * INPUT_STRIDE);
        // Ending on a single timestamp: the whole window is consumed.
        let toks = [tb, 1, tb + 50, tb + 50, 2, tb + 75];
        let (segs, seek) = split_segments(&toks, tb, 0.0, 0, 414);
        assert_eq!(segs.len(), 2);
        assert!(close(segs[1].end, 1.5));
        assert_eq!(seek, 414);
        // No pair at all: one segment up to the last timestamp.
        let (segs, seek) = split_segments(&[tb, 1, 2, tb + 40], tb, 0.0, 0, 414);
        assert_eq!((segs.len(), seek), (1, 414));
        assert!(close(segs[0].end, 0.8));
    }

    #[test]
    fn compression_ratio_of_repetitive_text_is_high() {
        assert!(compression_ratio(&"la ".repeat(100)) > 2.4);
        assert!(compression_ratio("Hello world.") < 1.0);
    }
}
