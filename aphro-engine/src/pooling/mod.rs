//! Pooling models: a BERT encoder on burn and the [`Embedder`] library API over it — embed,
//! score, rerank and classify with vLLM 0.33.0's semantics (`vllm/entrypoints/pooling/`), equal to
//! sentence-transformers / transformers on the same weights.
//!
//! * [`config`]: what the model folder says (BERT hyper-parameters, sentence-transformers'
//!   pooling mode, normalization and `max_seq_length`, the classifier's labels and activation)
//!   under vLLM's precedence rules.
//! * [`bert`]: the encoder (and BERT's pooler and classifier head), generic over the burn
//!   backend, batched over inputs of different lengths with a padding mask.
//! * [`host`]: the same encoder on the CPU on host slices, the sequences of a batch packed
//!   without padding and attention per sequence (what [`Embedder::load`] runs).
//! * [`embedder`]: tokenization (with the baked-in truncation and padding of a
//!   `tokenizer.json` switched off, as transformers does), vLLM's length and truncation rules,
//!   pooling, Matryoshka `dimensions`, normalization, cosine and cross-encoder scores.
//!
//! * [`batcher`]: dynamic batching — concurrent calls share one forward pass, up to a token
//!   budget.
//!
//! A pooling request is one forward pass: no KV cache.

pub mod batcher;
pub mod bert;
pub mod config;
pub mod embedder;
pub mod host;

pub use batcher::BatchStats;
pub use bert::{BertEncoder, EncoderInput};
pub use config::{
    is_pooling_model, BertConfig, ClassifierActivation, PoolingModelConfig, PoolingTask,
    PoolingType,
};
pub use embedder::{
    Classification, EmbedInput, EmbedOptions, Embedder, Embedding, RerankOutput, RerankResult,
    ScoreOptions, ScoreOutput, TruncationSide,
};
pub use host::HostBertEncoder;

use crate::model::ModelError;

/// Everything a pooling call can fail with. Request errors carry vLLM's message
/// ([`PoolingError::status`] says which HTTP status vLLM answers with).
#[derive(Debug, thiserror::Error)]
pub enum PoolingError {
    /// Weights that cannot be loaded.
    #[error(transparent)]
    Load(#[from] ModelError),
    /// A config file that cannot be read or lacks a field.
    #[error("bad pooling model config: {0}")]
    Config(String),
    /// A model this engine cannot run as a pooling model.
    #[error("{0} is not supported")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A prompt longer than the model's context without truncation. `at_least`: the text was
    /// tokenized with vLLM's cap of `max_model_len + 1` tokens, so only a lower bound is
    /// known.
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested \
         0 output tokens and your prompt contains {at}{tokens} input tokens, for a total of \
         {at}{tokens} tokens. Please reduce the length of the input prompt or the number of \
         requested output tokens.",
        at = if *at_least { "at least " } else { "" }
    )]
    PromptTooLong {
        max_model_len: usize,
        tokens: usize,
        at_least: bool,
    },
    /// A request vLLM refuses with a 400 (the message is vLLM's).
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
    },
    /// The model does not serve this task (vLLM's 501, e.g. embeddings on a classifier).
    #[error("{0}")]
    TaskNotSupported(String),
    #[error("backend: {0}")]
    Backend(String),
}

impl PoolingError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        PoolingError::InvalidRequest {
            message: message.into(),
            param: None,
        }
    }

    /// The HTTP status vLLM answers this error with.
    pub fn status(&self) -> u16 {
        match self {
            PoolingError::PromptTooLong { .. } | PoolingError::InvalidRequest { .. } => 400,
            PoolingError::TaskNotSupported(_) => 501,
            _ => 500,
        }
    }

    /// The request field the error is about, where vLLM names one.
    pub fn param(&self) -> Option<&str> {
        match self {
            PoolingError::InvalidRequest { param, .. } => param.as_deref(),
            _ => None,
        }
    }
}
