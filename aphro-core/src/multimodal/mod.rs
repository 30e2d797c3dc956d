//! Multimodal render: image content parts → placeholder tokens and vLLM's `features` object
//! (`mm_hashes`, `mm_placeholders`, `kwargs_data`, `mm_metadata`; `multimodal.md` §3), for the
//! Qwen2-VL / Qwen2.5-VL / Qwen3-VL image processor.
//!
//! The pipeline per image: [`image_io`] decodes the `data:` URL and the file, [`qwen_vl`]
//! resizes and patchifies it as transformers does, [`hash`] computes vLLM's mm_hash over the
//! file bytes, [`kwargs`] writes the msgpack blobs. [`VisionModel::expand_placeholders`]
//! replaces each `<|image_pad|>` the chat template wrote with the image's token run.
pub mod fetch;
pub mod hash;
pub mod image_io;
pub mod kwargs;
pub mod qwen_vl;
pub mod resize;
pub mod validate;

use crate::error::{Error, Result};
use serde_json::{json, Map, Value};
use std::path::Path;

pub use fetch::{load_image_url, MediaFetchOptions, MediaFetcher};
pub use hash::{image_mm_hash, ImageHashSource};
pub use image_io::{decode_data_url, decode_image, DecodedImage, EncodedImage};
pub use qwen_vl::{FloatDtype, PixelOutput, ProcessedImage, QwenVlProcessor};
pub use validate::validate_generate_features;

/// A tensor as the wire carries it: dtype name, shape, raw little-endian bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// One `{offset, length}` run of placeholder tokens in the rendered prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeholder {
    pub offset: usize,
    pub length: usize,
}

/// Server-level multimodal settings (vLLM's flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultimodalOptions {
    /// `--mm-device-do-normalize` (vLLM's default on): `pixel_values` stay `uint8`.
    pub device_normalize: bool,
    /// `--trust-request-mm-kwargs`: per-request `mm_processor_kwargs` are honoured.
    pub trust_request_mm_kwargs: bool,
}

impl Default for MultimodalOptions {
    fn default() -> Self {
        MultimodalOptions {
            device_normalize: true,
            trust_request_mm_kwargs: false,
        }
    }
}

/// An image item of a request: its source and the part's optional `uuid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInput {
    /// The image file (a `data:` URL's payload or a fetched file); `None` for a uuid-only
    /// part (`image_url: null`).
    pub file: Option<EncodedImage>,
    pub uuid: Option<String>,
}

/// One image after processing: what the features carry for it.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageFeature {
    pub mm_hash: String,
    pub processed: ProcessedImage,
}

/// A vision-language model's image settings: the processor and the special tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionModel {
    /// `model_config.model`: the `model_id` in every mm_hash.
    pub model_id: String,
    pub processor: QwenVlProcessor,
    pub image_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
    /// `torch_dtype` / `dtype` of the model config: the cast of CPU-normalized pixels.
    pub dtype: FloatDtype,
}

/// Architectures whose image processor this module implements.
const QWEN_VL_ARCHITECTURES: [&str; 4] = [
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
];

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    serde_json::from_str(&text).map_err(|e| Error::json(format!("parsing {}", path.display()), e))
}

fn token_id(cfg: &Value, key: &str, default: u32) -> u32 {
    cfg.get(key)
        .and_then(Value::as_u64)
        .map_or(default, |v| v as u32)
}

impl VisionModel {
    /// From a model dir's `config.json` + `preprocessor_config.json`. `Ok(None)` when the
    /// architecture is not a Qwen-VL one (a text-only model).
    pub fn from_model_dir(dir: &Path, model_id: &str) -> Result<Option<Self>> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Ok(None);
        }
        let config = read_json(&config_path)?;
        let is_qwen_vl = config
            .get("architectures")
            .and_then(Value::as_array)
            .is_some_and(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .any(|n| QWEN_VL_ARCHITECTURES.contains(&n))
            });
        if !is_qwen_vl {
            return Ok(None);
        }
        let pre = read_json(&dir.join("preprocessor_config.json"))?;
        Self::from_configs(&config, &pre, model_id).map(Some)
    }

    /// The image processor of a loaded model, when its directory (local, or the hub
    /// snapshot) holds a Qwen-VL config. The `--model` string is the mm_hash model id, as
    /// vLLM's `model_config.model` is.
    pub fn for_model(model: &crate::Model) -> Result<Option<Self>> {
        use crate::model::ModelSource;
        match &model.source {
            ModelSource::Dir(d) | ModelSource::Hub { snapshot: d, .. } => {
                Self::from_model_dir(d, &model.name)
            }
            ModelSource::Gguf(_) => Ok(None),
        }
    }

    /// From the parsed `config.json` and `preprocessor_config.json`.
    pub fn from_configs(config: &Value, preprocessor: &Value, model_id: &str) -> Result<Self> {
        let text = config.get("text_config");
        let dtype = ["torch_dtype", "dtype"]
            .iter()
            .find_map(|k| {
                config
                    .get(*k)
                    .or_else(|| text.and_then(|t| t.get(*k)))
                    .and_then(Value::as_str)
            })
            .and_then(FloatDtype::from_config)
            .unwrap_or(FloatDtype::BFloat16);
        Ok(VisionModel {
            model_id: model_id.to_owned(),
            processor: QwenVlProcessor::from_preprocessor_config(preprocessor)?,
            image_token_id: token_id(config, "image_token_id", 151_655),
            vision_start_token_id: token_id(config, "vision_start_token_id", 151_652),
            vision_end_token_id: token_id(config, "vision_end_token_id", 151_653),
            dtype,
        })
    }

    /// Decodes, hashes and processes the images of one request, in prompt order.
    ///
    /// `mm_processor_kwargs` is the request's dict: refused unless the server trusts it
    /// (vLLM's message), hashed as sent, and applied to the processor.
    pub fn process_images(
        &self,
        images: &[ImageInput],
        mm_processor_kwargs: Option<&Map<String, Value>>,
        options: MultimodalOptions,
    ) -> Result<Vec<ImageFeature>> {
        let kwargs = mm_processor_kwargs.filter(|m| !m.is_empty());
        let processor = match kwargs {
            Some(_) if !options.trust_request_mm_kwargs => {
                return Err(Error::for_param(
                    "Per-request mm_processor_kwargs are disabled by default because they can \
                     change multimodal preprocessing resource usage. Start the server with \
                     --trust-request-mm-kwargs only when clients are trusted.",
                    "mm_processor_kwargs",
                ))
            }
            Some(k) => self.processor.with_overrides(k)?,
            None => self.processor.clone(),
        };
        let output = if options.device_normalize {
            PixelOutput::RawU8
        } else {
            PixelOutput::Normalized(self.dtype)
        };
        images
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let Some(file) = &item.file else {
                    // No cache to look the uuid up in on a render server.
                    return Err(Error::bad_request(format!(
                        "Cache miss for image at index {i} but data is not provided."
                    )));
                };
                let decoded = decode_image(&file.bytes)?;
                let source = match &item.uuid {
                    Some(u) => ImageHashSource::Uuid(u),
                    None => ImageHashSource::File {
                        bytes: &file.bytes,
                        converted: decoded.converted,
                    },
                };
                let mm_hash = image_mm_hash(&self.model_id, source, kwargs, None);
                let processed = processor.process(&decoded, output)?;
                Ok(ImageFeature { mm_hash, processed })
            })
            .collect()
    }

    /// Replaces the i-th `<|image_pad|>` of `token_ids` with image i's run of
    /// `num_tokens` pads and returns the runs. The counts must agree (the chat template
    /// writes one pad per image part).
    pub fn expand_placeholders(
        &self,
        token_ids: &[u32],
        images: &[ImageFeature],
    ) -> Result<(Vec<u32>, Vec<Placeholder>)> {
        let pads = token_ids
            .iter()
            .filter(|&&t| t == self.image_token_id)
            .count();
        if pads != images.len() {
            return Err(Error::bad_request(format!(
                "Failed to apply prompt replacement for mm_items['image']: expected {} \
                 placeholders, found {pads}",
                images.len()
            )));
        }
        let extra: usize = images.iter().map(|i| i.processed.num_tokens).sum();
        let mut out = Vec::with_capacity(token_ids.len() + extra);
        let mut placeholders = Vec::with_capacity(images.len());
        let mut next = images.iter();
        for &t in token_ids {
            if t != self.image_token_id {
                out.push(t);
                continue;
            }
            let n = next.next().map_or(0, |i| i.processed.num_tokens);
            placeholders.push(Placeholder {
                offset: out.len(),
                length: n,
            });
            out.extend(std::iter::repeat_n(self.image_token_id, n));
        }
        Ok((out, placeholders))
    }
}

/// The items of a (validated) `features` object in prompt order: each placeholder run with
/// its mm_hash, over every modality (vLLM's `argsort_mm_positions`). These are what the
/// prefix cache keys blocks on besides the tokens.
pub fn feature_items(features: &Value) -> Vec<(String, Placeholder)> {
    let mut out = Vec::new();
    let hashes = features.get("mm_hashes").and_then(Value::as_object);
    let places = features.get("mm_placeholders").and_then(Value::as_object);
    let (Some(hashes), Some(places)) = (hashes, places) else {
        return out;
    };
    for (modality, hs) in hashes {
        let ps = places.get(modality).and_then(Value::as_array);
        let (Some(hs), Some(ps)) = (hs.as_array(), ps) else {
            continue;
        };
        for (h, p) in hs.iter().zip(ps) {
            let field = |k: &str| p.get(k).and_then(Value::as_u64).map(|v| v as usize);
            if let (Some(h), Some(offset), Some(length)) =
                (h.as_str(), field("offset"), field("length"))
            {
                out.push((h.to_owned(), Placeholder { offset, length }));
            }
        }
    }
    out.sort_by_key(|(_, p)| p.offset);
    out
}

/// The `features` object of a render response. `with_payload` false (`mm_payload: "none"`)
/// leaves `kwargs_data` and `mm_metadata` null; hashes and placeholders stay.
pub fn features_json(
    images: &[ImageFeature],
    placeholders: &[Placeholder],
    with_payload: bool,
) -> Value {
    let mut features = features_value(images, placeholders, with_payload);
    if with_payload {
        let rows = batch_rows(images.iter().map(|i| &i.processed));
        let blobs = images
            .iter()
            .map(|i| kwargs::kwargs_item_base64(&i.processed, &rows));
        put_kwargs(&mut features, blobs);
    }
    features
}

/// [`features_json`] with `kwargs_data` not yet encoded: a `null` in
/// `kwargs_data.image` for each image, and the payload that writes their text
/// ([`KwargsPayload::fill`], or blob by blob into the caller's own buffers).
pub fn features_json_pending(
    images: Vec<ImageFeature>,
    placeholders: &[Placeholder],
    with_payload: bool,
) -> (Value, Option<KwargsPayload>) {
    let features = features_value(&images, placeholders, with_payload);
    let payload = with_payload.then(|| KwargsPayload::new(images));
    (features, payload)
}

/// The `kwargs_data` blobs of a render response before encoding: the request's processed
/// images in order, which [`kwargs::KwargsBlob`] turns into text.
#[derive(Debug, Clone, PartialEq)]
pub struct KwargsPayload {
    images: Vec<ProcessedImage>,
    rows: Vec<usize>,
}

impl KwargsPayload {
    fn new(images: Vec<ImageFeature>) -> Self {
        let images: Vec<ProcessedImage> = images.into_iter().map(|i| i.processed).collect();
        let rows = batch_rows(images.iter());
        KwargsPayload { images, rows }
    }

    /// Number of blobs (images).
    pub fn len(&self) -> usize {
        self.images.len()
    }

    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// The `index`-th blob, in `kwargs_data.image` order.
    pub fn blob(&self, index: usize) -> Option<kwargs::KwargsBlob<'_>> {
        let image = self.images.get(index)?;
        Some(kwargs::KwargsBlob::new(image, &self.rows))
    }

    /// Encodes every blob into `features.kwargs_data.image`, in place of its `null`.
    pub fn fill(&self, features: &mut Value) {
        let blobs = self
            .images
            .iter()
            .map(|image| kwargs::kwargs_item_base64(image, &self.rows));
        put_kwargs(features, blobs);
    }
}

/// Row counts of each image's `pixel_values`, in order.
fn batch_rows<'a>(images: impl Iterator<Item = &'a ProcessedImage>) -> Vec<usize> {
    images.map(|p| p.pixel_values_shape()[0]).collect()
}

/// Moves the encoded blobs into `kwargs_data.image` (moved, not copied: they run to tens of
/// megabytes).
fn put_kwargs(features: &mut Value, blobs: impl Iterator<Item = String>) {
    if let Some(Value::Array(list)) = features
        .get_mut("kwargs_data")
        .and_then(|k| k.get_mut("image"))
    {
        for (slot, blob) in list.iter_mut().zip(blobs) {
            *slot = Value::String(blob);
        }
    }
}

/// The features object with a `null` per `kwargs_data` blob.
fn features_value(
    images: &[ImageFeature],
    placeholders: &[Placeholder],
    with_payload: bool,
) -> Value {
    let hashes: Vec<&str> = images.iter().map(|i| i.mm_hash.as_str()).collect();
    let places: Vec<Value> = placeholders
        .iter()
        .map(|p| json!({"offset": p.offset, "length": p.length}))
        .collect();
    let by_modality = |blobs: Vec<Value>| {
        Value::Object(Map::from_iter([("image".to_owned(), Value::Array(blobs))]))
    };
    let (kwargs_data, mm_metadata) = if with_payload {
        let pending = vec![Value::Null; images.len()];
        let meta = images
            .iter()
            .map(|i| {
                Value::String(kwargs::to_base64(&kwargs::encode_metadata_item(
                    &i.processed,
                )))
            })
            .collect();
        (by_modality(pending), by_modality(meta))
    } else {
        (Value::Null, Value::Null)
    };
    let mut out = Map::new();
    out.insert("mm_hashes".into(), json!({ "image": hashes }));
    out.insert("mm_placeholders".into(), json!({ "image": places }));
    out.insert("kwargs_data".into(), kwargs_data);
    out.insert("mm_metadata".into(), mm_metadata);
    Value::Object(out)
}
