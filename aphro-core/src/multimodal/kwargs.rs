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

// Writes into a Vec cannot fail; rmp's signatures are still fallible.
fn str(out: &mut Vec<u8>, s: &str) {
    let _ = encode::write_str(out, s);
}

fn tensor(out: &mut Vec<u8>, t: &Tensor) {
    let _ = encode::write_array_len(out, 3);
    str(out, t.dtype);
    let _ = encode::write_array_len(out, t.shape.len() as u32);
    for &d in &t.shape {
        let _ = encode::write_uint(out, d as u64);
    }
    let _ = encode::write_ext_meta(out, t.data.len() as u32, 3);
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

/// msgpack of the full item: `pixel_values` (a flat field) and `image_grid_thw`.
///
/// `batch_rows` are the row counts of every image of the request, in order. vLLM 0.33 keeps
/// the whole processor batch's slices in each item's field (`multimodal.md` §3.3) when the
/// images differ in size; when they are all the same size each item carries the one slice
/// `[0, rows]` (what its render server answered for two same-size images).
pub fn encode_kwargs_item(image: &ProcessedImage, batch_rows: &[usize]) -> Vec<u8> {
    let pv = &image.pixel_values;
    let mut out = Vec::with_capacity(pv.data.len() + 256);
    let _ = encode::write_map_len(&mut out, 2);
    str(&mut out, "pixel_values");
    let _ = encode::write_map_len(&mut out, 2);
    str(&mut out, "data");
    tensor(&mut out, pv);
    str(&mut out, "field");
    let _ = encode::write_array_len(&mut out, 2);
    str(&mut out, "flat");
    let _ = encode::write_map_len(&mut out, 3);
    str(&mut out, "keep_on_cpu");
    let _ = encode::write_bool(&mut out, false);
    str(&mut out, "slices");
    // [[slice(start, stop, None)] per image of the batch].
    let same_size = batch_rows.iter().all(|&r| r == pv.shape[0]);
    let own = [pv.shape[0]];
    let batch_rows = if same_size { &own[..] } else { batch_rows };
    let _ = encode::write_array_len(&mut out, batch_rows.len() as u32);
    let mut start = 0u64;
    for &rows in batch_rows {
        let _ = encode::write_array_len(&mut out, 1);
        let _ = encode::write_array_len(&mut out, 3);
        let _ = encode::write_uint(&mut out, start);
        start += rows as u64;
        let _ = encode::write_uint(&mut out, start);
        let _ = encode::write_nil(&mut out);
    }
    str(&mut out, "dim");
    let _ = encode::write_uint(&mut out, 0);
    grid_elem(&mut out, image.grid_thw);
    out
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
