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
/// Sequences with many query rows in the step (prefill chunks) take the tiled kernel of
/// [`super::flash`]; decode rows and short chunks the per-row kernel. Rows no sequence owns
/// stay zero.
pub fn paged_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[AttnSeq<'_>],
    shape: &AttnShape,
) -> Vec<f32> {
    let (tiled, per_row): (Vec<&AttnSeq<'_>>, Vec<&AttnSeq<'_>>) = seqs
        .iter()
        .partition(|s| s.q_len >= super::flash::MIN_TILED_ROWS);
    if tiled.is_empty() {
        return paged_attention_rows(q, k_cache, v_cache, seqs, shape);
    }
    let per_row: Vec<AttnSeq<'_>> = per_row.into_iter().copied().collect();
    let mut out = paged_attention_rows(q, k_cache, v_cache, &per_row, shape);
    super::flash::prefill_attention(q, k_cache, v_cache, &tiled, shape, &mut out);
    out
}

/// The per-row kernel: one task per (query row, KV head) handles that KV head's whole query
/// group, so each key and value row is read once per group; keys are walked block by block
/// through the block table (no gather). Rows no sequence in `seqs` owns stay zero.
pub fn paged_attention_rows(
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
    // Few (row, KV head) tasks (decode) would leave threads idle: then one task per query
    // head, each re-reading its KV head's rows (they stay in cache).
    let heads_per_task = if tokens * kvh < 2 * rayon::current_num_threads() {
        1
    } else {
        group
    };
    let mut out = vec![0f32; tokens * qdim];
    let task = |(t, acc): (usize, &mut [f32])| {
        let tasks_per_row = h / heads_per_task;
        let (row, first_head) = (t / tasks_per_row, (t % tasks_per_row) * heads_per_task);
        if let Some((si, i)) = owner[row] {
            let seq = &seqs[si];
            let q0 = row * qdim + first_head * d;
            let job = Attend {
                q: &q[q0..q0 + heads_per_task * d],
                k_cache,
                v_cache,
                seq,
                ctx: seq.start_pos + i + 1,
                kv_head: first_head / group,
                shape,
            };
            job.run(acc);
        }
    };
    out.par_chunks_mut(heads_per_task * d)
        .enumerate()
        .for_each(task);
    out
}

/// One attention task: query heads `q` (consecutive, all of KV head `kv_head`) of one row
/// against positions `0..ctx` of `seq`.
struct Attend<'a> {
    q: &'a [f32],
    k_cache: &'a [f32],
    v_cache: &'a [f32],
    seq: &'a AttnSeq<'a>,
    ctx: usize,
    kv_head: usize,
    shape: &'a AttnShape,
}

impl Attend<'_> {
    #[allow(unsafe_code)]
    fn run(&self, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if super::quant::has_avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked at run time); the body is
            // safe code.
            unsafe { self.run_avx2(out) };
            return;
        }
        self.body(out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn run_avx2(&self, out: &mut [f32]) {
        self.body(out)
    }

    /// Softmax(q·K^T * scale) · V over positions `0..ctx` for every query head in `q`.
    #[inline(always)]
    fn body(&self, out: &mut [f32]) {
        let Attend {
            q: qg,
            k_cache: kc,
            v_cache: vc,
            seq: s,
            ctx,
            kv_head,
            shape,
        } = *self;
        let d = shape.head_dim;
        let kv_w = shape.num_kv_heads * d;
        let bs = shape.block_size.max(1);
        let group = qg.len() / d.max(1);
        // Offsets of this KV head's row at each position, block by block.
        let offsets: Vec<usize> = s
            .block_table
            .iter()
            .flat_map(|&b| (0..bs).map(move |o| (b as usize * bs + o) * kv_w + kv_head * d))
            .take(ctx)
            .collect();
        let ctx = offsets.len();
        let mut scores = vec![0f32; group * ctx];
        for j in 0..group {
            let qj = &qg[j * d..(j + 1) * d];
            let sc = &mut scores[j * ctx..(j + 1) * ctx];
            // Eight keys at a time: eight independent accumulation chains instead of one. The
            // last partial tile repeats its final key, so every score comes from the same code.
            for (tile, out) in offsets.chunks(8).zip(sc.chunks_mut(8)) {
                let ks: [&[f32]; 8] = std::array::from_fn(|i| {
                    let off = tile[i.min(tile.len() - 1)];
                    &kc[off..off + d]
                });
                for (o, v) in out.iter_mut().zip(dot8(qj, ks)) {
                    *o = v * shape.scale;
                }
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
        for (p, &off) in offsets.iter().enumerate() {
            let v = &vc[off..off + d];
            for j in 0..group {
                let w = scores[j * ctx + p];
                for (a, &x) in out[j * d..(j + 1) * d].iter_mut().zip(v) {
                    *a = w.mul_add(x, *a);
                }
            }
        }
    }
}

/// Eight dot products of `q` with the rows `ks` (each at least `q.len()` long).
#[inline(always)]
#[allow(unsafe_code)]
fn dot8(q: &[f32], ks: [&[f32]; 8]) -> [f32; 8] {
    let d = q.len();
    assert!(
        ks.iter().all(|k| k.len() >= d),
        "key rows shorter than the query"
    );
    #[cfg(target_arch = "x86_64")]
    if super::quant::has_avx2() {
        // SAFETY: AVX2/FMA present (checked at run time); every row holds `d` values.
        return unsafe { dot8_avx2(q, &ks) };
    }
    std::array::from_fn(|i| {
        let mut acc = [0f32; 8];
        let (qc, kc) = (q.chunks_exact(8), ks[i][..d].chunks_exact(8));
        let tail: f32 = qc
            .remainder()
            .iter()
            .zip(kc.remainder())
            .map(|(a, b)| a * b)
            .sum();
        for (a, b) in qc.zip(kc) {
            for l in 0..8 {
                acc[l] = a[l].mul_add(b[l], acc[l]);
            }
        }
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail
    })
}

/// [`dot8`] with one FMA chain per row and a transposing horizontal reduction.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
unsafe fn dot8_avx2(q: &[f32], ks: &[&[f32]; 8]) -> [f32; 8] {
    use std::arch::x86_64::*;
    let d = q.len();
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut c = 0;
    // SAFETY (loads): c + 8 <= d and every row holds at least d values (caller).
    while c + 8 <= d {
        let qv = _mm256_loadu_ps(q.as_ptr().add(c));
        for (a, k) in acc.iter_mut().zip(ks) {
            *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.as_ptr().add(c)), *a);
        }
        c += 8;
    }
    let s01 = _mm256_hadd_ps(acc[0], acc[1]);
    let s23 = _mm256_hadd_ps(acc[2], acc[3]);
    let s45 = _mm256_hadd_ps(acc[4], acc[5]);
    let s67 = _mm256_hadd_ps(acc[6], acc[7]);
    let s0123 = _mm256_hadd_ps(s01, s23);
    let s4567 = _mm256_hadd_ps(s45, s67);
    let lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
    let hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(lo, hi));
    if c < d {
        for (o, k) in out.iter_mut().zip(ks) {
            *o += (c..d).map(|x| q[x] * k[x]).sum::<f32>();
        }
    }
    out
}
