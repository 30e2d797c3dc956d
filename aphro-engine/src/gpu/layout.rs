//! Host-side launch metadata of the paged-attention kernel, and the kernel's index math
//! written once in plain Rust so it can be checked without a GPU.
//!
//! The K/V pool keeps the engine's layout (see [`crate::model::ops::EngineOps`]): one row
//! per slot, `[num_blocks * block_size, num_kv_heads * head_dim]`, slot
//! `block_table[pos / block_size] * block_size + pos % block_size`. The kernel reads it in
//! place through these tables; nothing is gathered into a contiguous copy.

use crate::model::ops::{AttnSeq, AttnShape};

/// Marks a query row that belongs to no sequence (the kernel writes zeros there).
pub const NO_SEQ: u32 = u32::MAX;

/// What the kernel reads besides Q and the K/V pool, flattened into `u32` arrays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagedMeta {
    /// Per query row: its sequence's index in `seqs` ([`NO_SEQ`] if none).
    pub row_seq: Vec<u32>,
    /// Per query row: its absolute position; it attends to keys `0..=pos` (causal).
    pub row_pos: Vec<u32>,
    /// `[num_seqs, max_blocks]` block tables, rows padded with 0 (never read: a row only
    /// reads the blocks covering `0..=pos`).
    pub block_tables: Vec<u32>,
    pub max_blocks: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("sequence {seq}: query rows {start}..{end} exceed the step's {tokens} rows")]
    RowsOutOfRange {
        seq: usize,
        start: usize,
        end: usize,
        tokens: usize,
    },
    #[error("sequence {seq}: {positions} positions need {need} blocks, the table has {have}")]
    ShortTable {
        seq: usize,
        positions: usize,
        need: usize,
        have: usize,
    },
    #[error("position {0} does not fit the kernel's 32-bit indices")]
    TooLarge(usize),
}

impl PagedMeta {
    /// Flatten `seqs` for a step of `tokens` query rows.
    pub fn build(
        tokens: usize,
        seqs: &[AttnSeq<'_>],
        block_size: usize,
    ) -> Result<Self, MetaError> {
        let mut row_seq = vec![NO_SEQ; tokens];
        let mut row_pos = vec![0u32; tokens];
        let mut max_blocks = 1;
        for (si, s) in seqs.iter().enumerate() {
            let end = s.q_offset + s.q_len;
            if end > tokens {
                return Err(MetaError::RowsOutOfRange {
                    seq: si,
                    start: s.q_offset,
                    end,
                    tokens,
                });
            }
            let positions = s.start_pos + s.q_len;
            let need = positions.div_ceil(block_size);
            if s.block_table.len() < need {
                return Err(MetaError::ShortTable {
                    seq: si,
                    positions,
                    need,
                    have: s.block_table.len(),
                });
            }
            if positions > u32::MAX as usize / 2 {
                return Err(MetaError::TooLarge(positions));
            }
            max_blocks = max_blocks.max(need);
            for i in 0..s.q_len {
                row_seq[s.q_offset + i] = si as u32;
                row_pos[s.q_offset + i] = (s.start_pos + i) as u32;
            }
        }
        let mut block_tables = vec![0u32; seqs.len() * max_blocks];
        for (si, s) in seqs.iter().enumerate() {
            let need = (s.start_pos + s.q_len).div_ceil(block_size);
            block_tables[si * max_blocks..si * max_blocks + need]
                .copy_from_slice(&s.block_table[..need]);
        }
        Ok(Self {
            row_seq,
            row_pos,
            block_tables,
            max_blocks,
        })
    }

    /// Cache row of position `pos` of sequence `seq` (the kernel's formula).
    pub fn slot(&self, seq: usize, pos: usize, block_size: usize) -> usize {
        self.block_tables[seq * self.max_blocks + pos / block_size] as usize * block_size
            + pos % block_size
    }
}

/// The KV head query head `head` reads under grouped-query attention.
pub fn kv_head(head: usize, shape: &AttnShape) -> usize {
    head / (shape.num_heads / shape.num_kv_heads)
}

/// The kernel's algorithm on the host, step for step: `units` lanes per (row, head) each
/// run an online softmax over keys `lane, lane + units, …`, then the lanes' partial states
/// are merged. Used to test the index math and the merge against the reference.
pub fn paged_attention_host(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    meta: &PagedMeta,
    shape: &AttnShape,
    units: usize,
) -> Vec<f32> {
    let (h, d) = (shape.num_heads, shape.head_dim);
    let kv_w = shape.num_kv_heads * d;
    let tokens = meta.row_seq.len();
    let mut out = vec![0f32; tokens * h * d];
    for row in 0..tokens {
        let seq = meta.row_seq[row];
        if seq == NO_SEQ {
            continue;
        }
        let pos = meta.row_pos[row] as usize;
        for head in 0..h {
            let col = kv_head(head, shape) * d;
            let qv: Vec<f32> = q[row * h * d + head * d..][..d]
                .iter()
                .map(|x| x * shape.scale)
                .collect();
            let mut lanes = Vec::with_capacity(units);
            for lane in 0..units {
                let (mut m, mut l) = (NEG_BIG, 0f32);
                let mut acc = vec![0f32; d];
                // The first key in the sliding window, as the kernel skips to it.
                let mut p = lane + shape.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                while p <= pos {
                    let off = meta.slot(seq as usize, p, shape.block_size) * kv_w + col;
                    let s: f32 = qv
                        .iter()
                        .zip(&k_cache[off..off + d])
                        .map(|(a, b)| a * b)
                        .sum();
                    let m_new = m.max(s);
                    let (corr, w) = ((m - m_new).exp(), (s - m_new).exp());
                    l = l * corr + w;
                    for (a, v) in acc.iter_mut().zip(&v_cache[off..off + d]) {
                        *a = *a * corr + w * v;
                    }
                    m = m_new;
                    p += units;
                }
                lanes.push((m, l, acc));
            }
            let mx = lanes.iter().fold(NEG_BIG, |a, (m, _, _)| a.max(*m));
            let denom: f32 = lanes.iter().map(|(m, l, _)| l * (m - mx).exp()).sum();
            for j in 0..d {
                let num: f32 = lanes
                    .iter()
                    .map(|(m, _, acc)| acc[j] * (m - mx).exp())
                    .sum();
                out[row * h * d + head * d + j] = num / denom;
            }
        }
    }
    out
}

/// The running max's start value: finite, because WGSL has no infinity literal, and far
/// below any score so `exp(NEG_BIG - m)` is exactly 0.
pub const NEG_BIG: f32 = -1.0e30;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::reference;
    use burn::backend::flex::{Flex, FlexTensor};
    use burn::tensor::TensorData;

    use crate::test_support::rand;

    #[test]
    fn meta_flattens_tables_and_positions() {
        let (t1, t2) = ([7u32, 2, 9, 5], [4u32, 1]);
        let seqs = [
            AttnSeq {
                q_offset: 0,
                q_len: 3,
                start_pos: 6,
                block_table: &t1,
            },
            AttnSeq {
                q_offset: 4,
                q_len: 1,
                start_pos: 4,
                block_table: &t2,
            },
        ];
        let m = PagedMeta::build(5, &seqs, 4).expect("valid");
        // Positions 6..9 need 3 blocks (the 4th table entry is unused), 4..5 need 2.
        assert_eq!(m.max_blocks, 3);
        assert_eq!(m.block_tables, vec![7, 2, 9, 4, 1, 0]);
        assert_eq!(m.row_seq, vec![0, 0, 0, NO_SEQ, 1]);
        assert_eq!(m.row_pos, vec![6, 7, 8, 0, 4]);
        // Position 8 of seq 0 is block 9 (third entry), offset 0; position 5 is block 2.
        assert_eq!(m.slot(0, 8, 4), 36);
        assert_eq!(m.slot(0, 5, 4), 9);
        assert_eq!(m.slot(1, 4, 4), 4);
        let short = [AttnSeq {
            q_offset: 0,
            q_len: 2,
            start_pos: 7,
            block_table: &t2,
        }];
        assert!(matches!(
            PagedMeta::build(2, &short, 4),
            Err(MetaError::ShortTable {
                need: 3,
                have: 2,
                ..
            })
        ));
        assert!(matches!(
            PagedMeta::build(1, &short, 4),
            Err(MetaError::RowsOutOfRange { .. })
        ));
    }

    #[test]
    fn gqa_maps_query_groups_to_kv_heads() {
        let shape = AttnShape {
            num_heads: 8,
            num_kv_heads: 2,
            head_dim: 4,
            block_size: 4,
            scale: 1.0,
            window: None,
        };
        let got: Vec<usize> = (0..8).map(|h| kv_head(h, &shape)).collect();
        assert_eq!(got, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    }

    /// The kernel's split-lane online softmax equals the plain reference for decode rows,
    /// prefill over a cached prefix, partial last blocks and every lane count.
    #[test]
    fn host_kernel_matches_reference() {
        let mut seed = 5;
        let shape = AttnShape {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim: 8,
            block_size: 4,
            scale: 0.3,
            window: None,
        };
        let (nb, kv_w) = (16, 16);
        let kc = rand(nb * 4 * kv_w, &mut seed);
        let vc = rand(nb * 4 * kv_w, &mut seed);
        let (t1, t2, t3) = ([11u32, 3, 14, 0], [6u32], [9u32, 1, 2]);
        let seqs = [
            // Prefill of 5 tokens after a cached prefix of 6 (ends inside block 3).
            AttnSeq {
                q_offset: 0,
                q_len: 5,
                start_pos: 6,
                block_table: &t1,
            },
            // Decode at position 2 (first block only, partially filled).
            AttnSeq {
                q_offset: 5,
                q_len: 1,
                start_pos: 2,
                block_table: &t2,
            },
            // Decode at position 8 (one key in the last block).
            AttnSeq {
                q_offset: 6,
                q_len: 1,
                start_pos: 8,
                block_table: &t3,
            },
        ];
        let tokens = 7;
        let q = rand(tokens * 6 * 8, &mut seed);
        let meta = PagedMeta::build(tokens, &seqs, 4).expect("valid");
        let flex = |v: &[f32], s: [usize; 2]| FlexTensor::from_data(TensorData::new(v.to_vec(), s));
        // Without a window, and with one that cuts inside a block.
        for window in [None, Some(3)] {
            let shape = AttnShape { window, ..shape };
            let want = reference::paged_attention::<Flex>(
                flex(&q, [tokens, 48]),
                &flex(&kc, [nb * 4, kv_w]),
                &flex(&vc, [nb * 4, kv_w]),
                &seqs,
                &shape,
            )
            .into_data()
            .to_vec::<f32>()
            .expect("f32");
            for units in [1, 3, 32] {
                let got = paged_attention_host(&q, &kc, &vc, &meta, &shape, units);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "units {units} window {window:?} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }
}
