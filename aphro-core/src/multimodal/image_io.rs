//! Image input as vLLM's `ImageMediaIO` reads it (`vllm/multimodal/media/image.py`): a `data:`
//! URL's base64 is decoded strictly, the file is decoded (PNG, JPEG, WebP, GIF first frame),
//! turned upright by its EXIF orientation and converted to RGB, compositing transparency onto
//! white as Pillow's `paste(mask=alpha)` does. The original file bytes are kept: they, not the
//! pixels, go into the mm_hash.
use crate::error::{Error, Result};
use base64::Engine as _;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};
use std::io::Cursor;

/// An image file as the request carried it, before decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedImage {
    /// The file's bytes (what the mm_hash covers).
    pub bytes: Vec<u8>,
}

/// A decoded, upright, RGB image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedImage {
    pub width: usize,
    pub height: usize,
    /// Interleaved RGB, row-major, `width * height * 3` bytes.
    pub rgb: Vec<u8>,
    /// Whether the file was not plain RGB and had to be converted (Pillow mode `RGBA`, `L`,
    /// `P`, …): vLLM then hashes the conversion settings (`io_config`) with the bytes.
    pub converted: bool,
}

/// Decodes the payload of a `data:` URL (`data:<media type>;base64,<data>`).
///
/// Errors as vLLM's `MediaConnector._load_data_url`: a payload that is not base64 is a 501
/// (`NotImplementedError`), a bad base64 digit a 400 with binascii's message.
pub fn decode_data_url(url: &str) -> Result<EncodedImage> {
    let rest = url
        .strip_prefix("data:")
        .ok_or_else(|| Error::bad_request("Expected a data URL"))?;
    let (spec, data) = rest
        .split_once(',')
        .ok_or_else(|| Error::bad_request("not enough values to unpack (expected 2, got 1)"))?;
    // `data:image/png,<raw>` (no `;base64`) is vLLM's 501 as well (`multimodal.md` §3.6).
    let data_type = spec.split_once(';').map(|(_, t)| t);
    if data_type != Some("base64") {
        return Err(Error::NotImplemented(
            "Only base64 data URLs are supported for now.".into(),
        ));
    }
    decode_base64(data).map(|bytes| EncodedImage { bytes })
}

/// Strict standard base64 (`pybase64.b64decode(validate=True)`), with binascii's messages.
pub fn decode_base64(data: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| match e {
            base64::DecodeError::InvalidByte(_, b'=') | base64::DecodeError::InvalidPadding => {
                Error::bad_request("Incorrect padding")
            }
            base64::DecodeError::InvalidByte(..) | base64::DecodeError::InvalidLastSymbol(..) => {
                Error::bad_request("Non-base64 digit found")
            }
            base64::DecodeError::InvalidLength(_) => Error::bad_request(
                "Invalid base64-encoded string: number of data characters cannot be 1 more than a multiple of 4",
            ),
        })
}

fn not_an_image() -> Error {
    // Pillow's `UnidentifiedImageError`, as vLLM words it.
    Error::bad_request("Failed to load image: cannot identify image file <_io.BytesIO object>")
}

/// Whether Pillow would open this file in plain `RGB` mode (no conversion, no `io_config`).
fn opens_as_plain_rgb(format: ImageFormat, bytes: &[u8], decoded: &DynamicImage) -> bool {
    match format {
        // IHDR colour type 2 (truecolour) at 8 bits, and no tRNS chunk (a transparent colour).
        ImageFormat::Png => {
            bytes.len() > 25
                && bytes[24] == 8
                && bytes[25] == 2
                && !bytes.windows(4).any(|w| w == b"tRNS")
        }
        ImageFormat::Jpeg | ImageFormat::WebP => matches!(decoded, DynamicImage::ImageRgb8(_)),
        // A GIF frame opens in palette mode.
        _ => false,
    }
}

/// Pillow's `DIV255(a*src + (255-a)*dst)` blend of `paste(im, mask=alpha)`.
fn blend_on_white(v: u8, alpha: u8) -> u8 {
    let t = u32::from(v) * u32::from(alpha) + 255 * (255 - u32::from(alpha)) + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// JPEG through libjpeg-turbo's decoder (Pillow's): the `image` crate's JPEG decoder rounds its
/// IDCT and chroma upsampling differently, which changes pixels by one here and there.
/// Grayscale stays one channel (Pillow's `L`); colour comes out as RGB.
fn decode_jpeg_like_pillow(bytes: &[u8]) -> Result<DynamicImage> {
    let failed =
        |e: &dyn std::fmt::Display| Error::bad_request(format!("Failed to load image: {e}"));
    // libjpeg reports errors by unwinding out of its error handler.
    let decoded = std::panic::catch_unwind(|| -> std::io::Result<(usize, usize, bool, Vec<u8>)> {
        let d = mozjpeg::Decompress::new_mem(bytes)?;
        let gray = d.color_space() == mozjpeg::ColorSpace::JCS_GRAYSCALE;
        let mut started = if gray { d.grayscale()? } else { d.rgb()? };
        let (w, h) = (started.width(), started.height());
        let pixels = started.read_scanlines::<u8>()?;
        started.finish()?;
        Ok((w, h, gray, pixels))
    });
    let (w, h, gray, pixels) = match decoded {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return Err(failed(&e)),
        Err(_) => return Err(failed(&"broken JPEG data")),
    };
    let (w32, h32) = (w as u32, h as u32);
    let img = if gray {
        image::GrayImage::from_raw(w32, h32, pixels).map(DynamicImage::ImageLuma8)
    } else {
        image::RgbImage::from_raw(w32, h32, pixels).map(DynamicImage::ImageRgb8)
    };
    img.ok_or_else(|| failed(&"truncated JPEG scanlines"))
}

/// Decodes an image file to upright RGB. Formats: PNG, JPEG, WebP, GIF (first frame).
pub fn decode_image(bytes: &[u8]) -> Result<DecodedImage> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|_| not_an_image())?;
    let format = match reader.format() {
        Some(f @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif)) => {
            f
        }
        _ => return Err(not_an_image()),
    };
    let mut decoder = reader.into_decoder().map_err(|_| not_an_image())?;
    let orientation = decoder.orientation().ok();
    let mut img = if format == ImageFormat::Jpeg {
        decode_jpeg_like_pillow(bytes)?
    } else {
        DynamicImage::from_decoder(decoder)
            .map_err(|e| Error::bad_request(format!("Failed to load image: {e}")))?
    };
    if let Some(o) = orientation {
        img.apply_orientation(o);
    }
    let converted = !opens_as_plain_rgb(format, bytes, &img);
    let (width, height) = (img.width() as usize, img.height() as usize);
    let rgb = if img.color().has_alpha() {
        let rgba = img.to_rgba8();
        let mut out = Vec::with_capacity(width * height * 3);
        for px in rgba.pixels() {
            let [r, g, b, a] = px.0;
            out.extend([r, g, b].map(|v| blend_on_white(v, a)));
        }
        out
    } else {
        img.into_rgb8().into_raw()
    };
    Ok(DecodedImage {
        width,
        height,
        rgb,
        converted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_url_errors_are_vllms() {
        let e = decode_data_url("data:image/png;base64,!!!not-base64!!!").expect_err("bad digit");
        assert_eq!(
            (e.status(), e.to_string().as_str()),
            (400, "Non-base64 digit found")
        );
        let e = decode_data_url("data:image/png,rawbytes").expect_err("not base64");
        assert_eq!(e.status(), 501);
        let bytes = decode_data_url("data:image/png;base64,aGVsbG8=").expect("base64");
        let e = decode_image(&bytes.bytes).expect_err("not an image");
        assert_eq!(e.status(), 400);
        assert!(e
            .to_string()
            .starts_with("Failed to load image: cannot identify"));
    }

    #[test]
    fn alpha_blends_onto_white_like_pillow() {
        assert_eq!(blend_on_white(0, 0), 255);
        assert_eq!(blend_on_white(10, 255), 10);
        // DIV255(128*255 + 255*127 + 128) = 191 (rounded 255*(127)/255 + 128*128/255 ≈ 191.25)
        assert_eq!(blend_on_white(128, 128), 191);
    }
}
