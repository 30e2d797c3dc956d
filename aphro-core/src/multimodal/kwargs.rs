//! The `kwargs_data` / `mm_metadata` blobs of a render response's `features`: vLLM's
//! `MultiModalKwargsItem` as `MsgpackEncoder` writes it (`vllm/v1/serial_utils.py`,
//! `scale_out/token_in_token_out/mm_serde.py`), then standard padded base64.
//!
//! ```text
//! item   = map{ "pixel_values": elem, "image_grid_thw": elem }   (metadata: image_grid_thw only)
//! elem   = map{ "data": [dtype, [dims], ext(3, raw LE bytes)], "field": [factory, kwargs] }
//! ```
use super::qwen_vl::ProcessedImage;
use super::Tensor;
use rmp::encode;

/// Where [`Base64Writer`] puts its text: whole 3-byte groups (and the padded last group)
/// arrive and are encoded onto the end.
pub trait Base64Sink {
    fn encode(&mut self, bytes: &[u8]);
}

impl Base64Sink for String {
    fn encode(&mut self, bytes: &[u8]) {
        base64_simd::STANDARD.encode_append(bytes, self);
    }
}

/// A fixed buffer filled from the front (see [`KwargsBlob::write_base64`]).
pub struct SliceSink<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Base64Sink for SliceSink<'_> {
    fn encode(&mut self, bytes: &[u8]) {
        let n = base64_simd::STANDARD.encoded_length(bytes.len());
        let dst = base64_simd::Out::from_slice(&mut self.out[self.at..self.at + n]);
        let _ = base64_simd::STANDARD.encode(bytes, dst);
        self.at += n;
    }
}

/// Standard padded base64 written as the bytes arrive: whole 3-byte groups are encoded
/// straight from each slice, and at most 2 bytes wait for the next. The result is the same
/// text as encoding the concatenation at once.
pub struct Base64Writer<S: Base64Sink = String> {
    out: S,
    carry: [u8; 3],
    carried: usize,
}

impl Base64Writer<String> {
    /// A writer into a string sized up front for `raw_len` bytes (more may be written).
    pub fn new(raw_len: usize) -> Self {
        Base64Writer::to_sink(String::with_capacity(
            base64_simd::STANDARD.encoded_length(raw_len),
        ))
    }
}

impl<S: Base64Sink> Base64Writer<S> {
    pub fn to_sink(out: S) -> Self {
        Base64Writer {
            out,
            carry: [0; 3],
            carried: 0,
        }
    }

    pub fn write(&mut self, mut bytes: &[u8]) {
        if self.carried > 0 {
            let take = (3 - self.carried).min(bytes.len());
            self.carry[self.carried..self.carried + take].copy_from_slice(&bytes[..take]);
            self.carried += take;
            bytes = &bytes[take..];
            if self.carried < 3 {
                return;
            }
            self.out.encode(&self.carry);
            self.carried = 0;
        }
        let whole = bytes.len() / 3 * 3;
        self.out.encode(&bytes[..whole]);
        let rest = &bytes[whole..];
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carried = rest.len();
    }

    /// The text, with the last group padded.
    pub fn finish(mut self) -> S {
        self.out.encode(&self.carry[..self.carried]);
        self.out
    }
}

// Writes into a Vec cannot fail; rmp's signatures are still fallible.
fn str(out: &mut Vec<u8>, s: &str) {
    let _ = encode::write_str(out, s);
}

/// A tensor's `[dtype, [dims], ext(3, ...)]` up to its raw bytes, which follow it.
fn tensor_head(out: &mut Vec<u8>, dtype: &str, shape: &[usize], data_len: usize) {
    let _ = encode::write_array_len(out, 3);
    str(out, dtype);
    let _ = encode::write_array_len(out, shape.len() as u32);
    for &d in shape {
        let _ = encode::write_uint(out, d as u64);
    }
    let _ = encode::write_ext_meta(out, data_len as u32, 3);
}

fn tensor(out: &mut Vec<u8>, t: &Tensor) {
    tensor_head(out, t.dtype, &t.shape, t.data.len());
    out.extend_from_slice(&t.data);
}

fn grid_elem(out: &mut Vec<u8>, grid: [i64; 3]) {
    str(out, "image_grid_thw");
    let _ = encode::write_map_len(out, 2);
    str(out, "data");
    let data: Vec<u8> = grid.iter().flat_map(|v| v.to_le_bytes()).collect();
    tensor(
        out,
        &Tensor {
            dtype: "int64",
            shape: vec![3],
            data,
        },
    );
    str(out, "field");
    let _ = encode::write_array_len(out, 2);
    str(out, "batched");
    let _ = encode::write_map_len(out, 1);
    str(out, "keep_on_cpu");
    let _ = encode::write_bool(out, true);
}

/// One `kwargs_data` item before encoding: `pixel_values` (a flat field) and
/// `image_grid_thw` as msgpack, then base64. The pixel bytes go from the processed image to
/// the text a band at a time, never held whole, and the text can go into any buffer of
/// [`Self::base64_len`] bytes (the Python binding writes it straight into a `str`).
pub struct KwargsBlob<'a> {
    image: &'a ProcessedImage,
    /// msgpack before the pixel bytes, and after them.
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl<'a> KwargsBlob<'a> {
    /// `batch_rows` are the row counts of every image of the request, in order. vLLM 0.33
    /// keeps the whole processor batch's slices in each item's field (`multimodal.md` §3.3)
    /// when the images differ in size; when they are all the same size each item carries the
    /// one slice `[0, rows]` (what its render server answered for two same-size images).
    pub fn new(image: &'a ProcessedImage, batch_rows: &[usize]) -> Self {
        let shape = image.pixel_values_shape();
        let mut head = Vec::with_capacity(96);
        let _ = encode::write_map_len(&mut head, 2);
        str(&mut head, "pixel_values");
        let _ = encode::write_map_len(&mut head, 2);
        str(&mut head, "data");
        tensor_head(
            &mut head,
            image.pixel_values_dtype(),
            &shape,
            image.pixel_values_len(),
        );
        let mut tail = Vec::with_capacity(160);
        str(&mut tail, "field");
        let _ = encode::write_array_len(&mut tail, 2);
        str(&mut tail, "flat");
        let _ = encode::write_map_len(&mut tail, 3);
        str(&mut tail, "keep_on_cpu");
        let _ = encode::write_bool(&mut tail, false);
        str(&mut tail, "slices");
        // [[slice(start, stop, None)] per image of the batch].
        let same_size = batch_rows.iter().all(|&r| r == shape[0]);
        let own = [shape[0]];
        let batch_rows = if same_size { &own[..] } else { batch_rows };
        let _ = encode::write_array_len(&mut tail, batch_rows.len() as u32);
        let mut start = 0u64;
        for &rows in batch_rows {
            let _ = encode::write_array_len(&mut tail, 1);
            let _ = encode::write_array_len(&mut tail, 3);
            let _ = encode::write_uint(&mut tail, start);
            start += rows as u64;
            let _ = encode::write_uint(&mut tail, start);
            let _ = encode::write_nil(&mut tail);
        }
        str(&mut tail, "dim");
        let _ = encode::write_uint(&mut tail, 0);
        grid_elem(&mut tail, image.grid_thw);
        KwargsBlob { image, head, tail }
    }

    /// msgpack bytes in all.
    fn raw_len(&self) -> usize {
        self.head.len() + self.image.pixel_values_len() + self.tail.len()
    }

    /// Length of the base64 text.
    pub fn base64_len(&self) -> usize {
        base64_simd::STANDARD.encoded_length(self.raw_len())
    }

    fn write<S: Base64Sink>(&self, mut b64: Base64Writer<S>) -> S {
        b64.write(&self.head);
        self.image.write_pixel_values(|band| b64.write(band));
        b64.write(&self.tail);
        b64.finish()
    }

    /// The base64 text.
    pub fn to_base64(&self) -> String {
        self.write(Base64Writer::new(self.raw_len()))
    }

    /// Writes the base64 text into `out`, which must be [`Self::base64_len`] bytes long.
    pub fn write_base64(&self, out: &mut [u8]) -> Result<(), BufferLengthError> {
        let want = self.base64_len();
        if out.len() != want {
            return Err(BufferLengthError {
                want,
                got: out.len(),
            });
        }
        self.write(Base64Writer::to_sink(SliceSink { out, at: 0 }));
        Ok(())
    }
}

/// [`KwargsBlob::write_base64`] got a buffer of the wrong size.
#[derive(Debug, thiserror::Error)]
#[error("a kwargs_data buffer of {got} bytes, {want} needed")]
pub struct BufferLengthError {
    pub want: usize,
    pub got: usize,
}

/// The full item as base64 ([`KwargsBlob`]).
pub fn kwargs_item_base64(image: &ProcessedImage, batch_rows: &[usize]) -> String {
    KwargsBlob::new(image, batch_rows).to_base64()
}

/// msgpack of the metadata item: the fields kept on the CPU (`image_grid_thw`).
pub fn encode_metadata_item(image: &ProcessedImage) -> Vec<u8> {
    let mut out = Vec::with_capacity(96);
    let _ = encode::write_map_len(&mut out, 1);
    grid_elem(&mut out, image.grid_thw);
    out
}

/// Standard padded base64, as vLLM sends the blobs.
pub fn to_base64(bytes: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_base64_equals_one_shot_base64() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 37 % 251) as u8).collect();
        for total in [0, 1, 2, 3, 4, 5, 100, 1000] {
            let data = &data[..total];
            let want = to_base64(data);
            for pieces in [1, 2, 3, 7, 64] {
                let mut w = Base64Writer::new(total);
                let mut rest = data;
                let mut i = 0;
                while !rest.is_empty() {
                    // Uneven piece sizes, empty ones included.
                    let n = ((i * 5) % (pieces + 1)).min(rest.len());
                    w.write(&rest[..n]);
                    rest = &rest[n..];
                    i += 1;
                    if i > 10 * total + 10 {
                        w.write(rest);
                        rest = &[];
                    }
                }
                assert_eq!(w.finish(), want, "{total} bytes in pieces up to {pieces}");
            }
        }
    }
}
