//! vLLM 0.33's mm_hash (`vllm/multimodal/hasher.py::MultiModalHasher`, the default `blake3`
//! algorithm): the sorted `hash_kwargs` fed to the digest as framed chunks
//! (`multimodal.md` §3.4 as corrected by §3.6). The image contributes its original file
//! bytes, with the RGB conversion settings when the decode converted the mode.
use serde_json::{Map, Value};

/// Where the framed chunks go: blake3, exactly as vLLM's `hasher.update(chunk)` calls.
struct Framer(blake3::Hasher);

impl Framer {
    fn len8(&mut self, n: usize) {
        self.0.update(&(n as u64).to_le_bytes());
    }

    fn key(&mut self, k: &str) {
        self.len8(k.len());
        self.0.update(k.as_bytes());
    }

    fn leaf_bytes(&mut self, b: &[u8]) {
        self.0.update(&[3]);
        self.len8(b.len());
        self.0.update(b);
    }

    fn json(&mut self, v: &Value) {
        match v {
            Value::Null => {
                self.0.update(&[0]);
            }
            Value::Array(items) => {
                self.0.update(&[1]);
                self.len8(items.len());
                items.iter().for_each(|e| self.json(e));
            }
            Value::Object(map) => self.dict(map),
            Value::String(s) => self.leaf_bytes(s.as_bytes()),
            // np.array(x).tobytes(): bool 1 byte, int int64, float float64.
            Value::Bool(b) => self.leaf_bytes(&[u8::from(*b)]),
            Value::Number(n) => match n.as_i64() {
                Some(i) => self.leaf_bytes(&i.to_le_bytes()),
                None => self.leaf_bytes(&n.as_f64().unwrap_or(f64::NAN).to_le_bytes()),
            },
        }
    }

    fn dict(&mut self, map: &Map<String, Value>) {
        self.0.update(&[2]);
        self.len8(map.len());
        for (k, v) in map {
            self.key(k);
            self.json(v);
        }
    }
}

/// What identifies one image item for hashing.
#[derive(Debug, Clone, Copy)]
pub enum ImageHashSource<'a> {
    /// The file bytes; `converted` when the decode changed the mode (adds `io_config`).
    File { bytes: &'a [u8], converted: bool },
    /// A client `uuid` on the content part: it stands for the image.
    Uuid(&'a str),
}

/// The mm_hash of one image item. `mm_processor_kwargs` / `media_io_kwargs` are the
/// request's dicts as sent (only hashed when non-empty); `model_id` is the served model.
pub fn image_mm_hash(
    model_id: &str,
    source: ImageHashSource<'_>,
    mm_processor_kwargs: Option<&Map<String, Value>>,
    media_io_image_kwargs: Option<&Map<String, Value>>,
) -> String {
    let processor = mm_processor_kwargs.filter(|m| !m.is_empty());
    let media_io = media_io_image_kwargs.filter(|m| !m.is_empty());
    if let (ImageHashSource::Uuid(uuid), None, None) = (source, processor, media_io) {
        return uuid.to_owned();
    }
    let mut h = Framer(blake3::Hasher::new());
    // Keys in sorted order: image < media_io_kwargs < mm_processor_kwargs < model_id.
    h.key("image");
    match source {
        ImageHashSource::Uuid(uuid) => h.leaf_bytes(uuid.as_bytes()),
        ImageHashSource::File { bytes, converted } => {
            h.0.update(&[3]);
            h.key("image");
            if converted {
                h.0.update(&[2]);
                h.len8(2);
                h.key("io_config");
                h.0.update(&[2]);
                h.len8(2);
                h.key("image_mode");
                h.leaf_bytes(b"RGB");
                h.key("rgba_background_color");
                h.0.update(&[1]);
                h.len8(3);
                for _ in 0..3 {
                    h.leaf_bytes(&255i64.to_le_bytes());
                }
                h.key("data");
            }
            h.leaf_bytes(bytes);
        }
    }
    if let Some(m) = media_io {
        h.key("media_io_kwargs");
        let mut outer = Map::new();
        outer.insert("image".into(), Value::Object(m.clone()));
        h.dict(&outer);
    }
    if let Some(m) = processor {
        h.key("mm_processor_kwargs");
        h.dict(m);
    }
    h.key("model_id");
    h.leaf_bytes(model_id.as_bytes());
    h.0.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn uuid_with_processor_kwargs_matches_the_readme_example() {
        let kw = json!({"max_pixels": 50176});
        let got = image_mm_hash(
            "Qwen/Qwen2-VL-2B-Instruct",
            ImageHashSource::Uuid("img-42"),
            kw.as_object(),
            None,
        );
        assert_eq!(
            got,
            "d623d9628afb2f2c8631ace1cb52915a3f0450dccbf815425d0616b343d65eb6"
        );
        let bare = image_mm_hash("m", ImageHashSource::Uuid("sku-1234"), None, None);
        assert_eq!(bare, "sku-1234");
    }
}
