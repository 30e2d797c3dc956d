//! The boundary between the engine's control plane (scheduler, KV block manager, sampler —
//! plain Rust, no burn types) and a model that runs on some backend.
//!
//! The scheduler decides *which* tokens run in a step and *where* their K/V live (physical
//! block ids); the runner owns the KV memory itself and computes logits. Keeping this
//! boundary narrow is what lets the CUDA backend add kernels without touching scheduling.

/// Static facts about a loaded model that the scheduler and sampler need.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// Architecture name as the weights call it (e.g. `"llama"`).
    pub architecture: String,
    pub vocab_size: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Maximum context length (positions) the model supports.
    pub max_position: usize,
    /// End-of-sequence token ids (primary first).
    pub eos_token_ids: Vec<u32>,
    /// Bytes one token's K and V take across all layers (for sizing the cache).
    pub kv_bytes_per_token: usize,
}

/// Which logits a sequence needs back from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (an intermediate prefill chunk).
    None,
    /// Only for the last token of `token_ids` (the usual case).
    Last,
    /// For every token of `token_ids` (prompt logprobs).
    All,
}

/// One sequence's share of a step.
#[derive(Debug, Clone)]
pub struct SeqInput {
    /// Scheduler-assigned id, stable for the life of the sequence.
    pub seq_id: u64,
    /// Tokens to run this step: a prefill chunk, or one decode token.
    pub token_ids: Vec<u32>,
    /// Position of `token_ids[0]`. K/V for positions `0..start_pos` are already cached.
    pub start_pos: usize,
    /// Physical block ids covering positions `0..start_pos + token_ids.len()`, in order.
    /// Position `p` lives in block `block_table[p / block_size]`, slot `p % block_size`.
    pub block_table: Vec<u32>,
    pub logits: LogitsWanted,
}

/// A batch for one engine step.
#[derive(Debug, Clone, Default)]
pub struct BatchInput {
    pub seqs: Vec<SeqInput>,
}

/// Logits for one sequence: `rows × vocab_size`, row-major; one row per wanted position.
#[derive(Debug, Clone, Default)]
pub struct SeqLogits {
    pub seq_id: u64,
    pub rows: usize,
    pub data: LogitsRows,
}

/// One sequence's rows of a step's logits: a range of the buffer the whole step's logits
/// came in, shared by every sequence of the step rather than copied out per sequence (with
/// a large vocabulary a step's logits are megabytes: Gemma 3's 262,144 entries make 16 MiB
/// at 16 sequences). Reads as a `[f32]`.
#[derive(Debug, Clone, Default)]
pub struct LogitsRows {
    buf: std::sync::Arc<Vec<f32>>,
    range: std::ops::Range<usize>,
}

impl LogitsRows {
    /// `buf[range]`, sharing `buf` (panics when the range is out of bounds).
    pub fn shared(buf: std::sync::Arc<Vec<f32>>, range: std::ops::Range<usize>) -> Self {
        assert!(
            range.start <= range.end && range.end <= buf.len(),
            "logits range out of bounds"
        );
        Self { buf, range }
    }
}

impl From<Vec<f32>> for LogitsRows {
    fn from(v: Vec<f32>) -> Self {
        let range = 0..v.len();
        Self {
            buf: std::sync::Arc::new(v),
            range,
        }
    }
}

impl std::ops::Deref for LogitsRows {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[self.range.clone()]
    }
}

impl PartialEq for LogitsRows {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("block {block} is out of range (the cache has {num_blocks} blocks)")]
    BadBlock { block: u32, num_blocks: usize },
    #[error("position {pos} exceeds the model's maximum of {max}")]
    PositionTooLarge { pos: usize, max: usize },
    #[error("block table too short for {positions} positions at block size {block_size}")]
    ShortBlockTable { positions: usize, block_size: usize },
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    BadToken { id: u32, vocab: usize },
    #[error("model execution failed: {0}")]
    Backend(String),
}

/// A model with its own paged KV memory.
pub trait ModelRunner: Send {
    fn info(&self) -> &ModelInfo;
    /// Tokens per KV block.
    fn block_size(&self) -> usize;
    /// Number of physical KV blocks the runner allocated.
    fn num_blocks(&self) -> usize;
    /// Run one step: write K/V for every `token_ids` position into its slot, attend over
    /// positions `0..=p` through the block table, and return the wanted logits (same order as
    /// `batch.seqs`, one entry per sequence, `rows == 0` when `LogitsWanted::None`).
    fn execute(&mut self, batch: &BatchInput) -> Result<Vec<SeqLogits>, RunnerError>;
    /// Copy whole blocks (`src -> dst`) — used for copy-on-write when sequences that share a
    /// partially filled block diverge (`n > 1`).
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), RunnerError>;
}
