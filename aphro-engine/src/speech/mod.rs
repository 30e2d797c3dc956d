//! Speech to text: Whisper on the CPU or a burn backend, decoding as faster-whisper 1.2.1 /
//! openai-whisper do (sequential 30 s windows, timestamp rules, conditioning on the previous
//! text).
//!
//! [`Transcriber`] is the library API the server, the CLI and the Python bindings share.
//!
//! * [`ct2`]: a bounds-checked reader of CTranslate2's `model.bin`.
//! * [`mel`]: openai-whisper's log-mel front end.
//! * `model`: the encoder and decoder on the CPU (gemm on host slices, own rayon pool),
//!   and the [`model::WhisperNetwork`] trait decoding runs on.
//! * `burn_model`: the same network on any burn backend (CubeCL GPUs, or `burn-flex`).
//! * `decode`: one window's decoding with CTranslate2's Whisper rules (suppression,
//!   timestamp rules, no-speech probability, greedy or seeded sampling).
//! * `transcribe`: faster-whisper's sequential windows, segments and seeking.
//! * `tokens`: special ids, languages, text encoding and decoding.

use std::path::Path;

use crate::backend::{Device, DeviceError};
use crate::model::ModelError;

mod batch;
mod burn_model;
pub mod ct2;
mod decode;
pub mod mel;
mod model;
mod tokens;
mod transcribe;

pub use crate::sampler::{Penalties, Truncation};
pub use batch::BatchStats;
pub use model::WhisperDims;
pub use tokens::{VLLM_SUPPORTED_LANGUAGES, WHISPER_LANGUAGES};

/// Settings fixed when a model is loaded.
#[derive(Debug, Clone, Default)]
pub struct TranscriberConfig {
    /// Threads of the transcriber's own compute pool; `None`: one per core.
    pub num_threads: Option<usize>,
    /// Where the network runs ([`Transcriber::load`]): `cpu` is the host network, `cuda:N`
    /// the burn network on burn-cuda; `auto` is CUDA when compiled in and usable.
    pub device: Device,
}

/// `/v1/audio/transcriptions` (same language out) or `/v1/audio/translations` (to English).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpeechTask {
    #[default]
    Transcribe,
    Translate,
}

/// One request's decoding options.
#[derive(Debug, Clone)]
pub struct TranscribeOptions {
    pub task: SpeechTask,
    /// ISO-639-1 code; `None`: detected on the first window (English-only models: `en`).
    pub language: Option<String>,
    /// Initial prompt: text that conditions the first window, as openai-whisper's
    /// `initial_prompt`.
    pub prompt: Option<String>,
    /// Hint phrases (faster-whisper's `hotwords`): put after `<|startofprev|>` in every
    /// window's prompt, before the previous text.
    pub hotwords: Option<String>,
    /// 0: greedy.
    pub temperature: f32,
    /// min_p / top_k / top_p on the draw when `temperature > 0` (the engine's sampler).
    pub truncation: Truncation,
    /// Repetition, frequency and presence penalties over the tokens generated in each
    /// window (CTranslate2's `repetition_penalty` counts those only).
    pub penalties: Penalties,
    /// Seed of the sampler when `temperature > 0`.
    pub seed: Option<u64>,
    /// Predict segment timestamps (otherwise one segment per 30 s window).
    pub with_timestamps: bool,
    /// Cap on the tokens generated per window (the model's limit applies anyway).
    pub max_new_tokens: Option<usize>,
}

impl Default for TranscribeOptions {
    fn default() -> Self {
        Self {
            task: SpeechTask::Transcribe,
            language: None,
            prompt: None,
            hotwords: None,
            temperature: 0.0,
            truncation: Truncation::NONE,
            penalties: Penalties::NONE,
            seed: None,
            with_timestamps: true,
            max_new_tokens: None,
        }
    }
}

/// What the model folder says about the model.
#[derive(Debug, Clone)]
pub struct WhisperInfo {
    /// The model folder's name.
    pub name: String,
    pub is_multilingual: bool,
    pub n_mels: usize,
    /// Language codes the model's tokenizer has tokens for (English-only models: `["en"]`).
    pub languages: Vec<&'static str>,
    /// The decoder's positions (448 for every Whisper size).
    pub max_target_positions: usize,
}

/// The result of one transcription.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcription {
    /// The segment texts concatenated (each starts with its own space, as faster-whisper's).
    pub text: String,
    pub language: String,
    /// The detected language's probability among the languages on the first window
    /// (faster-whisper's `language_probability`); 1 when the language was given or the
    /// model is English-only.
    pub language_probability: f64,
    /// Seconds of audio.
    pub duration: f64,
    pub segments: Vec<Segment>,
    /// Decoder prompt tokens over all windows.
    pub prompt_tokens: usize,
    /// Generated tokens over all windows.
    pub completion_tokens: usize,
}

/// One segment, with faster-whisper's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// From 1, as faster-whisper numbers them.
    pub id: usize,
    /// Start of the window the segment was decoded in, in 10 ms frames.
    pub seek: usize,
    pub start: f64,
    pub end: f64,
    pub text: String,
    /// Generated ids, including the segment's timestamp tokens.
    pub tokens: Vec<u32>,
    pub avg_logprob: f64,
    pub compression_ratio: f64,
    pub no_speech_prob: f64,
    pub temperature: f32,
}

/// Everything loading or transcribing can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SpeechError {
    /// Weights or files that cannot be loaded.
    #[error(transparent)]
    Load(#[from] ModelError),
    /// A config file that cannot be read or lacks a field.
    #[error("bad whisper model config: {0}")]
    Config(String),
    /// A `model.bin` that cannot be read (truncated, corrupt) or lacks a Whisper tensor.
    #[error("bad whisper weights: {0}")]
    Weights(String),
    /// vLLM's message for a language code Whisper does not know.
    #[error("Unsupported language: '{language}'.  Must be one of {supported}.")]
    UnsupportedLanguage { language: String, supported: String },
    /// A request that cannot be served (400).
    #[error("{0}")]
    InvalidRequest(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The device asked for is not usable.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl SpeechError {
    /// The HTTP status of this error: 400 for request errors, 500 otherwise.
    pub fn status(&self) -> u16 {
        match self {
            SpeechError::UnsupportedLanguage { .. } | SpeechError::InvalidRequest(_) => 400,
            _ => 500,
        }
    }
}

/// One decode of [`Transcriber::generate`]: an explicit decoder prompt, as CTranslate2's
/// `Whisper.generate` takes it.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Must contain `<|startoftranscript|>`; timestamp rules apply unless it ends with
    /// `<|notimestamps|>`.
    pub prompt: Vec<u32>,
    /// Forbid `<|endoftext|>` and a blank at the first step (config.json's
    /// `suppress_ids_begin`).
    pub suppress_blank: bool,
    /// Forbid config.json's `suppress_ids` (non-speech symbols) and the control tokens.
    pub suppress_tokens: bool,
    pub max_new_tokens: Option<usize>,
}

/// A loaded Whisper model. `Send + Sync`: share it behind an `Arc`; transcriptions running
/// on several threads at once decode their tokens in shared batched steps.
pub struct Transcriber {
    loaded: transcribe::Loaded,
}

impl Transcriber {
    /// Load a CTranslate2 Whisper folder on `config.device`.
    pub fn load(model_dir: &Path, config: TranscriberConfig) -> Result<Self, SpeechError> {
        let network = match crate::backend::resolve(config.device)? {
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => {
                use crate::backend::cuda::{device, CudaBackend};
                let dev = device(i);
                return Ok(Self {
                    loaded: transcribe::load(
                        model_dir,
                        &config,
                        transcribe::burn_network::<CudaBackend>(&dev),
                    )?,
                });
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => return Err(DeviceError::CudaNotCompiled.into()),
            Device::Cpu | Device::Auto => transcribe::host_network(),
        };
        Ok(Self {
            loaded: transcribe::load(model_dir, &config, network)?,
        })
    }

    /// Load with the network on burn backend `B` (`config.device` is not consulted). On
    /// `burn_flex::Flex` it computes what the host network does, slower; on a CubeCL
    /// backend (burn-cuda, burn-wgpu) it runs on the GPU. Concurrent transcriptions share
    /// batched decoding steps there too.
    pub fn load_on<B: burn::tensor::backend::Backend>(
        model_dir: &Path,
        config: TranscriberConfig,
        device: &B::Device,
    ) -> Result<Self, SpeechError> {
        Ok(Self {
            loaded: transcribe::load(model_dir, &config, transcribe::burn_network::<B>(device))?,
        })
    }

    /// A CTranslate2 Whisper folder (`model.bin` + a `config.json` with `suppress_ids` or
    /// `alignment_heads`) or a Hugging Face Whisper folder (`model_type: "whisper"`).
    pub fn is_speech_model(model_dir: &Path) -> bool {
        let Ok(text) = std::fs::read_to_string(model_dir.join("config.json")) else {
            return false;
        };
        let Ok(cfg) = serde_json::from_str::<serde_json::Value>(&text) else {
            return false;
        };
        let ct2 = model_dir.join("model.bin").is_file()
            && (cfg.get("suppress_ids").is_some() || cfg.get("alignment_heads").is_some());
        ct2 || cfg.get("model_type").and_then(|v| v.as_str()) == Some("whisper")
    }

    pub fn info(&self) -> &WhisperInfo {
        &self.loaded.info
    }

    /// The model's shape.
    pub fn dims(&self) -> WhisperDims {
        self.loaded.model.dims()
    }

    /// How the decoding steps of concurrent [`Transcriber::transcribe`] calls were batched
    /// so far (calls on several threads share each step's weight reads).
    pub fn batch_stats(&self) -> BatchStats {
        self.loaded.batcher.stats()
    }

    /// `samples`: 16 kHz mono in [-1, 1]. faster-whisper's sequential 30 s windows.
    pub fn transcribe(
        &self,
        samples: &[f32],
        opts: &TranscribeOptions,
    ) -> Result<Transcription, SpeechError> {
        self.transcribe_with(samples, opts, &mut |_| {})
    }

    /// Same as [`Transcriber::transcribe`], calling `on_segment` as each segment is final.
    pub fn transcribe_with(
        &self,
        samples: &[f32],
        opts: &TranscribeOptions,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<Transcription, SpeechError> {
        self.run(samples, opts, on_segment)
    }

    /// Greedy decodes of one window of at most 30 s, zero-padded to 30 s before the log-mel
    /// (as HF's / vLLM's feature extractor does), one per request, sharing one encoder pass.
    /// Returns the generated ids of each (the final `<|endoftext|>` excluded).
    pub fn generate(
        &self,
        samples: &[f32],
        requests: &[GenerateRequest],
    ) -> Result<Vec<Vec<u32>>, SpeechError> {
        self.generate_window(samples, requests)
    }
}
