//! Row-wise elementwise ops on host `f32` slices, for CPU backends: one pass over the data
//! with no intermediate tensors (a decode step runs them on rows of a few hundred values,
//! where per-op tensor overhead would dominate).

use rayon::prelude::*;

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
    assert_eq!(cos.len(), x.len() / width * d);
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

/// `g = gelu_tanh(g) * u` elementwise, in PyTorch's formula
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn geglu_tanh(g: &mut [f32], u: &[f32]) {
    use super::ops::reference::{GELU_BETA, GELU_KAPPA};
    let n = 1024.min(g.len());
    for_rows(g, n, |i, row| {
        for (v, &u) in row.iter_mut().zip(&u[i * n..]) {
            let x = *v;
            let inner = GELU_BETA * (x + GELU_KAPPA * x * x * x);
            *v = 0.5 * x * (1.0 + inner.tanh()) * u;
        }
    });
}
