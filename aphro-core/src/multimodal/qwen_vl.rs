//! The Qwen2-VL / Qwen2.5-VL / Qwen3-VL image processor as vLLM 0.33 runs transformers'
//! `Qwen2VLImageProcessor` (torchvision backend): `smart_resize` to a multiple of
//! `patch_size * merge_size` within `[min_pixels, max_pixels]`, bicubic antialiased resize in
//! `uint8`, then either the raw bytes (vLLM's default, the model normalizes on the device) or
//! rescale + normalize cast to the model dtype, and patchify (as the rows are written) to
//! `[grid_t*grid_h*grid_w, C*T*P*P]` with the frame repeated `temporal_patch_size` times.
use super::image_io::DecodedImage;
use super::resize::resize_rgb8_bicubic_aa_planar;
use super::Tensor;
use crate::error::{Error, Result};
use serde_json::{Map, Value};

const CHANNELS: usize = 3;

/// What `preprocessor_config.json` (and the model's `config.json`) say about images.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenVlProcessor {
    pub patch_size: usize,
    pub merge_size: usize,
    pub temporal_patch_size: usize,
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    pub rescale_factor: f64,
    /// The name vLLM's processor errors use (`Qwen2VLProcessor`, `Qwen3VLProcessor`).
    pub processor_class: String,
}

/// How `pixel_values` leave the processor (vLLM's `--[no-]mm-device-do-normalize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelOutput {
    /// Default: the resized `uint8` pixels; the model rescales and normalizes on the device.
    RawU8,
    /// Rescaled and normalized on the CPU, then cast to the model dtype.
    Normalized(FloatDtype),
}

/// The floating dtypes a model config names (`torch_dtype` / `dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatDtype {
    BFloat16,
    Float16,
    Float32,
}

impl FloatDtype {
    /// From a `config.json` dtype string; `None` for anything else.
    pub fn from_config(name: &str) -> Option<Self> {
        match name {
            "bfloat16" => Some(FloatDtype::BFloat16),
            "float16" | "half" => Some(FloatDtype::Float16),
            "float32" | "float" => Some(FloatDtype::Float32),
            _ => None,
        }
    }

    /// Bytes per element.
    fn width(self) -> usize {
        match self {
            FloatDtype::Float32 => 4,
            FloatDtype::BFloat16 | FloatDtype::Float16 => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            FloatDtype::BFloat16 => "bfloat16",
            FloatDtype::Float16 => "float16",
            FloatDtype::Float32 => "float32",
        }
    }
}

/// One processed image: the resized pixels, from which `pixel_values` rows are cut when
/// they are written ([`ProcessedImage::write_pixel_values`]), so the
/// `[grid_t*grid_h*grid_w, C*T*P*P]` tensor (12 MB for a 1920x1080 photo) is never held
/// whole on the way to `kwargs_data`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedImage {
    /// `image_grid_thw`: `[1, grid_h, grid_w]` in patches.
    pub grid_thw: [i64; 3],
    /// Placeholder tokens the image takes: `grid_t*grid_h*grid_w / merge_size²`.
    pub num_tokens: usize,
    /// The resized image as three planes (R, G, B), `width * height` bytes each.
    planes: Vec<u8>,
    width: usize,
    height: usize,
    patch_size: usize,
    merge_size: usize,
    temporal_patch_size: usize,
    encoding: PixelEncoding,
}

/// How one resized byte becomes `pixel_values` bytes.
#[derive(Debug, Clone, PartialEq)]
enum PixelEncoding {
    /// The byte itself (`uint8`).
    Raw,
    /// Rescaled and normalized: the value depends only on (channel, byte), so `table` holds
    /// the encoded bytes of all 3 × 256, `dtype.width()` bytes each.
    Table { dtype: FloatDtype, table: Vec<u8> },
}

impl ProcessedImage {
    /// `pixel_values`' dtype name (`uint8`, or the model dtype when normalized on the CPU).
    pub fn pixel_values_dtype(&self) -> &'static str {
        match &self.encoding {
            PixelEncoding::Raw => "uint8",
            PixelEncoding::Table { dtype, .. } => dtype.name(),
        }
    }

    /// `pixel_values`' shape: `[grid_t*grid_h*grid_w, C*T*P*P]`.
    pub fn pixel_values_shape(&self) -> [usize; 2] {
        let p = self.patch_size;
        let rows = (self.height / p) * (self.width / p);
        [rows, CHANNELS * self.temporal_patch_size * p * p]
    }

    /// Bytes per element of `pixel_values`.
    fn element_width(&self) -> usize {
        match &self.encoding {
            PixelEncoding::Raw => 1,
            PixelEncoding::Table { dtype, .. } => dtype.width(),
        }
    }

    /// `pixel_values`' size in bytes.
    pub fn pixel_values_len(&self) -> usize {
        let [rows, row_len] = self.pixel_values_shape();
        rows * row_len * self.element_width()
    }

    /// The whole `pixel_values` tensor.
    pub fn pixel_values(&self) -> Tensor {
        let mut data = Vec::with_capacity(self.pixel_values_len());
        self.write_pixel_values(|band| data.extend_from_slice(band));
        Tensor {
            dtype: self.pixel_values_dtype(),
            shape: self.pixel_values_shape().to_vec(),
            data,
        }
    }

    /// Writes `pixel_values`' raw little-endian bytes in order, one band of merge windows
    /// (`merge_size * patch_size` image rows) at a time, through one reused buffer.
    ///
    /// The row order: merge window (grid_h/m, grid_w/m), then the patch inside it (m, m);
    /// each row is channel-major with the frame repeated T times: `[C, T, P, P]`.
    pub fn write_pixel_values(&self, mut sink: impl FnMut(&[u8])) {
        let (p, m) = (self.patch_size, self.merge_size);
        let (gh, gw) = (self.height / p, self.width / p);
        let band_len = gw * m * CHANNELS * self.temporal_patch_size * p * p * self.element_width();
        // Room for the last 16-byte line store of a band of 14-byte lines.
        let mut band = vec![0u8; band_len + LINE_SLACK];
        for bh in 0..gh / m {
            match (&self.encoding, p) {
                (PixelEncoding::Raw, 14) => self.cut_band_raw::<14>(bh, &mut band),
                (PixelEncoding::Raw, 16) => self.cut_band_raw::<16>(bh, &mut band),
                (PixelEncoding::Raw, _) => {
                    self.cut_band(bh, &mut band[..band_len], 1, |_, src, dst| {
                        dst.copy_from_slice(src)
                    })
                }
                (PixelEncoding::Table { dtype, table }, _) => {
                    let width = dtype.width();
                    self.cut_band(bh, &mut band[..band_len], width, |c, src, dst| {
                        let channel = &table[c * 256 * width..(c + 1) * 256 * width];
                        for (d, &x) in dst.chunks_exact_mut(width).zip(src) {
                            let x = usize::from(x);
                            d.copy_from_slice(&channel[x * width..(x + 1) * width]);
                        }
                    })
                }
            }
            sink(&band[..band_len]);
        }
    }

    /// [`Self::cut_band`] for `uint8` pixels with `P` ≤ 16: each patch line is moved as one
    /// 16-byte load and store per frame. A store runs up to `16 - P` bytes past its line,
    /// into the next line, which is written after it: the lines are stored in ascending
    /// order, and `out` has [`LINE_SLACK`] bytes after the band for the last one.
    #[inline(always)]
    fn cut_band_raw<const P: usize>(&self, bh: usize, out: &mut [u8]) {
        let w = self.width;
        let planes = &self.planes[..];
        let plane_len = w * self.height;
        let block = P * P;
        let mut at = 0;
        for (y0, x0) in self.patch_origins(bh) {
            for c in 0..CHANNELS {
                let first = c * plane_len + y0 * w + x0;
                for _ in 0..self.temporal_patch_size {
                    for py in 0..P {
                        let src = first + py * w;
                        // Fixed-size arrays: one 16-byte move, not a memcpy call.
                        let dst: &mut [u8; LINE_SLACK] = (&mut out
                            [at + py * P..at + py * P + LINE_SLACK])
                            .try_into()
                            .expect("16 bytes");
                        match planes.get(src..src + LINE_SLACK) {
                            Some(line) => *dst = line.try_into().expect("16 bytes"),
                            // The image's last line: no 16 bytes to read past it.
                            None => dst[..P].copy_from_slice(&planes[src..src + P]),
                        }
                    }
                    at += block;
                }
            }
        }
        debug_assert_eq!(at + LINE_SLACK, out.len());
    }

    /// The top-left pixel `(y, x)` of each patch of band `bh`, in row order: merge window
    /// along the band, then the patch inside it.
    #[inline(always)]
    fn patch_origins(&self, bh: usize) -> impl Iterator<Item = (usize, usize)> {
        let (p, m) = (self.patch_size, self.merge_size);
        (0..self.width / p / m).flat_map(move |bw| {
            (0..m).flat_map(move |mh| (0..m).map(move |mw| ((bh * m + mh) * p, (bw * m + mw) * p)))
        })
    }

    /// Fills `out` with band `bh`'s rows; `line(channel, P pixels of one plane, out)` writes
    /// one patch line.
    #[inline(always)]
    fn cut_band(
        &self,
        bh: usize,
        out: &mut [u8],
        elem: usize,
        line: impl Fn(usize, &[u8], &mut [u8]),
    ) {
        let (p, w) = (self.patch_size, self.width);
        let plane_len = w * self.height;
        let line_len = p * elem;
        let block = p * line_len;
        let mut at = 0;
        for (y0, x0) in self.patch_origins(bh) {
            for (c, plane) in self.planes.chunks_exact(plane_len).enumerate() {
                let first = at;
                for py in 0..p {
                    let start = (y0 + py) * w + x0;
                    line(c, &plane[start..start + p], &mut out[at..at + line_len]);
                    at += line_len;
                }
                // The frame repeated `temporal_patch_size` times.
                for _ in 1..self.temporal_patch_size {
                    out.copy_within(first..first + block, at);
                    at += block;
                }
            }
        }
        debug_assert_eq!(at, out.len());
    }
}

/// Bytes a patch line store may run past its line ([`ProcessedImage::cut_band_raw`]).
const LINE_SLACK: usize = 16;

fn usize_of(cfg: &Value, key: &str, default: usize) -> usize {
    cfg.get(key)
        .and_then(Value::as_u64)
        .map_or(default, |v| v as usize)
}

fn triple(cfg: &Value, key: &str, default: [f32; 3]) -> Result<[f32; 3]> {
    let Some(v) = cfg.get(key) else {
        return Ok(default);
    };
    let list: Vec<f64> = v
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    match list.as_slice() {
        [a, b, c] => Ok([*a as f32, *b as f32, *c as f32]),
        _ => Err(Error::ModelFiles(format!(
            "preprocessor_config.json: `{key}` must be 3 numbers"
        ))),
    }
}

impl QwenVlProcessor {
    /// From `preprocessor_config.json`: `min_pixels`/`max_pixels` (Qwen2-VL) or
    /// `size.shortest_edge`/`size.longest_edge` (Qwen3-VL), patch/merge/temporal sizes, mean/std.
    pub fn from_preprocessor_config(cfg: &Value) -> Result<Self> {
        let size = cfg.get("size");
        let pick = |top: &str, edge: &str, default: u64| {
            cfg.get(top)
                .and_then(Value::as_u64)
                .or_else(|| size.and_then(|s| s.get(edge)).and_then(Value::as_u64))
                .unwrap_or(default)
        };
        let processor_class = cfg
            .get("processor_class")
            .and_then(Value::as_str)
            .unwrap_or("Qwen2VLProcessor")
            .to_owned();
        let p = QwenVlProcessor {
            patch_size: usize_of(cfg, "patch_size", 14),
            merge_size: usize_of(cfg, "merge_size", 2),
            temporal_patch_size: usize_of(cfg, "temporal_patch_size", 2),
            min_pixels: pick("min_pixels", "shortest_edge", 56 * 56),
            max_pixels: pick("max_pixels", "longest_edge", 28 * 28 * 1280),
            image_mean: triple(cfg, "image_mean", [0.481_454_66, 0.457_827_5, 0.408_210_73])?,
            image_std: triple(cfg, "image_std", [0.268_629_54, 0.261_302_6, 0.275_777_1])?,
            rescale_factor: cfg
                .get("rescale_factor")
                .and_then(Value::as_f64)
                .unwrap_or(1.0 / 255.0),
            processor_class,
        };
        if p.patch_size == 0 || p.merge_size == 0 || p.temporal_patch_size == 0 {
            return Err(Error::ModelFiles(
                "preprocessor_config.json: patch sizes must be positive".into(),
            ));
        }
        Ok(p)
    }

    /// This processor with a request's `mm_processor_kwargs` applied (`min_pixels`,
    /// `max_pixels`, `size`); other keys do not change the image path.
    pub fn with_overrides(&self, kwargs: &Map<String, Value>) -> Result<Self> {
        let mut p = self.clone();
        let num = |v: &Value, k: &str| {
            v.as_u64().ok_or_else(|| {
                Error::bad_request(format!(
                    "mm_processor_kwargs.{k} must be a positive integer"
                ))
            })
        };
        if let Some(v) = kwargs.get("min_pixels") {
            p.min_pixels = num(v, "min_pixels")?;
        }
        if let Some(v) = kwargs.get("max_pixels") {
            p.max_pixels = num(v, "max_pixels")?;
        }
        if let Some(size) = kwargs.get("size") {
            if let Some(v) = size.get("shortest_edge") {
                p.min_pixels = num(v, "size.shortest_edge")?;
            }
            if let Some(v) = size.get("longest_edge") {
                p.max_pixels = num(v, "size.longest_edge")?;
            }
        }
        Ok(p)
    }

    /// `patch_size * merge_size`: output sides are multiples of this.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// transformers' `smart_resize`: the `(height, width)` the image is resized to.
    pub fn smart_resize(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        let (h, w) = (height as f64, width as f64);
        let ratio = h.max(w) / h.min(w);
        if height == 0 || width == 0 || ratio > 200.0 {
            return Err(Error::bad_request(format!(
                "Failed to apply {}: absolute aspect ratio must be smaller than 200, got {ratio}",
                self.processor_class
            )));
        }
        let f = self.factor() as f64;
        // Python's round() rounds half to even.
        let mut h_bar = (h / f).round_ties_even() * f;
        let mut w_bar = (w / f).round_ties_even() * f;
        if h_bar * w_bar > self.max_pixels as f64 {
            let beta = (h * w / self.max_pixels as f64).sqrt();
            h_bar = f.max((h / beta / f).floor() * f);
            w_bar = f.max((w / beta / f).floor() * f);
        } else if h_bar * w_bar < self.min_pixels as f64 {
            let beta = (self.min_pixels as f64 / (h * w)).sqrt();
            h_bar = (h * beta / f).ceil() * f;
            w_bar = (w * beta / f).ceil() * f;
        }
        Ok((h_bar as usize, w_bar as usize))
    }

    /// Resizes one image; its `pixel_values` are cut from the result when written.
    pub fn process(&self, image: &DecodedImage, output: PixelOutput) -> Result<ProcessedImage> {
        let (h, w) = self.smart_resize(image.height, image.width)?;
        let planes = resize_rgb8_bicubic_aa_planar(&image.rgb, image.width, image.height, w, h);
        let (p, m) = (self.patch_size, self.merge_size);
        let (gh, gw) = (h / p, w / p);
        let encoding =
            match output {
                PixelOutput::RawU8 => PixelEncoding::Raw,
                PixelOutput::Normalized(dtype) => {
                    // transformers fuses rescale into normalize: mean/std scaled by 1/rescale_factor
                    // in float32, then (x - mean) / std in float32.
                    let inv = (1.0 / self.rescale_factor) as f32;
                    let mean = self.image_mean.map(|v| v * inv);
                    let std = self.image_std.map(|v| v * inv);
                    let width = dtype.width();
                    let mut table = vec![0u8; CHANNELS * 256 * width];
                    for (i, entry) in table.chunks_exact_mut(width).enumerate() {
                        let (c, x) = (i / 256, i % 256);
                        let v = (x as f32 - mean[c]) / std[c];
                        match dtype {
                            FloatDtype::BFloat16 => entry
                                .copy_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes()),
                            FloatDtype::Float16 => entry
                                .copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes()),
                            FloatDtype::Float32 => entry.copy_from_slice(&v.to_le_bytes()),
                        }
                    }
                    PixelEncoding::Table { dtype, table }
                }
            };
        Ok(ProcessedImage {
            grid_thw: [1, gh as i64, gw as i64],
            num_tokens: gh * gw / (m * m),
            planes,
            width: w,
            height: h,
            patch_size: p,
            merge_size: m,
            temporal_patch_size: self.temporal_patch_size,
            encoding,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen2() -> QwenVlProcessor {
        QwenVlProcessor::from_preprocessor_config(
            &json!({"min_pixels": 3136, "max_pixels": 12845056}),
        )
        .expect("config")
    }

    #[test]
    fn smart_resize_matches_the_observed_grids() {
        let p = qwen2();
        assert_eq!(p.smart_resize(224, 224).ok(), Some((224, 224)));
        assert_eq!(p.smart_resize(480, 640).ok(), Some((476, 644)));
        assert_eq!(p.smart_resize(32, 32).ok(), Some((56, 56)));
        assert_eq!(p.smart_resize(200, 1000).ok(), Some((196, 1008)));
        assert_eq!(p.smart_resize(2000, 3000).ok(), Some((1988, 2996)));
        assert_eq!(p.smart_resize(10, 10).ok(), Some((56, 56)));
        let e = p.smart_resize(1, 201).expect_err("aspect ratio");
        assert_eq!(e.status(), 400);
    }
}
