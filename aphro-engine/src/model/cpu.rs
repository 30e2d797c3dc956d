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

/// Values per chunk of the gated activations: the exponentials of a chunk are computed
/// together by [`exp_in_place`], which vectorises (libm's scalar `expf`/`tanhf` cost as
/// much as a layer's matmuls at batch 16).
const ACT_CHUNK: usize = 64;

/// `g = silu(g) * u` elementwise: `g / (1 + e^-g) * u`.
pub fn swiglu(g: &mut [f32], u: &[f32]) {
    gated(g, u, |x| -x, |x, e, u| x / (1.0 + e) * u);
}

/// `g = gelu_tanh(g) * u` elementwise, PyTorch's `0.5 x (1 + tanh(y))` with
/// `y = sqrt(2/pi) (x + 0.044715 x^3)`, as `0.5 x (1 + 1 - 2 / (e^2y + 1))`: the tanh
/// through one exponential, rounded where PyTorch's is (its `1 + tanh` cancels the same
/// way for negative `x`). Within a few ulp of PyTorch's float32 result.
pub fn geglu_tanh(g: &mut [f32], u: &[f32]) {
    use super::ops::reference::{GELU_BETA, GELU_KAPPA};
    gated(
        g,
        u,
        |x| 2.0 * (GELU_BETA * (x + GELU_KAPPA * x * x * x)),
        |x, e, u| 0.5 * x * (1.0 + (1.0 - 2.0 / (e + 1.0))) * u,
    );
}

/// `g[i] = out(g[i], e^arg(g[i]), u[i])` in chunks whose exponentials vectorise.
#[inline(always)]
fn gated(
    g: &mut [f32],
    u: &[f32],
    arg: impl Fn(f32) -> f32 + Sync + Send + Copy,
    out: impl Fn(f32, f32, f32) -> f32 + Sync + Send + Copy,
) {
    assert_eq!(g.len(), u.len());
    let n = 1024.min(g.len());
    for_rows(g, n, |i, row| {
        let ur = &u[i * n..i * n + row.len()];
        #[cfg(target_arch = "x86_64")]
        if super::quant::has_avx2() {
            // SAFETY: the CPU has AVX2 and FMA (checked at run time).
            #[allow(unsafe_code)]
            unsafe {
                gated_row_fma(row, ur, arg, out)
            };
            return;
        }
        gated_row(row, ur, arg, out);
    });
}

/// [`gated_row`] compiled with FMA: `exp_in_place`'s `mul_add`s are otherwise calls to
/// libm's software `fmaf` (the same, correctly rounded, results, many times slower).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
unsafe fn gated_row_fma(
    row: &mut [f32],
    ur: &[f32],
    arg: impl Fn(f32) -> f32,
    out: impl Fn(f32, f32, f32) -> f32,
) {
    gated_row(row, ur, arg, out)
}

#[inline(always)]
fn gated_row(
    row: &mut [f32],
    ur: &[f32],
    arg: impl Fn(f32) -> f32,
    out: impl Fn(f32, f32, f32) -> f32,
) {
    for (gc, uc) in row.chunks_mut(ACT_CHUNK).zip(ur.chunks(ACT_CHUNK)) {
        let mut e = [0f32; ACT_CHUNK];
        let e = &mut e[..gc.len()];
        for (e, &x) in e.iter_mut().zip(gc.iter()) {
            *e = arg(x);
        }
        exp_in_place(e);
        for ((v, &e), &u) in gc.iter_mut().zip(e.iter()).zip(uc) {
            *v = out(*v, e, u);
        }
    }
}

/// `e^x`, the same function as [`exp_in_place`] lane by lane.
#[inline(always)]
pub(crate) fn exp_scalar(x: f32) -> f32 {
    let mut v = [x];
    exp_in_place(&mut v);
    v[0]
}

/// `e^x` in place: Cephes' `expf` (range reduction by ln 2 in two parts, a degree-5
/// polynomial, scaling by 2^n through the exponent bits), written so it vectorises.
/// Within 2 ulp of `f32::exp` (softmax gives it `x <= 0`, the gated activations any
/// `x`); `-inf` → 0, and past `88.38` it saturates at `e^88.38` (~2.4e38) instead of
/// overflowing.
#[inline(always)]
pub(crate) fn exp_in_place(xs: &mut [f32]) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    for x in xs.iter_mut() {
        let v = x.clamp(-87.336_55, 88.376_26);
        // Round to nearest by the 1.5 * 2^23 trick (vectorises, unlike `round`): the sum's
        // low mantissa bits are the integer itself, read from the bits below (a saturating
        // `as i32` cast would keep the loop scalar).
        let shifted = v * LOG2E + 12_582_912.0;
        let n = shifted - 12_582_912.0;
        let n_int = (shifted.to_bits() as i32).wrapping_sub(0x4B40_0000);
        let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, v));
        let mut p = P[0];
        for &c in &P[1..] {
            p = p.mul_add(r, c);
        }
        let e = (p * r * r + r) + 1.0;
        // Wrapping: an overflow check (dev profile) would keep the loop scalar too.
        let bits = (n_int.wrapping_add(127) as u32) << 23;
        let y = e * f32::from_bits(bits);
        // Below the clamp the true value underflows to 0 (and -inf must give 0).
        *x = if *x < -87.336_55 { 0.0 } else { y };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::reference::{GELU_BETA, GELU_KAPPA};

    #[test]
    fn exp_matches_std_within_two_ulp_over_its_range() {
        let mut worst = 0u32;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let got = exp_scalar(x);
            let want = x.exp();
            let ulp = (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs() as u32;
            worst = worst.max(ulp);
            x += 0.001_37;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
        assert_eq!(exp_scalar(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_scalar(-100.0), 0.0);
        assert_eq!(exp_scalar(0.0), 1.0);
    }

    /// The chunked activations against the textbook formulas in f64: within a few ulp
    /// (relative to the product's magnitude) over the range activations take, including
    /// the saturated tails and lengths that leave a partial chunk.
    #[test]
    fn gated_activations_match_their_formulas() {
        let n = 3 * 1024 + 77;
        let x: Vec<f32> = (0..n)
            .map(|i| (i as f32 - n as f32 / 2.0) * 0.013)
            .collect();
        let u: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let check = |got: &[f32], f: &dyn Fn(f64) -> f64, name: &str| {
            for ((&g, &x), &u) in got.iter().zip(&x).zip(&u) {
                let want = f(x as f64) * u as f64;
                let tol = 4.0 * f32::EPSILON as f64 * (x.abs() as f64 * u as f64).max(1e-30);
                assert!(
                    (g as f64 - want).abs() <= tol,
                    "{name}({x}) = {g}, want {want}"
                );
            }
        };
        let mut g = x.clone();
        swiglu(&mut g, &u);
        check(&g, &|x| x / (1.0 + (-x).exp()), "silu");
        // The FMA-compiled path gives the portable one's bits (`mul_add` is fused in both).
        let mut portable = x.clone();
        for (r, ur) in portable.chunks_mut(1024).zip(u.chunks(1024)) {
            gated_row(r, ur, |x| -x, |x, e, u| x / (1.0 + e) * u);
        }
        assert_eq!(g, portable);
        let mut g = x.clone();
        geglu_tanh(&mut g, &u);
        let (beta, kappa) = (GELU_BETA as f64, GELU_KAPPA as f64);
        check(
            &g,
            &|x| 0.5 * x * (1.0 + (beta * (x + kappa * x * x * x)).tanh()),
            "gelu_tanh",
        );
    }
}
