//! A reader of CTranslate2's `model.bin` (binary versions 2–6, as written by
//! `ctranslate2/specs/model_spec.py` and read by `src/models/model.cc`):
//!
//! ```text
//! u32 binary_version
//! string spec_name, u32 spec_revision                (binary_version >= 2)
//! u32 num_variables, then per variable:
//!     string name, u8 rank, u32 dims[rank],
//!     u8 dtype, u32 num_bytes                         (binary_version >= 4)
//!     | u8 item_size, u32 num_items                   (older)
//!     u8 data[num_bytes]
//! u32 num_aliases, then per alias: string alias, string variable   (binary_version >= 3)
//! ```
//!
//! Integers are little-endian; a string is a u16 length that counts a trailing NUL, then the
//! bytes. Every read is bounds-checked: a truncated or corrupt file is a [`Ct2Error`].

use std::collections::HashMap;
use std::path::Path;

/// The newest binary version CTranslate2 4.x writes and this reader understands.
const MAX_BINARY_VERSION: u32 = 6;

/// CTranslate2's `DataType` codes (`include/ctranslate2/types.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ct2DType {
    F32,
    I8,
    I16,
    I32,
    F16,
    BF16,
}

impl Ct2DType {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::F32,
            1 => Self::I8,
            2 => Self::I16,
            3 => Self::I32,
            4 => Self::F16,
            5 => Self::BF16,
            _ => return None,
        })
    }

    /// Binary version < 4 stored the item size instead of the type; floats are assumed, as
    /// CTranslate2's `get_dtype_from_item_size` does.
    fn from_item_size(size: u8) -> Option<Self> {
        Some(match size {
            4 => Self::F32,
            2 => Self::F16,
            1 => Self::I8,
            _ => return None,
        })
    }

    pub fn item_size(self) -> usize {
        match self {
            Self::I8 => 1,
            Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::F32 | Self::I32 => 4,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Ct2Error {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("model.bin is truncated: {what} at byte {offset} needs {need} bytes, {left} left")]
    Truncated {
        what: &'static str,
        offset: usize,
        need: usize,
        left: usize,
    },
    #[error("model.bin has binary version {0}; this reader supports 1 to {MAX_BINARY_VERSION}")]
    UnsupportedVersion(u32),
    #[error("model.bin has a bad string at byte {offset}: {reason}")]
    BadString { offset: usize, reason: &'static str },
    #[error("variable {name:?} has unknown data type code {code}")]
    UnknownDType { name: String, code: u8 },
    #[error("variable {name:?}: shape {shape:?} of {dtype:?} needs {expected} bytes, the file says {got}")]
    SizeMismatch {
        name: String,
        shape: Vec<usize>,
        dtype: Ct2DType,
        expected: usize,
        got: usize,
    },
    #[error("variable {0:?} appears twice")]
    Duplicate(String),
    #[error("alias {alias:?} names variable {target:?}, which the file does not have")]
    DanglingAlias { alias: String, target: String },
    #[error("model.bin has {0} bytes after its last alias")]
    TrailingBytes(usize),
    #[error("variable {name:?} is {dtype:?}, not a {want}")]
    WrongType {
        name: String,
        dtype: Ct2DType,
        want: &'static str,
    },
}

/// One variable: its shape, type and the byte range of its data in the file.
#[derive(Debug, Clone)]
pub struct Ct2Variable {
    pub shape: Vec<usize>,
    pub dtype: Ct2DType,
    range: std::ops::Range<usize>,
}

/// A parsed `model.bin`, holding the file's bytes.
pub struct Ct2Model {
    pub binary_version: u32,
    /// E.g. `WhisperSpec`; empty for binary version 1.
    pub spec: String,
    pub spec_revision: u32,
    bytes: Vec<u8>,
    variables: HashMap<String, Ct2Variable>,
    aliases: HashMap<String, String>,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Ct2Error> {
        let left = self.bytes.len() - self.pos;
        if n > left {
            return Err(Ct2Error::Truncated {
                what,
                offset: self.pos,
                need: n,
                left,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, Ct2Error> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, Ct2Error> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, Ct2Error> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self, what: &'static str) -> Result<String, Ct2Error> {
        let offset = self.pos;
        let len = self.u16(what)? as usize;
        if len == 0 {
            return Err(Ct2Error::BadString {
                offset,
                reason: "zero length (the length counts the trailing NUL)",
            });
        }
        let raw = self.take(len, what)?;
        // The last byte is the NUL terminator CTranslate2 writes and drops.
        String::from_utf8(raw[..len - 1].to_vec()).map_err(|_| Ct2Error::BadString {
            offset,
            reason: "not UTF-8",
        })
    }
}

/// A tensor as (shape, row-major f32 values).
pub type ShapedF32 = (Vec<usize>, Vec<f32>);

impl Ct2Model {
    pub fn open(path: &Path) -> Result<Self, Ct2Error> {
        let bytes = std::fs::read(path).map_err(|source| Ct2Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(bytes)
    }

    pub fn parse(bytes: Vec<u8>) -> Result<Self, Ct2Error> {
        let mut c = Cursor {
            bytes: &bytes,
            pos: 0,
        };
        let binary_version = c.u32("binary version")?;
        if binary_version == 0 || binary_version > MAX_BINARY_VERSION {
            return Err(Ct2Error::UnsupportedVersion(binary_version));
        }
        let (spec, spec_revision) = if binary_version >= 2 {
            (c.string("spec name")?, c.u32("spec revision")?)
        } else {
            (String::new(), 1)
        };
        let num_variables = c.u32("variable count")?;
        let mut variables = HashMap::new();
        for _ in 0..num_variables {
            let name = c.string("variable name")?;
            let rank = c.u8("rank")? as usize;
            let mut shape = Vec::with_capacity(rank);
            for _ in 0..rank {
                shape.push(c.u32("dimension")? as usize);
            }
            let (dtype, num_bytes) = if binary_version >= 4 {
                let code = c.u8("data type")?;
                let dtype = Ct2DType::from_code(code).ok_or_else(|| Ct2Error::UnknownDType {
                    name: name.clone(),
                    code,
                })?;
                (dtype, c.u32("byte count")? as usize)
            } else {
                let size = c.u8("item size")?;
                let dtype =
                    Ct2DType::from_item_size(size).ok_or_else(|| Ct2Error::UnknownDType {
                        name: name.clone(),
                        code: size,
                    })?;
                (dtype, c.u32("item count")? as usize * size as usize)
            };
            let expected = shape
                .iter()
                .try_fold(dtype.item_size(), |acc, &d| acc.checked_mul(d));
            if expected != Some(num_bytes) {
                return Err(Ct2Error::SizeMismatch {
                    name,
                    shape,
                    dtype,
                    expected: expected.unwrap_or(usize::MAX),
                    got: num_bytes,
                });
            }
            let start = c.pos;
            c.take(num_bytes, "variable data")?;
            let var = Ct2Variable {
                shape,
                dtype,
                range: start..start + num_bytes,
            };
            if variables.insert(name.clone(), var).is_some() {
                return Err(Ct2Error::Duplicate(name));
            }
        }
        let mut aliases = HashMap::new();
        if binary_version >= 3 {
            let n = c.u32("alias count")?;
            for _ in 0..n {
                let alias = c.string("alias name")?;
                let target = c.string("alias target")?;
                if !variables.contains_key(&target) {
                    return Err(Ct2Error::DanglingAlias { alias, target });
                }
                aliases.insert(alias, target);
            }
        }
        let rest = bytes.len() - c.pos;
        if rest != 0 {
            return Err(Ct2Error::TrailingBytes(rest));
        }
        Ok(Self {
            binary_version,
            spec,
            spec_revision,
            bytes,
            variables,
            aliases,
        })
    }

    /// The variable of this name, following an alias.
    pub fn get(&self, name: &str) -> Option<&Ct2Variable> {
        let name = self.aliases.get(name).map_or(name, String::as_str);
        self.variables.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.variables.keys().map(String::as_str)
    }

    /// A floating-point variable's values as `f32` (`None` if the file lacks it).
    pub fn f32(&self, name: &str) -> Result<Option<ShapedF32>, Ct2Error> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let data = &self.bytes[v.range.clone()];
        let values = match v.dtype {
            Ct2DType::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Ct2DType::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Ct2DType::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            dtype => {
                return Err(Ct2Error::WrongType {
                    name: name.to_string(),
                    dtype,
                    want: "floating-point tensor",
                })
            }
        };
        Ok(Some((v.shape.clone(), values)))
    }

    /// An integer scalar (e.g. `encoder/num_heads`), `None` if the file lacks it.
    pub fn int_scalar(&self, name: &str) -> Result<Option<i64>, Ct2Error> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let d = &self.bytes[v.range.clone()];
        let wrong = |dtype| Ct2Error::WrongType {
            name: name.to_string(),
            dtype,
            want: "integer scalar",
        };
        if !v.shape.is_empty() {
            return Err(wrong(v.dtype));
        }
        Ok(Some(match v.dtype {
            Ct2DType::I8 => d[0] as i8 as i64,
            Ct2DType::I16 => i16::from_le_bytes([d[0], d[1]]) as i64,
            Ct2DType::I32 => i32::from_le_bytes([d[0], d[1], d[2], d[3]]) as i64,
            dtype => return Err(wrong(dtype)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small but complete file: one f16 matrix, one i16 scalar, one alias.
    fn sample() -> Vec<u8> {
        let mut b = Vec::new();
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend_from_slice(&(s.len() as u16 + 1).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
            b.push(0);
        };
        b.extend_from_slice(&6u32.to_le_bytes());
        string(&mut b, "WhisperSpec");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        string(&mut b, "decoder/embeddings/weight");
        b.push(2);
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&3u32.to_le_bytes());
        b.push(4);
        b.extend_from_slice(&12u32.to_le_bytes());
        for v in [1.0f32, -2.0, 0.5, 0.25, 3.0, -0.125] {
            b.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        string(&mut b, "encoder/num_heads");
        b.push(0);
        b.push(2);
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&6i16.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        string(&mut b, "decoder/projection/weight");
        string(&mut b, "decoder/embeddings/weight");
        b
    }

    #[test]
    fn reads_variables_scalars_and_aliases() {
        let m = Ct2Model::parse(sample()).expect("valid file");
        assert_eq!(
            (m.binary_version, m.spec.as_str(), m.spec_revision),
            (6, "WhisperSpec", 3)
        );
        let (shape, w) = m
            .f32("decoder/projection/weight")
            .expect("test data")
            .expect("test data");
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(w, vec![1.0, -2.0, 0.5, 0.25, 3.0, -0.125]);
        assert_eq!(
            m.int_scalar("encoder/num_heads").expect("test data"),
            Some(6)
        );
        assert!(m.f32("missing").expect("test data").is_none());
        assert!(matches!(
            m.f32("encoder/num_heads"),
            Err(Ct2Error::WrongType { .. })
        ));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let full = sample();
        for len in 0..full.len() {
            let err = Ct2Model::parse(full[..len].to_vec()).err();
            assert!(err.is_some(), "a file cut at {len} bytes was accepted");
        }
        let mut longer = full.clone();
        longer.push(0);
        assert!(matches!(
            Ct2Model::parse(longer),
            Err(Ct2Error::TrailingBytes(1))
        ));
    }

    #[test]
    fn corrupt_headers_are_typed_errors() {
        let full = sample();
        // Version 7 does not exist yet.
        let mut v = full.clone();
        v[0] = 7;
        assert!(matches!(
            Ct2Model::parse(v),
            Err(Ct2Error::UnsupportedVersion(7))
        ));
        // The matrix's byte count (offset: 4 + 2+12 + 4 + 4 + 2+26 + 1 + 8 + 1) off by two.
        let at = 4 + 14 + 4 + 4 + 28 + 1 + 8 + 1;
        let mut s = full.clone();
        s[at] = 14;
        assert!(matches!(
            Ct2Model::parse(s),
            Err(Ct2Error::SizeMismatch { .. })
        ));
        // An unknown dtype code.
        let mut d = full.clone();
        d[at - 1] = 9;
        assert!(matches!(
            Ct2Model::parse(d),
            Err(Ct2Error::UnknownDType { code: 9, .. })
        ));
        // A huge dimension: the size check must not overflow.
        let mut h = full.clone();
        h[at - 9..at - 5].copy_from_slice(&u32::MAX.to_le_bytes());
        h[at - 5..at - 1].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Ct2Model::parse(h).is_err());
        // A zero-length string.
        let mut z = full;
        z[4] = 0;
        z[5] = 0;
        assert!(matches!(
            Ct2Model::parse(z),
            Err(Ct2Error::BadString { .. })
        ));
    }
}
