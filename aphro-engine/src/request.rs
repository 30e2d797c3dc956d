//! Engine-internal request and output types (plain Rust; the HTTP layer converts the wire
//! types of `docs/spec/api.md` §2.3/§4 at the edge) and `SamplingParams` validation with vLLM's
//! messages.

use std::collections::HashSet;

pub use aphro_core::structured::{GrammarMatcher, TokenMask};

use aphro_core::protocol::{verify_greedy, verify_sampling_args, SamplingArgError, SamplingArgs};
pub use aphro_core::protocol::{MAX_N_SEQUENCES, SAMPLING_EPS};

/// vLLM clamps `0 < temperature < 0.01` up to this to avoid inf/NaN.
pub const MIN_TEMPERATURE: f64 = 0.01;

/// Sampling parameters as the client sent them (after JSON decoding), before validation.
///
/// Integer fields are signed so out-of-range values reach [`SamplingConfig::validate`] and
/// get vLLM's exact message instead of failing a conversion somewhere else.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    pub n: i64,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
    pub repetition_penalty: f64,
    pub temperature: f64,
    pub top_p: f64,
    /// 0 or -1 disables.
    pub top_k: i64,
    pub min_p: f64,
    /// `-1` is normalized to `None` (vLLM).
    pub seed: Option<i64>,
    pub stop_token_ids: Vec<u32>,
    /// Bad words already tokenized (each a token-id sequence); the last id of a word is
    /// banned when the output ends with the word's other ids.
    pub bad_words_token_ids: Vec<Vec<u32>>,
    pub ignore_eos: bool,
    /// `None` = until the context is full.
    pub max_tokens: Option<i64>,
    pub min_tokens: i64,
    /// Top-k logprobs per generated token; `-1` = the whole vocabulary.
    pub logprobs: Option<i64>,
    pub prompt_logprobs: Option<i64>,
    /// Additive biases, clamped to [-100, 100].
    pub logit_bias: Vec<(u32, f64)>,
    pub allowed_token_ids: Option<Vec<u32>>,
    /// With `logprobs`: the candidates reported at each generated position are exactly these
    /// ids, in this order, instead of the top-k (vLLM's `logprob_token_ids`; generative
    /// scoring reads its label tokens through it).
    pub logprob_token_ids: Option<Vec<u32>>,
    /// Structured outputs: the compiled constraint, fresh (each choice advances its own copy).
    pub grammar: Option<GrammarMatcher>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            n: 1,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            stop_token_ids: Vec::new(),
            bad_words_token_ids: Vec::new(),
            ignore_eos: false,
            max_tokens: Some(16),
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
            logprob_token_ids: None,
            grammar: None,
        }
    }
}

impl SamplingConfig {
    /// Greedy decoding (temperature 0) with the given budget.
    pub fn greedy(max_tokens: i64) -> Self {
        Self {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            ..Self::default()
        }
    }
}

/// One generation request as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineRequest {
    /// Unique among in-flight requests; abort uses it.
    pub request_id: String,
    pub prompt_token_ids: Vec<u32>,
    pub sampling: SamplingConfig,
    /// Lower runs first (vLLM priority scheduling); ties are first-come first-served.
    pub priority: i64,
    /// `cache_salt`: prefix-cache blocks are shared only between requests with the same
    /// salt (or none), so one tenant cannot probe another's prompts by timing hits.
    pub cache_salt: Option<String>,
    /// The prompt's multimodal items (mm_hash and placeholder run), sorted by offset: each
    /// enters the hash of the blocks it touches, so two images behind the same placeholder
    /// tokens never share KV blocks (vLLM's `mm_features`).
    pub mm_features: Vec<crate::kv_hash::MmPosition>,
}

impl EngineRequest {
    pub fn new(
        request_id: impl Into<String>,
        prompt_token_ids: Vec<u32>,
        sampling: SamplingConfig,
    ) -> Self {
        Self {
            request_id: request_id.into(),
            prompt_token_ids,
            sampling,
            priority: 0,
            cache_salt: None,
            mm_features: Vec::new(),
        }
    }
}

/// A request rejected before it reached the scheduler (HTTP 400). Messages are vLLM 0.33's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// A range check on one `SamplingParams` field; `param` names it where vLLM sets `param`.
    #[error("{message}")]
    Param {
        param: Option<&'static str>,
        message: String,
    },
    #[error("Input length ({len}) exceeds model's maximum context length ({max}).")]
    PromptTooLong { len: usize, max: usize },
    #[error("The prompt must contain at least one token.")]
    EmptyPrompt,
    #[error("token id {id} in the prompt is outside the vocabulary ({vocab})")]
    PromptTokenOutOfVocab { id: u32, vocab: usize },
    #[error("n={n} exceeds max_num_seqs={max}")]
    TooManySequences { n: i64, max: usize },
}

impl ValidationError {
    fn param(param: &'static str, message: String) -> Self {
        Self::Param {
            param: Some(param),
            message,
        }
    }
    fn msg(message: String) -> Self {
        Self::Param {
            param: None,
            message,
        }
    }
}

fn py_list(ids: &[u32]) -> String {
    let items: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    format!("[{}]", items.join(", "))
}

impl From<SamplingArgError> for ValidationError {
    fn from(e: SamplingArgError) -> Self {
        ValidationError::Param {
            param: e.param,
            message: e.message,
        }
    }
}

/// Model/engine facts that validation depends on.
#[derive(Debug, Clone, Copy)]
pub struct ValidationLimits {
    pub vocab_size: usize,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    /// `--max-logprobs`; -1 = vocabulary size.
    pub max_logprobs: i64,
}

/// Validated, normalized sampling parameters the scheduler and sampler use.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingPlan {
    pub n: usize,
    pub greedy: bool,
    pub temperature: f32,
    pub top_p: f32,
    /// 0 = disabled.
    pub top_k: usize,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    pub seed: Option<u64>,
    /// Ids that stop with `stop_reason = id` (request ids + secondary EOS unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// The primary EOS (stop with `stop_reason = null`), `None` with `ignore_eos`.
    pub eos_token_id: Option<u32>,
    /// Everything `min_tokens` masks: stop ids and every EOS id.
    pub all_stop_token_ids: Vec<u32>,
    pub bad_words_token_ids: Vec<Vec<u32>>,
    /// Effective cap: min(max_tokens, max_model_len - prompt_len).
    pub max_tokens: usize,
    pub min_tokens: usize,
    /// Number of top candidates per generated token (`Some(0)` = sampled token only).
    pub logprobs: Option<usize>,
    pub prompt_logprobs: Option<usize>,
    pub logit_bias: Vec<(u32, f32)>,
    pub allowed_token_ids: Option<Vec<u32>>,
    /// See [`SamplingConfig::logprob_token_ids`].
    pub logprob_token_ids: Option<Vec<u32>>,
}

impl SamplingConfig {
    /// Range checks that need no model facts (vLLM `SamplingParams._verify_args`, then
    /// its greedy check), through the same checks the wire `SamplingParams` gets.
    pub fn verify_args(&self) -> Result<(), ValidationError> {
        verify_sampling_args(&SamplingArgs {
            n: self.n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            max_tokens: self.max_tokens,
            min_tokens: self.min_tokens,
            stream_interval: None,
            logprobs: self.logprobs,
            prompt_logprobs: self.prompt_logprobs,
        })
        .and_then(|()| verify_greedy(self.n, self.temperature))
        .map_err(ValidationError::from)
    }

    /// Full validation against the model, normalized into a [`SamplingPlan`].
    /// `eos_token_ids` is the model's list, primary first.
    pub fn plan(
        &self,
        prompt_len: usize,
        eos_token_ids: &[u32],
        limits: &ValidationLimits,
    ) -> Result<SamplingPlan, ValidationError> {
        self.verify_args()?;
        let vocab = limits.vocab_size;
        if self.n as u64 > limits.max_num_seqs as u64 {
            return Err(ValidationError::TooManySequences {
                n: self.n,
                max: limits.max_num_seqs,
            });
        }
        let max_logprobs = if limits.max_logprobs == -1 {
            vocab as i64
        } else {
            limits.max_logprobs
        };
        for (name, value) in [
            ("logprobs", self.logprobs),
            ("prompt_logprobs", self.prompt_logprobs),
        ] {
            if let Some(v) = value {
                let v = if v == -1 { vocab as i64 } else { v };
                if v > max_logprobs {
                    let what = if name == "logprobs" {
                        "sample logprobs"
                    } else {
                        "prompt logprobs"
                    };
                    return Err(ValidationError::param(
                        name,
                        format!("Requested {what} of {v}, which is greater than max allowed: {max_logprobs}"),
                    ));
                }
            }
        }
        let bad: Vec<u32> = self
            .stop_token_ids
            .iter()
            .copied()
            .filter(|&t| t as usize >= vocab)
            .collect();
        if !bad.is_empty() {
            return Err(ValidationError::param(
                "stop_token_ids",
                format!(
                    "token_id(s) {} in stop_token_ids contain out-of-vocab token ids. Vocabulary size: {vocab}",
                    py_list(&bad)
                ),
            ));
        }
        let bad: Vec<u32> = self
            .logit_bias
            .iter()
            .map(|&(t, _)| t)
            .filter(|&t| t as usize >= vocab)
            .collect();
        if !bad.is_empty() {
            return Err(ValidationError::param(
                "logit_bias",
                format!(
                    "token_id(s) {} in logit_bias contain out-of-vocab token ids. Vocabulary size: {vocab}",
                    py_list(&bad)
                ),
            ));
        }
        if let Some(allowed) = &self.allowed_token_ids {
            if allowed.is_empty() {
                return Err(ValidationError::param(
                    "allowed_token_ids",
                    "allowed_token_ids is not None and empty!".into(),
                ));
            }
            if allowed.iter().any(|&t| t as usize >= vocab) {
                return Err(ValidationError::param(
                    "allowed_token_ids",
                    "allowed_token_ids contains out-of-vocab token id!".into(),
                ));
            }
        }
        if let Some(ids) = &self.logprob_token_ids {
            if ids.iter().any(|&t| t as usize >= vocab) {
                return Err(ValidationError::param(
                    "logprob_token_ids",
                    "logprob_token_ids contains out-of-vocab token id!".into(),
                ));
            }
        }
        let bad: Vec<u32> = self
            .bad_words_token_ids
            .iter()
            .flatten()
            .copied()
            .filter(|&t| t as usize >= vocab)
            .collect();
        if !bad.is_empty() {
            return Err(ValidationError::msg(format!(
                "The model vocabulary size is {vocab}, but the following tokens were specified as bad: {}. \
                 All token id values should be integers satisfying: 0 <= token_id <= {}.",
                py_list(&bad),
                vocab.saturating_sub(1)
            )));
        }
        if prompt_len > limits.max_model_len {
            return Err(ValidationError::PromptTooLong {
                len: prompt_len,
                max: limits.max_model_len,
            });
        }
        let room = limits.max_model_len - prompt_len;
        if room == 0 {
            return Err(ValidationError::param(
                "max_tokens",
                "max_tokens must be at least 1, got 0.".into(),
            ));
        }
        // verify_args guarantees these are >= 1 / >= 0, so the casts below cannot wrap.
        let max_tokens = match self.max_tokens {
            Some(m) => usize::try_from(m).unwrap_or(usize::MAX).min(room),
            None => room,
        };
        let min_tokens = usize::try_from(self.min_tokens)
            .unwrap_or(usize::MAX)
            .min(max_tokens);

        let greedy = self.temperature < SAMPLING_EPS;
        let temperature = if greedy {
            0.0
        } else {
            self.temperature.max(MIN_TEMPERATURE)
        };

        // Dedup keeping order (vLLM `dict.fromkeys`).
        let mut seen = HashSet::new();
        let mut stop_token_ids: Vec<u32> = self
            .stop_token_ids
            .iter()
            .copied()
            .filter(|t| seen.insert(*t))
            .collect();
        let primary_eos = eos_token_ids.first().copied();
        if !self.ignore_eos {
            // Secondary EOS ids stop like stop_token_ids (reported as the int id).
            for &e in eos_token_ids.iter().skip(1) {
                if Some(e) != primary_eos && seen.insert(e) {
                    stop_token_ids.push(e);
                }
            }
        }
        let mut all_stop: Vec<u32> = stop_token_ids.clone();
        for &e in eos_token_ids {
            if !all_stop.contains(&e) {
                all_stop.push(e);
            }
        }
        let count = |v: Option<i64>| {
            v.map(|v| {
                if v == -1 {
                    vocab
                } else {
                    usize::try_from(v).unwrap_or(vocab).min(vocab)
                }
            })
        };
        Ok(SamplingPlan {
            n: usize::try_from(self.n).unwrap_or(1),
            greedy,
            temperature: temperature as f32,
            top_p: if greedy { 1.0 } else { self.top_p as f32 },
            top_k: if greedy || self.top_k <= 0 {
                0
            } else {
                usize::try_from(self.top_k).unwrap_or(usize::MAX)
            },
            min_p: if greedy { 0.0 } else { self.min_p as f32 },
            presence_penalty: self.presence_penalty as f32,
            frequency_penalty: self.frequency_penalty as f32,
            repetition_penalty: self.repetition_penalty as f32,
            seed: match self.seed {
                None | Some(-1) => None,
                Some(s) => Some(s as u64),
            },
            stop_token_ids,
            eos_token_id: if self.ignore_eos { None } else { primary_eos },
            all_stop_token_ids: all_stop,
            bad_words_token_ids: self
                .bad_words_token_ids
                .iter()
                .filter(|w| !w.is_empty())
                .cloned()
                .collect(),
            max_tokens,
            min_tokens,
            logprobs: count(self.logprobs),
            prompt_logprobs: count(self.prompt_logprobs),
            logit_bias: self
                .logit_bias
                .iter()
                .map(|&(t, b)| (t, b.clamp(-100.0, 100.0) as f32))
                .collect(),
            allowed_token_ids: self.allowed_token_ids.clone(),
            logprob_token_ids: self.logprob_token_ids.clone(),
        })
    }
}

/// Why a choice finished (§2.6). `error` is never a finish reason: it is an `Err` item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// One candidate's log-probability; `rank` is 1-based (1 = most likely).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Logprob {
    pub token_id: u32,
    pub logprob: f32,
    pub rank: usize,
}

/// Logprobs at one position: the chosen token (sampled, or the prompt token), then the
/// `top` candidates by rank (vLLM engine order; the chosen token is not repeated).
#[derive(Debug, Clone, PartialEq)]
pub struct PositionLogprobs {
    pub chosen: Logprob,
    pub top: Vec<Logprob>,
}

/// Token counts for one choice so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// This choice's generated tokens so far.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// One step's delta for one choice of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOutput {
    pub request_id: String,
    /// Choice index (`0..n`).
    pub index: usize,
    /// Newly generated ids (including a stop / EOS id that finished the choice).
    pub token_ids: Vec<u32>,
    /// One entry per id in `token_ids`, when `logprobs` was requested.
    pub logprobs: Option<Vec<PositionLogprobs>>,
    /// On the first output of the request only, when `prompt_logprobs` was requested:
    /// one entry per prompt token, the first `None`.
    pub prompt_logprobs: Option<Vec<Option<PositionLogprobs>>>,
    pub finish_reason: Option<FinishReason>,
    /// The stop token id that finished the choice (request stop id or secondary EOS);
    /// `None` for the primary EOS, length and abort.
    pub stop_reason: Option<u32>,
    pub usage: Usage,
}

impl EngineOutput {
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }
}
