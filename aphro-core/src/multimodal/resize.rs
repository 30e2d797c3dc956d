//! Antialiased bicubic resize of 8-bit RGB exactly as torch computes it for a `uint8` tensor
//! (`torchvision.transforms.v2.functional.resize(..., BICUBIC, antialias=True)`, which calls
//! `_upsample_bicubic2d_aa`): Pillow's separable convolution (`libImaging/Resample.c`, Keys
//! cubic with a = -0.5, support scaled by the downscale factor) but with the weights rounded
//! to `i16` at a per-axis precision (`_compute_indices_int16_weights_aa` in
//! `aten/src/ATen/native/cpu/UpSampleKernel.cpp`). Horizontal pass first, then vertical, each
//! rounded back to `u8`; an axis whose size does not change is not filtered.

/// The taps of one output pixel along one axis.
struct Taps {
    /// First input index.
    start: usize,
    /// Number of inputs read.
    len: usize,
}

/// One axis's fixed-point filter: per output index its taps and `ksize` weights.
struct AxisFilter {
    taps: Vec<Taps>,
    weights: Vec<i16>,
    ksize: usize,
    precision: u32,
}

/// torch's `HelperInterpCubic::aa_filter` (a = -0.5, Pillow's choice).
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

impl AxisFilter {
    fn new(input: usize, output: usize) -> Self {
        let scale = input as f64 / output as f64;
        // interp_size 4 (cubic): support 2, widened by the downscale factor.
        let support = if scale >= 1.0 { 2.0 * scale } else { 2.0 };
        let ksize = support.ceil() as usize * 2 + 1;
        let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
        let mut taps = Vec::with_capacity(output);
        let mut float_weights = vec![0f64; output * ksize];
        for (i, w) in float_weights.chunks_exact_mut(ksize).enumerate() {
            let center = scale * (i as f64 + 0.5);
            // C++ casts truncate toward zero, as `as i64` does.
            let start = ((center - support + 0.5) as i64).max(0);
            let end = ((center + support + 0.5) as i64).min(input as i64);
            let len = (end - start).max(0) as usize;
            let mut total = 0.0;
            for (j, wj) in w.iter_mut().enumerate().take(len) {
                *wj = bicubic((j as f64 + start as f64 - center + 0.5) * invscale);
                total += *wj;
            }
            if total != 0.0 {
                for wj in w.iter_mut().take(len) {
                    *wj /= total;
                }
            }
            taps.push(Taps {
                start: start as usize,
                len,
            });
        }
        let w_max = float_weights
            .iter()
            .copied()
            .fold(float_weights[0], f64::max);
        let mut precision = 0u32;
        while precision < 22 {
            let next = (0.5 + w_max * f64::from(1u32 << (precision + 1))) as i32;
            if next >= 1 << 15 {
                break;
            }
            precision += 1;
        }
        let unit = f64::from(1u32 << precision);
        let weights = float_weights
            .iter()
            .map(|&v| {
                let r = if v < 0.0 {
                    -0.5 + v * unit
                } else {
                    0.5 + v * unit
                };
                r as i32 as i16
            })
            .collect();
        AxisFilter {
            taps,
            weights,
            ksize,
            precision,
        }
    }

    /// One output sample: the weighted sum of `len` inputs `stride` apart, rounded and clamped.
    #[inline]
    fn apply(&self, out_index: usize, src: &[u8], base: usize, stride: usize) -> u8 {
        let t = &self.taps[out_index];
        let w = &self.weights[out_index * self.ksize..out_index * self.ksize + t.len];
        let mut acc: i32 = 1 << (self.precision - 1);
        let mut pos = base + t.start * stride;
        for &wk in w {
            acc += i32::from(src[pos]) * i32::from(wk);
            pos += stride;
        }
        (acc >> self.precision).clamp(0, 255) as u8
    }
}

/// Resizes an interleaved RGB image (`width * height * 3` bytes) to `out_w` x `out_h`.
pub fn resize_rgb8_bicubic_aa(
    src: &[u8],
    width: usize,
    height: usize,
    out_w: usize,
    out_h: usize,
) -> Vec<u8> {
    const C: usize = 3;
    debug_assert_eq!(src.len(), width * height * C);
    let horizontal;
    let (rows, row_w): (&[u8], usize) = if out_w != width {
        let f = AxisFilter::new(width, out_w);
        let mut out = vec![0u8; height * out_w * C];
        for y in 0..height {
            let in_row = y * width * C;
            let out_row = &mut out[y * out_w * C..(y + 1) * out_w * C];
            for x in 0..out_w {
                for c in 0..C {
                    out_row[x * C + c] = f.apply(x, src, in_row + c, C);
                }
            }
        }
        horizontal = out;
        (&horizontal, out_w)
    } else {
        (src, width)
    };
    if out_h == height {
        return rows.to_vec();
    }
    let f = AxisFilter::new(height, out_h);
    let stride = row_w * C;
    let mut out = vec![0u8; out_h * stride];
    for y in 0..out_h {
        let out_row = &mut out[y * stride..(y + 1) * stride];
        for (i, o) in out_row.iter_mut().enumerate() {
            *o = f.apply(y, rows, i, stride);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_image_stays_flat_up_and_down() {
        let src = [200u8, 10, 30].repeat(7 * 5);
        for (w, h) in [(14, 10), (3, 2), (7, 9)] {
            let out = resize_rgb8_bicubic_aa(&src, 7, 5, w, h);
            assert_eq!(out, [200u8, 10, 30].repeat(w * h), "{w}x{h}");
        }
    }

    #[test]
    fn weights_of_each_output_sum_to_one_in_fixed_point() {
        for (i, o) in [(64, 56), (32, 56), (1000, 1008), (480, 476), (10, 3)] {
            let f = AxisFilter::new(i, o);
            for k in 0..o {
                let s: i32 = f.weights[k * f.ksize..(k + 1) * f.ksize]
                    .iter()
                    .map(|&w| i32::from(w))
                    .sum();
                let unit = 1i32 << f.precision;
                assert!(
                    (s - unit).abs() <= f.ksize as i32,
                    "{i}->{o} @{k}: {s} vs {unit}"
                );
            }
        }
    }
}
