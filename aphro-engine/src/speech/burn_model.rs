//! The Whisper network on any burn backend (`burn-flex` on the CPU, CubeCL through
//! `burn-cuda` or `burn-wgpu`): the same computation as the host network of [`super::model`]
//! in generic tensor ops, so one decoding loop ([`super::decode`]) drives either.
//!
//! * The two convolutions are im2col + matmul built from slices (kernel 3, padding 1; the
//!   second with stride 2 read through a `[positions, 2, d]` view of the padded input), so
//!   no backend needs a convolution kernel.
//! * Attention is per head in `[heads, positions, head_dim]` batches; a multi-token decode
//!   (the prompt) adds a causal bias.
//! * Concurrent transcriptions' steps run together ([`WhisperNetwork::step_batch`]): the
//!   projections, the feed-forward and the vocabulary projection over all rows at once,
//!   attention per sequence.
//! * The decoder's caches stay on the device: self-attention keys/values grow by
//!   concatenation, cross-attention keys/values are computed once per window. Only the
//!   encoder output (for the next window's cross keys/values) and each step's logits cross
//!   to the host, where the timestamp rules and the sampler run.

use burn::tensor::activation::{gelu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::pooling::bert::{Dense, LayerNorm};

use super::model::{
    bias_or_zeros, need, need_shape, BatchScratch, Ct2Names, DecoderState, WhisperDims,
    WhisperNetwork,
};
use super::SpeechError;

struct EncoderLayer<B: Backend> {
    attn_ln: LayerNorm<B>,
    qkv: Dense<B>,
    attn_out: Dense<B>,
    ffn_ln: LayerNorm<B>,
    fc1: Dense<B>,
    fc2: Dense<B>,
}

struct DecoderLayer<B: Backend> {
    self_ln: LayerNorm<B>,
    self_qkv: Dense<B>,
    self_out: Dense<B>,
    cross_ln: LayerNorm<B>,
    cross_q: Dense<B>,
    cross_kv: Dense<B>,
    cross_out: Dense<B>,
    ffn_ln: LayerNorm<B>,
    fc1: Dense<B>,
    fc2: Dense<B>,
}

/// Whisper on backend `B`.
pub(crate) struct BurnWhisper<B: Backend> {
    dims: WhisperDims,
    device: B::Device,
    /// conv1 as `[d, 3·n_mels]`, columns ordered (tap, channel).
    conv1_w: Tensor<B, 2>,
    conv1_b: Tensor<B, 1>,
    /// conv2 as `[3·d, d]` (rows ordered (tap, channel)), applied from the right.
    conv2: Dense<B>,
    enc_pos: Tensor<B, 2>,
    enc_layers: Vec<EncoderLayer<B>>,
    enc_ln: LayerNorm<B>,
    /// `[n_vocab, d]`; also the output projection.
    emb: Tensor<B, 2>,
    dec_pos: Tensor<B, 2>,
    dec_layers: Vec<DecoderLayer<B>>,
    dec_ln: LayerNorm<B>,
}

/// One transcription's decoder caches on the device.
struct BurnState<B: Backend> {
    /// Per layer, `[heads, positions, head_dim]`; `None` while empty.
    self_k: Vec<Option<Tensor<B, 3>>>,
    self_v: Vec<Option<Tensor<B, 3>>>,
    cross_k: Vec<Option<Tensor<B, 3>>>,
    cross_v: Vec<Option<Tensor<B, 3>>>,
    /// Final-LayerNorm hidden states of the last decoded positions, `[n, d]`.
    x: Option<Tensor<B, 2>>,
}

struct Loader<'a, B: Backend> {
    src: &'a dyn Ct2Names,
    device: &'a B::Device,
}

impl<B: Backend> Loader<'_, B> {
    fn upload<const D: usize>(&self, data: Vec<f32>, shape: [usize; D]) -> Tensor<B, D> {
        Tensor::from_data(TensorData::new(data, shape), self.device)
    }

    fn tensor<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
    ) -> Result<Tensor<B, D>, SpeechError> {
        Ok(self.upload(need_shape(self.src, name, &shape)?, shape))
    }

    /// `{name}/weight` `[out, in]` and `{name}/bias` (zeros when absent: Whisper's key
    /// projection has none).
    fn dense(&self, name: &str, out: usize, inp: usize) -> Result<Dense<B>, SpeechError> {
        let w: Tensor<B, 2> = self.tensor(&format!("{name}/weight"), [out, inp])?;
        Ok(Dense {
            wt: w.transpose(),
            b: self.upload(bias_or_zeros(self.src, name, out)?, [out]),
        })
    }

    fn norm(&self, name: &str, d: usize) -> Result<LayerNorm<B>, SpeechError> {
        Ok(LayerNorm {
            gamma: self.tensor(&format!("{name}/gamma"), [d])?,
            beta: self.tensor(&format!("{name}/beta"), [d])?,
            // PyTorch's nn.LayerNorm default, which Whisper uses.
            eps: 1e-5,
        })
    }
}

impl<B: Backend> BurnWhisper<B> {
    /// Upload CTranslate2's Whisper variables to `device` (as f32).
    pub fn from_ct2(src: &dyn Ct2Names, device: &B::Device) -> Result<Self, SpeechError> {
        let dims = WhisperDims::from_ct2(src)?;
        let WhisperDims {
            n_mels,
            d_model: d,
            n_audio_ctx,
            n_text_ctx,
            n_vocab,
            ffn,
            ..
        } = dims;
        let l = Loader::<B> { src, device };
        // [out, in, tap] → [out, (tap, in)] for conv1 and [(tap, in), out] for conv2.
        let conv1 = need(src, "encoder/conv1/weight")?.1;
        let mut conv1_w = vec![0f32; d * 3 * n_mels];
        for o in 0..d {
            for c in 0..n_mels {
                for k in 0..3 {
                    conv1_w[o * 3 * n_mels + k * n_mels + c] = conv1[(o * n_mels + c) * 3 + k];
                }
            }
        }
        let conv2 = need_shape(src, "encoder/conv2/weight", &[d, d, 3])?;
        let mut conv2_wt = vec![0f32; 3 * d * d];
        for o in 0..d {
            for c in 0..d {
                for k in 0..3 {
                    conv2_wt[(k * d + c) * d + o] = conv2[(o * d + c) * 3 + k];
                }
            }
        }
        let mut enc_layers = Vec::with_capacity(dims.encoder_layers);
        for i in 0..dims.encoder_layers {
            let p = |s: &str| format!("encoder/layer_{i}/{s}");
            enc_layers.push(EncoderLayer {
                attn_ln: l.norm(&p("self_attention/layer_norm"), d)?,
                qkv: l.dense(&p("self_attention/linear_0"), 3 * d, d)?,
                attn_out: l.dense(&p("self_attention/linear_1"), d, d)?,
                ffn_ln: l.norm(&p("ffn/layer_norm"), d)?,
                fc1: l.dense(&p("ffn/linear_0"), ffn, d)?,
                fc2: l.dense(&p("ffn/linear_1"), d, ffn)?,
            });
        }
        let mut dec_layers = Vec::with_capacity(dims.decoder_layers);
        for i in 0..dims.decoder_layers {
            let p = |s: &str| format!("decoder/layer_{i}/{s}");
            dec_layers.push(DecoderLayer {
                self_ln: l.norm(&p("self_attention/layer_norm"), d)?,
                self_qkv: l.dense(&p("self_attention/linear_0"), 3 * d, d)?,
                self_out: l.dense(&p("self_attention/linear_1"), d, d)?,
                cross_ln: l.norm(&p("attention/layer_norm"), d)?,
                cross_q: l.dense(&p("attention/linear_0"), d, d)?,
                cross_kv: l.dense(&p("attention/linear_1"), 2 * d, d)?,
                cross_out: l.dense(&p("attention/linear_2"), d, d)?,
                ffn_ln: l.norm(&p("ffn/layer_norm"), d)?,
                fc1: l.dense(&p("ffn/linear_0"), ffn, d)?,
                fc2: l.dense(&p("ffn/linear_1"), d, ffn)?,
            });
        }
        let emb = need_shape(src, "decoder/embeddings/weight", &[n_vocab, d])?;
        if let Some((_, proj)) = src.tensor("decoder/projection/weight")? {
            if proj != emb {
                return Err(SpeechError::Weights(
                    "decoder/projection/weight is not tied to the embeddings".into(),
                ));
            }
        }
        Ok(Self {
            dims,
            device: device.clone(),
            conv1_w: l.upload(conv1_w, [d, 3 * n_mels]),
            conv1_b: l.tensor("encoder/conv1/bias", [d])?,
            conv2: Dense {
                wt: l.upload(conv2_wt, [3 * d, d]),
                b: l.tensor("encoder/conv2/bias", [d])?,
            },
            enc_pos: l.tensor("encoder/position_encodings/encodings", [n_audio_ctx, d])?,
            enc_layers,
            enc_ln: l.norm("encoder/layer_norm", d)?,
            emb: l.upload(emb, [n_vocab, d]),
            dec_pos: l.tensor("decoder/position_encodings/encodings", [n_text_ctx, d])?,
            dec_layers,
            dec_ln: l.norm("decoder/layer_norm", d)?,
        })
    }

    /// `[n, d]` → `[heads, n, head_dim]`.
    fn heads(&self, t: Tensor<B, 2>, heads: usize) -> Tensor<B, 3> {
        let [n, d] = t.dims();
        t.reshape([n, heads, d / heads]).swap_dims(0, 1)
    }

    /// Scaled dot-product attention of `q` over `k`/`v` (`[heads, _, head_dim]`), plus an
    /// optional `[queries, keys]` bias; back to `[queries, d]`.
    fn attend(
        &self,
        q: Tensor<B, 3>,
        k: Tensor<B, 3>,
        v: Tensor<B, 3>,
        bias: Option<Tensor<B, 2>>,
    ) -> Tensor<B, 2> {
        let [heads, n, hd] = q.dims();
        let mut scores = q.matmul(k.swap_dims(1, 2)) * (1.0 / (hd as f64).sqrt());
        if let Some(bias) = bias {
            scores = scores + bias.unsqueeze::<3>();
        }
        softmax(scores, 2)
            .matmul(v)
            .swap_dims(0, 1)
            .reshape([n, heads * hd])
    }

    /// Self-attention of the fused `qkv` rows (`[n, 3d]`, the positions after the cache),
    /// after appending their keys and values to layer `li`'s cache; `[n, d]`.
    fn attend_self(
        &self,
        st: &mut BurnState<B>,
        li: usize,
        qkv: Tensor<B, 2>,
        causal: Option<Tensor<B, 2>>,
    ) -> Tensor<B, 2> {
        let [n, d3] = qkv.dims();
        let d = d3 / 3;
        let heads = self.dims.decoder_heads;
        let part = |i: usize| self.heads(qkv.clone().slice([0..n, i * d..(i + 1) * d]), heads);
        let grow = |cache: &mut Option<Tensor<B, 3>>, new: Tensor<B, 3>| {
            let all = match cache.take() {
                Some(old) => Tensor::cat(vec![old, new], 1),
                None => new,
            };
            *cache = Some(all.clone());
            all
        };
        let k = grow(&mut st.self_k[li], part(1));
        let v = grow(&mut st.self_v[li], part(2));
        self.attend(part(0), k, v, causal)
    }

    /// Cross-attention of the query rows `q` (`[n, d]`) over the window's audio; `[n, d]`.
    fn attend_cross(&self, st: &BurnState<B>, li: usize, q: Tensor<B, 2>) -> Tensor<B, 2> {
        let (Some(k), Some(v)) = (&st.cross_k[li], &st.cross_v[li]) else {
            panic!("decode before begin_window");
        };
        let q = self.heads(q, self.dims.decoder_heads);
        self.attend(q, k.clone(), v.clone(), None)
    }

    /// `f` of each sequence's row of `rows` (`[sequences, _]`) with its state, stacked back.
    fn per_sequence(
        &self,
        states: &mut [DecoderState],
        rows: Tensor<B, 2>,
        f: impl Fn(&mut BurnState<B>, Tensor<B, 2>) -> Tensor<B, 2>,
    ) -> Tensor<B, 2> {
        let width = rows.dims()[1];
        let outs = states
            .iter_mut()
            .enumerate()
            .map(|(r, state)| f(self.state(state), rows.clone().slice([r..r + 1, 0..width])))
            .collect();
        Tensor::cat(outs, 0)
    }

    fn state<'s>(&self, state: &'s mut DecoderState) -> &'s mut BurnState<B> {
        state
            .device
            .as_mut()
            .and_then(|s| s.downcast_mut::<BurnState<B>>())
            .expect("a decoder state made by this network")
    }
}

/// Read a tensor back to the host. A failure here is the device failing (lost, out of
/// memory), not anything a request did.
fn to_host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap_or_else(|e| panic!("reading a Whisper tensor back from the device: {e:?}"))
}

impl<B: Backend> WhisperNetwork for BurnWhisper<B> {
    fn dims(&self) -> WhisperDims {
        self.dims
    }

    fn encode(&self, mel: &[f32]) -> Vec<f32> {
        let WhisperDims {
            n_mels,
            d_model: d,
            n_audio_ctx: n_out,
            ..
        } = self.dims;
        let n_in = 2 * n_out;
        assert_eq!(mel.len(), n_mels * n_in, "one window of mel frames");
        let dev = &self.device;
        let mel = Tensor::<B, 2>::from_data(TensorData::new(mel.to_vec(), [n_mels, n_in]), dev);
        // conv1: the three taps of the zero-padded frames stacked as rows (tap, channel).
        let zeros = Tensor::<B, 2>::zeros([n_mels, 1], dev);
        let padded = Tensor::cat(vec![zeros.clone(), mel, zeros], 1);
        let cols = Tensor::cat(
            (0..3)
                .map(|k| padded.clone().slice([0..n_mels, k..k + n_in]))
                .collect(),
            0,
        );
        let h1 = self.conv1_w.clone().matmul(cols) + self.conv1_b.clone().unsqueeze_dim(1);
        let h1 = gelu(h1).transpose(); // [n_in, d]
                                       // conv2, stride 2: padded row 2t + k is row t, column k of a [n_out + 1, 2, d] view.
        let zeros = Tensor::<B, 2>::zeros([1, d], dev);
        let pairs = Tensor::cat(vec![zeros.clone(), h1, zeros], 0).reshape([n_out + 1, 2, d]);
        let tap = |rows: std::ops::Range<usize>, k: usize| {
            pairs
                .clone()
                .slice([rows, k..k + 1, 0..d])
                .reshape([n_out, d])
        };
        let cols = Tensor::cat(
            vec![tap(0..n_out, 0), tap(0..n_out, 1), tap(1..n_out + 1, 0)],
            1,
        );
        let mut x = gelu(self.conv2.forward(cols)) + self.enc_pos.clone();
        let heads = self.dims.encoder_heads;
        for layer in &self.enc_layers {
            let qkv = layer.qkv.forward(layer.attn_ln.forward(x.clone()));
            let part =
                |i: usize| self.heads(qkv.clone().slice([0..n_out, i * d..(i + 1) * d]), heads);
            let ctx = self.attend(part(0), part(1), part(2), None);
            x = x + layer.attn_out.forward(ctx);
            let inner = gelu(layer.fc1.forward(layer.ffn_ln.forward(x.clone())));
            x = x + layer.fc2.forward(inner);
        }
        to_host(self.enc_ln.forward(x))
    }

    fn new_state(&self) -> DecoderState {
        let layers = self.dims.decoder_layers;
        DecoderState::on_device(
            self.dims.n_vocab,
            Box::new(BurnState::<B> {
                self_k: vec![None; layers],
                self_v: vec![None; layers],
                cross_k: vec![None; layers],
                cross_v: vec![None; layers],
                x: None,
            }),
        )
    }

    fn begin_window(&self, state: &mut DecoderState, audio: &[f32]) {
        let WhisperDims {
            d_model: d,
            n_audio_ctx: n,
            decoder_heads: heads,
            ..
        } = self.dims;
        assert_eq!(audio.len(), n * d, "one window's encoder output");
        state.len = 0;
        let audio =
            Tensor::<B, 2>::from_data(TensorData::new(audio.to_vec(), [n, d]), &self.device);
        let st = self.state(state);
        for (li, layer) in self.dec_layers.iter().enumerate() {
            let kv = layer.cross_kv.forward(audio.clone());
            st.cross_k[li] = Some(self.heads(kv.clone().slice([0..n, 0..d]), heads));
            st.cross_v[li] = Some(self.heads(kv.slice([0..n, d..2 * d]), heads));
            st.self_k[li] = None;
            st.self_v[li] = None;
        }
        st.x = None;
    }

    fn truncate(&self, state: &mut DecoderState, len: usize) {
        if len >= state.len {
            return;
        }
        state.len = len;
        let st = self.state(state);
        for cache in st.self_k.iter_mut().chain(st.self_v.iter_mut()) {
            *cache = match cache.take() {
                Some(t) if len > 0 => {
                    let [h, _, hd] = t.dims();
                    Some(t.slice([0..h, 0..len, 0..hd]))
                }
                _ => None,
            };
        }
    }

    fn decode(&self, state: &mut DecoderState, tokens: &[u32]) {
        let WhisperDims {
            d_model: d,
            n_text_ctx,
            n_vocab,
            ..
        } = self.dims;
        let (start, n) = (state.len, tokens.len());
        assert!(
            start + n <= n_text_ctx,
            "decoder positions {start}+{n} past {n_text_ctx}"
        );
        let ids: Vec<i64> = tokens
            .iter()
            .map(|&t| {
                assert!((t as usize) < n_vocab, "token id {t} out of the vocabulary");
                t as i64
            })
            .collect();
        let dev = &self.device;
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), dev);
        let mut x =
            self.emb.clone().select(0, ids) + self.dec_pos.clone().slice([start..start + n, 0..d]);
        let total = start + n;
        // Position start + i sees keys 0..=start + i.
        let causal = (n > 1).then(|| {
            let bias: Vec<f32> = (0..n)
                .flat_map(|i| (0..total).map(move |j| if j > start + i { -1e30 } else { 0.0 }))
                .collect();
            Tensor::<B, 2>::from_data(TensorData::new(bias, [n, total]), dev)
        });
        let st = self.state(state);
        for (li, layer) in self.dec_layers.iter().enumerate() {
            let qkv = layer.self_qkv.forward(layer.self_ln.forward(x.clone()));
            x = x + layer
                .self_out
                .forward(self.attend_self(st, li, qkv, causal.clone()));
            let q = layer.cross_q.forward(layer.cross_ln.forward(x.clone()));
            x = x + layer.cross_out.forward(self.attend_cross(st, li, q));
            let inner = gelu(layer.fc1.forward(layer.ffn_ln.forward(x.clone())));
            x = x + layer.fc2.forward(inner);
        }
        st.x = Some(self.dec_ln.forward(x));
        state.len = total;
    }

    fn step_batch(&self, states: &mut [DecoderState], tokens: &[u32], _: &mut BatchScratch) {
        assert_eq!(states.len(), tokens.len(), "one token per sequence");
        let WhisperDims {
            d_model: d,
            n_text_ctx,
            n_vocab,
            ..
        } = self.dims;
        let rows = states.len();
        let (mut ids, mut positions) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
        for (state, &t) in states.iter().zip(tokens) {
            assert!((t as usize) < n_vocab, "token id {t} out of the vocabulary");
            assert!(
                state.len < n_text_ctx,
                "decoder position {} past {n_text_ctx}",
                state.len
            );
            ids.push(t as i64);
            positions.push(state.len as i64);
        }
        let dev = &self.device;
        let index = |v: Vec<i64>| Tensor::<B, 1, Int>::from_data(TensorData::new(v, [rows]), dev);
        let mut x = self.emb.clone().select(0, index(ids))
            + self.dec_pos.clone().select(0, index(positions));
        // Projections and the feed-forward over all rows at once; attention per sequence,
        // over its own caches.
        for (li, layer) in self.dec_layers.iter().enumerate() {
            let qkv = layer.self_qkv.forward(layer.self_ln.forward(x.clone()));
            let ctx = self.per_sequence(states, qkv, |st, row| self.attend_self(st, li, row, None));
            x = x + layer.self_out.forward(ctx);
            let q = layer.cross_q.forward(layer.cross_ln.forward(x.clone()));
            let ctx = self.per_sequence(states, q, |st, row| self.attend_cross(st, li, row));
            x = x + layer.cross_out.forward(ctx);
            let inner = gelu(layer.fc1.forward(layer.ffn_ln.forward(x.clone())));
            x = x + layer.fc2.forward(inner);
        }
        let x = self.dec_ln.forward(x);
        // One vocabulary projection and one read-back for every row.
        let logits = to_host(x.clone().matmul(self.emb.clone().transpose()));
        for ((r, state), row) in states
            .iter_mut()
            .enumerate()
            .zip(logits.chunks_exact(n_vocab))
        {
            state.logits.copy_from_slice(row);
            state.len += 1;
            self.state(state).x = Some(x.clone().slice([r..r + 1, 0..d]));
        }
    }

    fn logits(&self, state: &mut DecoderState, row: usize) {
        let d = self.dims.d_model;
        let st = self.state(state);
        let x = st.x.clone().expect("logits after a decode");
        let row = x.slice([row..row + 1, 0..d]);
        let logits = to_host(row.matmul(self.emb.clone().transpose()));
        state.logits.copy_from_slice(&logits);
    }
}
