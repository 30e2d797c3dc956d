//! Weight sources: GGUF files and HF safetensors (single file or sharded with an index).
//!
//! Every source answers requests by HF parameter name (`model.layers.3.self_attn.q_proj.weight`)
//! and returns Q/K in HF's rotate-half row order, so the model code is source-independent.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use aphro_core::gguf::{GgmlType, GgufFile, GgufTensorInfo};
use half::{bf16, f16};
use rayon::prelude::*;

use super::config::LlamaConfig;
use super::quant::{dequantize_into, q5_0_to_q8_0, QuantMatrix, QuantType};
use super::ModelError;

/// A weight as loaded into host memory.
#[derive(Debug, Clone)]
pub enum HostTensor {
    /// Row-major f32 with its shape (HF order: `[out, in]` for matrices).
    F32 { shape: Vec<usize>, data: Vec<f32> },
    /// A `[rows, cols]` matrix kept in its ggml block format.
    Quant(QuantMatrix),
}

impl HostTensor {
    pub fn shape(&self) -> Vec<usize> {
        match self {
            HostTensor::F32 { shape, .. } => shape.clone(),
            HostTensor::Quant(q) => vec![q.rows, q.cols],
        }
    }

    pub fn into_f32(self) -> (Vec<usize>, Vec<f32>) {
        match self {
            HostTensor::F32 { shape, data } => (shape, data),
            HostTensor::Quant(q) => (vec![q.rows, q.cols], q.dequantize()),
        }
    }
}

/// Where the model's parameters come from.
pub trait WeightSource {
    /// The tensor with this HF name, or `None` if the file does not have it. With
    /// `keep_quant`, block-quantized matrices stay quantized.
    fn get(&self, name: &str, keep_quant: bool) -> Result<Option<HostTensor>, ModelError>;

    /// Whether the source has a tensor of this name, without loading it.
    fn contains(&self, name: &str) -> bool {
        self.get(name, true).is_ok_and(|t| t.is_some())
    }
}

/// HF parameter name → GGUF tensor name (llama.cpp's Llama names).
pub fn gguf_name(hf: &str) -> Option<String> {
    gguf_name_with(hf, super::arch::same_names)
}

/// [`gguf_name`], with an architecture's renamed per-layer parts (`renamed(part)`) first.
pub fn gguf_name_with(hf: &str, renamed: fn(&str) -> Option<&'static str>) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (part, suffix) = rest.rsplit_once('.')?;
    if let Some(g) = renamed(part) {
        return Some(format!("blk.{layer}.{g}.{suffix}"));
    }
    let g = match part {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        // MoE routers (Qwen-MoE/OLMoE, Mixtral).
        "mlp.gate" | "block_sparse_moe.gate" => "ffn_gate_inp",
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        _ => return None,
    };
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

/// An HF per-expert weight name → (GGUF name of the stacked `[experts, rows, cols]` tensor,
/// expert index). llama.cpp stores each layer's experts as one 3-D tensor.
pub fn gguf_expert_name(hf: &str) -> Option<(String, usize)> {
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest
        .strip_prefix("mlp.experts.")
        .or_else(|| rest.strip_prefix("block_sparse_moe.experts."))?;
    let (expert, part) = rest.split_once('.')?;
    let g = match part {
        "gate_proj.weight" | "w1.weight" => "ffn_gate_exps",
        "up_proj.weight" | "w3.weight" => "ffn_up_exps",
        "down_proj.weight" | "w2.weight" => "ffn_down_exps",
        _ => return None,
    };
    Some((format!("blk.{layer}.{g}.weight"), expert.parse().ok()?))
}

/// Undo llama.cpp's Q/K row permutation: GGUF row `h*d + 2i + j` holds HF row `h*d + j*d/2 + i`.
fn unpermute_rows<T: Copy>(rows: &[T], row_len: usize, n_heads: usize) -> Vec<T> {
    let n_rows = rows.len() / row_len;
    let d = n_rows / n_heads;
    let half = d / 2;
    let mut out = Vec::with_capacity(rows.len());
    for hf_row in 0..n_rows {
        let (h, r) = (hf_row / d, hf_row % d);
        let (j, i) = (r / half, r % half);
        let g = h * d + 2 * i + j;
        out.extend_from_slice(&rows[g * row_len..(g + 1) * row_len]);
    }
    out
}

pub struct GgufWeights {
    pub file: GgufFile,
    cfg: LlamaConfig,
}

impl GgufWeights {
    pub fn new(file: GgufFile, cfg: LlamaConfig) -> Self {
        Self { file, cfg }
    }

    /// Tensor `info`; `heads` undoes llama.cpp's Q/K row permutation for that many heads
    /// (on the ggml rows, before any repacking or dequantization).
    fn load(
        &self,
        info: &GgufTensorInfo,
        keep_quant: bool,
        heads: Option<usize>,
    ) -> Result<HostTensor, ModelError> {
        self.load_part(info, keep_quant, heads, None)
    }

    /// [`Self::load`]; `expert` = `Some(e)` takes expert `e` of a stacked 3-D expert tensor
    /// (its slowest dimension), a contiguous run of whole rows in every ggml format.
    fn load_part(
        &self,
        info: &GgufTensorInfo,
        keep_quant: bool,
        heads: Option<usize>,
        expert: Option<usize>,
    ) -> Result<HostTensor, ModelError> {
        let mut bytes = self.file.tensor_data(info);
        let mut n = info.n_elements() as usize;
        // GGUF dims are fastest-first; HF shape is the reverse.
        let mut shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        if let Some(e) = expert {
            let count = shape.first().copied().unwrap_or(0);
            if info.dims.len() != 3 || e >= count || !bytes.len().is_multiple_of(count) {
                return Err(ModelError::Weights(format!(
                    "{}: no expert {e} in a tensor of shape {shape:?}",
                    info.name
                )));
            }
            let per = bytes.len() / count;
            bytes = &bytes[e * per..(e + 1) * per];
            n /= count;
            shape.remove(0);
        }
        let quant = match info.ggml_type {
            GgmlType::F32 => {
                let data = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                return Ok(f32_tensor(shape, data, heads));
            }
            GgmlType::F16 => {
                let data = bytes
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect();
                return Ok(f32_tensor(shape, data, heads));
            }
            GgmlType::BF16 => {
                let data = bytes
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect();
                return Ok(f32_tensor(shape, data, heads));
            }
            // Q5_0's values (q - 16) * d are exactly Q8_0 blocks: converted below.
            GgmlType::Q8_0 | GgmlType::Q5_0 => QuantType::Q8_0,
            GgmlType::Q4_0 => QuantType::Q4_0,
            GgmlType::Q4_1 => QuantType::Q4_1,
            GgmlType::Q5_1 => QuantType::Q5_1,
            GgmlType::Q4K => QuantType::Q4K,
            GgmlType::Q5K => QuantType::Q5K,
            GgmlType::Q6K => QuantType::Q6K,
            other => {
                return Err(ModelError::UnsupportedTensorType {
                    name: info.name.clone(),
                    ty: other.to_string(),
                })
            }
        };
        let converted;
        let bytes: &[u8] = if matches!(info.ggml_type, GgmlType::Q5_0) {
            converted = q5_0_to_q8_0(bytes);
            &converted
        } else {
            bytes
        };
        let cols = info.dims.first().copied().unwrap_or(1) as usize;
        let rows = n / cols.max(1);
        QuantMatrix::check_size(quant, rows, cols, bytes.len())
            .map_err(|e| ModelError::Weights(format!("{}: {e}", info.name)))?;
        let row_bytes = bytes.len() / rows.max(1);
        let bytes = match heads {
            Some(h) => std::borrow::Cow::Owned(unpermute_rows(bytes, row_bytes, h)),
            None => std::borrow::Cow::Borrowed(bytes),
        };
        // Every block format has a fused kernel; `--dtype float32` dequantizes at load.
        if keep_quant && quant.has_fused_kernel() {
            let q = QuantMatrix::new(quant, rows, cols, bytes.into_owned())
                .map_err(|e| ModelError::Weights(format!("{}: {e}", info.name)))?;
            Ok(HostTensor::Quant(q))
        } else {
            let mut data = vec![0f32; n];
            data.par_chunks_mut(cols.max(1))
                .zip(bytes.par_chunks(row_bytes.max(1)))
                .for_each(|(o, b)| dequantize_into(quant, b, o));
            Ok(HostTensor::F32 { shape, data })
        }
    }
}

impl WeightSource for GgufWeights {
    fn get(&self, name: &str, keep_quant: bool) -> Result<Option<HostTensor>, ModelError> {
        if let Some((g, e)) = gguf_expert_name(name) {
            let Some(info) = self.file.tensor_info(&g) else {
                return Ok(None);
            };
            return self.load_part(info, keep_quant, None, Some(e)).map(Some);
        }
        let renamed = super::arch::by_name(&self.cfg.architecture)
            .map_or(super::arch::same_names as fn(&str) -> _, |a| a.gguf_tensor);
        let Some(g) = gguf_name_with(name, renamed) else {
            return Ok(None);
        };
        let Some(info) = self.file.tensor_info(&g) else {
            return Ok(None);
        };
        let heads = if g.ends_with("attn_q.weight") || g.ends_with("attn_q.bias") {
            Some(self.cfg.num_heads)
        } else if g.ends_with("attn_k.weight") || g.ends_with("attn_k.bias") {
            Some(self.cfg.num_kv_heads)
        } else {
            None
        };
        let heads = heads.filter(|_| self.cfg.gguf_qk_permuted());
        self.load(info, keep_quant, heads).map(Some)
    }
}

/// An f32 tensor, with llama.cpp's Q/K row permutation undone for `heads` heads.
fn f32_tensor(shape: Vec<usize>, data: Vec<f32>, heads: Option<usize>) -> HostTensor {
    let Some(heads) = heads else {
        return HostTensor::F32 { shape, data };
    };
    let row_len = if shape.len() == 2 { shape[1] } else { 1 };
    let data = unpermute_rows(&data, row_len, heads);
    HostTensor::F32 { shape, data }
}

/// HF safetensors: `model.safetensors`, or shards listed in `model.safetensors.index.json`.
pub struct SafetensorsWeights {
    files: Vec<memmap2::Mmap>,
    /// tensor name → index into `files`.
    index: HashMap<String, usize>,
}

impl SafetensorsWeights {
    /// Open every shard of the model in `dir`.
    pub fn open_dir(dir: &Path) -> Result<Self, ModelError> {
        let index_path = dir.join("model.safetensors.index.json");
        let shard_paths: Vec<PathBuf> = if index_path.exists() {
            let v: serde_json::Value = serde_json::from_slice(&read(&index_path)?)
                .map_err(|e| ModelError::Weights(format!("{}: {e}", index_path.display())))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Weights("index has no weight_map".into()))?;
            let mut shards: Vec<String> = map
                .values()
                .filter_map(|s| s.as_str().map(String::from))
                .collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        Self::open_files(&shard_paths)
    }

    pub fn open_files(paths: &[PathBuf]) -> Result<Self, ModelError> {
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for (i, p) in paths.iter().enumerate() {
            let f = std::fs::File::open(p).map_err(|e| ModelError::Io(p.clone(), e))?;
            // SAFETY: the file is opened read-only and treated as immutable for the life of
            // the map; a concurrent truncation by another process is outside our contract.
            #[allow(unsafe_code)]
            let map =
                unsafe { memmap2::Mmap::map(&f) }.map_err(|e| ModelError::Io(p.clone(), e))?;
            let st = safetensors::SafeTensors::deserialize(&map)
                .map_err(|e| ModelError::Weights(format!("{}: {e}", p.display())))?;
            for name in st.names() {
                index.insert(name.to_string(), i);
            }
            files.push(map);
        }
        Ok(Self { files, index })
    }
}

fn read(p: &Path) -> Result<Vec<u8>, ModelError> {
    std::fs::read(p).map_err(|e| ModelError::Io(p.to_path_buf(), e))
}

impl WeightSource for SafetensorsWeights {
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn get(&self, name: &str, _keep_quant: bool) -> Result<Option<HostTensor>, ModelError> {
        let Some(&i) = self.index.get(name) else {
            return Ok(None);
        };
        let st = safetensors::SafeTensors::deserialize(&self.files[i])
            .map_err(|e| ModelError::Weights(e.to_string()))?;
        let t = st
            .tensor(name)
            .map_err(|e| ModelError::Weights(format!("{name}: {e}")))?;
        let b = t.data();
        use safetensors::Dtype;
        let data: Vec<f32> = match t.dtype() {
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(ModelError::UnsupportedTensorType {
                    name: name.to_string(),
                    ty: format!("{other:?}"),
                })
            }
        };
        Ok(Some(HostTensor::F32 {
            shape: t.shape().to_vec(),
            data,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_names() {
        assert_eq!(
            gguf_name("model.layers.12.self_attn.o_proj.weight").as_deref(),
            Some("blk.12.attn_output.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.post_attention_layernorm.weight").as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(gguf_name("model.layers.0.weird.weight"), None);
        assert_eq!(
            gguf_name("model.layers.2.block_sparse_moe.gate.weight").as_deref(),
            Some("blk.2.ffn_gate_inp.weight")
        );
        assert_eq!(
            gguf_expert_name("model.layers.1.mlp.experts.7.down_proj.weight"),
            Some(("blk.1.ffn_down_exps.weight".into(), 7))
        );
        assert_eq!(
            gguf_expert_name("model.layers.0.block_sparse_moe.experts.3.w3.weight"),
            Some(("blk.0.ffn_up_exps.weight".into(), 3))
        );
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(h, 2, d/2, ...).swapaxes(1, 2)
        let (heads, d) = (2, 4);
        let hf: Vec<usize> = (0..heads * d).collect();
        let mut gguf = vec![0; heads * d];
        for h in 0..heads {
            for i in 0..d / 2 {
                for j in 0..2 {
                    gguf[h * d + 2 * i + j] = hf[h * d + j * d / 2 + i];
                }
            }
        }
        assert_eq!(unpermute_rows(&gguf, 1, heads), hf);
    }
}
