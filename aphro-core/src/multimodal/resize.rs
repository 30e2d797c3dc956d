//! Antialiased bicubic resize of 8-bit RGB exactly as torch computes it for a `uint8` tensor
//! (`torchvision.transforms.v2.functional.resize(..., BICUBIC, antialias=True)`, which calls
//! `_upsample_bicubic2d_aa`): Pillow's separable convolution (`libImaging/Resample.c`, Keys
//! cubic with a = -0.5, support scaled by the downscale factor) but with the weights rounded
//! to `i16` at a per-axis precision (`_compute_indices_int16_weights_aa` in
//! `aten/src/ATen/native/cpu/UpSampleKernel.cpp`). Horizontal pass first, then vertical, each
//! rounded back to `u8`; an axis whose size does not change is not filtered. The result is
//! planar (R, G, B planes), the layout the patches are cut from.

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
}

/// Resizes an interleaved RGB image (`width * height * 3` bytes) to `out_w` x `out_h`, and
/// returns it as three planes (R, G, B), `out_w * out_h` bytes each, one after another: the
/// layout `pixel_values` rows read from (each patch line is a run of one plane).
#[allow(unsafe_code)]
pub fn resize_rgb8_bicubic_aa_planar(
    src: &[u8],
    width: usize,
    height: usize,
    out_w: usize,
    out_h: usize,
) -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        let vbmi = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vbmi");
        if vbmi {
            // SAFETY: AVX-512 F/BW/VBMI are present (checked at run time).
            return unsafe { resize_avx512(src, width, height, out_w, out_h) };
        }
        // SAFETY: AVX2 is present (checked at run time); the body is safe code.
        return unsafe { resize_avx2(src, width, height, out_w, out_h) };
    }
    resize(src, width, height, out_w, out_h, false)
}

/// The same code compiled for AVX2: the row sums vectorize 8 lanes wide (SSE2 has no
/// 32-bit multiply), and the integer results are identical.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn resize_avx2(src: &[u8], width: usize, height: usize, out_w: usize, out_h: usize) -> Vec<u8> {
    resize(src, width, height, out_w, out_h, false)
}

/// The same code for AVX-512 with VBMI: the horizontal pass in [`vbmi`], the row sums of the
/// vertical pass 16 lanes wide.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
fn resize_avx512(src: &[u8], width: usize, height: usize, out_w: usize, out_h: usize) -> Vec<u8> {
    resize(src, width, height, out_w, out_h, true)
}

/// The portable code alone (what the SIMD passes are checked against).
#[cfg(test)]
fn resize_portable(src: &[u8], width: usize, height: usize, out_w: usize, out_h: usize) -> Vec<u8> {
    resize(src, width, height, out_w, out_h, false)
}

const C: usize = 3;

/// Interleaved RGB to three planes.
#[inline(always)]
fn deinterleave(src: &[u8], pixels: usize) -> Vec<u8> {
    let mut out = vec![0u8; pixels * C];
    let (r, gb) = out.split_at_mut(pixels);
    let (g, b) = gb.split_at_mut(pixels);
    for (((px, r), g), b) in src.chunks_exact(C).zip(r).zip(g).zip(b) {
        (*r, *g, *b) = (px[0], px[1], px[2]);
    }
    out
}

/// The horizontal pass for outputs `from..out_w` of every row: interleaved RGB in, planes out
/// (`out` holds the three `height * out_w` planes).
#[inline(always)]
fn horizontal_scalar(
    f: &AxisFilter,
    src: &[u8],
    width: usize,
    height: usize,
    out_w: usize,
    from: usize,
    out: &mut [u8],
) {
    let plane = height * out_w;
    let (r_plane, gb) = out.split_at_mut(plane);
    let (g_plane, b_plane) = gb.split_at_mut(plane);
    let round = 1i32 << (f.precision - 1);
    for (((in_row, r_row), g_row), b_row) in src
        .chunks_exact(width * C)
        .zip(r_plane.chunks_exact_mut(out_w))
        .zip(g_plane.chunks_exact_mut(out_w))
        .zip(b_plane.chunks_exact_mut(out_w))
    {
        // The three channels of a pixel share its taps: one pass over them.
        for (x, ((r_out, g_out), b_out)) in r_row
            .iter_mut()
            .zip(g_row.iter_mut())
            .zip(b_row)
            .enumerate()
            .skip(from)
        {
            let t = &f.taps[x];
            let w = &f.weights[x * f.ksize..x * f.ksize + t.len];
            let input = &in_row[t.start * C..(t.start + t.len) * C];
            let (mut r, mut g, mut b) = (round, round, round);
            for (&wk, rgb) in w.iter().zip(input.chunks_exact(C)) {
                let wk = i32::from(wk);
                r += i32::from(rgb[0]) * wk;
                g += i32::from(rgb[1]) * wk;
                b += i32::from(rgb[2]) * wk;
            }
            *r_out = (r >> f.precision).clamp(0, 255) as u8;
            *g_out = (g >> f.precision).clamp(0, 255) as u8;
            *b_out = (b >> f.precision).clamp(0, 255) as u8;
        }
    }
}

#[inline(always)]
fn resize(
    src: &[u8],
    width: usize,
    height: usize,
    out_w: usize,
    out_h: usize,
    vbmi: bool,
) -> Vec<u8> {
    let _ = vbmi; // used on x86_64 only
    debug_assert_eq!(src.len(), width * height * C);
    // Horizontal pass (or none), interleaved in, planar out.
    let planes = if out_w != width {
        let f = AxisFilter::new(width, out_w);
        let mut out = vec![0u8; height * out_w * C];
        let mut done = false;
        #[cfg(target_arch = "x86_64")]
        if vbmi {
            if let Some(plan) = vbmi::HorizontalPlan::new(&f, out_w) {
                // SAFETY: the caller checked AVX-512 F/BW/VBMI at run time.
                #[allow(unsafe_code)]
                unsafe {
                    vbmi::horizontal(&plan, &f, src, width, height, out_w, &mut out)
                };
                done = true;
            }
        }
        if !done {
            horizontal_scalar(&f, src, width, height, out_w, 0, &mut out);
        }
        out
    } else {
        deinterleave(src, width * height)
    };
    if out_h == height {
        return planes;
    }
    // Vertical pass, plane by plane: each output row is a weighted sum of whole input rows,
    // so the inner loop runs over contiguous bytes and vectorizes; integer sums, so the
    // order changes nothing.
    let f = AxisFilter::new(height, out_h);
    let mut out = vec![0u8; out_h * out_w * C];
    let mut acc = vec![0i32; out_w];
    for (plane, out_plane) in planes
        .chunks_exact(height * out_w)
        .zip(out.chunks_exact_mut(out_h * out_w))
    {
        for (y, out_row) in out_plane.chunks_exact_mut(out_w).enumerate() {
            let t = &f.taps[y];
            let w = &f.weights[y * f.ksize..y * f.ksize + t.len];
            let rows = &plane[t.start * out_w..(t.start + t.len) * out_w];
            #[cfg(target_arch = "x86_64")]
            if vbmi {
                // SAFETY: the caller checked AVX-512 F/BW at run time.
                #[allow(unsafe_code)]
                let done = unsafe { vbmi::vertical_row(rows, out_w, w, f.precision, out_row) };
                vertical_columns(rows, out_w, w, f.precision, done, out_row);
                continue;
            }
            acc.fill(1 << (f.precision - 1));
            for (k, &wk) in w.iter().enumerate() {
                let wk = i32::from(wk);
                for (a, &v) in acc.iter_mut().zip(&rows[k * out_w..(k + 1) * out_w]) {
                    *a += i32::from(v) * wk;
                }
            }
            for (o, &a) in out_row.iter_mut().zip(&acc) {
                *o = (a >> f.precision).clamp(0, 255) as u8;
            }
        }
    }
    out
}

/// Output pixels `from..` of one row of the vertical pass, column by column: `rows` are the
/// taps' input rows (`stride` bytes each), `w` their weights.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn vertical_columns(
    rows: &[u8],
    stride: usize,
    w: &[i16],
    precision: u32,
    from: usize,
    out: &mut [u8],
) {
    for (x, o) in out.iter_mut().enumerate().skip(from) {
        let mut a = 1i32 << (precision - 1);
        for (k, &wk) in w.iter().enumerate() {
            a += i32::from(rows[k * stride + x]) * i32::from(wk);
        }
        *o = (a >> precision).clamp(0, 255) as u8;
    }
}

/// The horizontal pass with AVX-512 VBMI, 16 outputs of a row at a time: the interleaved
/// input pixels the 16 outputs read lie within 128 bytes (42 pixels) when the scale is near
/// one (smart_resize's usual case), so one two-register byte permute per channel and tap
/// pair gathers them as 16-bit pairs, and `madd` applies the pair's two weights. The sums
/// and rounding are the scalar pass's; plans that do not fit fall back to it.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vbmi {
    use super::{horizontal_scalar, AxisFilter, C};
    use std::arch::x86_64::*;

    /// Outputs per vector step.
    const LANES: usize = 16;
    /// Input pixels a step may span: 128 bytes of interleaved RGB.
    const SPAN: usize = 128 / C;

    pub struct HorizontalPlan {
        /// Whole steps; the remaining outputs run the scalar pass.
        steps: usize,
        /// Tap pairs per output: `ceil(ksize / 2)`.
        pairs: usize,
        /// Per step: the first input pixel its window starts at.
        base: Vec<usize>,
        /// Per (step, pair, channel): byte indices into the window, the even byte of each
        /// 16-bit lane (the odd bytes are zeroed).
        index: Vec<[u8; 64]>,
        /// Per (step, pair): the pair's two weights per output.
        weight: Vec<[i16; 32]>,
    }

    impl HorizontalPlan {
        pub fn new(f: &AxisFilter, out_w: usize) -> Option<Self> {
            let steps = out_w / LANES;
            let pairs = f.ksize.div_ceil(2);
            let mut plan = HorizontalPlan {
                steps,
                pairs,
                base: Vec::with_capacity(steps),
                index: vec![[0; 64]; steps * pairs * C],
                weight: vec![[0; 32]; steps * pairs],
            };
            for s in 0..steps {
                let base = f.taps[s * LANES].start;
                plan.base.push(base);
                for i in 0..LANES {
                    let x = s * LANES + i;
                    let t = &f.taps[x];
                    if t.start < base || t.start + t.len - base > SPAN {
                        return None;
                    }
                    for k in 0..t.len {
                        let (pair, half) = (k / 2, k % 2);
                        plan.weight[s * pairs + pair][2 * i + half] = f.weights[x * f.ksize + k];
                        for c in 0..C {
                            plan.index[(s * pairs + pair) * C + c][4 * i + 2 * half] =
                                ((t.start + k - base) * C + c) as u8;
                        }
                    }
                }
            }
            Some(plan)
        }
    }

    /// The horizontal pass of the whole image (`out`: three `height * out_w` planes).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW and VBMI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub unsafe fn horizontal(
        plan: &HorizontalPlan,
        f: &AxisFilter,
        src: &[u8],
        width: usize,
        height: usize,
        out_w: usize,
        out: &mut [u8],
    ) {
        let plane = height * out_w;
        assert!(src.len() >= width * height * C && out.len() >= plane * C);
        // Windows are read in place; one whose 128 bytes would run past the image (at the
        // end of the last rows) reads a copy of its row in a buffer 128 bytes longer. The
        // bytes past a row meet zero weights.
        let mut padded = vec![0u8; width * C + 128];
        let round = _mm512_set1_epi32(1 << (f.precision - 1));
        let shift = _mm_cvtsi32_si128(f.precision as i32);
        let zero = _mm512_setzero_si512();
        const EVEN_BYTES: u64 = 0x5555_5555_5555_5555;
        for y in 0..height {
            let row = &src[y * width * C..(y + 1) * width * C];
            let in_place = y * width * C + width * C + 128 <= src.len();
            if !in_place {
                padded[..width * C].copy_from_slice(row);
            }
            for s in 0..plan.steps {
                // SAFETY: base * C + 128 <= width * C + 128, since every tap starts inside
                // the row: in place, the image has 128 bytes past this row's end; else
                // `padded` is that long.
                let at = if in_place {
                    row.as_ptr().add(plan.base[s] * C)
                } else {
                    padded.as_ptr().add(plan.base[s] * C)
                };
                let lo = _mm512_loadu_si512(at.cast());
                let hi = _mm512_loadu_si512(at.add(64).cast());
                let mut acc = [round; C];
                for j in 0..plan.pairs {
                    let w = _mm512_loadu_si512(plan.weight[s * plan.pairs + j].as_ptr().cast());
                    for (c, acc) in acc.iter_mut().enumerate() {
                        let idx = plan.index[(s * plan.pairs + j) * C + c].as_ptr();
                        let idx = _mm512_loadu_si512(idx.cast());
                        let px = _mm512_maskz_permutex2var_epi8(EVEN_BYTES, lo, idx, hi);
                        *acc = _mm512_add_epi32(*acc, _mm512_madd_epi16(px, w));
                    }
                }
                for (c, acc) in acc.into_iter().enumerate() {
                    let v = _mm512_max_epi32(_mm512_sra_epi32(acc, shift), zero);
                    let bytes = _mm512_cvtusepi32_epi8(v);
                    let dst = &mut out[c * plane + y * out_w + s * LANES..][..LANES];
                    // SAFETY: `dst` is 16 bytes.
                    _mm_storeu_si128(dst.as_mut_ptr().cast(), bytes);
                }
            }
        }
        if plan.steps * LANES < out_w {
            horizontal_scalar(f, src, width, height, out_w, plan.steps * LANES, out);
        }
    }

    /// One output row of the vertical pass, 32 outputs at a time: the taps' rows (`rows`,
    /// `stride` bytes each, weights `w`) go in pairs, their bytes widened to 16 bits and
    /// interleaved so one `madd` applies both weights; the sums, shift and clamp are the
    /// scalar pass's. Returns how many leading outputs it wrote (a multiple of 32).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn vertical_row(
        rows: &[u8],
        stride: usize,
        w: &[i16],
        precision: u32,
        out: &mut [u8],
    ) -> usize {
        let taps = w.len();
        if taps == 0 || out.len() > stride || rows.len() < taps * stride {
            return 0;
        }
        let round = _mm512_set1_epi32(1 << (precision - 1));
        let shift = _mm_cvtsi32_si128(precision as i32);
        let (zero, max) = (_mm512_setzero_si512(), _mm512_set1_epi16(255));
        let mut x = 0;
        while x + 32 <= out.len() {
            let (mut lo, mut hi) = (round, round);
            for k0 in (0..taps).step_by(2) {
                // An odd last tap pairs with itself at weight zero.
                let (k1, w1) = if k0 + 1 < taps {
                    (k0 + 1, w[k0 + 1])
                } else {
                    (k0, 0)
                };
                let pair = u32::from(w[k0] as u16) | (u32::from(w1 as u16) << 16);
                let weights = _mm512_set1_epi32(pair as i32);
                // SAFETY: k * stride + x + 32 <= taps * stride <= rows.len(), as x + 32 <=
                // out.len() <= stride.
                let a = _mm256_loadu_si256(rows.as_ptr().add(k0 * stride + x).cast());
                let b = _mm256_loadu_si256(rows.as_ptr().add(k1 * stride + x).cast());
                let (a, b) = (_mm512_cvtepu8_epi16(a), _mm512_cvtepu8_epi16(b));
                // Per 128-bit lane: columns 0-3 (lo) and 4-7 (hi) of its 8.
                lo = _mm512_add_epi32(lo, _mm512_madd_epi16(_mm512_unpacklo_epi16(a, b), weights));
                hi = _mm512_add_epi32(hi, _mm512_madd_epi16(_mm512_unpackhi_epi16(a, b), weights));
            }
            let (lo, hi) = (_mm512_sra_epi32(lo, shift), _mm512_sra_epi32(hi, shift));
            // `packs` puts each lane's 4 + 4 columns back in order (saturating, which keeps
            // the clamp's result).
            let v = _mm512_min_epi16(_mm512_max_epi16(_mm512_packs_epi32(lo, hi), zero), max);
            // SAFETY: x + 32 <= out.len().
            _mm256_storeu_si256(out.as_mut_ptr().add(x).cast(), _mm512_cvtepi16_epi8(v));
            x += 32;
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_image_stays_flat_up_and_down() {
        let src = [200u8, 10, 30].repeat(7 * 5);
        for (w, h) in [(14, 10), (3, 2), (7, 9), (7, 5), (7, 3), (4, 5)] {
            let out = resize_rgb8_bicubic_aa_planar(&src, 7, 5, w, h);
            let planes = [200u8, 10, 30].map(|v| vec![v; w * h]).concat();
            assert_eq!(out, planes, "{w}x{h}");
        }
    }

    #[test]
    fn the_simd_passes_equal_the_portable_code() {
        // Noise with hard edges (clamping at 0 and 255 happens), at smart_resize's usual
        // near-one scales, a downscale past the VBMI window (scalar fallback), output widths
        // with and without a partial last step, and an unchanged width.
        let mut state = 0x2545_f491u32;
        let mut noise = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|i| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    if i % 97 < 40 {
                        (state >> 24) as u8
                    } else {
                        [0, 255][(state >> 31) as usize]
                    }
                })
                .collect()
        };
        for (w, h, ow, oh) in [
            (640, 480, 644, 476),
            (1920, 37, 1932, 41),
            (100, 9, 56, 9),
            (1000, 5, 1008, 3),
            (333, 7, 330, 7),
            (16, 3, 17, 5),
            (64, 8, 64, 16),
            (700, 4, 96, 4),
        ] {
            let src = noise(w * h * 3);
            assert_eq!(
                resize_rgb8_bicubic_aa_planar(&src, w, h, ow, oh),
                resize_portable(&src, w, h, ow, oh),
                "{w}x{h} -> {ow}x{oh}"
            );
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
