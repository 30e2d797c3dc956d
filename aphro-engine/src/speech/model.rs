//! The Whisper network on the CPU, on host `f32` slices (the weights converted from the
//! checkpoint's f16 at load): two GELU convolutions, the sinusoidal positions and the
//! pre-LayerNorm encoder over the 1500 audio positions; the decoder with learned positions,
//! a self-attention KV cache, and cross-attention keys/values computed once per 30 s window.
//!
//! Projections are `gemm` calls over all positions at once (the encoder's 1500, a prompt's
//! tokens) with the bias preloaded into the output, as [`crate::pooling::host`] does for BERT;
//! every parallel loop runs on the caller's rayon pool (the transcriber installs its own).
//! [`DecoderState`] holds every buffer a decoding step needs, so the per-token loop does
//! not allocate.

use gemm::Parallelism;
use rayon::prelude::*;

use super::ct2::{Ct2Error, Ct2Model};
use super::SpeechError;
use crate::pooling::config::HiddenAct;
use crate::pooling::host::{activate, gemm_strided, transpose, Dense, LayerNorm};

/// Whisper's hyper-parameters as the checkpoint's tensor shapes give them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WhisperDims {
    pub n_mels: usize,
    pub d_model: usize,
    pub n_audio_ctx: usize,
    pub n_text_ctx: usize,
    pub encoder_heads: usize,
    pub decoder_heads: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub n_vocab: usize,
    pub ffn: usize,
}

impl WhisperDims {
    /// The shape of CTranslate2's Whisper variables (`WhisperSpec`, revision ≤ 3), checked
    /// for consistency.
    pub(crate) fn from_ct2(src: &dyn Ct2Names) -> Result<Self, SpeechError> {
        let (conv1_shape, _) = need(src, "encoder/conv1/weight")?;
        let [d, n_mels, 3] = conv1_shape[..] else {
            return Err(SpeechError::Weights(format!(
                "encoder/conv1/weight has shape {conv1_shape:?}, expected [d_model, n_mels, 3]"
            )));
        };
        let (emb_shape, _) = need(src, "decoder/embeddings/weight")?;
        let [n_vocab, d_emb] = emb_shape[..] else {
            return Err(SpeechError::Weights(format!(
                "decoder/embeddings/weight has shape {emb_shape:?}"
            )));
        };
        let (enc_pos_shape, _) = need(src, "encoder/position_encodings/encodings")?;
        let (dec_pos_shape, _) = need(src, "decoder/position_encodings/encodings")?;
        if d_emb != d || enc_pos_shape.get(1) != Some(&d) || dec_pos_shape.get(1) != Some(&d) {
            return Err(SpeechError::Weights(format!(
                "inconsistent model widths: conv1 {d}, embeddings {d_emb}, positions {enc_pos_shape:?} / {dec_pos_shape:?}"
            )));
        }
        let heads = |name: &str| -> Result<usize, SpeechError> {
            match src.scalar(name)? {
                Some(h) if h > 0 && d % h as usize == 0 => Ok(h as usize),
                Some(h) => Err(SpeechError::Weights(format!(
                    "{name} = {h} does not divide the width {d}"
                ))),
                None => Err(SpeechError::Weights(format!("the checkpoint lacks {name}"))),
            }
        };
        let ffn = need(src, "encoder/layer_0/ffn/linear_0/weight")?
            .0
            .first()
            .copied()
            .ok_or_else(|| {
                SpeechError::Weights("encoder/layer_0/ffn/linear_0/weight is a scalar".into())
            })?;
        let dims = WhisperDims {
            n_mels,
            d_model: d,
            n_audio_ctx: enc_pos_shape[0],
            n_text_ctx: dec_pos_shape[0],
            encoder_heads: heads("encoder/num_heads")?,
            decoder_heads: heads("decoder/num_heads")?,
            encoder_layers: count_layers(src, "encoder")?,
            decoder_layers: count_layers(src, "decoder")?,
            n_vocab,
            ffn,
        };
        if dims.encoder_layers == 0 || dims.decoder_layers == 0 {
            return Err(SpeechError::Weights("the checkpoint has no layers".into()));
        }
        Ok(dims)
    }
}

/// A named tensor source with CTranslate2's Whisper names (`encoder/layer_0/...`).
pub(crate) trait Ct2Names {
    /// The tensor as f32, `None` if absent.
    fn tensor(&self, name: &str) -> Result<Option<super::ct2::ShapedF32>, SpeechError>;
    fn scalar(&self, name: &str) -> Result<Option<i64>, SpeechError>;
}

impl From<Ct2Error> for SpeechError {
    fn from(e: Ct2Error) -> Self {
        SpeechError::Weights(e.to_string())
    }
}

impl Ct2Names for Ct2Model {
    fn tensor(&self, name: &str) -> Result<Option<super::ct2::ShapedF32>, SpeechError> {
        Ok(self.f32(name)?)
    }
    fn scalar(&self, name: &str) -> Result<Option<i64>, SpeechError> {
        Ok(self.int_scalar(name)?)
    }
}

pub(super) fn need(src: &dyn Ct2Names, name: &str) -> Result<(Vec<usize>, Vec<f32>), SpeechError> {
    src.tensor(name)?
        .ok_or_else(|| SpeechError::Weights(format!("the checkpoint lacks {name}")))
}

pub(super) fn need_shape(
    src: &dyn Ct2Names,
    name: &str,
    shape: &[usize],
) -> Result<Vec<f32>, SpeechError> {
    let (got, data) = need(src, name)?;
    if got != shape {
        return Err(SpeechError::Weights(format!(
            "{name} has shape {got:?}, expected {shape:?}"
        )));
    }
    Ok(data)
}

/// `{name}/weight` `[out, in]` and `{name}/bias` `[out]` (zeros if absent, as Whisper's key
/// projection has none).
fn dense(src: &dyn Ct2Names, name: &str, out: usize, inp: usize) -> Result<Dense, SpeechError> {
    let w = need_shape(src, &format!("{name}/weight"), &[out, inp])?;
    Ok(Dense {
        wt: transpose(&w, out, inp),
        b: bias_or_zeros(src, name, out)?,
        out,
        inp,
    })
}

/// `{name}/bias` `[out]`, zeros if absent (Whisper's key projection has none).
pub(super) fn bias_or_zeros(
    src: &dyn Ct2Names,
    name: &str,
    out: usize,
) -> Result<Vec<f32>, SpeechError> {
    match src.tensor(&format!("{name}/bias"))? {
        Some((shape, b)) if shape == [out] => Ok(b),
        Some((shape, _)) => Err(SpeechError::Weights(format!(
            "{name}/bias has shape {shape:?}, expected [{out}]"
        ))),
        None => Ok(vec![0.0; out]),
    }
}

fn norm(src: &dyn Ct2Names, name: &str, d: usize) -> Result<LayerNorm, SpeechError> {
    Ok(LayerNorm {
        gamma: need_shape(src, &format!("{name}/gamma"), &[d])?,
        beta: need_shape(src, &format!("{name}/beta"), &[d])?,
        // PyTorch's nn.LayerNorm default, which Whisper uses.
        eps: 1e-5,
    })
}

struct EncoderLayer {
    attn_ln: LayerNorm,
    /// q, k, v fused: `[d, 3d]`.
    qkv: Dense,
    attn_out: Dense,
    ffn_ln: LayerNorm,
    fc1: Dense,
    fc2: Dense,
}

struct DecoderLayer {
    self_ln: LayerNorm,
    self_qkv: Dense,
    self_out: Dense,
    cross_ln: LayerNorm,
    cross_q: Dense,
    /// Cross-attention k and v fused: `[d, 2d]`, applied to the encoder output once.
    cross_kv: Dense,
    cross_out: Dense,
    ffn_ln: LayerNorm,
    fc1: Dense,
    fc2: Dense,
}

/// What decoding runs on: the encoder, and a decoder whose caches live in a
/// [`DecoderState`]. [`WhisperModel`] computes on host slices; [`super::burn_model`] on any
/// burn backend. Callers keep a state with the network that made it.
pub(crate) trait WhisperNetwork: Send + Sync {
    fn dims(&self) -> WhisperDims;
    /// The encoder output `[n_audio_ctx, d]` of one window `mel: [n_mels, 2·n_audio_ctx]`.
    fn encode(&self, mel: &[f32]) -> Vec<f32>;
    fn new_state(&self) -> DecoderState;
    /// Start a window: the cross-attention keys and values of `audio` (the encoder output),
    /// and an empty self-attention cache.
    fn begin_window(&self, state: &mut DecoderState, audio: &[f32]);
    /// Drop cached positions past `len`.
    fn truncate(&self, state: &mut DecoderState, len: usize);
    /// Run `tokens` through the decoder at positions `state.len..`, appending them to the
    /// cache. Callers keep `state.len + tokens.len()` within `n_text_ctx` and the ids below
    /// `n_vocab`.
    fn decode(&self, state: &mut DecoderState, tokens: &[u32]);
    /// The logits of row `row` of the last [`WhisperNetwork::decode`], into `state.logits`.
    fn logits(&self, state: &mut DecoderState, row: usize);
    /// One decoding step of several transcriptions at once: `tokens[b]` into `states[b]` at
    /// its own position, its logits into `states[b].logits`; each weight read once for all
    /// rows ([`super::batch::StepBatcher`] gathers them). `scratch` keeps host buffers
    /// between steps.
    fn step_batch(&self, states: &mut [DecoderState], tokens: &[u32], scratch: &mut BatchScratch);
}

impl WhisperNetwork for WhisperModel {
    fn dims(&self) -> WhisperDims {
        self.dims
    }
    fn encode(&self, mel: &[f32]) -> Vec<f32> {
        WhisperModel::encode(self, mel)
    }
    fn new_state(&self) -> DecoderState {
        WhisperModel::new_state(self)
    }
    fn begin_window(&self, state: &mut DecoderState, audio: &[f32]) {
        WhisperModel::begin_window(self, state, audio)
    }
    fn truncate(&self, state: &mut DecoderState, len: usize) {
        WhisperModel::truncate(self, state, len)
    }
    fn decode(&self, state: &mut DecoderState, tokens: &[u32]) {
        WhisperModel::decode(self, state, tokens)
    }
    fn logits(&self, state: &mut DecoderState, row: usize) {
        WhisperModel::logits(self, state, row)
    }
    fn step_batch(&self, states: &mut [DecoderState], tokens: &[u32], scratch: &mut BatchScratch) {
        WhisperModel::step_batch(self, states, tokens, scratch)
    }
}

pub(crate) struct WhisperModel {
    pub dims: WhisperDims,
    conv1: Dense,
    conv2: Dense,
    enc_pos: Vec<f32>,
    enc_layers: Vec<EncoderLayer>,
    enc_ln: LayerNorm,
    /// Token embeddings `[n_vocab, d]`; the output projection is tied to them.
    emb: Embeddings,
    dec_pos: Vec<f32>,
    dec_layers: Vec<DecoderLayer>,
    dec_ln: LayerNorm,
}

fn count_layers(src: &dyn Ct2Names, prefix: &str) -> Result<usize, SpeechError> {
    let mut n = 0;
    while src
        .tensor(&format!("{prefix}/layer_{n}/ffn/layer_norm/gamma"))?
        .is_some()
    {
        n += 1;
    }
    Ok(n)
}

impl WhisperModel {
    /// Build from CTranslate2's Whisper variables (`WhisperSpec`, revision ≤ 3).
    pub fn from_ct2(src: &dyn Ct2Names) -> Result<Self, SpeechError> {
        let dims = WhisperDims::from_ct2(src)?;
        let WhisperDims {
            d_model: d,
            n_mels,
            ffn,
            ..
        } = dims;
        let conv1_w = need(src, "encoder/conv1/weight")?.1;
        let (emb_shape, emb) = need(src, "decoder/embeddings/weight")?;
        let enc_pos = need(src, "encoder/position_encodings/encodings")?.1;
        let dec_pos = need(src, "decoder/position_encodings/encodings")?.1;
        let conv2_w = need_shape(src, "encoder/conv2/weight", &[d, d, 3])?;
        let conv = |w: Vec<f32>, inp: usize, name: &str| -> Result<Dense, SpeechError> {
            Ok(Dense {
                // [out, in, 3] is [out, in·3] row-major: im2col columns are (channel, tap).
                wt: transpose(&w, d, inp * 3),
                b: need_shape(src, &format!("encoder/{name}/bias"), &[d])?,
                out: d,
                inp: inp * 3,
            })
        };
        let mut enc_layers = Vec::with_capacity(dims.encoder_layers);
        for i in 0..dims.encoder_layers {
            let p = |s: &str| format!("encoder/layer_{i}/{s}");
            enc_layers.push(EncoderLayer {
                attn_ln: norm(src, &p("self_attention/layer_norm"), d)?,
                qkv: dense(src, &p("self_attention/linear_0"), 3 * d, d)?,
                attn_out: dense(src, &p("self_attention/linear_1"), d, d)?,
                ffn_ln: norm(src, &p("ffn/layer_norm"), d)?,
                fc1: dense(src, &p("ffn/linear_0"), ffn, d)?,
                fc2: dense(src, &p("ffn/linear_1"), d, ffn)?,
            });
        }
        let mut dec_layers = Vec::with_capacity(dims.decoder_layers);
        for i in 0..dims.decoder_layers {
            let p = |s: &str| format!("decoder/layer_{i}/{s}");
            dec_layers.push(DecoderLayer {
                self_ln: norm(src, &p("self_attention/layer_norm"), d)?,
                self_qkv: dense(src, &p("self_attention/linear_0"), 3 * d, d)?,
                self_out: dense(src, &p("self_attention/linear_1"), d, d)?,
                cross_ln: norm(src, &p("attention/layer_norm"), d)?,
                cross_q: dense(src, &p("attention/linear_0"), d, d)?,
                cross_kv: dense(src, &p("attention/linear_1"), 2 * d, d)?,
                cross_out: dense(src, &p("attention/linear_2"), d, d)?,
                ffn_ln: norm(src, &p("ffn/layer_norm"), d)?,
                fc1: dense(src, &p("ffn/linear_0"), ffn, d)?,
                fc2: dense(src, &p("ffn/linear_1"), d, ffn)?,
            });
        }
        // The output projection must be the embeddings (tied), as in every Whisper.
        if let Some((shape, proj)) = src.tensor("decoder/projection/weight")? {
            if shape != emb_shape || proj != emb {
                return Err(SpeechError::Weights(
                    "decoder/projection/weight is not tied to the embeddings".into(),
                ));
            }
        }
        Ok(Self {
            dims,
            conv1: conv(conv1_w, n_mels, "conv1")?,
            conv2: conv(conv2_w, d, "conv2")?,
            enc_pos,
            enc_layers,
            enc_ln: norm(src, "encoder/layer_norm", d)?,
            emb: Embeddings::new_rows(emb, d),
            dec_pos,
            dec_layers,
            dec_ln: norm(src, "decoder/layer_norm", d)?,
        })
    }

    /// The encoder output `[n_audio_ctx, d]` of one window `mel: [n_mels, 2·n_audio_ctx]`.
    pub fn encode(&self, mel: &[f32]) -> Vec<f32> {
        let WhisperDims {
            n_mels,
            d_model: d,
            n_audio_ctx: n_out,
            ..
        } = self.dims;
        let n_in = 2 * n_out;
        assert_eq!(mel.len(), n_mels * n_in, "one window of mel frames");
        // conv1 (kernel 3, padding 1) as im2col + GEMM: cols[t][c·3 + k] = mel[c][t + k − 1].
        let mut cols = vec![0f32; n_in * n_mels * 3];
        cols.par_chunks_mut(n_mels * 3 * 64)
            .enumerate()
            .for_each(|(blk, chunk)| {
                for (r, row) in chunk.chunks_exact_mut(n_mels * 3).enumerate() {
                    let t = blk * 64 + r;
                    for c in 0..n_mels {
                        for k in 0..3 {
                            let s = t + k;
                            row[c * 3 + k] = if s >= 1 && s - 1 < n_in {
                                mel[c * n_in + s - 1]
                            } else {
                                0.0
                            };
                        }
                    }
                }
            });
        let mut h1 = vec![0f32; n_in * d];
        self.conv1.apply(&cols, &mut h1, false);
        activate(HiddenAct::Gelu, &mut h1);
        // conv2 (kernel 3, stride 2, padding 1): cols[t][c·3 + k] = h1[2t + k − 1][c].
        let mut cols = vec![0f32; n_out * d * 3];
        cols.par_chunks_mut(d * 3 * 32)
            .enumerate()
            .for_each(|(blk, chunk)| {
                for (r, row) in chunk.chunks_exact_mut(d * 3).enumerate() {
                    let t = blk * 32 + r;
                    for k in 0..3 {
                        let s = 2 * t + k;
                        if s >= 1 && s - 1 < n_in {
                            let src = &h1[(s - 1) * d..s * d];
                            for (c, &v) in src.iter().enumerate() {
                                row[c * 3 + k] = v;
                            }
                        }
                    }
                }
            });
        drop(h1);
        let mut x = vec![0f32; n_out * d];
        self.conv2.apply(&cols, &mut x, false);
        drop(cols);
        activate(HiddenAct::Gelu, &mut x);
        x.iter_mut().zip(&self.enc_pos).for_each(|(v, p)| *v += p);

        let ffn = self.dims.ffn;
        let mut h = vec![0f32; n_out * d];
        let mut qkv = vec![0f32; n_out * 3 * d];
        let mut ctx = vec![0f32; n_out * d];
        let mut inner = vec![0f32; n_out * ffn];
        for layer in &self.enc_layers {
            h.copy_from_slice(&x);
            layer.attn_ln.apply(&mut h);
            layer.qkv.apply(&h, &mut qkv, false);
            self_attention(&qkv, n_out, d, self.dims.encoder_heads, &mut ctx);
            layer.attn_out.apply(&ctx, &mut x, true);
            h.copy_from_slice(&x);
            layer.ffn_ln.apply(&mut h);
            layer.fc1.apply(&h, &mut inner, false);
            activate(HiddenAct::Gelu, &mut inner);
            layer.fc2.apply(&inner, &mut x, true);
        }
        self.enc_ln.apply(&mut x);
        x
    }

    /// A decoder state for this model, its buffers sized once.
    pub fn new_state(&self) -> DecoderState {
        let WhisperDims {
            d_model: d,
            n_text_ctx,
            n_audio_ctx,
            decoder_layers,
            ffn,
            n_vocab,
            ..
        } = self.dims;
        DecoderState {
            len: 0,
            self_k: vec![vec![0.0; n_text_ctx * d]; decoder_layers],
            self_v: vec![vec![0.0; n_text_ctx * d]; decoder_layers],
            cross_kv: vec![vec![0.0; n_audio_ctx * 2 * d]; decoder_layers],
            x: Vec::with_capacity(n_text_ctx * d),
            h: Vec::with_capacity(n_text_ctx * d),
            qkv: Vec::with_capacity(n_text_ctx * 3 * d),
            ctx: Vec::with_capacity(n_text_ctx * d),
            inner: Vec::with_capacity(n_text_ctx * ffn),
            scores: Vec::with_capacity(n_audio_ctx.max(n_text_ctx) * n_text_ctx),
            logits: vec![0.0; n_vocab],
            device: None,
        }
    }

    /// Start a window: the cross-attention keys and values of `audio` (the encoder output),
    /// and an empty self-attention cache.
    pub fn begin_window(&self, state: &mut DecoderState, audio: &[f32]) {
        state.len = 0;
        for (layer, kv) in self.dec_layers.iter().zip(&mut state.cross_kv) {
            layer.cross_kv.apply(audio, kv, false);
        }
    }

    /// Drop cached positions past `len` (a decode restarted from a shared prompt).
    pub fn truncate(&self, state: &mut DecoderState, len: usize) {
        state.len = state.len.min(len);
    }

    /// Run `tokens` through the decoder at positions `state.len..`, appending them to the
    /// cache; the final-LayerNorm hidden states of the new positions are left in
    /// `state.x` (`[tokens.len(), d]`). Callers keep `state.len + tokens.len()` within
    /// `n_text_ctx` and the ids below `n_vocab`.
    pub fn decode(&self, state: &mut DecoderState, tokens: &[u32]) {
        let d = self.dims.d_model;
        let n = tokens.len();
        let start = state.len;
        assert!(
            start + n <= self.dims.n_text_ctx,
            "decoder positions {start}+{n} past {}",
            self.dims.n_text_ctx
        );
        let DecoderState {
            self_k,
            self_v,
            cross_kv,
            x,
            h,
            qkv,
            ctx,
            inner,
            scores,
            ..
        } = state;
        resize(x, n * d);
        for (i, (&t, row)) in tokens.iter().zip(x.chunks_exact_mut(d)).enumerate() {
            self.embed_into(t, start + i, row);
        }
        resize(h, n * d);
        resize(qkv, n * 3 * d);
        resize(ctx, n * d);
        resize(inner, n * self.dims.ffn);
        for (li, layer) in self.dec_layers.iter().enumerate() {
            h.copy_from_slice(x);
            layer.self_ln.apply(h);
            layer.self_qkv.apply(h, qkv, false);
            self.attend_self((&mut self_k[li], &mut self_v[li]), qkv, start, scores, ctx);
            layer.self_out.apply(ctx, x, true);

            h.copy_from_slice(x);
            layer.cross_ln.apply(h);
            let q = &mut qkv[..n * d];
            layer.cross_q.apply(h, q, false);
            self.attend_cross(&cross_kv[li], q, scores, ctx);
            layer.cross_out.apply(ctx, x, true);

            self.feed_forward(layer, x, h, inner);
        }
        self.dec_ln.apply(x);
        state.len = start + n;
    }

    /// The decoder's input row of token `t` at position `pos`: its embedding plus the
    /// learned position.
    fn embed_into(&self, t: u32, pos: usize, row: &mut [f32]) {
        let (t, d) = (t as usize, self.dims.d_model);
        assert!(t < self.dims.n_vocab, "token id {t} out of the vocabulary");
        self.emb.row_into(t, row);
        let p = &self.dec_pos[pos * d..(pos + 1) * d];
        row.iter_mut().zip(p).for_each(|(v, p)| *v += p);
    }

    /// Causal self-attention of the `qkv` rows (`[n, 3d]`, positions `start..start + n`)
    /// over one layer's cache, after appending their keys and values to it; into `ctx`
    /// (`[n, d]`). Shared by [`WhisperModel::decode`] and [`WhisperModel::step_batch`], so
    /// a sequence's attention is the same computation batched or not.
    fn attend_self(
        &self,
        (self_k, self_v): (&mut [f32], &mut [f32]),
        qkv: &[f32],
        start: usize,
        scores: &mut Vec<f32>,
        ctx: &mut [f32],
    ) {
        let d = self.dims.d_model;
        let n = qkv.len() / (3 * d);
        let heads = self.dims.decoder_heads;
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let total = start + n;
        for i in 0..n {
            let row = &qkv[i * 3 * d..(i + 1) * 3 * d];
            self_k[(start + i) * d..(start + i + 1) * d].copy_from_slice(&row[d..2 * d]);
            self_v[(start + i) * d..(start + i + 1) * d].copy_from_slice(&row[2 * d..]);
        }
        let (keys, values) = (&self_k[..total * d], &self_v[..total * d]);
        resize(scores, n * total);
        for head in 0..heads {
            gemm_strided(
                (n, total, hd),
                (&mut scores[..], total),
                (&qkv[head * hd..], 3 * d, 1),
                (&keys[head * hd..], 1, d),
                false,
                scale,
                Parallelism::None,
            );
            for (i, row) in scores.chunks_exact_mut(total).enumerate() {
                // Position start + i sees keys 0..=start + i.
                softmax_prefix(row, start + i + 1);
            }
            gemm_strided(
                (n, hd, total),
                (&mut ctx[head * hd..], d),
                (&scores[..], total, 1),
                (&values[head * hd..], d, 1),
                false,
                1.0,
                Parallelism::None,
            );
        }
    }

    /// Cross-attention of the query rows `q` (`[n, d]`) over a window's audio keys and
    /// values (`kv: [n_audio_ctx, 2d]`), into `ctx` (`[n, d]`).
    fn attend_cross(&self, kv: &[f32], q: &[f32], scores: &mut Vec<f32>, ctx: &mut [f32]) {
        let d = self.dims.d_model;
        let n = q.len() / d;
        let heads = self.dims.decoder_heads;
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let n_audio = self.dims.n_audio_ctx;
        resize(scores, n * n_audio);
        for head in 0..heads {
            gemm_strided(
                (n, n_audio, hd),
                (&mut scores[..], n_audio),
                (&q[head * hd..], d, 1),
                (&kv[head * hd..], 1, 2 * d),
                false,
                scale,
                Parallelism::None,
            );
            for row in scores.chunks_exact_mut(n_audio) {
                softmax_prefix(row, n_audio);
            }
            gemm_strided(
                (n, hd, n_audio),
                (&mut ctx[head * hd..], d),
                (&scores[..], n_audio, 1),
                (&kv[d + head * hd..], 2 * d, 1),
                false,
                1.0,
                Parallelism::None,
            );
        }
    }

    /// `x += fc2(gelu(fc1(LN(x))))` over the rows of `x`.
    fn feed_forward(&self, layer: &DecoderLayer, x: &mut [f32], h: &mut [f32], inner: &mut [f32]) {
        h.copy_from_slice(x);
        layer.ffn_ln.apply(h);
        layer.fc1.apply(h, inner, false);
        activate(HiddenAct::Gelu, inner);
        layer.fc2.apply(inner, x, true);
    }

    /// One decoding step of several sequences at once: `tokens[b]` goes into `states[b]` at
    /// its own position, and its logits land in `states[b].logits`. The projections and the
    /// vocabulary GEMV read each weight once for the whole batch (decoding one token is
    /// bound by those reads); attention runs per sequence over its own caches, in parallel.
    pub fn step_batch(
        &self,
        states: &mut [DecoderState],
        tokens: &[u32],
        scratch: &mut BatchScratch,
    ) {
        assert_eq!(states.len(), tokens.len(), "one token per sequence");
        let WhisperDims {
            d_model: d,
            ffn,
            n_text_ctx,
            n_vocab,
            ..
        } = self.dims;
        let rows = states.len();
        let BatchScratch {
            x,
            h,
            qkv,
            ctx,
            inner,
        } = scratch;
        resize(x, rows * d);
        resize(h, rows * d);
        resize(qkv, rows * 3 * d);
        resize(ctx, rows * d);
        resize(inner, rows * ffn);
        for ((state, &t), row) in states.iter().zip(tokens).zip(x.chunks_exact_mut(d)) {
            assert!(
                state.len < n_text_ctx,
                "decoder position {} past {n_text_ctx}",
                state.len
            );
            self.embed_into(t, state.len, row);
        }
        for (li, layer) in self.dec_layers.iter().enumerate() {
            h.copy_from_slice(x);
            layer.self_ln.apply(h);
            layer.self_qkv.apply(h, qkv, false);
            states
                .par_iter_mut()
                .zip(qkv.par_chunks(3 * d))
                .zip(ctx.par_chunks_mut(d))
                .for_each(|((st, row), out)| {
                    let start = st.len;
                    let DecoderState {
                        self_k,
                        self_v,
                        scores,
                        ..
                    } = st;
                    self.attend_self((&mut self_k[li], &mut self_v[li]), row, start, scores, out);
                });
            layer.self_out.apply(ctx, x, true);

            h.copy_from_slice(x);
            layer.cross_ln.apply(h);
            let q = &mut qkv[..rows * d];
            layer.cross_q.apply(h, q, false);
            states
                .par_iter_mut()
                .zip(q.par_chunks(d))
                .zip(ctx.par_chunks_mut(d))
                .for_each(|((st, q), out)| {
                    self.attend_cross(&st.cross_kv[li], q, &mut st.scores, out);
                });
            layer.cross_out.apply(ctx, x, true);

            self.feed_forward(layer, x, h, inner);
        }
        self.dec_ln.apply(x);
        for st in states.iter_mut() {
            st.len += 1;
        }
        // Every sequence's logits from one pass over the embeddings: one task per block of
        // the vocabulary, computing that block for all rows.
        const BLOCK: usize = 2048;
        let mut blocks: Vec<Vec<&mut [f32]>> = (0..n_vocab.div_ceil(BLOCK))
            .map(|_| Vec::with_capacity(rows))
            .collect();
        for st in states.iter_mut() {
            for (b, chunk) in st.logits.chunks_mut(BLOCK).enumerate() {
                blocks[b].push(chunk);
            }
        }
        let x = &x[..];
        let emb = &self.emb;
        blocks
            .into_par_iter()
            .enumerate()
            .for_each(|(b, mut outs)| {
                let len = outs.first().map_or(0, |o| o.len());
                for i in 0..len {
                    for (r, out) in outs.iter_mut().enumerate() {
                        out[i] = emb.dot_row(&x[r * d..(r + 1) * d], b * BLOCK + i);
                    }
                }
            });
    }

    /// The logits of row `row` of the last [`WhisperModel::decode`] call, into
    /// `state.logits` (`x · Eᵀ`, the embeddings being the output projection).
    pub fn logits(&self, state: &mut DecoderState, row: usize) {
        let d = self.dims.d_model;
        let x = &state.x[row * d..(row + 1) * d];
        let out = &mut state.logits;
        let emb = &self.emb;
        // A GEMV over the vocabulary, split in blocks of rows across the pool.
        const BLOCK: usize = 2048;
        let run = |(b, out): (usize, &mut [f32])| {
            for (i, o) in out.iter_mut().enumerate() {
                *o = emb.dot_row(x, b * BLOCK + i);
            }
        };
        if rayon::current_num_threads() > 1 {
            out.par_chunks_mut(BLOCK).enumerate().for_each(run);
        } else {
            out.chunks_mut(BLOCK).enumerate().for_each(run);
        }
    }
}

/// Decoder buffers of one transcription: the caches and every per-step scratch buffer.
/// `Default` is an empty placeholder (a state moved out to a batched step leaves it behind).
#[derive(Default)]
pub(crate) struct DecoderState {
    /// Positions in the self-attention cache.
    pub len: usize,
    self_k: Vec<Vec<f32>>,
    self_v: Vec<Vec<f32>>,
    cross_kv: Vec<Vec<f32>>,
    /// Hidden states of the last decoded positions (after the final LayerNorm).
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    inner: Vec<f32>,
    scores: Vec<f32>,
    /// Logits of the last [`WhisperNetwork::logits`] call.
    pub logits: Vec<f32>,
    /// A device network's own caches ([`super::burn_model`]); the host buffers above then
    /// stay empty.
    pub(super) device: Option<Box<dyn std::any::Any + Send>>,
}

impl DecoderState {
    /// The state of a device network: its caches in `device`, no host buffers.
    pub(super) fn on_device(n_vocab: usize, device: Box<dyn std::any::Any + Send>) -> Self {
        Self {
            logits: vec![0.0; n_vocab],
            device: Some(device),
            ..Self::default()
        }
    }
}

/// Per-row buffers of [`WhisperModel::step_batch`], kept by the batcher across steps.
#[derive(Default)]
pub(crate) struct BatchScratch {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    inner: Vec<f32>,
}

/// Set the length of a buffer whose capacity was reserved up front (no reallocation on
/// the decoding path).
fn resize(v: &mut Vec<f32>, n: usize) {
    v.resize(n, 0.0);
}

/// Softmax over `row[..len]` in place; `row[len..]` (future positions) set to 0.
fn softmax_prefix(row: &mut [f32], len: usize) {
    let (live, masked) = row.split_at_mut(len);
    masked.iter_mut().for_each(|v| *v = 0.0);
    let max = live.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in live.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    live.iter_mut().for_each(|v| *v *= inv);
}

/// The token embeddings `[n_vocab, d]`, which are also the output projection. Kept in f16
/// when every value is an f16 (CTranslate2 stores Whisper in f16): the vocabulary GEMV is the
/// largest read of a decoding step, and f16 → f32 is exact, so each dot equals [`dot`] over
/// the f32 values bit for bit, at half the memory traffic.
enum Embeddings {
    F32 {
        values: Vec<f32>,
        d: usize,
    },
    F16 {
        bits: Vec<u16>,
        d: usize,
        f16c: bool,
    },
}

impl Embeddings {
    /// `values` row-major with rows of `d`; `d` divides its length.
    fn new_rows(values: Vec<f32>, d: usize) -> Self {
        let exact = values
            .iter()
            .all(|&v| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits());
        if !exact {
            return Embeddings::F32 { values, d };
        }
        #[cfg(target_arch = "x86_64")]
        let f16c = std::arch::is_x86_feature_detected!("avx")
            && std::arch::is_x86_feature_detected!("f16c");
        #[cfg(not(target_arch = "x86_64"))]
        let f16c = false;
        Embeddings::F16 {
            bits: values
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect(),
            d,
            f16c,
        }
    }

    /// Row `t` into `out` (`[d]`).
    fn row_into(&self, t: usize, out: &mut [f32]) {
        match self {
            Embeddings::F32 { values, d } => out.copy_from_slice(&values[t * d..(t + 1) * d]),
            Embeddings::F16 { bits, d, .. } => {
                for (o, &b) in out.iter_mut().zip(&bits[t * d..(t + 1) * d]) {
                    *o = half::f16::from_bits(b).to_f32();
                }
            }
        }
    }

    /// `x · row t`, equal to [`dot`] over the f32 values.
    fn dot_row(&self, x: &[f32], t: usize) -> f32 {
        match self {
            Embeddings::F32 { values, d } => dot(x, &values[t * d..(t + 1) * d]),
            Embeddings::F16 { bits, d, f16c } => {
                let row = &bits[t * d..(t + 1) * d];
                #[cfg(target_arch = "x86_64")]
                if *f16c {
                    // SAFETY: `f16c` is set only when the CPU has AVX and F16C.
                    #[allow(unsafe_code)]
                    return unsafe { dot_f16_avx(x, row) };
                }
                let _ = f16c;
                let mut acc = [0f32; 16];
                let (xc, xr) = x.split_at(x.len() / 16 * 16);
                let (rc, rr) = row.split_at(xc.len());
                for (a, b) in xc.chunks_exact(16).zip(rc.chunks_exact(16)) {
                    for i in 0..16 {
                        acc[i] += a[i] * half::f16::from_bits(b[i]).to_f32();
                    }
                }
                let mut s: f32 = acc.iter().sum();
                for (a, &b) in xr.iter().zip(rr) {
                    s += a * half::f16::from_bits(b).to_f32();
                }
                s
            }
        }
    }
}

/// [`dot`] of `a` with f16 values `b`, converted in registers: the same 16 partial sums
/// (a multiply then an add, no FMA, as `dot` compiles), summed in the same order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
#[allow(unsafe_code)]
unsafe fn dot_f16_avx(a: &[f32], b: &[u16]) -> f32 {
    use std::arch::x86_64::*;
    assert_eq!(a.len(), b.len());
    let n16 = a.len() / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i < n16 {
        // SAFETY: i + 16 <= n16 <= len of both slices.
        unsafe {
            let y0 = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i) as *const __m128i));
            let y1 = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i + 8) as *const __m128i));
            acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(_mm256_loadu_ps(pa.add(i)), y0));
            acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(_mm256_loadu_ps(pa.add(i + 8)), y1));
        }
        i += 16;
    }
    let mut acc = [0f32; 16];
    // SAFETY: acc holds 16 floats.
    unsafe {
        _mm256_storeu_ps(acc.as_mut_ptr(), acc0);
        _mm256_storeu_ps(acc.as_mut_ptr().add(8), acc1);
    }
    let mut s: f32 = acc.iter().sum();
    for (x, &y) in a[n16..].iter().zip(&b[n16..]) {
        s += x * half::f16::from_bits(y).to_f32();
    }
    s
}

/// A dot product with independent partial sums (vectorizes without fast-math).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, ar) = a.split_at(a.len() / 16 * 16);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(16).zip(bc.chunks_exact(16)) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// Bidirectional multi-head attention of `n` positions with themselves, from the fused
/// `qkv: [n, 3d]` into `ctx: [n, d]`: one task per (head, block of queries), each with its
/// own `[block, n]` score buffer.
fn self_attention(qkv: &[f32], n: usize, d: usize, heads: usize, ctx: &mut [f32]) {
    let hd = d / heads;
    let scale = 1.0 / (hd as f32).sqrt();
    const QBLOCK: usize = 128;
    let blocks = n.div_ceil(QBLOCK);
    // Each task writes its own (rows, head columns) of ctx; collect per task, then scatter,
    // so the tasks borrow nothing mutably in common.
    let results: Vec<(usize, usize, Vec<f32>)> = (0..heads * blocks)
        .into_par_iter()
        .map(|task| {
            let (head, blk) = (task / blocks, task % blocks);
            let r0 = blk * QBLOCK;
            let rows = QBLOCK.min(n - r0);
            let mut scores = vec![0f32; rows * n];
            gemm_strided(
                (rows, n, hd),
                (&mut scores, n),
                (&qkv[r0 * 3 * d + head * hd..], 3 * d, 1),
                (&qkv[d + head * hd..], 1, 3 * d),
                false,
                scale,
                Parallelism::None,
            );
            for row in scores.chunks_exact_mut(n) {
                softmax_prefix(row, n);
            }
            let mut out = vec![0f32; rows * hd];
            gemm_strided(
                (rows, hd, n),
                (&mut out, hd),
                (&scores, n, 1),
                (&qkv[2 * d + head * hd..], 3 * d, 1),
                false,
                1.0,
                Parallelism::None,
            );
            (task, rows, out)
        })
        .collect();
    for (task, rows, out) in results {
        let (head, blk) = (task / blocks, task % blocks);
        let r0 = blk * QBLOCK;
        for r in 0..rows {
            ctx[(r0 + r) * d + head * hd..(r0 + r) * d + (head + 1) * hd]
                .copy_from_slice(&out[r * hd..(r + 1) * hd]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f16-held embeddings give the f32 dot bit for bit, with and without F16C, at Whisper's
    /// widths and at one that leaves a tail; values that are not all f16 stay f32.
    #[test]
    fn f16_embeddings_dot_exactly_as_f32() {
        let mut seed = 0x9e37_79b9_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32 - 0.5) * 4.0
        };
        for d in [384, 512, 100] {
            let rows = 7;
            let values: Vec<f32> = (0..rows * d)
                .map(|_| half::f16::from_f32(next()).to_f32())
                .collect();
            let x: Vec<f32> = (0..d).map(|_| next()).collect();
            let emb = Embeddings::new_rows(values.clone(), d);
            let Embeddings::F16 { bits, f16c, .. } = &emb else {
                panic!("f16 values are kept as f16");
            };
            let plain = Embeddings::F16 {
                bits: bits.clone(),
                d,
                f16c: false,
            };
            for t in 0..rows {
                let want = dot(&x, &values[t * d..(t + 1) * d]);
                assert_eq!(
                    emb.dot_row(&x, t).to_bits(),
                    want.to_bits(),
                    "d {d} row {t} (f16c {f16c})"
                );
                assert_eq!(
                    plain.dot_row(&x, t).to_bits(),
                    want.to_bits(),
                    "d {d} row {t}"
                );
                let mut row = vec![0f32; d];
                emb.row_into(t, &mut row);
                assert_eq!(row, values[t * d..(t + 1) * d]);
            }
        }
        let not_f16 = Embeddings::new_rows(vec![0.1f32; 32], 16);
        assert!(matches!(not_f16, Embeddings::F32 { .. }));
    }
}
