//! [`Embedder`]: a pooling model with its tokenizer — `embed`, `score`, `rerank`, `classify`
//! with vLLM 0.33.0's request semantics (`renderers/params.py`, `pooling_params.py`,
//! `entrypoints/pooling/`).

use std::path::Path;

use burn::backend::flex::Flex;
use burn::tensor::backend::Backend;
use tokenizers::utils::truncation::{
    truncate_encodings, TruncationDirection, TruncationParams, TruncationStrategy,
};
use tokenizers::{Encoding, PostProcessor};

use super::batcher::{BatchStats, Batcher, DEFAULT_TOKEN_BUDGET};
use super::bert::{BertEncoder, EncoderInput, HiddenStates};
use super::config::{ClassifierActivation, PoolingModelConfig, PoolingTask, PoolingType};
use super::host::HostBertEncoder;
use super::PoolingError;
use crate::model::weights::SafetensorsWeights;

/// Tokens per forward pass (the burn encoder: padded batch size × longest sequence, batches
/// formed from the inputs sorted by length so padding stays small; the host encoder: real
/// tokens).
const BATCH_TOKEN_BUDGET: usize = 8192;

/// One input: text or token ids used as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedInput {
    /// Text tokenized with the model's special tokens (`[CLS]` … `[SEP]`).
    Text(String),
    /// Text tokenized without special tokens (vLLM's `add_special_tokens: false`, the default
    /// for a prompt rendered from chat messages, whose template places them).
    RawText(String),
    Tokens(Vec<u32>),
}

impl From<&str> for EmbedInput {
    fn from(s: &str) -> Self {
        EmbedInput::Text(s.to_string())
    }
}

impl From<String> for EmbedInput {
    fn from(s: String) -> Self {
        EmbedInput::Text(s)
    }
}

impl From<Vec<u32>> for EmbedInput {
    fn from(ids: Vec<u32>) -> Self {
        EmbedInput::Tokens(ids)
    }
}

/// Which end `truncate_prompt_tokens` keeps (`truncation_side`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TruncationSide {
    /// Keep the first tokens: the tokenizer truncates the text and keeps `[CLS]` … `[SEP]`.
    #[default]
    Right,
    /// Keep the last tokens of the full tokenization (`[CLS]` is lost).
    Left,
}

/// Request fields of `/v1/embeddings` the engine acts on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EmbedOptions {
    /// `-1` = the model's maximum length; `None` = an over-long input is an error.
    pub truncate_prompt_tokens: Option<i64>,
    pub truncation_side: Option<TruncationSide>,
    /// Matryoshka truncation (before normalization); refused for other models.
    pub dimensions: Option<i64>,
    /// Normalize (`None`: the model's default, sentence-transformers' `Normalize` module).
    pub use_activation: Option<bool>,
}

/// Request fields of `/score`, `/rerank` and `/classify`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScoreOptions {
    pub truncate_prompt_tokens: Option<i64>,
    pub truncation_side: Option<TruncationSide>,
    /// Cross-encoders: `false` returns the raw logit instead of the activation's output.
    pub use_activation: Option<bool>,
}

/// One embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    pub embedding: Vec<f32>,
    /// The ids the model ran on.
    pub token_ids: Vec<u32>,
    pub prompt_tokens: usize,
}

/// Scores in pair order and the prompt tokens of the whole request.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreOutput {
    pub scores: Vec<f32>,
    pub prompt_tokens: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RerankResult {
    /// The document's position in the request.
    pub index: usize,
    pub relevance_score: f32,
}

/// Results by score, highest first (ties keep input order), cut to `top_n`.
#[derive(Debug, Clone, PartialEq)]
pub struct RerankOutput {
    pub results: Vec<RerankResult>,
    /// Every pair's tokens, also those cut by `top_n`.
    pub prompt_tokens: usize,
}

/// One `/classify` result.
#[derive(Debug, Clone, PartialEq)]
pub struct Classification {
    /// `id2label` of the most probable class.
    pub label: Option<String>,
    pub probs: Vec<f32>,
    pub num_classes: usize,
    pub prompt_tokens: usize,
}

/// Which encoder runs the forward passes.
enum Encoder<B: Backend> {
    /// The CPU: packed sequences on host slices ([`super::host`]).
    Host(Box<HostBertEncoder>),
    /// Any burn backend: padded batches of tensors ([`super::bert`]).
    Burn(BertEncoder<B>),
}

/// A pooling model and its tokenizer.
pub struct Embedder<B: Backend = Flex> {
    model: Encoder<B>,
    tokenizer: aphro_core::Tokenizer,
    config: PoolingModelConfig,
    served_name: String,
    /// Concurrent calls share forward passes (see [`super::batcher`]).
    batcher: Batcher,
}

impl Embedder<Flex> {
    /// Load an HF model folder (`config.json`, safetensors, `tokenizer.json`, and
    /// sentence-transformers' files when present) on the CPU, with the packed host encoder.
    pub fn load(dir: &Path) -> Result<Self, PoolingError> {
        Self::load_with(dir, |config, weights, num_labels| {
            HostBertEncoder::load(config.bert.clone(), weights, num_labels)
                .map(|m| Encoder::Host(Box::new(m)))
        })
    }
}

impl<B: Backend> Embedder<B> {
    /// [`Embedder::load`] with the burn encoder on any burn backend (on `Flex` it computes the
    /// same as the host encoder, slower: padded batches of generic tensor ops).
    pub fn load_on(dir: &Path, device: &B::Device) -> Result<Self, PoolingError> {
        Self::load_with(dir, |config, weights, num_labels| {
            BertEncoder::load(config.bert.clone(), weights, num_labels, device).map(Encoder::Burn)
        })
    }

    fn load_with(
        dir: &Path,
        encoder: impl FnOnce(
            &PoolingModelConfig,
            &SafetensorsWeights,
            Option<usize>,
        ) -> Result<Encoder<B>, PoolingError>,
    ) -> Result<Self, PoolingError> {
        let dir = crate::model::resolve_model_path(dir)?;
        let config = PoolingModelConfig::from_dir(&dir)?;
        let weights = SafetensorsWeights::open_dir(&dir)?;
        let num_labels = match config.task {
            PoolingTask::Classify => Some(config.labels.len()),
            PoolingTask::Embed => None,
        };
        let model = encoder(&config, &weights, num_labels)?;
        let tokenizer = load_tokenizer(&dir.join("tokenizer.json"))?;
        Ok(Self {
            model,
            tokenizer,
            config,
            served_name: dir.display().to_string(),
            batcher: Batcher::new(DEFAULT_TOKEN_BUDGET),
        })
    }

    /// The name error messages use for the model (vLLM's served model name; default: the
    /// folder's path).
    pub fn with_served_name(mut self, name: impl Into<String>) -> Self {
        self.served_name = name.into();
        self
    }

    /// Calls submitted so far and the batched forward passes that served them: under
    /// concurrency there are fewer forwards than calls.
    pub fn batch_stats(&self) -> BatchStats {
        self.batcher.stats()
    }

    pub fn config(&self) -> &PoolingModelConfig {
        &self.config
    }

    pub fn tokenizer(&self) -> &aphro_core::Tokenizer {
        &self.tokenizer
    }

    pub fn max_model_len(&self) -> usize {
        self.config.max_model_len
    }

    /// The ids the model runs on for `input`, after vLLM's truncation and length checks.
    pub fn tokenize(
        &self,
        input: &EmbedInput,
        truncate_prompt_tokens: Option<i64>,
        side: Option<TruncationSide>,
    ) -> Result<Vec<u32>, PoolingError> {
        let limit = self.truncation_limit(truncate_prompt_tokens)?;
        let side = side.unwrap_or_default();
        let ids = match input {
            EmbedInput::Text(text) => self.tokenize_text(text, true, limit, side)?,
            EmbedInput::RawText(text) => self.tokenize_text(text, false, limit, side)?,
            EmbedInput::Tokens(ids) => match (limit, side) {
                (Some(n), TruncationSide::Right) => ids[..ids.len().min(n)].to_vec(),
                (Some(n), TruncationSide::Left) => keep_last(ids.clone(), n),
                (None, _) => {
                    if ids.len() > self.config.max_model_len {
                        return Err(PoolingError::PromptTooLong {
                            max_model_len: self.config.max_model_len,
                            tokens: ids.len(),
                            at_least: false,
                        });
                    }
                    ids.clone()
                }
            },
        };
        self.check_ids(&ids)?;
        Ok(ids)
    }

    /// `text`'s ids with or without the special tokens, truncated to `limit` from `side`
    /// (right: the tokenizer truncates the text and keeps the special tokens; left: the last
    /// ids of the full tokenization), or vLLM's length error without a limit.
    fn tokenize_text(
        &self,
        text: &str,
        specials: bool,
        limit: Option<usize>,
        side: TruncationSide,
    ) -> Result<Vec<u32>, PoolingError> {
        match (limit, side) {
            (Some(n), TruncationSide::Right) => {
                let enc = self.encode(text)?;
                let added = if specials {
                    self.added_tokens(false)
                } else {
                    0
                };
                if n < added {
                    return Err(PoolingError::invalid(format!(
                        "truncate_prompt_tokens={n} leaves no room for the model's {added} \
                         special tokens"
                    )));
                }
                let (enc, _) =
                    truncate_encodings(enc, None, &right_truncation(n - added)).map_err(tok_err)?;
                Ok(self.post_process(enc, None, specials)?.get_ids().to_vec())
            }
            (Some(n), TruncationSide::Left) => {
                let ids = self
                    .post_process(self.encode(text)?, None, specials)?
                    .get_ids()
                    .to_vec();
                Ok(keep_last(ids, n))
            }
            (None, _) => {
                let ids = self
                    .post_process(self.encode(text)?, None, specials)?
                    .get_ids()
                    .to_vec();
                if ids.len() > self.config.max_model_len {
                    return Err(PoolingError::PromptTooLong {
                        max_model_len: self.config.max_model_len,
                        tokens: self.config.max_model_len + 1,
                        at_least: true,
                    });
                }
                Ok(ids)
            }
        }
    }

    /// Embed every input (one vector each, in input order).
    pub fn embed(
        &self,
        inputs: &[EmbedInput],
        opts: &EmbedOptions,
    ) -> Result<Vec<Embedding>, PoolingError> {
        if self.config.task != PoolingTask::Embed {
            return Err(PoolingError::TaskNotSupported(
                "The model does not support Embeddings API".into(),
            ));
        }
        let dims = self.check_dimensions(opts.dimensions)?;
        let ids: Vec<Vec<u32>> = inputs
            .iter()
            .map(|i| self.tokenize(i, opts.truncate_prompt_tokens, opts.truncation_side))
            .collect::<Result<_, _>>()?;
        let normalize = opts.use_activation.unwrap_or(self.config.normalize);
        let seqs = ids
            .iter()
            .map(|ids| EncoderInput {
                token_ids: ids.clone(),
                token_type_ids: Vec::new(),
            })
            .collect();
        let hidden = self.run(seqs)?;
        Ok(hidden
            .iter()
            .zip(ids)
            .map(|(h, ids)| {
                let mut v = self.pool(h, ids.len());
                if let Some(d) = dims {
                    v.truncate(d);
                }
                if normalize {
                    l2_normalize(&mut v);
                }
                Embedding {
                    embedding: v,
                    prompt_tokens: ids.len(),
                    token_ids: ids,
                }
            })
            .collect())
    }

    /// vLLM `/score`: 1:1, 1:N (the query broadcast) or N:N pairs. A bi-encoder scores the
    /// cosine of the two embeddings (each text embedded once); a one-label cross-encoder
    /// scores `[CLS] q [SEP] d [SEP]` with its classifier.
    pub fn score(
        &self,
        queries: &[String],
        documents: &[String],
        opts: &ScoreOptions,
    ) -> Result<ScoreOutput, PoolingError> {
        if queries.is_empty() {
            return Err(PoolingError::invalid(
                "At least one text element must be given",
            ));
        }
        if documents.is_empty() {
            return Err(PoolingError::invalid(
                "At least one text_pair element must be given",
            ));
        }
        if queries.len() > 1 && queries.len() != documents.len() {
            return Err(PoolingError::invalid(
                "Input lengths must be either 1:1, 1:N or N:N",
            ));
        }
        let query_of = |i: usize| if queries.len() == 1 { 0 } else { i };
        match self.config.task {
            PoolingTask::Embed => {
                let embed = |texts: &[String]| {
                    let inputs: Vec<EmbedInput> =
                        texts.iter().map(|t| EmbedInput::Text(t.clone())).collect();
                    self.embed(
                        &inputs,
                        &EmbedOptions {
                            truncate_prompt_tokens: opts.truncate_prompt_tokens,
                            truncation_side: opts.truncation_side,
                            dimensions: None,
                            use_activation: opts.use_activation,
                        },
                    )
                };
                let q = embed(queries)?;
                let d = embed(documents)?;
                let scores = (0..documents.len())
                    .map(|i| cosine(&q[query_of(i)].embedding, &d[i].embedding))
                    .collect();
                let prompt_tokens = q.iter().chain(&d).map(|e| e.prompt_tokens).sum();
                Ok(ScoreOutput {
                    scores,
                    prompt_tokens,
                })
            }
            PoolingTask::Classify => {
                if self.config.labels.len() != 1 {
                    return Err(PoolingError::TaskNotSupported(
                        "The model does not support Score API".into(),
                    ));
                }
                let pairs: Vec<EncoderInput> = (0..documents.len())
                    .map(|i| self.encode_pair(&queries[query_of(i)], &documents[i], opts))
                    .collect::<Result<_, _>>()?;
                let prompt_tokens = pairs.iter().map(|p| p.token_ids.len()).sum();
                let out = self.classify_encoded(pairs, opts.use_activation)?;
                Ok(ScoreOutput {
                    scores: out.into_iter().map(|c| c.probs[0]).collect(),
                    prompt_tokens,
                })
            }
        }
    }

    /// vLLM `/rerank`: [`Self::score`] of the query against every document, sorted by score
    /// (highest first, ties in input order), cut to `top_n` (`0` = all).
    pub fn rerank(
        &self,
        query: &str,
        documents: &[String],
        top_n: usize,
        opts: &ScoreOptions,
    ) -> Result<RerankOutput, PoolingError> {
        let out = self.score(&[query.to_string()], documents, opts)?;
        let mut results: Vec<RerankResult> = out
            .scores
            .iter()
            .enumerate()
            .map(|(index, &relevance_score)| RerankResult {
                index,
                relevance_score,
            })
            .collect();
        // `sort_by` is stable, like Python's `sorted`.
        results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score));
        if top_n > 0 && top_n < results.len() {
            results.truncate(top_n);
        }
        Ok(RerankOutput {
            results,
            prompt_tokens: out.prompt_tokens,
        })
    }

    /// vLLM `/classify` on a sequence-classification model: one result per input.
    pub fn classify(
        &self,
        inputs: &[EmbedInput],
        opts: &ScoreOptions,
    ) -> Result<Vec<Classification>, PoolingError> {
        if self.config.task != PoolingTask::Classify {
            return Err(PoolingError::TaskNotSupported(
                "The model does not support Classification API".into(),
            ));
        }
        let seqs: Vec<EncoderInput> = inputs
            .iter()
            .map(|i| {
                Ok(EncoderInput {
                    token_ids: self.tokenize(
                        i,
                        opts.truncate_prompt_tokens,
                        opts.truncation_side,
                    )?,
                    token_type_ids: Vec::new(),
                })
            })
            .collect::<Result<_, PoolingError>>()?;
        self.classify_encoded(seqs, opts.use_activation)
    }

    /// The raw logits of a cross-encoder for one (query, document) pair, as transformers'
    /// `BertForSequenceClassification` returns them.
    pub fn pair_logits(&self, query: &str, document: &str) -> Result<Vec<f32>, PoolingError> {
        let pair = self.encode_pair(query, document, &ScoreOptions::default())?;
        let out = self.classify_encoded(vec![pair], Some(false))?;
        Ok(out.into_iter().next().map(|c| c.probs).unwrap_or_default())
    }

    /// The ids and token types of a cross-encoder pair: `tokenizer(text=q, text_pair=d)`;
    /// an empty document is dropped as transformers' single-pair call drops it.
    pub fn encode_pair(
        &self,
        query: &str,
        document: &str,
        opts: &ScoreOptions,
    ) -> Result<EncoderInput, PoolingError> {
        let limit = self.truncation_limit(opts.truncate_prompt_tokens)?;
        let q = self.encode(query)?;
        let d = if document.is_empty() {
            None
        } else {
            Some(self.encode(document)?)
        };
        let (q, d) = match limit {
            Some(n) => {
                let added = self.added_tokens(d.is_some());
                if n < added {
                    return Err(PoolingError::invalid(format!(
                        "truncate_prompt_tokens={n} leaves no room for the model's {added} \
                         special tokens"
                    )));
                }
                let mut params = right_truncation(n - added);
                params.strategy = TruncationStrategy::LongestFirst;
                truncate_encodings(q, d, &params).map_err(tok_err)?
            }
            None => (q, d),
        };
        let enc = self.post_process(q, d, true)?;
        if enc.get_ids().len() > self.config.max_model_len {
            return Err(PoolingError::PromptTooLong {
                max_model_len: self.config.max_model_len,
                tokens: self.config.max_model_len + 1,
                at_least: true,
            });
        }
        self.check_ids(enc.get_ids())?;
        Ok(EncoderInput {
            token_ids: enc.get_ids().to_vec(),
            token_type_ids: enc.get_type_ids().to_vec(),
        })
    }

    fn classify_encoded(
        &self,
        seqs: Vec<EncoderInput>,
        use_activation: Option<bool>,
    ) -> Result<Vec<Classification>, PoolingError> {
        let lens: Vec<usize> = seqs.iter().map(|s| s.token_ids.len()).collect();
        let hidden = self.run(seqs)?;
        let mut rows = Vec::with_capacity(hidden.len() * self.config.bert.hidden_size);
        for (h, &n) in hidden.iter().zip(&lens) {
            rows.extend(self.pool(h, n));
        }
        let logits = match &self.model {
            Encoder::Host(m) => m.classify(&m.pool_dense(rows)),
            Encoder::Burn(m) => m.classify(m.pool_dense(rows)?)?,
        };
        let logits = logits.ok_or_else(|| {
            PoolingError::TaskNotSupported("The model does not support Classification API".into())
        })?;
        let k = self.config.labels.len();
        let activate = use_activation.unwrap_or(true);
        Ok(logits
            .chunks(k.max(1))
            .zip(&lens)
            .map(|(l, &n)| {
                let probs = if activate {
                    activation(self.config.activation, l)
                } else {
                    l.to_vec()
                };
                let best = argmax(&probs);
                Classification {
                    label: best.and_then(|i| self.config.labels.get(i).cloned()),
                    num_classes: probs.len(),
                    probs,
                    prompt_tokens: n,
                }
            })
            .collect())
    }

    /// The hidden states of `seqs`, computed together with the other calls running at the
    /// same time (dynamic batching).
    fn run(&self, seqs: Vec<EncoderInput>) -> Result<HiddenStates, PoolingError> {
        self.batcher.submit(seqs, |all| match &self.model {
            Encoder::Host(m) => forward_packed(m, all),
            Encoder::Burn(m) => forward_sorted(m, all),
        })
    }
}

/// Forward `seqs` packed, in chunks of at most [`BATCH_TOKEN_BUDGET`] tokens (one sequence
/// may exceed it alone): no padding, so the order and mix of lengths cost nothing.
fn forward_packed(
    model: &HostBertEncoder,
    seqs: Vec<EncoderInput>,
) -> Result<HiddenStates, PoolingError> {
    let mut out = Vec::with_capacity(seqs.len());
    let mut start = 0;
    while start < seqs.len() {
        let mut end = start + 1;
        let mut tokens = seqs[start].token_ids.len();
        while end < seqs.len() && tokens + seqs[end].token_ids.len() <= BATCH_TOKEN_BUDGET {
            tokens += seqs[end].token_ids.len();
            end += 1;
        }
        out.extend(model.forward(&seqs[start..end])?);
        start = end;
    }
    Ok(out)
}

/// Forward `seqs` in padded batches of similar length; hidden states in input order.
fn forward_sorted<B: Backend>(
    model: &BertEncoder<B>,
    seqs: Vec<EncoderInput>,
) -> Result<HiddenStates, PoolingError> {
    {
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_by_key(|&i| seqs[i].token_ids.len());
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
        let mut start = 0;
        while start < order.len() {
            // Sorted by length: the last sequence taken is the longest of its batch.
            // A batch pads every sequence to its longest: it also ends where padding would
            // more than double the tokens computed (a short text next to a long one would
            // otherwise cost as much as the long one).
            let mut end = start + 1;
            let mut real = seqs[order[start]].token_ids.len();
            while end < order.len() {
                let len = seqs[order[end]].token_ids.len();
                let padded = (end - start + 1) * len;
                if padded > BATCH_TOKEN_BUDGET || (padded > 2 * (real + len) && padded > 512) {
                    break;
                }
                real += len;
                end += 1;
            }
            let batch: Vec<EncoderInput> =
                order[start..end].iter().map(|&i| seqs[i].clone()).collect();
            for (h, &i) in model.forward(&batch)?.into_iter().zip(&order[start..end]) {
                out[i] = h;
            }
            start = end;
        }
        Ok(out)
    }
}

impl<B: Backend> Embedder<B> {
    /// One sequence's hidden states (`n` tokens) → one vector, by the model's pooling type.
    /// Sums run in f32 in token order, as vLLM's pooler accumulates.
    fn pool(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        let h = self.config.bert.hidden_size;
        let rows = hidden.chunks_exact(h).take(n);
        match self.config.pooling {
            PoolingType::Cls => hidden[..h].to_vec(),
            PoolingType::Last => hidden[(n - 1) * h..n * h].to_vec(),
            PoolingType::Mean => {
                let mut sum = vec![0f32; h];
                for r in rows {
                    for (s, v) in sum.iter_mut().zip(r) {
                        *s += v;
                    }
                }
                sum.iter().map(|s| s / n as f32).collect()
            }
            PoolingType::Max => {
                let mut max = vec![f32::NEG_INFINITY; h];
                for r in rows {
                    for (m, &v) in max.iter_mut().zip(r) {
                        *m = m.max(v);
                    }
                }
                max
            }
        }
    }

    /// `truncate_prompt_tokens` → the number of tokens to keep (`-1` = `max_model_len`).
    fn truncation_limit(&self, t: Option<i64>) -> Result<Option<usize>, PoolingError> {
        let max = self.config.max_model_len;
        match t {
            None => Ok(None),
            Some(-1) => Ok(Some(max)),
            Some(n) if n < -1 => Err(PoolingError::InvalidRequest {
                message: "truncate_prompt_tokens must be greater than or equal to -1".into(),
                param: Some("truncate_prompt_tokens".into()),
            }),
            Some(n) if n as u64 > max as u64 => Err(PoolingError::InvalidRequest {
                message: "truncate_prompt_tokens value is greater than max_model_len. Please \
                          request a smaller truncation size."
                    .into(),
                param: Some("truncate_prompt_tokens".into()),
            }),
            Some(n) => Ok(Some(n as usize)),
        }
    }

    /// vLLM `PoolingParams.verify` of `dimensions`: the size to keep, if any.
    fn check_dimensions(&self, dimensions: Option<i64>) -> Result<Option<usize>, PoolingError> {
        let Some(d) = dimensions else {
            return Ok(None);
        };
        let err = |message: String| PoolingError::InvalidRequest {
            message,
            param: Some("dimensions".into()),
        };
        match &self.config.matryoshka {
            None => Err(err(format!(
                "Model \"{}\" does not support matryoshka representation, changing output \
                 dimensions will lead to poor results.",
                self.served_name
            ))),
            Some(allowed) if !allowed.is_empty() && !allowed.iter().any(|&a| a as i64 == d) => {
                Err(err(format!(
                    "Model '{}' only supports {allowed:?} matryoshka dimensions, use other \
                     output dimensions will lead to poor results.",
                    self.served_name
                )))
            }
            Some(_) if d < 1 => Err(err("Dimensions must be greater than 0".into())),
            Some(_) => Ok(Some(d as usize)),
        }
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), PoolingError> {
        if ids.is_empty() {
            return Err(PoolingError::invalid("The decoder prompt cannot be empty"));
        }
        if let Some(&max) = ids.iter().max() {
            if max as usize >= self.config.bert.vocab_size {
                return Err(PoolingError::invalid(format!(
                    "Token id {max} is out of vocabulary"
                )));
            }
        }
        Ok(())
    }

    /// The text's encoding without special tokens (nothing truncated or padded).
    fn encode(&self, text: &str) -> Result<Encoding, PoolingError> {
        self.tokenizer
            .hf()
            .encode_fast(text, false)
            .map_err(tok_err)
    }

    fn post_process(
        &self,
        a: Encoding,
        b: Option<Encoding>,
        add_special_tokens: bool,
    ) -> Result<Encoding, PoolingError> {
        self.tokenizer
            .hf()
            .post_process(a, b, add_special_tokens)
            .map_err(tok_err)
    }

    fn added_tokens(&self, pair: bool) -> usize {
        self.tokenizer
            .hf()
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(pair))
    }
}

/// A `tokenizer.json` as transformers loads it: the truncation and padding baked into the
/// file are switched off (sentence-transformers and vLLM apply their own limits).
pub fn load_tokenizer(path: &Path) -> Result<aphro_core::Tokenizer, PoolingError> {
    let mut inner = tokenizers::Tokenizer::from_file(path)
        .map_err(|e| PoolingError::Tokenizer(format!("{}: {e}", path.display())))?;
    inner
        .with_truncation(None)
        .map_err(|e| PoolingError::Tokenizer(e.to_string()))?;
    inner.with_padding(None);
    Ok(aphro_core::Tokenizer::from_hf(inner))
}

fn tok_err(e: tokenizers::Error) -> PoolingError {
    PoolingError::Tokenizer(e.to_string())
}

fn right_truncation(max_length: usize) -> TruncationParams {
    TruncationParams {
        direction: TruncationDirection::Right,
        max_length,
        strategy: TruncationStrategy::LongestFirst,
        stride: 0,
    }
}

fn keep_last(mut ids: Vec<u32>, n: usize) -> Vec<u32> {
    if ids.len() > n {
        ids.drain(..ids.len() - n);
    }
    ids
}

/// `x / max(‖x‖₂, 1e-12)` (`F.normalize`).
fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let norm = norm.max(1e-12);
    for x in v {
        *x = (*x as f64 / norm) as f32;
    }
}

/// `F.cosine_similarity(a, b, dim=0)` (eps 1e-8).
fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    (dot / (na.max(1e-8) * nb.max(1e-8))) as f32
}

fn activation(act: ClassifierActivation, logits: &[f32]) -> Vec<f32> {
    match act {
        ClassifierActivation::Identity => logits.to_vec(),
        ClassifierActivation::Sigmoid => logits
            .iter()
            .map(|&l| (1.0 / (1.0 + (-(l as f64)).exp())) as f32)
            .collect(),
        ClassifierActivation::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let exps: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            exps.iter().map(|e| (e / sum) as f32).collect()
        }
    }
}

fn argmax(v: &[f32]) -> Option<usize> {
    v.iter()
        .enumerate()
        .fold(None, |best: Option<(usize, f32)>, (i, &x)| match best {
            Some((_, b)) if b >= x => best,
            _ => Some((i, x)),
        })
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(keep_last(vec![1, 2, 3, 4], 2), vec![3, 4]);
        assert_eq!(keep_last(vec![1, 2], 5), vec![1, 2]);
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0, 0.0];
        l2_normalize(&mut z);
        assert_eq!(z, vec![0.0, 0.0]);
        assert!((cosine(&[1.0, 0.0], &[1.0, 1.0]) - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-7);
        assert_eq!(argmax(&[0.1, 0.7, 0.7]), Some(1));
        let p = activation(ClassifierActivation::Softmax, &[0.0, 0.0]);
        assert_eq!(p, vec![0.5, 0.5]);
        let s = activation(ClassifierActivation::Sigmoid, &[0.0]);
        assert_eq!(s, vec![0.5]);
    }
}
