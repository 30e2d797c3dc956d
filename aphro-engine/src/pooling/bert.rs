//! The BERT encoder on burn, generic over the backend: word + absolute position + token-type
//! embeddings and LayerNorm, then post-LN layers (bidirectional self-attention, GELU
//! feed-forward), optionally BERT's pooler (`dense` + `tanh` of a pooled row) and a
//! sequence-classification head.
//!
//! A batch holds sequences of different lengths padded to the longest; padded keys get a
//! large negative attention bias, so every real token sees exactly its own sequence and a
//! sequence's result does not depend on what it was batched with (up to float summation
//! order). Activations stay on the device; only the last hidden state comes back.

use burn::tensor::activation::{gelu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::config::{BertConfig, HiddenAct};
use super::PoolingError;
use crate::model::weights::WeightSource;

/// A dense layer stored as `[in, out]` (HF's `[out, in]` transposed at load) with its bias.
/// Also Whisper's on burn ([`crate::speech`]).
pub(crate) struct Dense<B: Backend> {
    pub wt: Tensor<B, 2>,
    pub b: Tensor<B, 1>,
}

impl<B: Backend> Dense<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        x.matmul(self.wt.clone()) + self.b.clone().unsqueeze::<2>()
    }
}

pub(crate) struct LayerNorm<B: Backend> {
    pub gamma: Tensor<B, 1>,
    pub beta: Tensor<B, 1>,
    pub eps: f64,
}

impl<B: Backend> LayerNorm<B> {
    /// Two-pass mean and (biased) variance over the last axis, as PyTorch computes them.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let mean = x.clone().mean_dim(1);
        let centered = x - mean;
        let var = centered.clone().powi_scalar(2).mean_dim(1);
        let normed = centered / (var + self.eps).sqrt();
        normed * self.gamma.clone().unsqueeze::<2>() + self.beta.clone().unsqueeze::<2>()
    }
}

struct Layer<B: Backend> {
    query: Dense<B>,
    key: Dense<B>,
    value: Dense<B>,
    attn_out: Dense<B>,
    attn_norm: LayerNorm<B>,
    intermediate: Dense<B>,
    output: Dense<B>,
    out_norm: LayerNorm<B>,
}

/// One sequence of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncoderInput {
    pub token_ids: Vec<u32>,
    /// Token types (segment ids), one per token; empty = all 0.
    pub token_type_ids: Vec<u32>,
}

/// The last hidden state of a batch: `hidden[seq][token * hidden_size + j]`.
pub type HiddenStates = Vec<Vec<f32>>;

pub struct BertEncoder<B: Backend> {
    pub cfg: BertConfig,
    word: Tensor<B, 2>,
    position: Tensor<B, 2>,
    token_type: Tensor<B, 2>,
    emb_norm: LayerNorm<B>,
    layers: Vec<Layer<B>>,
    /// BERT's pooler (`pooler.dense`), when the checkpoint has it.
    pooler: Option<Dense<B>>,
    /// `classifier` of `BertForSequenceClassification`.
    classifier: Option<Dense<B>>,
    device: B::Device,
}

struct Loader<'a, B: Backend> {
    src: &'a dyn WeightSource,
    /// `"bert."` when the checkpoint names the encoder's tensors with that prefix.
    prefix: &'static str,
    device: &'a B::Device,
}

impl<B: Backend> Loader<'_, B> {
    fn raw(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, PoolingError> {
        let Some(t) = self.src.get(name, false)? else {
            return Ok(None);
        };
        let (got, data) = t.into_f32();
        if got != shape {
            return Err(PoolingError::Load(
                crate::model::ModelError::ShapeMismatch {
                    name: name.to_string(),
                    expected: shape.to_vec(),
                    got,
                },
            ));
        }
        Ok(Some(data))
    }

    /// An encoder tensor: `name` under the checkpoint's prefix.
    fn encoder<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
    ) -> Result<Tensor<B, D>, PoolingError> {
        let full = format!("{}{name}", self.prefix);
        let data = self.raw(&full, &shape)?.ok_or_else(|| {
            PoolingError::Load(crate::model::ModelError::MissingTensor(full.clone()))
        })?;
        Ok(Tensor::from_data(TensorData::new(data, shape), self.device))
    }

    fn dense(&self, name: &str, out: usize, inp: usize) -> Result<Dense<B>, PoolingError> {
        let w: Tensor<B, 2> = self.encoder(&format!("{name}.weight"), [out, inp])?;
        Ok(Dense {
            wt: w.transpose(),
            b: self.encoder(&format!("{name}.bias"), [out])?,
        })
    }

    fn opt_dense(
        &self,
        full: &str,
        out: usize,
        inp: usize,
    ) -> Result<Option<Dense<B>>, PoolingError> {
        let Some(w) = self.raw(&format!("{full}.weight"), &[out, inp])? else {
            return Ok(None);
        };
        let b = self.raw(&format!("{full}.bias"), &[out])?.ok_or_else(|| {
            PoolingError::Load(crate::model::ModelError::MissingTensor(format!(
                "{full}.bias"
            )))
        })?;
        let w = Tensor::<B, 2>::from_data(TensorData::new(w, [out, inp]), self.device);
        Ok(Some(Dense {
            wt: w.transpose(),
            b: Tensor::from_data(TensorData::new(b, [out]), self.device),
        }))
    }

    fn norm(&self, name: &str, n: usize, eps: f64) -> Result<LayerNorm<B>, PoolingError> {
        Ok(LayerNorm {
            gamma: self.encoder(&format!("{name}.weight"), [n])?,
            beta: self.encoder(&format!("{name}.bias"), [n])?,
            eps,
        })
    }
}

impl<B: Backend> BertEncoder<B> {
    /// Load the encoder (names with or without the `bert.` prefix), the pooler if present,
    /// and, with `num_labels`, the `classifier` head.
    pub fn load(
        cfg: BertConfig,
        src: &dyn WeightSource,
        num_labels: Option<usize>,
        device: &B::Device,
    ) -> Result<Self, PoolingError> {
        let prefix = tensor_prefix(src);
        let l = Loader::<B> {
            src,
            prefix,
            device,
        };
        let (h, ff, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = |s: &str| format!("encoder.layer.{i}.{s}");
            layers.push(Layer {
                query: l.dense(&p("attention.self.query"), h, h)?,
                key: l.dense(&p("attention.self.key"), h, h)?,
                value: l.dense(&p("attention.self.value"), h, h)?,
                attn_out: l.dense(&p("attention.output.dense"), h, h)?,
                attn_norm: l.norm(&p("attention.output.LayerNorm"), h, eps)?,
                intermediate: l.dense(&p("intermediate.dense"), ff, h)?,
                output: l.dense(&p("output.dense"), h, ff)?,
                out_norm: l.norm(&p("output.LayerNorm"), h, eps)?,
            });
        }
        let classifier = match num_labels {
            Some(n) => Some(l.opt_dense("classifier", n, h)?.ok_or_else(|| {
                PoolingError::Load(crate::model::ModelError::MissingTensor(
                    "classifier.weight".into(),
                ))
            })?),
            None => None,
        };
        Ok(Self {
            word: l.encoder("embeddings.word_embeddings.weight", [cfg.vocab_size, h])?,
            position: l.encoder(
                "embeddings.position_embeddings.weight",
                [cfg.max_position_embeddings, h],
            )?,
            token_type: l.encoder(
                "embeddings.token_type_embeddings.weight",
                [cfg.type_vocab_size, h],
            )?,
            emb_norm: l.norm("embeddings.LayerNorm", h, eps)?,
            layers,
            pooler: l.opt_dense(&format!("{prefix}pooler.dense"), h, h)?,
            classifier,
            device: device.clone(),
            cfg,
        })
    }

    pub fn has_pooler(&self) -> bool {
        self.pooler.is_some()
    }

    fn index(&self, v: Vec<i64>) -> Tensor<B, 1, Int> {
        let n = v.len();
        Tensor::from_data(TensorData::new(v, [n]), &self.device)
    }

    /// The last hidden state of each sequence (no padding in the result). Every sequence
    /// must be non-empty, at most `max_position_embeddings` long, with ids in the vocabulary
    /// (the caller checks; see [`super::Embedder`]).
    pub fn forward(&self, batch: &[EncoderInput]) -> Result<HiddenStates, PoolingError> {
        let b = batch.len();
        let len = batch.iter().map(|s| s.token_ids.len()).max().unwrap_or(0);
        if b == 0 || len == 0 {
            return Ok(vec![Vec::new(); b]);
        }
        let (h, nh) = (self.cfg.hidden_size, self.cfg.num_heads);
        let d = h / nh;
        let n = b * len;
        let mut ids = vec![0i64; n];
        let mut types = vec![0i64; n];
        let mut pos = vec![0i64; n];
        let mut bias = vec![0f32; n];
        for (s, seq) in batch.iter().enumerate() {
            for t in 0..len {
                let i = s * len + t;
                pos[i] = t as i64;
                match seq.token_ids.get(t) {
                    Some(&id) => {
                        ids[i] = id as i64;
                        types[i] = seq.token_type_ids.get(t).copied().unwrap_or(0) as i64;
                    }
                    None => bias[i] = -1e30,
                }
            }
        }
        let x = self.word.clone().select(0, self.index(ids))
            + self.position.clone().select(0, self.index(pos))
            + self.token_type.clone().select(0, self.index(types));
        let mut x = self.emb_norm.forward(x);
        // [b, 1, 1, len]: added to every head's scores of every query row.
        let mask = Tensor::<B, 1>::from_data(TensorData::new(bias, [n]), &self.device)
            .reshape([b, 1, 1, len]);
        let scale = 1.0 / (d as f64).sqrt();
        for layer in &self.layers {
            let heads = |t: Tensor<B, 2>| t.reshape([b, len, nh, d]).swap_dims(1, 2);
            let q = heads(layer.query.forward(x.clone()));
            let k = heads(layer.key.forward(x.clone()));
            let v = heads(layer.value.forward(x.clone()));
            let scores = q.matmul(k.swap_dims(2, 3)) * scale + mask.clone();
            let ctx = softmax(scores, 3).matmul(v).swap_dims(1, 2).reshape([n, h]);
            x = layer.attn_norm.forward(layer.attn_out.forward(ctx) + x);
            let inner = layer.intermediate.forward(x.clone());
            let inner = match self.cfg.hidden_act {
                HiddenAct::Gelu => gelu(inner),
                HiddenAct::GeluTanh => burn::tensor::activation::gelu_approximate(inner),
                HiddenAct::Relu => burn::tensor::activation::relu(inner),
            };
            x = layer.out_norm.forward(layer.output.forward(inner) + x);
        }
        let all = to_vec(x)?;
        Ok(batch
            .iter()
            .enumerate()
            .map(|(s, seq)| all[s * len * h..(s * len + seq.token_ids.len()) * h].to_vec())
            .collect())
    }

    /// BERT's pooler on pooled rows (`[rows, hidden]` row-major): `tanh(dense(x))`; the rows
    /// unchanged when the checkpoint has no pooler.
    pub fn pool_dense(&self, rows: Vec<f32>) -> Result<Vec<f32>, PoolingError> {
        let Some(p) = &self.pooler else {
            return Ok(rows);
        };
        let h = self.cfg.hidden_size;
        let n = rows.len() / h;
        let x = Tensor::<B, 2>::from_data(TensorData::new(rows, [n, h]), &self.device);
        to_vec(p.forward(x).tanh())
    }

    /// The classifier's logits of pooled rows (`[rows, num_labels]` row-major); `None`
    /// without a classifier head.
    pub fn classify(&self, rows: Vec<f32>) -> Result<Option<Vec<f32>>, PoolingError> {
        let Some(c) = self.classifier.as_ref() else {
            return Ok(None);
        };
        let h = self.cfg.hidden_size;
        let n = rows.len() / h;
        let x = Tensor::<B, 2>::from_data(TensorData::new(rows, [n, h]), &self.device);
        to_vec(c.forward(x)).map(Some)
    }

    pub fn num_labels(&self) -> Option<usize> {
        self.classifier.as_ref().map(|c| c.b.dims()[0])
    }
}

/// `"bert."` when the checkpoint names the encoder's tensors with that prefix
/// (`BertForSequenceClassification`), else `""` (sentence-transformers' `BertModel`).
pub(super) fn tensor_prefix(src: &dyn WeightSource) -> &'static str {
    if src.contains("bert.embeddings.word_embeddings.weight") {
        "bert."
    } else {
        ""
    }
}

fn to_vec<B: Backend>(t: Tensor<B, 2>) -> Result<Vec<f32>, PoolingError> {
    t.into_data()
        .convert::<f32>()
        .into_vec()
        .map_err(|e| PoolingError::Backend(format!("reading back the hidden states: {e:?}")))
}
