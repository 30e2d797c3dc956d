//! The BERT encoder on the CPU, on host `f32` slices: the same model as [`super::bert`], but
//! the sequences of a batch are packed one after another (no padding) and attention runs
//! per sequence and head, so a batch of mixed lengths costs the sum of its tokens, not
//! `batch × longest`. The projections are single `gemm` calls over every token of the batch
//! (q/k/v fused into one), the bias (and the residual) preloaded into the output; the
//! elementwise ops are one pass each, in place.
//!
//! [`super::bert`] stays the encoder of the burn backends (CUDA, wgpu); this one is what
//! [`super::Embedder::load`] runs on the CPU.

use gemm::Parallelism;
use rayon::prelude::*;

use super::bert::{tensor_prefix, EncoderInput, HiddenStates};
use super::config::{BertConfig, HiddenAct};
use super::PoolingError;
use crate::model::weights::WeightSource;
use crate::model::ModelError;

/// Below this many multiply-adds a matmul runs on the calling thread (thread hand-off costs
/// more than it saves on a few tokens).
pub(crate) const PARALLEL_MIN_FLOPS: usize = 1 << 21;

/// A dense layer: `wt = Wᵀ: [in, out]` row-major (HF's `[out, in]` transposed at load, so
/// the GEMM reads its right-hand side with unit column stride and packs it with vector
/// loads), and its bias.
pub(crate) struct Dense {
    pub(crate) wt: Vec<f32>,
    pub(crate) b: Vec<f32>,
    pub(crate) out: usize,
    pub(crate) inp: usize,
}

impl Dense {
    /// `y = x Wᵀ + b (+ y)` for `x: [tokens, in]`; with `accumulate`, `y` holds the residual
    /// on entry and the bias is added to it (one pass fewer than adding it after).
    pub(crate) fn apply(&self, x: &[f32], y: &mut [f32], accumulate: bool) {
        let tokens = x.len() / self.inp;
        debug_assert_eq!(y.len(), tokens * self.out);
        for row in y.chunks_exact_mut(self.out) {
            if accumulate {
                row.iter_mut().zip(&self.b).for_each(|(v, b)| *v += b);
            } else {
                row.copy_from_slice(&self.b);
            }
        }
        let par = if tokens * self.out * self.inp >= PARALLEL_MIN_FLOPS {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        };
        gemm_strided(
            (tokens, self.out, self.inp),
            (y, self.out),
            (x, self.inp, 1),
            (&self.wt, self.out, 1),
            true,
            1.0,
            par,
        );
    }

    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0f32; x.len() / self.inp * self.out];
        self.apply(x, &mut y, false);
        y
    }
}

pub(crate) struct LayerNorm {
    pub(crate) gamma: Vec<f32>,
    pub(crate) beta: Vec<f32>,
    pub(crate) eps: f32,
}

impl LayerNorm {
    /// In place over each row: two-pass mean and biased variance, as PyTorch computes them.
    pub(crate) fn apply(&self, x: &mut [f32]) {
        let n = self.gamma.len();
        let norm_row = |row: &mut [f32]| {
            let mean = row.iter().sum::<f32>() / n as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            for ((v, g), b) in row.iter_mut().zip(&self.gamma).zip(&self.beta) {
                *v = (*v - mean) * inv * g + b;
            }
        };
        if x.len() >= 1 << 16 {
            x.par_chunks_mut(n).for_each(norm_row);
        } else {
            x.chunks_mut(n).for_each(norm_row);
        }
    }
}

struct Layer {
    /// `query`, `key` and `value` stacked: `[3 * hidden, hidden]`.
    qkv: Dense,
    attn_out: Dense,
    attn_norm: LayerNorm,
    intermediate: Dense,
    output: Dense,
    out_norm: LayerNorm,
}

pub struct HostBertEncoder {
    pub cfg: BertConfig,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
    pooler: Option<Dense>,
    classifier: Option<Dense>,
}

fn read(
    src: &dyn WeightSource,
    name: &str,
    shape: &[usize],
) -> Result<Option<Vec<f32>>, PoolingError> {
    let Some(t) = src.get(name, false)? else {
        return Ok(None);
    };
    let (got, data) = t.into_f32();
    if got != shape {
        return Err(PoolingError::Load(ModelError::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            got,
        }));
    }
    Ok(Some(data))
}

fn need(src: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<Vec<f32>, PoolingError> {
    read(src, name, shape)?
        .ok_or_else(|| PoolingError::Load(ModelError::MissingTensor(name.to_string())))
}

fn dense(
    src: &dyn WeightSource,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<Dense, PoolingError> {
    let w = need(src, &format!("{name}.weight"), &[out, inp])?;
    Ok(Dense {
        wt: transpose(&w, out, inp),
        b: need(src, &format!("{name}.bias"), &[out])?,
        out,
        inp,
    })
}

fn opt_dense(
    src: &dyn WeightSource,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<Option<Dense>, PoolingError> {
    if read(src, &format!("{name}.weight"), &[out, inp])?.is_none() {
        return Ok(None);
    }
    dense(src, name, out, inp).map(Some)
}

fn norm(src: &dyn WeightSource, name: &str, n: usize, eps: f64) -> Result<LayerNorm, PoolingError> {
    Ok(LayerNorm {
        gamma: need(src, &format!("{name}.weight"), &[n])?,
        beta: need(src, &format!("{name}.bias"), &[n])?,
        eps: eps as f32,
    })
}

impl HostBertEncoder {
    /// Load the encoder (names with or without the `bert.` prefix), the pooler if present,
    /// and, with `num_labels`, the `classifier` head.
    pub fn load(
        cfg: BertConfig,
        src: &dyn WeightSource,
        num_labels: Option<usize>,
    ) -> Result<Self, PoolingError> {
        let prefix = tensor_prefix(src);
        let (h, ff, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps);
        let p = |s: &str| format!("{prefix}{s}");
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let l = |s: &str| p(&format!("encoder.layer.{i}.{s}"));
            let (q, k, v) = (
                dense(src, &l("attention.self.query"), h, h)?,
                dense(src, &l("attention.self.key"), h, h)?,
                dense(src, &l("attention.self.value"), h, h)?,
            );
            layers.push(Layer {
                qkv: Dense {
                    // Wᵀ rows of `[in, 3h]`: each input row's q, k then v outputs.
                    wt: (0..h)
                        .flat_map(|i| {
                            [&q.wt, &k.wt, &v.wt]
                                .into_iter()
                                .flat_map(move |t| &t[i * h..(i + 1) * h])
                        })
                        .copied()
                        .collect(),
                    b: [q.b, k.b, v.b].concat(),
                    out: 3 * h,
                    inp: h,
                },
                attn_out: dense(src, &l("attention.output.dense"), h, h)?,
                attn_norm: norm(src, &l("attention.output.LayerNorm"), h, eps)?,
                intermediate: dense(src, &l("intermediate.dense"), ff, h)?,
                output: dense(src, &l("output.dense"), h, ff)?,
                out_norm: norm(src, &l("output.LayerNorm"), h, eps)?,
            });
        }
        let classifier = match num_labels {
            Some(n) => Some(opt_dense(src, "classifier", n, h)?.ok_or_else(|| {
                PoolingError::Load(ModelError::MissingTensor("classifier.weight".into()))
            })?),
            None => None,
        };
        Ok(Self {
            word: need(
                src,
                &p("embeddings.word_embeddings.weight"),
                &[cfg.vocab_size, h],
            )?,
            position: need(
                src,
                &p("embeddings.position_embeddings.weight"),
                &[cfg.max_position_embeddings, h],
            )?,
            token_type: need(
                src,
                &p("embeddings.token_type_embeddings.weight"),
                &[cfg.type_vocab_size, h],
            )?,
            emb_norm: norm(src, &p("embeddings.LayerNorm"), h, eps)?,
            layers,
            pooler: opt_dense(src, &p("pooler.dense"), h, h)?,
            classifier,
            cfg,
        })
    }

    pub fn has_pooler(&self) -> bool {
        self.pooler.is_some()
    }

    pub fn num_labels(&self) -> Option<usize> {
        self.classifier.as_ref().map(|c| c.out)
    }

    /// The last hidden state of each sequence. Same contract as
    /// [`super::BertEncoder::forward`]: non-empty sequences, at most
    /// `max_position_embeddings` long, ids and token types in range (the caller checks).
    pub fn forward(&self, batch: &[EncoderInput]) -> Result<HiddenStates, PoolingError> {
        let h = self.cfg.hidden_size;
        let lens: Vec<usize> = batch.iter().map(|s| s.token_ids.len()).collect();
        let total: usize = lens.iter().sum();
        if total == 0 {
            return Ok(vec![Vec::new(); batch.len()]);
        }
        if let Some(&l) = lens.iter().find(|&&l| l > self.cfg.max_position_embeddings) {
            return Err(PoolingError::Backend(format!(
                "a sequence of {l} tokens is longer than the model's {} positions",
                self.cfg.max_position_embeddings
            )));
        }
        let types = self.cfg.type_vocab_size;
        if let Some(&ty) = batch
            .iter()
            .flat_map(|s| &s.token_type_ids)
            .find(|&&t| t as usize >= types)
        {
            return Err(PoolingError::Backend(format!(
                "token type {ty} is out of the model's {types} token types"
            )));
        }
        let mut x = vec![0f32; total * h];
        let mut rows = x.chunks_exact_mut(h);
        for seq in batch {
            for (t, &id) in seq.token_ids.iter().enumerate() {
                let ty = seq.token_type_ids.get(t).copied().unwrap_or(0) as usize;
                let id = id as usize;
                let row = rows.next().expect("one row per token");
                let (w, p, y) = (
                    &self.word[id * h..(id + 1) * h],
                    &self.position[t * h..(t + 1) * h],
                    &self.token_type[ty * h..(ty + 1) * h],
                );
                for (j, v) in row.iter_mut().enumerate() {
                    *v = w[j] + p[j] + y[j];
                }
            }
        }
        self.emb_norm.apply(&mut x);
        let ff = self.cfg.intermediate_size;
        let mut qkv = vec![0f32; total * 3 * h];
        let mut ctx = vec![0f32; total * h];
        let mut inner = vec![0f32; total * ff];
        for layer in &self.layers {
            layer.qkv.apply(&x, &mut qkv, false);
            self.attention(&qkv, &lens, &mut ctx);
            // x = LayerNorm(ctx Wₒᵀ + b + x)
            layer.attn_out.apply(&ctx, &mut x, true);
            layer.attn_norm.apply(&mut x);
            layer.intermediate.apply(&x, &mut inner, false);
            activate(self.cfg.hidden_act, &mut inner);
            layer.output.apply(&inner, &mut x, true);
            layer.out_norm.apply(&mut x);
        }
        let mut out = Vec::with_capacity(batch.len());
        let mut start = 0;
        for &l in &lens {
            out.push(x[start * h..(start + l) * h].to_vec());
            start += l;
        }
        Ok(out)
    }

    /// Bidirectional attention of every sequence with itself, per head, from the fused
    /// `qkv: [tokens, 3 * hidden]` into `ctx: [tokens, hidden]`.
    fn attention(&self, qkv: &[f32], lens: &[usize], ctx: &mut [f32]) {
        let (h, nh) = (self.cfg.hidden_size, self.cfg.num_heads);
        let d = h / nh;
        let scale = 1.0 / (d as f32).sqrt();
        // Each sequence's rows of ctx, then one task per (sequence, head).
        let mut tasks = Vec::with_capacity(lens.len() * nh);
        let mut rest = ctx;
        let mut offset = 0;
        for &len in lens {
            let (mine, tail) = rest.split_at_mut(len * h);
            rest = tail;
            tasks.push((offset, len, mine));
            offset += len;
        }
        let work: usize = lens.iter().map(|l| l * l).sum::<usize>() * h;
        let run = |(offset, len, out): (usize, usize, &mut [f32])| {
            let mut scores = vec![0f32; len * len];
            for head in 0..nh {
                let q = &qkv[offset * 3 * h + head * d..];
                let k = &qkv[offset * 3 * h + h + head * d..];
                let v = &qkv[offset * 3 * h + 2 * h + head * d..];
                let stride = 3 * h;
                // scores = scale · Q Kᵀ (q/k/v rows at stride 3h, this head's d columns)
                gemm_strided(
                    (len, len, d),
                    (&mut scores, len),
                    (q, stride, 1),
                    (k, 1, stride),
                    false,
                    scale,
                    Parallelism::None,
                );
                for row in scores.chunks_exact_mut(len) {
                    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0.0;
                    for s in row.iter_mut() {
                        *s = (*s - max).exp();
                        sum += *s;
                    }
                    let inv = 1.0 / sum;
                    row.iter_mut().for_each(|s| *s *= inv);
                }
                // this head's columns of out = P V
                gemm_strided(
                    (len, d, len),
                    (&mut out[head * d..], h),
                    (&scores, len, 1),
                    (v, stride, 1),
                    false,
                    1.0,
                    Parallelism::None,
                );
            }
        };
        if work >= PARALLEL_MIN_FLOPS && tasks.len() > 1 {
            tasks.into_par_iter().for_each(run);
        } else {
            tasks.into_iter().for_each(run);
        }
    }

    /// BERT's pooler on pooled rows (`[rows, hidden]`): `tanh(dense(x))`; the rows unchanged
    /// when the checkpoint has no pooler.
    pub fn pool_dense(&self, rows: Vec<f32>) -> Vec<f32> {
        match &self.pooler {
            Some(p) => p.forward(&rows).into_iter().map(f32::tanh).collect(),
            None => rows,
        }
    }

    /// The classifier's logits of pooled rows (`[rows, num_labels]`); `None` without a
    /// classifier head.
    pub fn classify(&self, rows: &[f32]) -> Option<Vec<f32>> {
        self.classifier.as_ref().map(|c| c.forward(rows))
    }
}

/// `m: [rows, cols]` row-major → its transpose.
pub(crate) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for (r, row) in m.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            t[c * rows + r] = v;
        }
    }
    t
}

/// `dst = [dst +] scale · lhs · rhs` for an `m×n` result over `k`, on strided row-major
/// views: `dst` rows at `dst.1` (columns contiguous), `lhs`/`rhs` as `(data, row stride,
/// column stride)`. With `accumulate` the result is added to what `dst` holds. Panics if a
/// view reaches past its slice, so the `gemm` call below only touches memory it borrows.
#[allow(unsafe_code)]
pub(crate) fn gemm_strided(
    (m, n, k): (usize, usize, usize),
    dst: (&mut [f32], usize),
    lhs: (&[f32], usize, usize),
    rhs: (&[f32], usize, usize),
    accumulate: bool,
    scale: f32,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(
        last(m, n, dst.1, 1) < dst.0.len(),
        "gemm: dst view out of bounds"
    );
    if k > 0 {
        assert!(
            last(m, k, lhs.1, lhs.2) < lhs.0.len(),
            "gemm: lhs view out of bounds"
        );
        assert!(
            last(k, n, rhs.1, rhs.2) < rhs.0.len(),
            "gemm: rhs view out of bounds"
        );
    }
    // SAFETY: the asserts above keep every element of the three views inside its slice;
    // `dst` is borrowed mutably, so it does not alias `lhs` or `rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.0.as_mut_ptr(),
            1,
            dst.1 as isize,
            accumulate,
            lhs.0.as_ptr(),
            lhs.2 as isize,
            lhs.1 as isize,
            rhs.0.as_ptr(),
            rhs.2 as isize,
            rhs.1 as isize,
            1.0,
            scale,
            false,
            false,
            false,
            par,
        );
    }
}

/// The feed-forward activation in place (exact GELU through `erf`, as PyTorch's default).
pub(crate) fn activate(act: HiddenAct, x: &mut [f32]) {
    let f = |v: &mut f32| {
        let x = *v;
        *v = match act {
            HiddenAct::Gelu => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
            HiddenAct::GeluTanh => {
                let c = (2.0 / std::f32::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            HiddenAct::Relu => x.max(0.0),
        };
    };
    if x.len() >= 1 << 16 {
        x.par_chunks_mut(4096)
            .for_each(|c| c.iter_mut().for_each(f));
    } else {
        x.iter_mut().for_each(f);
    }
}
