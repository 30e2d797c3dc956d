//! `POST /v1/embeddings`: request and response shapes of vLLM 0.33.0
//! (`entrypoints/pooling/embed/protocol.py`, `pooling/base/protocol.py`), and the parts every
//! pooling request shares (`PoolingInput`, `EncodingParams`, `PoolingParamsFields`), each
//! flattened into the requests as vLLM composes its request mixins.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::ChatMessage;

/// `input`: a string, a list of strings, a list of token ids, or a list of lists of ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Tokens(Vec<u32>),
    TokenBatch(Vec<Vec<u32>>),
    Texts(Vec<String>),
}

/// Completion-style input (vLLM's `CompletionRequestMixin`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionInput {
    pub input: EmbeddingInput,
    /// Add the model's special tokens (`[CLS]` … `[SEP]`) to text input.
    #[serde(default = "default_true")]
    #[schema(default = true)]
    pub add_special_tokens: bool,
}

fn default_true() -> bool {
    true
}

/// Chat-style input (vLLM's `ChatRequestMixin`): `messages` rendered through the chat
/// template into one prompt.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChatInput {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub add_generation_prompt: bool,
    #[serde(default)]
    pub continue_final_message: bool,
    /// Special tokens on top of the template's own (off by default: the template places them).
    #[serde(default)]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub chat_template: Option<String>,
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// The input of `/v1/embeddings`, `/pooling` and `/classify`: `input` or chat `messages`
/// (vLLM's request union picks the completion form when `input` is present).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PoolingInput {
    Completion(CompletionInput),
    Chat(ChatInput),
}

/// `truncation_side`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TruncationSideParam {
    Left,
    Right,
}

/// The truncation and activation fields every pooling route acts on (vLLM's
/// `PoolingBasicRequestMixin` and the `use_activation` of its embed / classify mixins).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolingParamsFields {
    /// `-1`: the model's maximum length; absent: an over-long input is an error.
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    /// `right` keeps the first tokens, `left` the last.
    #[serde(default)]
    pub truncation_side: Option<TruncationSideParam>,
    /// Normalize embeddings / apply the classifier's activation (absent: the model's default).
    #[serde(default)]
    pub use_activation: Option<bool>,
}

/// `encoding_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
    /// `application/octet-stream` of every vector's bytes, with a `metadata` header.
    Bytes,
    /// As `bytes`, without the header.
    BytesOnly,
}

/// `embed_dtype`: the element type of `base64` and `bytes` vectors (`endpoints.md` §1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EmbedDType {
    #[default]
    Float32,
    Float16,
    Bfloat16,
    Fp8E4m3,
    Fp8E5m2,
}

/// `endianness` of `base64` and `bytes` vectors; `native` is the server's byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Endianness {
    #[default]
    Native,
    Big,
    Little,
}

/// How vectors are sent back (vLLM's `EncodingRequestMixin`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EncodingParams {
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    #[serde(default)]
    pub embed_dtype: EmbedDType,
    #[serde(default)]
    pub endianness: Endianness,
}

impl EmbedDType {
    /// The name vLLM uses on the wire (`metadata` of a `bytes` response).
    pub fn as_str(self) -> &'static str {
        match self {
            EmbedDType::Float32 => "float32",
            EmbedDType::Float16 => "float16",
            EmbedDType::Bfloat16 => "bfloat16",
            EmbedDType::Fp8E4m3 => "fp8_e4m3",
            EmbedDType::Fp8E5m2 => "fp8_e5m2",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            EmbedDType::Float32 => 4,
            EmbedDType::Float16 | EmbedDType::Bfloat16 => 2,
            EmbedDType::Fp8E4m3 | EmbedDType::Fp8E5m2 => 1,
        }
    }
}

impl Endianness {
    pub fn as_str(self) -> &'static str {
        match self {
            Endianness::Native => "native",
            Endianness::Big => "big",
            Endianness::Little => "little",
        }
    }
}

/// vLLM's `tensor2binary`: `v` cast to `dtype` as torch casts (round to nearest even; fp8
/// as `float8_e4m3fn` / `float8_e5m2`), the raw bytes in `endianness` order (`native`: this
/// machine's).
pub fn vector_bytes(v: &[f32], dtype: EmbedDType, endianness: Endianness) -> Vec<u8> {
    let big = match endianness {
        Endianness::Big => true,
        Endianness::Little => false,
        Endianness::Native => cfg!(target_endian = "big"),
    };
    let mut out = Vec::with_capacity(v.len() * dtype.size());
    for &x in v {
        match dtype {
            EmbedDType::Float32 => out.extend(if big {
                x.to_be_bytes()
            } else {
                x.to_le_bytes()
            }),
            EmbedDType::Float16 => {
                let h = half::f16::from_f32(x);
                out.extend(if big {
                    h.to_be_bytes()
                } else {
                    h.to_le_bytes()
                });
            }
            EmbedDType::Bfloat16 => {
                let h = half::bf16::from_f32(x);
                out.extend(if big {
                    h.to_be_bytes()
                } else {
                    h.to_le_bytes()
                });
            }
            EmbedDType::Fp8E4m3 => out.push(fp8_e4m3fn_from_f32(x)),
            EmbedDType::Fp8E5m2 => out.push(fp8_e5m2_from_f32(x)),
        }
    }
    out
}

/// A float32 to float8_e4m3fn as torch's tensor cast (`tensor.to(torch.float8_e4m3fn)`, what
/// vLLM's `tensor2binary` runs) does it: round to nearest even, NaN → 0x7f, and everything
/// beyond the largest finite value (±448, infinities included) saturates to it (0x7e). The
/// scalar `c10::fp8e4m3fn_from_fp32_value` would give NaN there; the tensor cast does not.
fn fp8_e4m3fn_from_f32(f: f32) -> u8 {
    const FP8_MAX: u32 = 1087 << 20;
    const DENORM_MASK: u32 = 141 << 23;
    let bits = f.to_bits();
    let sign = bits & 0x8000_0000;
    let mut f_bits = bits ^ sign;
    let result = if f_bits > (255 << 23) {
        0x7f
    } else if f_bits >= FP8_MAX {
        0x7e
    } else if f_bits < (121 << 23) {
        // Below 2^-6, the smallest normal: the float add rounds the mantissa into place.
        f_bits = (f32::from_bits(f_bits) + f32::from_bits(DENORM_MASK)).to_bits();
        f_bits.wrapping_sub(DENORM_MASK) as u8
    } else {
        let mant_odd = (f_bits >> 20) & 1;
        f_bits = f_bits.wrapping_add(((7u32).wrapping_sub(127) << 23).wrapping_add(0x7FFFF));
        f_bits = f_bits.wrapping_add(mant_odd);
        // [464, 480) rounds up to the NaN pattern: saturate instead.
        ((f_bits >> 20) as u8).min(0x7e)
    };
    result | (sign >> 24) as u8
}

/// torch's `fp8e5m2_from_fp32_value` (c10/util/Float8_e5m2.h): round to nearest even,
/// overflow → infinity (0x7c), NaN → 0x7f.
fn fp8_e5m2_from_f32(f: f32) -> u8 {
    const FP32_INF: u32 = 255 << 23;
    const FP8_MAX: u32 = 143 << 23;
    const DENORM_MASK: u32 = 134 << 23;
    let bits = f.to_bits();
    let sign = bits & 0x8000_0000;
    let mut f_bits = bits ^ sign;
    let result = if f_bits >= FP8_MAX {
        if f_bits > FP32_INF {
            0x7f
        } else {
            0x7c
        }
    } else if f_bits < (113 << 23) {
        f_bits = (f32::from_bits(f_bits) + f32::from_bits(DENORM_MASK)).to_bits();
        f_bits.wrapping_sub(DENORM_MASK) as u8
    } else {
        let mant_odd = (f_bits >> 21) & 1;
        f_bits = f_bits.wrapping_add(((15u32).wrapping_sub(127) << 23).wrapping_add(0xFFFFF));
        f_bits = f_bits.wrapping_add(mant_odd);
        (f_bits >> 21) as u8
    };
    result | (sign >> 24) as u8
}

/// The `/v1/embeddings` body. Unknown keys are accepted and ignored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(flatten)]
    pub input: PoolingInput,
    #[serde(flatten)]
    pub encoding: EncodingParams,
    /// Matryoshka truncation (before normalization).
    #[serde(default)]
    pub dimensions: Option<i64>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(flatten)]
    pub params: PoolingParamsFields,
}

/// One vector: a float list, or base64 of its bytes (`embed_dtype`, `endianness`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingData {
    pub index: usize,
    /// Always `"embedding"`.
    pub object: String,
    pub embedding: EmbeddingVector,
}

/// Usage of a pooling response: no completion, `prompt_tokens_details` null.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolingUsage {
    pub prompt_tokens: u64,
    pub total_tokens: u64,
    pub completion_tokens: u64,
    #[schema(value_type = Option<Object>)]
    pub prompt_tokens_details: Option<Value>,
}

impl PoolingUsage {
    pub fn prompt(tokens: u64) -> Self {
        Self {
            prompt_tokens: tokens,
            total_tokens: tokens,
            completion_tokens: 0,
            prompt_tokens_details: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingResponse {
    /// `embd-<X-Request-Id or random id>`.
    pub id: String,
    /// Always `"list"`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub data: Vec<EmbeddingData>,
    pub usage: PoolingUsage,
}

/// One vector's place in a `bytes` body (vLLM's `MetadataItem`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BytesMetadataItem {
    pub index: usize,
    pub embed_dtype: EmbedDType,
    pub endianness: Endianness,
    /// Byte range of the vector in the body.
    pub start: usize,
    pub end: usize,
    pub shape: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BytesUsage {
    pub prompt_tokens: u64,
    pub total_tokens: u64,
}

/// The JSON of the `metadata` header of an `encoding_format: "bytes"` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BytesMetadata {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub data: Vec<BytesMetadataItem>,
    pub usage: BytesUsage,
}

/// vLLM's `encode_pooling_bytes`: every vector's bytes back to back, and where each lies.
pub fn encode_bytes(
    vectors: &[Vec<f32>],
    dtype: EmbedDType,
    endianness: Endianness,
) -> (Vec<u8>, Vec<BytesMetadataItem>) {
    let mut body = Vec::new();
    let mut items = Vec::with_capacity(vectors.len());
    for (index, v) in vectors.iter().enumerate() {
        let start = body.len();
        body.extend(vector_bytes(v, dtype, endianness));
        items.push(BytesMetadataItem {
            index,
            embed_dtype: dtype,
            endianness,
            start,
            end: body.len(),
            shape: vec![v.len()],
        });
    }
    (body, items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_casts_match_torch() {
        // (value, float8_e4m3fn bits, float8_e5m2 bits), as torch 2.15's tensor casts give
        // them (`torch.tensor(v).to(dtype).view(torch.uint8)`).
        let cases: [(f32, u8, u8); 13] = [
            (0.0, 0x00, 0x00),
            (-0.0, 0x80, 0x80),
            (1.0, 0x38, 0x3c),
            (-1.0, 0xb8, 0xbc),
            (0.1, 0x1d, 0x2e),
            (-0.5, 0xb0, 0xb8),
            (448.0, 0x7e, 0x5f),
            (464.0, 0x7e, 0x5f),
            (500.0, 0x7e, 0x60),
            (470.0, 0x7e, 0x5f),
            (2f32.powi(-9), 0x01, 0x18),
            (2f32.powi(-10), 0x00, 0x14),
            (3.0 * 2f32.powi(-10), 0x02, 0x1a),
        ];
        for (x, e4m3, e5m2) in cases {
            assert_eq!(fp8_e4m3fn_from_f32(x), e4m3, "e4m3 {x}");
            assert_eq!(fp8_e5m2_from_f32(x), e5m2, "e5m2 {x}");
        }
        assert_eq!(fp8_e5m2_from_f32(57344.0), 0x7b);
        assert_eq!(fp8_e5m2_from_f32(70000.0), 0x7c);
        assert_eq!(fp8_e5m2_from_f32(2f32.powi(-16)), 0x01);
        assert_eq!(fp8_e5m2_from_f32(f32::NAN), 0x7f);
        assert_eq!(fp8_e4m3fn_from_f32(f32::NAN), 0x7f);
        assert_eq!(fp8_e4m3fn_from_f32(f32::INFINITY), 0x7e);
        assert_eq!(fp8_e4m3fn_from_f32(f32::NEG_INFINITY), 0xfe);
    }

    #[test]
    fn vector_bytes_in_each_dtype_and_order() {
        let v = [1.0f32, -2.5];
        assert_eq!(
            vector_bytes(&v, EmbedDType::Float32, Endianness::Little),
            [0, 0, 0x80, 0x3f, 0, 0, 0x20, 0xc0]
        );
        assert_eq!(
            vector_bytes(&v, EmbedDType::Float32, Endianness::Big),
            [0x3f, 0x80, 0, 0, 0xc0, 0x20, 0, 0]
        );
        assert_eq!(
            vector_bytes(&v, EmbedDType::Float16, Endianness::Big),
            [0x3c, 0x00, 0xc1, 0x00]
        );
        assert_eq!(
            vector_bytes(&v, EmbedDType::Bfloat16, Endianness::Little),
            [0x80, 0x3f, 0x20, 0xc0]
        );
        assert_eq!(
            vector_bytes(&v, EmbedDType::Fp8E4m3, Endianness::Big),
            [0x38, 0xc2]
        );
        let (body, items) = encode_bytes(
            &[vec![1.0, 2.0], vec![3.0]],
            EmbedDType::Float16,
            Endianness::Native,
        );
        assert_eq!(body.len(), 6);
        assert_eq!((items[1].start, items[1].end), (4, 6));
        assert_eq!(items[0].shape, vec![2]);
    }

    #[test]
    fn input_forms() {
        let r: EmbeddingRequest =
            serde_json::from_value(serde_json::json!({"input": "a", "embed_dtype": "fp8_e5m2"}))
                .expect("completion");
        assert!(matches!(
            r.input,
            PoolingInput::Completion(CompletionInput {
                add_special_tokens: true,
                ..
            })
        ));
        assert_eq!(r.encoding.embed_dtype, EmbedDType::Fp8E5m2);
        let r: EmbeddingRequest = serde_json::from_value(serde_json::json!({
            "messages": [{"role": "user", "content": "hi"}],
            "truncate_prompt_tokens": 5,
        }))
        .expect("chat");
        assert!(matches!(
            r.input,
            PoolingInput::Chat(ChatInput {
                add_special_tokens: false,
                add_generation_prompt: false,
                ..
            })
        ));
        assert_eq!(r.params.truncate_prompt_tokens, Some(5));
        assert!(
            serde_json::from_value::<EmbeddingRequest>(serde_json::json!({"inputs": "a"})).is_err()
        );
    }
}
