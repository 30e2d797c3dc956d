//! Row-wise elementwise ops on host `f32` slices, for CPU backends: one pass over the data
//! with no intermediate tensors (a decode step runs them on rows of a few hundred values,
//! where per-op tensor overhead would dominate).

use rayon::prelude::*;

use super::ops::{AttnSeq, AttnShape};

/// Rows per rayon task; below this many values in total the op runs on the calling thread.
const PAR_MIN: usize = 1 << 16;

fn for_rows(x: &mut [f32], n: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if n == 0 {
        return;
    }
    if x.len() >= PAR_MIN {
        x.par_chunks_mut(n).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        x.chunks_mut(n).enumerate().for_each(|(i, r)| f(i, r));
    }
}

/// `x[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w` for each row of `w.len()` values.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for_rows(x, n, |_, row| {
        let ss: f32 = row.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / n as f32 + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    });
}

/// HF `rotate_half` RoPE in place on `x: [tokens, width]` (`width = heads * d`) with
/// `cos`/`sin: [tokens, d]`.
pub fn rope(x: &mut [f32], width: usize, heads: usize, cos: &[f32], sin: &[f32]) {
    if heads == 0 || width == 0 {
        return;
    }
    let d = width / heads;
    let half = d / 2;
    debug_assert_eq!(cos.len(), x.len() / width * d);
    for_rows(x, width, |t, row| {
        let (c, s) = (&cos[t * d..(t + 1) * d], &sin[t * d..(t + 1) * d]);
        for h in row.chunks_exact_mut(d) {
            for j in 0..half {
                let (a, b) = (h[j], h[j + half]);
                h[j] = a * c[j] - b * s[j];
                h[j + half] = b * c[j + half] + a * s[j + half];
            }
        }
    });
}

/// `g = silu(g) * u` elementwise.
pub fn swiglu(g: &mut [f32], u: &[f32]) {
    let n = 1024.min(g.len());
    for_rows(g, n, |i, row| {
        for (v, &u) in row.iter_mut().zip(&u[i * n..]) {
            *v = *v / (1.0 + (-*v).exp()) * u;
        }
    });
}

/// Paged attention over host slices: `q: [tokens, heads * d]`, caches `[slots, kv_heads * d]`.
/// One task per (query row, KV head) handles that KV head's whole query group, so each
/// key and value row is read once per group; keys are walked block by block through the
/// block table (no gather). Rows no sequence owns stay zero.
pub fn paged_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[AttnSeq<'_>],
    shape: &AttnShape,
) -> Vec<f32> {
    let (h, kvh, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let qdim = h * d;
    if qdim == 0 || kvh == 0 {
        return Vec::new();
    }
    let tokens = q.len() / qdim;
    let mut owner: Vec<Option<(usize, usize)>> = vec![None; tokens];
    for (si, s) in seqs.iter().enumerate() {
        for i in 0..s.q_len {
            if let Some(o) = owner.get_mut(s.q_offset + i) {
                *o = Some((si, i));
            }
        }
    }
    let group = h / kvh;
    let mut out = vec![0f32; tokens * qdim];
    let task = |(t, acc): (usize, &mut [f32])| {
        let (row, kv_head) = (t / kvh, t % kvh);
        if let Some((si, i)) = owner[row] {
            let s = &seqs[si];
            let q0 = row * qdim + kv_head * group * d;
            let qg = &q[q0..q0 + group * d];
            attend(
                qg,
                k_cache,
                v_cache,
                s,
                s.start_pos + i + 1,
                kv_head,
                shape,
                acc,
            );
        }
    };
    let chunk = group * d;
    if tokens * kvh >= 4 {
        out.par_chunks_mut(chunk).enumerate().for_each(task);
    } else {
        out.chunks_mut(chunk).enumerate().for_each(task);
    }
    out
}

#[allow(clippy::too_many_arguments)]
#[allow(unsafe_code)]
fn attend(
    qg: &[f32],
    kc: &[f32],
    vc: &[f32],
    s: &AttnSeq<'_>,
    ctx: usize,
    kv_head: usize,
    shape: &AttnShape,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::quant::has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time); the body is safe code.
        unsafe { attend_avx2(qg, kc, vc, s, ctx, kv_head, shape, out) };
        return;
    }
    attend_body(qg, kc, vc, s, ctx, kv_head, shape, out)
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
fn attend_avx2(
    qg: &[f32],
    kc: &[f32],
    vc: &[f32],
    s: &AttnSeq<'_>,
    ctx: usize,
    kv_head: usize,
    shape: &AttnShape,
    out: &mut [f32],
) {
    attend_body(qg, kc, vc, s, ctx, kv_head, shape, out)
}

/// Softmax(q·K^T * scale) · V over positions `0..ctx` for every query head in `qg`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_body(
    qg: &[f32],
    kc: &[f32],
    vc: &[f32],
    s: &AttnSeq<'_>,
    ctx: usize,
    kv_head: usize,
    shape: &AttnShape,
    out: &mut [f32],
) {
    let d = shape.head_dim;
    let kv_w = shape.num_kv_heads * d;
    let bs = shape.block_size.max(1);
    let group = qg.len() / d.max(1);
    // Offsets of this KV head's row at each position, block by block.
    let offsets = || {
        s.block_table
            .iter()
            .flat_map(move |&b| (0..bs).map(move |o| (b as usize * bs + o) * kv_w + kv_head * d))
            .take(ctx)
    };
    let mut scores = vec![0f32; group * ctx];
    for (p, off) in offsets().enumerate() {
        let k = &kc[off..off + d];
        for j in 0..group {
            scores[j * ctx + p] = dot(&qg[j * d..(j + 1) * d], k) * shape.scale;
        }
    }
    for sc in scores.chunks_exact_mut(ctx.max(1)) {
        let max = sc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0f32;
        for v in sc.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        sc.iter_mut().for_each(|v| *v *= inv);
    }
    for (p, off) in offsets().enumerate() {
        let v = &vc[off..off + d];
        for j in 0..group {
            let w = scores[j * ctx + p];
            for (a, &x) in out[j * d..(j + 1) * d].iter_mut().zip(v) {
                *a += w * x;
            }
        }
    }
}

/// Dot product with eight independent lanes (vectorizes inside the AVX2 wrapper).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}
