//! Prefix-cache block hashes computed exactly as vLLM computes them (`endpoints.md §4.5`),
//! so the hashes aphro's KV events carry index into a router the same way vLLM's do.
//!
//! `block_hash = H((parent_hash or NONE_HASH, tuple(block_token_ids), extra_keys or None))`
//! where `H` is `sha256` over Python pickle protocol 5 (`--prefix-caching-hash-algo sha256`,
//! vLLM's default) or over canonical CBOR (`sha256_cbor`). `NONE_HASH = H(PYTHONHASHSEED)`
//! when that variable is set (the seed *string*), else `H("vllm-none-hash")`: vLLM 0.33.0
//! derives it from a fixed seed for these cryptographic hashes, so independent processes
//! (and a router recomputing hashes) agree without configuration. Extra keys enter the hash
//! tagged with their source (`("lora", name, path)`, `("mm", id, offset)`,
//! `("cache_salt", salt)`); events publish them untagged ([`ExtraKey::event_form`]).

use sha2::{Digest, Sha256};

/// A block's hash: the 32-byte SHA-256 digest.
pub type BlockHash = [u8; 32];

/// `--prefix-caching-hash-algo` (`endpoints.md §4.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashAlgo {
    /// `sha256`: SHA-256 of the pickle (protocol 5) of the tuple. vLLM's default.
    #[default]
    Sha256,
    /// `sha256_cbor`: SHA-256 of the canonical CBOR of the tuple (portable).
    Sha256Cbor,
}

impl std::str::FromStr for HashAlgo {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sha256" => Ok(Self::Sha256),
            "sha256_cbor" => Ok(Self::Sha256Cbor),
            "xxhash" | "xxhash_cbor" => Err(format!(
                "--prefix-caching-hash-algo {s} is not supported; use sha256 or sha256_cbor"
            )),
            _ => Err(format!(
                "invalid --prefix-caching-hash-algo {s:?}: expected sha256 or sha256_cbor"
            )),
        }
    }
}

impl HashAlgo {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha256Cbor => "sha256_cbor",
        }
    }
}

/// One element of a block's extra keys, as vLLM 0.33.0's `generate_block_hash_extra_keys`
/// makes them (`endpoints.md §4.5`): in this order LoRA, multimodal items, `cache_salt`,
/// prompt-embeds digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraKey {
    /// `("lora", name, path)`: the path too, so a name re-pointed at another adapter does not
    /// reuse its KV.
    Lora { name: String, path: String },
    /// `("mm", identifier, offset relative to the block start)`.
    Mm(String, i64),
    /// `("cache_salt", salt)`, on the first block only.
    CacheSalt(String),
    /// `("prompt_embeds", sha256 of the block's embeddings)`.
    PromptEmbeds(Vec<u8>),
}

/// A multimodal item's run of placeholder tokens in a prompt (vLLM's `MultiModalFeatureSpec`
/// `identifier` + `mm_position`): the tokens of an image are the same pads for every image,
/// so the item's identifier (its mm_hash) must enter the hash of every block they touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmPosition {
    /// The mm_hash (vLLM's identifier without a tower LoRA).
    pub identifier: String,
    /// First placeholder token.
    pub offset: usize,
    /// Number of placeholder tokens (> 0).
    pub length: usize,
}

/// vLLM's `_gen_mm_extra_hash_keys` for the block `[start, end)`: `("mm", identifier,
/// offset - start)` for each item (sorted, non-overlapping) overlapping the block; the
/// offset is negative for an item that began in an earlier block.
pub fn mm_extra_keys(items: &[MmPosition], start: usize, end: usize) -> Vec<ExtraKey> {
    items
        .iter()
        .filter(|m| end > m.offset && start < m.offset + m.length)
        .map(|m| ExtraKey::Mm(m.identifier.clone(), m.offset as i64 - start as i64))
        .collect()
}

/// What a KV event carries for one extra key (`to_event_extra_keys`): the value without its
/// tag, and a multimodal item as `(identifier, offset)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKey<'a> {
    Str(&'a str),
    Mm(&'a str, i64),
    Bytes(&'a [u8]),
}

impl ExtraKey {
    pub fn event_form(&self) -> EventKey<'_> {
        match self {
            Self::Lora { name, .. } => EventKey::Str(name),
            Self::Mm(id, off) => EventKey::Mm(id, *off),
            Self::CacheSalt(s) => EventKey::Str(s),
            Self::PromptEmbeds(d) => EventKey::Bytes(d),
        }
    }

    fn hashed(&self) -> Py<'_> {
        match self {
            Self::Lora { name, path } => {
                Py::Tuple(vec![Py::Str("lora"), Py::Str(name), Py::Str(path)])
            }
            Self::Mm(id, off) => Py::Tuple(vec![Py::Str("mm"), Py::Str(id), Py::Int(*off)]),
            Self::CacheSalt(s) => Py::Tuple(vec![Py::Str("cache_salt"), Py::Str(s)]),
            Self::PromptEmbeds(d) => Py::Tuple(vec![Py::Str("prompt_embeds"), Py::Bytes(d)]),
        }
    }
}

/// The Python values vLLM hashes.
enum Py<'a> {
    None,
    Bytes(&'a [u8]),
    Str(&'a str),
    Int(i64),
    Tuple(Vec<Py<'a>>),
}

fn extra_py(keys: &[ExtraKey]) -> Py<'_> {
    Py::Tuple(keys.iter().map(ExtraKey::hashed).collect())
}

/// Canonical CBOR as `cbor2.dumps(x, canonical=True)` writes these types: shortest heads,
/// tuples as definite arrays, `None` as `f6`. No maps or floats occur, so canonical ordering
/// never comes into play.
fn cbor_value(x: &Py<'_>) -> ciborium::Value {
    use ciborium::Value;
    match x {
        Py::None => Value::Null,
        Py::Bytes(b) => Value::Bytes(b.to_vec()),
        Py::Str(s) => Value::Text((*s).to_owned()),
        Py::Int(i) => Value::Integer((*i).into()),
        Py::Tuple(t) => Value::Array(t.iter().map(cbor_value).collect()),
    }
}

fn cbor(x: &Py<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = ciborium::into_writer(&cbor_value(x), &mut out);
    out
}

/// `pickle.dumps(x, protocol=5)` for these types, byte for byte as CPython's C pickler
/// writes them: one FRAME around the body, MEMOIZE after every str/bytes/non-empty tuple.
/// (Values are fresh objects, so no memo lookups ever hit: vLLM builds a new tuple per block.)
fn pickle(x: &Py<'_>) -> Vec<u8> {
    fn body(x: &Py<'_>, out: &mut Vec<u8>) {
        const MEMOIZE: u8 = 0x94;
        match x {
            Py::None => out.push(b'N'),
            Py::Int(i) => {
                let i = *i;
                if (0..256).contains(&i) {
                    out.extend_from_slice(&[b'K', i as u8]);
                } else if (0..65536).contains(&i) {
                    out.push(b'M');
                    out.extend_from_slice(&(i as u16).to_le_bytes());
                } else if let Ok(v) = i32::try_from(i) {
                    out.push(b'J');
                    out.extend_from_slice(&v.to_le_bytes());
                } else {
                    // LONG1: minimal two's-complement little-endian.
                    let mut b = i.to_le_bytes().to_vec();
                    while b.len() > 1 {
                        let last = b[b.len() - 1];
                        let prev = b[b.len() - 2];
                        if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                            b.pop();
                        } else {
                            break;
                        }
                    }
                    out.extend_from_slice(&[0x8a, b.len() as u8]);
                    out.extend_from_slice(&b);
                }
            }
            Py::Bytes(b) => {
                if b.len() < 256 {
                    out.extend_from_slice(&[b'C', b.len() as u8]);
                } else {
                    out.push(b'B');
                    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                }
                out.extend_from_slice(b);
                out.push(MEMOIZE);
            }
            Py::Str(s) => {
                if s.len() < 256 {
                    out.extend_from_slice(&[0x8c, s.len() as u8]);
                } else {
                    out.push(b'X');
                    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                }
                out.extend_from_slice(s.as_bytes());
                out.push(MEMOIZE);
            }
            Py::Tuple(t) => {
                match t.len() {
                    0 => {
                        out.push(b')');
                        return;
                    }
                    1..=3 => {
                        for e in t {
                            body(e, out);
                        }
                        out.push([0x85, 0x86, 0x87][t.len() - 1]);
                    }
                    _ => {
                        out.push(b'(');
                        for e in t {
                            body(e, out);
                        }
                        out.push(b't');
                    }
                }
                out.push(MEMOIZE);
            }
        }
    }
    let mut b = Vec::new();
    body(x, &mut b);
    b.push(b'.');
    let mut out = Vec::with_capacity(b.len() + 11);
    out.extend_from_slice(&[0x80, 5]);
    // CPython frames any pickle body of at least 4 bytes (FRAME_SIZE_MIN).
    if b.len() >= 4 {
        out.push(0x95);
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    }
    out.extend_from_slice(&b);
    out
}

/// vLLM's `DEFAULT_NONE_HASH_SEED`: what `NONE_HASH` hashes when `PYTHONHASHSEED` is unset.
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// Hashes blocks as vLLM does for one `--prefix-caching-hash-algo` and `NONE_HASH`.
#[derive(Debug, Clone)]
pub struct BlockHasher {
    algo: HashAlgo,
    none_hash: BlockHash,
}

impl BlockHasher {
    /// `python_hash_seed` is `PYTHONHASHSEED` (vLLM hashes the seed string itself); without
    /// one, vLLM 0.33.0 hashes its fixed seed [`DEFAULT_NONE_HASH_SEED`] (both algorithms
    /// here are cryptographic; only xxhash keeps a random seed).
    pub fn new(algo: HashAlgo, python_hash_seed: Option<&str>) -> Self {
        let seed = python_hash_seed.unwrap_or(DEFAULT_NONE_HASH_SEED);
        let none_hash = Self::digest(algo, &Py::Str(seed));
        Self { algo, none_hash }
    }

    /// `NONE_HASH` from this process's `PYTHONHASHSEED`.
    pub fn from_env(algo: HashAlgo) -> Self {
        let seed = std::env::var("PYTHONHASHSEED").ok();
        Self::new(algo, seed.as_deref())
    }

    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    pub fn none_hash(&self) -> &BlockHash {
        &self.none_hash
    }

    fn digest(algo: HashAlgo, x: &Py<'_>) -> BlockHash {
        let bytes = match algo {
            HashAlgo::Sha256 => pickle(x),
            HashAlgo::Sha256Cbor => cbor(x),
        };
        Sha256::digest(bytes).into()
    }

    /// The hash of one full block given its parent's hash (`None` for the first block).
    pub fn hash_block(
        &self,
        parent: Option<&BlockHash>,
        tokens: &[u32],
        extra: Option<&[ExtraKey]>,
    ) -> BlockHash {
        let x = Py::Tuple(vec![
            Py::Bytes(parent.unwrap_or(&self.none_hash)),
            Py::Tuple(tokens.iter().map(|&t| Py::Int(t.into())).collect()),
            extra.filter(|e| !e.is_empty()).map_or(Py::None, extra_py),
        ]);
        Self::digest(self.algo, &x)
    }
}

/// vLLM's int form of a hash in KV events: the last 8 bytes of the digest, big-endian.
pub fn hash_to_u64(h: &BlockHash) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[24..]);
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    // Test vectors of `endpoints.md §4.5` (PYTHONHASHSEED="0", tokens 1..16, no extras).
    #[test]
    fn sha256_cbor_matches_vllm_vectors() {
        assert_eq!(hex(&cbor(&Py::Str("0"))), "6130");
        let h = BlockHasher::new(HashAlgo::Sha256Cbor, Some("0"));
        assert_eq!(
            hex(h.none_hash()),
            "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
        );
        let toks0: Vec<u32> = (1..=16).collect();
        let input = cbor(&Py::Tuple(vec![
            Py::Bytes(h.none_hash()),
            Py::Tuple(toks0.iter().map(|&t| Py::Int(t.into())).collect()),
            Py::None,
        ]));
        let mut want = format!("835820{}90", hex(h.none_hash()));
        for t in 1..=16 {
            want.push_str(&format!("{t:02x}"));
        }
        want.push_str("f6");
        assert_eq!(hex(&input), want);
        let b0 = h.hash_block(None, &toks0, None);
        assert_eq!(
            hex(&b0),
            "202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea"
        );
        assert_eq!(hash_to_u64(&b0), 3236607068019569386);
        let toks1: Vec<u32> = (17..=32).collect();
        let b1 = h.hash_block(Some(&b0), &toks1, None);
        assert_eq!(
            hex(&b1),
            "4a0a393805c6d2f0ed831000d41bb65980336c4c04895d5e26470bbec927f5bf"
        );
        assert_eq!(hash_to_u64(&b1), 2758186210834249151);
        // Empty extra keys hash as None, like vLLM's `generate_block_hash_extra_keys`.
        assert_eq!(h.hash_block(None, &toks0, Some(&[])), b0);
        let extra = [
            ExtraKey::Lora {
                name: "my-lora".into(),
                path: "/a".into(),
            },
            ExtraKey::Mm("abc123".into(), 3),
            ExtraKey::CacheSalt("salt".into()),
        ];
        assert_eq!(
            hex(&cbor(&extra_py(&extra))),
            format!(
                "83 8364{}67{}62{} 8362{}66{}03 826a{}64{}",
                hex(b"lora"),
                hex(b"my-lora"),
                hex(b"/a"),
                hex(b"mm"),
                hex(b"abc123"),
                hex(b"cache_salt"),
                hex(b"salt")
            )
            .replace(' ', "")
        );
        assert_ne!(h.hash_block(None, &toks0, Some(&extra)), b0);
    }

    #[test]
    fn sha256_pickle_matches_vllm_vectors() {
        assert_eq!(
            hex(&pickle(&Py::Str("0"))),
            "80059505000000000000008c0130942e"
        );
        let h = BlockHasher::new(HashAlgo::Sha256, Some("0"));
        assert_eq!(
            hex(h.none_hash()),
            "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"
        );
        let toks0: Vec<u32> = (1..=16).collect();
        let input = pickle(&Py::Tuple(vec![
            Py::Bytes(h.none_hash()),
            Py::Tuple(toks0.iter().map(|&t| Py::Int(t.into())).collect()),
            Py::None,
        ]));
        let mut want = format!("8005954a00000000000000 4320{}9428", hex(h.none_hash()));
        want.retain(|c| c != ' ');
        for t in 1..=16 {
            want.push_str(&format!("4b{t:02x}"));
        }
        want.push_str("7494 4e87942e");
        want.retain(|c| c != ' ');
        assert_eq!(hex(&input), want);
        let b0 = h.hash_block(None, &toks0, None);
        assert_eq!(
            hex(&b0),
            "bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325"
        );
        assert_eq!(hash_to_u64(&b0), 7536218907325174565);
    }

    #[test]
    fn pickle_ints_use_the_shortest_opcode() {
        let p = |i: i64| hex(&pickle(&Py::Int(i))[2..]);
        assert_eq!(p(255), "4bff2e"); // no frame under 4 bytes
        assert_eq!(p(256), "950400000000000000 4d00012e".replace(' ', ""));
        assert_eq!(p(65536), "950600000000000000 4a000001002e".replace(' ', ""));
        assert_eq!(p(-1), "950600000000000000 4affffffff2e".replace(' ', ""));
    }

    #[test]
    fn hash_algo_names_parse_and_unsupported_ones_are_errors() {
        assert_eq!("sha256".parse(), Ok(HashAlgo::Sha256));
        assert_eq!("sha256_cbor".parse(), Ok(HashAlgo::Sha256Cbor));
        assert!("xxhash".parse::<HashAlgo>().is_err());
        assert!("builtin".parse::<HashAlgo>().is_err());
    }

    #[test]
    fn unset_seed_uses_vllms_fixed_seed() {
        let a = BlockHasher::new(HashAlgo::Sha256Cbor, None);
        let b = BlockHasher::new(HashAlgo::Sha256Cbor, Some(DEFAULT_NONE_HASH_SEED));
        assert_eq!(a.none_hash(), b.none_hash());
        assert_ne!(
            a.none_hash(),
            BlockHasher::new(HashAlgo::Sha256Cbor, Some("0")).none_hash()
        );
    }

    /// Hashes of `testdata/kv_events/vllm_0.33.0.json`, made by vLLM 0.33.0's own hash code
    /// (`scripts/make_kv_event_goldens.py`): seeded and unseeded, pickle and CBOR, with LoRA
    /// and `cache_salt` keys.
    #[test]
    fn block_hashes_equal_vllm_goldens() {
        for c in crate::kv_events::tests::goldens() {
            let h = BlockHasher::new(c.algo, c.seed.as_deref());
            assert_eq!(hex(h.none_hash()), c.none_hash, "{}", c.name);
            let mut parent = None;
            for (i, want) in c.block_hashes.iter().enumerate() {
                let extra = c.extra_keys(i);
                let got = h.hash_block(
                    parent.as_ref(),
                    &c.tokens[i * c.block_size..(i + 1) * c.block_size],
                    extra.as_deref(),
                );
                assert_eq!(&hex(&got), want, "{} block {i}", c.name);
                parent = Some(got);
            }
        }
    }
}
