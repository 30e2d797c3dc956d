//! A reader for GGUF files (llama.cpp's model format, versions 2 and 3).
//!
//! The file is memory-mapped: metadata is parsed eagerly (it is small, apart from the
//! tokenizer vocabulary), tensor data is handed out as borrowed byte slices so the engine
//! can keep quantized weights in place. Every length and offset read from the file is
//! bounds-checked; a truncated or corrupt file is a [`GgufError`], never a panic.
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Upper bound on array lengths and string sizes, so a corrupt header cannot make us allocate
/// terabytes before the bounds check on the actual bytes fails.
const MAX_ELEMENTS: u64 = 1 << 32;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a GGUF file (bad magic)")]
    BadMagic { path: PathBuf },
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("{path}: GGUF file is truncated or corrupt ({what})")]
    Corrupt { path: PathBuf, what: String },
    #[error("GGUF metadata key `{key}` is missing")]
    MissingKey { key: String },
    #[error("GGUF metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: String,
        found: &'static str,
        expected: &'static str,
    },
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::F32(_) => "f32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F64(_) => "f64",
        }
    }

    /// Any integer type as `i64` (GGUF writers are not consistent about widths).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => i64::try_from(v).ok()?,
            GgufValue::I64(v) => v,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            GgufValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// ggml tensor element types that can appear in a GGUF file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
}

impl GgmlType {
    fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            9 => GgmlType::Q8_1,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            15 => GgmlType::Q8K,
            24 => GgmlType::I8,
            25 => GgmlType::I16,
            26 => GgmlType::I32,
            27 => GgmlType::I64,
            28 => GgmlType::F64,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block).
    pub fn block_layout(self) -> (u64, u64) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q8_1 => (32, 36),
            GgmlType::Q2K => (256, 84),
            GgmlType::Q3K => (256, 110),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
            GgmlType::Q8K => (256, 292),
            GgmlType::I8 => (1, 1),
            GgmlType::I16 => (1, 2),
            GgmlType::I32 => (1, 4),
            GgmlType::I64 | GgmlType::F64 => (1, 8),
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Where a tensor lives in the file and what it holds.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGUF dimension order: `dims[0]` is the fastest-varying (row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Size in bytes (derived from dims and type).
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    pub version: u32,
    metadata: HashMap<String, GgufValue>,
    /// Metadata keys in file order.
    keys: Vec<String>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: usize,
    map: memmap2::Mmap,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.keys.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn corrupt(&self, what: impl Into<String>) -> GgufError {
        GgufError::Corrupt {
            path: self.path.to_path_buf(),
            what: what.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.corrupt(format!("need {n} bytes at offset {}", self.pos)))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn len(&mut self, what: &str) -> Result<usize, GgufError> {
        let n = self.u64()?;
        if n > MAX_ELEMENTS {
            return Err(self.corrupt(format!("{what} length {n} is implausible")));
        }
        usize::try_from(n).map_err(|_| self.corrupt(format!("{what} length {n} overflows")))
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.len("string")?;
        let bytes = self.take(n)?;
        // Tokenizer vocabularies can hold byte sequences that are not valid UTF-8 in old files;
        // keep them (lossily) rather than rejecting the whole model.
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<GgufValue, GgufError> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>()?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => GgufValue::Bool(self.array::<1>()?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth > 4 {
                    return Err(self.corrupt("arrays nested too deeply"));
                }
                let elem_ty = self.u32()?;
                let n = self.len("array")?;
                // Each element takes at least one byte: reject counts the file cannot hold.
                if n > self.buf.len().saturating_sub(self.pos) {
                    return Err(self.corrupt(format!("array of {n} elements exceeds the file")));
                }
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.value(elem_ty, depth + 1)?);
                }
                GgufValue::Array(out)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(self.corrupt(format!("unknown metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Open and parse a GGUF file. Tensor data stays memory-mapped.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = std::fs::File::open(&path).map_err(io_err)?;
        // SAFETY: the map is read-only and private to this process; like every mmap-based model
        // loader we rely on the file not being truncated while it is mapped.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        Self::parse(path, map)
    }

    fn parse(path: PathBuf, map: memmap2::Mmap) -> Result<Self, GgufError> {
        let mut cur = Cursor {
            buf: &map[..],
            pos: 0,
            path: &path,
        };
        if cur.take(4).ok() != Some(&GGUF_MAGIC[..]) {
            return Err(GgufError::BadMagic { path: path.clone() });
        }
        let version = cur.u32()?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion {
                path: path.clone(),
                version,
            });
        }
        let n_tensors = cur.len("tensor count")?;
        let n_kv = cur.len("metadata count")?;
        let mut metadata = HashMap::with_capacity(n_kv.min(4096));
        let mut keys = Vec::with_capacity(n_kv.min(4096));
        for _ in 0..n_kv {
            let key = cur.string()?;
            let ty = cur.u32()?;
            let value = cur.value(ty, 0)?;
            keys.push(key.clone());
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(n_tensors.min(65536));
        for _ in 0..n_tensors {
            let name = cur.string()?;
            let n_dims = cur.u32()?;
            if n_dims > 8 {
                return Err(cur.corrupt(format!("tensor {name} has {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(cur.u64()?);
            }
            let type_id = cur.u32()?;
            let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
                cur.corrupt(format!("tensor {name} has unknown ggml type {type_id}"))
            })?;
            let offset = cur.u64()?;
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| cur.corrupt(format!("tensor {name} dims overflow")))?;
            let (block, block_bytes) = ggml_type.block_layout();
            if n_elements % block != 0 {
                return Err(cur.corrupt(format!(
                    "tensor {name}: {n_elements} elements is not a multiple of the {ggml_type} block size {block}"
                )));
            }
            let n_bytes = (n_elements / block)
                .checked_mul(block_bytes)
                .ok_or_else(|| cur.corrupt(format!("tensor {name} size overflows")))?;
            tensors.push(GgufTensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                n_bytes,
            });
        }
        let alignment = match metadata
            .get("general.alignment")
            .and_then(GgufValue::as_i64)
        {
            Some(a) if a > 0 => a as u64,
            _ => DEFAULT_ALIGNMENT,
        };
        let pos = cur.pos as u64;
        let data_offset = pos.div_ceil(alignment) * alignment;
        let data_offset =
            usize::try_from(data_offset).map_err(|_| cur.corrupt("data offset overflows"))?;
        let data_len = map.len().saturating_sub(data_offset) as u64;
        for t in &tensors {
            let end = t.offset.checked_add(t.n_bytes);
            if end.is_none_or(|e| e > data_len) {
                return Err(GgufError::Corrupt {
                    path: path.clone(),
                    what: format!("tensor {} extends past the end of the file", t.name),
                });
            }
        }
        let tensor_index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path,
            version,
            metadata,
            keys,
            tensors,
            tensor_index,
            data_offset,
            map,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Metadata keys in file order.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&GgufValue, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })
    }

    fn wrong(&self, key: &str, v: &GgufValue, expected: &'static str) -> GgufError {
        GgufError::WrongType {
            key: key.into(),
            found: v.type_name(),
            expected,
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, v, "string"))
    }

    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        let v = self.require(key)?;
        v.as_i64().ok_or_else(|| self.wrong(key, v, "integer"))
    }

    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| self.wrong(key, v, "number"))
    }

    pub fn get_array(&self, key: &str) -> Result<&[GgufValue], GgufError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong(key, v, "array"))
    }

    /// A string array (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.wrong(key, v, "array of strings"))
            })
            .collect()
    }

    /// `general.architecture`, e.g. `"llama"`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// `<arch>.<suffix>` as an integer, e.g. `arch_i64("context_length")`.
    pub fn arch_i64(&self, suffix: &str) -> Result<i64, GgufError> {
        let arch = self.architecture()?;
        self.get_i64(&format!("{arch}.{suffix}"))
    }

    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (bounds were checked at open).
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> &[u8] {
        let start = self.data_offset + info.offset as usize;
        &self.map[start..start + info.n_bytes as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gguf_string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    /// A tiny but complete GGUF v3 file built by hand: two metadata keys and one F32 tensor.
    fn tiny_gguf() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes()); // tensors
        b.extend_from_slice(&3u64.to_le_bytes()); // kv
        gguf_string(&mut b, "general.architecture");
        b.extend_from_slice(&8u32.to_le_bytes());
        gguf_string(&mut b, "llama");
        gguf_string(&mut b, "llama.context_length");
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&8192u32.to_le_bytes());
        gguf_string(&mut b, "tokenizer.ggml.tokens");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        gguf_string(&mut b, "a");
        gguf_string(&mut b, "<s>");
        gguf_string(&mut b, "w");
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&3u64.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // F32
        b.extend_from_slice(&0u64.to_le_bytes());
        while b.len() % 32 != 0 {
            b.push(0);
        }
        for i in 0..6 {
            b.extend_from_slice(&(i as f32).to_le_bytes());
        }
        b
    }

    fn write_tmp(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("tmp");
        f.write_all(bytes).expect("write");
        f
    }

    #[test]
    fn parses_metadata_and_tensors() {
        let f = write_tmp(&tiny_gguf());
        let g = GgufFile::open(f.path()).expect("open");
        assert_eq!(g.architecture().ok(), Some("llama"));
        assert_eq!(g.arch_i64("context_length").ok(), Some(8192));
        assert_eq!(
            g.get_str_array("tokenizer.ggml.tokens").ok(),
            Some(vec!["a", "<s>"])
        );
        let t = g.tensor_info("w").expect("tensor");
        assert_eq!(t.dims, vec![2, 3]);
        assert_eq!(t.n_bytes, 24);
        let data = g.tensor_data(t);
        assert_eq!(&data[4..8], &1f32.to_le_bytes());
        assert!(matches!(
            g.get_str("llama.context_length"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            g.get_str("nope"),
            Err(GgufError::MissingKey { .. })
        ));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let full = tiny_gguf();
        for cut in 0..full.len() - 24 {
            let f = write_tmp(&full[..cut]);
            assert!(
                GgufFile::open(f.path()).is_err(),
                "truncated at {cut} parsed"
            );
        }
    }

    #[test]
    fn rejects_non_gguf() {
        let f = write_tmp(b"not a gguf file at all");
        assert!(matches!(
            GgufFile::open(f.path()),
            Err(GgufError::BadMagic { .. })
        ));
    }
}
