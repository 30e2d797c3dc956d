//! [`ModelRunner`] for the Llama family: owns the paged K/V memory and turns a scheduler
//! batch into one forward pass.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Tensor, TensorPrimitive};

use super::llama::{HiddenTrace, Llama, StepPlan};
use super::ops::{AttnSeq, EngineOps};
use super::ModelError;
use crate::runner::{
    BatchInput, LogitsRows, LogitsWanted, ModelInfo, ModelRunner, RunnerError, SeqLogits,
};

pub struct LlamaRunner<B: EngineOps> {
    model: Llama<B>,
    info: ModelInfo,
    block_size: usize,
    num_blocks: usize,
    /// Per layer, `[num_blocks * block_size, kv_heads * head_dim]`; `None` only mid-step.
    k_cache: Vec<Option<FloatTensor<B>>>,
    v_cache: Vec<Option<FloatTensor<B>>>,
}

/// Bytes one token's K and V take across all layers in a `kv_dtype` pool.
pub fn kv_bytes_per_token(cfg: &super::config::LlamaConfig, kv_dtype: FloatDType) -> usize {
    2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * DType::from(kv_dtype).size()
}

impl<B: EngineOps> LlamaRunner<B> {
    /// Allocate `cache_bytes` worth of KV blocks of `block_size` tokens for `model`.
    pub fn new(model: Llama<B>, cache_bytes: usize, block_size: usize) -> Result<Self, ModelError> {
        Self::with_kv_dtype(model, cache_bytes, block_size, FloatDType::F32)
    }

    /// [`Self::new`] with K/V stored as `kv_dtype` (16-bit pools are for backends whose
    /// `EngineOps` read them, the CubeCL ones; the CPU ops read f32).
    pub fn with_kv_dtype(
        model: Llama<B>,
        cache_bytes: usize,
        block_size: usize,
        kv_dtype: FloatDType,
    ) -> Result<Self, ModelError> {
        let cfg = &model.cfg;
        let kv_w = cfg.num_kv_heads * cfg.head_dim;
        let kv_bytes_per_token = kv_bytes_per_token(cfg, kv_dtype);
        if block_size == 0 {
            return Err(ModelError::Config("block_size must be > 0".into()));
        }
        let num_blocks = cache_bytes / (block_size * kv_bytes_per_token);
        if num_blocks == 0 {
            return Err(ModelError::CacheTooSmall {
                cache_bytes,
                block_bytes: block_size * kv_bytes_per_token,
            });
        }
        let info = ModelInfo {
            architecture: cfg.architecture.clone(),
            vocab_size: cfg.vocab_size,
            num_layers: cfg.num_layers,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            max_position: cfg.max_position,
            eos_token_ids: cfg.eos_token_ids.clone(),
            kv_bytes_per_token,
        };
        let zeros = || {
            Some(
                Tensor::<B, 2>::zeros([num_blocks * block_size, kv_w], model.device())
                    .cast(kv_dtype)
                    .into_primitive()
                    .tensor(),
            )
        };
        let k_cache = (0..cfg.num_layers).map(|_| zeros()).collect();
        let v_cache = (0..cfg.num_layers).map(|_| zeros()).collect();
        Ok(Self {
            model,
            info,
            block_size,
            num_blocks,
            k_cache,
            v_cache,
        })
    }

    pub fn model(&self) -> &Llama<B> {
        &self.model
    }

    fn validate(&self, batch: &BatchInput) -> Result<(), RunnerError> {
        for s in &batch.seqs {
            if s.token_ids.is_empty() {
                return Err(RunnerError::Backend(format!(
                    "sequence {} has no tokens",
                    s.seq_id
                )));
            }
            if let Some(&id) = s
                .token_ids
                .iter()
                .find(|&&id| id as usize >= self.info.vocab_size)
            {
                return Err(RunnerError::BadToken {
                    id,
                    vocab: self.info.vocab_size,
                });
            }
            let end = s.start_pos + s.token_ids.len();
            if end > self.info.max_position {
                return Err(RunnerError::PositionTooLarge {
                    pos: end - 1,
                    max: self.info.max_position,
                });
            }
            let need = end.div_ceil(self.block_size);
            if s.block_table.len() < need {
                return Err(RunnerError::ShortBlockTable {
                    positions: end,
                    block_size: self.block_size,
                });
            }
            if let Some(&b) = s.block_table[..need]
                .iter()
                .find(|&&b| b as usize >= self.num_blocks)
            {
                return Err(RunnerError::BadBlock {
                    block: b,
                    num_blocks: self.num_blocks,
                });
            }
        }
        Ok(())
    }

    /// [`ModelRunner::execute`], optionally recording the residual stream of the step's
    /// last token (parity debugging).
    pub fn execute_traced(
        &mut self,
        batch: &BatchInput,
        trace: Option<&mut HiddenTrace>,
    ) -> Result<Vec<SeqLogits>, RunnerError> {
        self.validate(batch)?;
        let bs = self.block_size;
        let total: usize = batch.seqs.iter().map(|s| s.token_ids.len()).sum();
        let mut tokens = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut slots = Vec::with_capacity(total);
        let mut seqs = Vec::with_capacity(batch.seqs.len());
        let mut logit_rows = Vec::new();
        let mut rows_per_seq = Vec::with_capacity(batch.seqs.len());
        for s in &batch.seqs {
            let q_offset = tokens.len();
            for (i, &id) in s.token_ids.iter().enumerate() {
                let p = s.start_pos + i;
                tokens.push(id);
                positions.push(p);
                slots.push(s.block_table[p / bs] as usize * bs + p % bs);
            }
            let n = s.token_ids.len();
            let rows = match s.logits {
                LogitsWanted::None => 0,
                LogitsWanted::Last => {
                    logit_rows.push(q_offset + n - 1);
                    1
                }
                LogitsWanted::All => {
                    logit_rows.extend(q_offset..q_offset + n);
                    n
                }
            };
            rows_per_seq.push(rows);
            seqs.push(AttnSeq {
                q_offset,
                q_len: n,
                start_pos: s.start_pos,
                block_table: &s.block_table,
            });
        }
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let plan = StepPlan {
            token_ids: &tokens,
            positions: &positions,
            slots: &slots,
            seqs: &seqs,
            logit_rows: &logit_rows,
        };
        let (model, kc, vc) = (&self.model, &mut self.k_cache, &mut self.v_cache);
        // Run the whole step on a pool worker: each op's parallel loop then forks from inside
        // the pool instead of waking it from outside and blocking (hundreds of times a step).
        let logits = rayon::scope(|_| model.forward(&plan, kc, vc, bs, trace))
            .map_err(|e| RunnerError::Backend(e.to_string()))?;
        let vocab = self.info.vocab_size;
        let logits = std::sync::Arc::new(logits);
        let mut out = Vec::with_capacity(batch.seqs.len());
        let mut at = 0;
        for (s, rows) in batch.seqs.iter().zip(rows_per_seq) {
            out.push(SeqLogits {
                seq_id: s.seq_id,
                rows,
                data: LogitsRows::shared(logits.clone(), at * vocab..(at + rows) * vocab),
            });
            at += rows;
        }
        Ok(out)
    }
}

impl<B: EngineOps> ModelRunner for LlamaRunner<B>
where
    FloatTensor<B>: Send,
{
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn execute(&mut self, batch: &BatchInput) -> Result<Vec<SeqLogits>, RunnerError> {
        self.execute_traced(batch, None)
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), RunnerError> {
        let n = self.num_blocks;
        if let Some(&b) = pairs
            .iter()
            .flat_map(|(a, b)| [a, b])
            .find(|&&b| b as usize >= n)
        {
            return Err(RunnerError::BadBlock {
                block: b,
                num_blocks: n,
            });
        }
        if pairs.is_empty() {
            return Ok(());
        }
        let bs = self.block_size;
        let mut src_slots = Vec::with_capacity(pairs.len() * bs);
        let mut dst_slots = Vec::with_capacity(pairs.len() * bs);
        for &(s, d) in pairs {
            src_slots.extend((0..bs).map(|i| s as usize * bs + i));
            dst_slots.extend((0..bs).map(|i| d as usize * bs + i));
        }
        for cache in self.k_cache.iter_mut().chain(self.v_cache.iter_mut()) {
            let c = cache
                .take()
                .ok_or_else(|| RunnerError::Backend("KV cache missing".into()))?;
            let t: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(c.clone()));
            let device = t.device();
            let idx: Vec<i64> = src_slots.iter().map(|&s| s as i64).collect();
            let idx = Tensor::<B, 1, burn::tensor::Int>::from_data(
                burn::tensor::TensorData::new(idx, [src_slots.len()]),
                &device,
            );
            let rows = t.select(0, idx).into_primitive().tensor();
            *cache = Some(B::reshape_and_cache(c, rows, &dst_slots));
        }
        Ok(())
    }
}
