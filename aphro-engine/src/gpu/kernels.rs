//! CubeCL kernels of the engine, generic over the CubeCL runtime (CUDA, wgpu) and over the
//! float types of the activations (`F`) and of the K/V pool (`K`: f32, f16 or bf16). All
//! arithmetic is f32. Index math mirrors [`super::layout`], where it is tested in plain Rust.

// The launch functions the macro generates take one argument per kernel parameter.
#![allow(clippy::too_many_arguments)]

use cubecl::prelude::*;

/// Paged attention of one (query row, query head) per cube. The cube's `units` lanes split
/// the keys `0..=pos` round-robin, each keeping an online-softmax state (running max, sum
/// and a `head_dim` accumulator) in registers, and merge them through shared memory at the
/// end. Decode rows and prefill rows (causal over the chunk plus cached blocks) are the
/// same thing here: a row attends to every key up to its own position, or with a sliding
/// `window` (0: none) to the `window` keys ending there.
///
/// Launch: `CubeCount(num_heads, tokens, 1)`, `CubeDim(units, 1, 1)`.
#[cube(launch)]
pub fn paged_attention_kernel<F: Float, K: Float>(
    q: &Tensor<F>,
    k_cache: &Tensor<K>,
    v_cache: &Tensor<K>,
    row_seq: &Tensor<u32>,
    row_pos: &Tensor<u32>,
    block_tables: &Tensor<u32>,
    out: &mut Tensor<F>,
    scale: f32,
    window: u32,
    #[comptime] head_dim: usize,
    #[comptime] group: usize,
    #[comptime] block_size: usize,
    #[comptime] units: usize,
    #[define(F, K)] _dtypes: [StorageType; 2],
) {
    let head = CUBE_POS_X as usize;
    let row = CUBE_POS_Y as usize;
    let lane = UNIT_POS_X as usize;
    let o_base = row * out.stride(0) + head * head_dim * out.stride(1);
    let seq = row_seq[row];
    if seq == 0xFFFF_FFFFu32 {
        // A row outside every sequence: zeros, like the CPU paths.
        let mut j = lane;
        while j < head_dim {
            out[o_base + j * out.stride(1)] = F::new(0.0);
            j += units;
        }
        terminate!();
    }
    let pos = row_pos[row] as usize;
    let kv_col = (head / group) * head_dim;

    let mut qv = Array::<f32>::new(head_dim);
    let mut acc = Array::<f32>::new(head_dim);
    let q_base = row * q.stride(0) + head * head_dim * q.stride(1);
    for j in 0..head_dim {
        qv[j] = f32::cast_from(q[q_base + j * q.stride(1)]) * scale;
        acc[j] = f32::new(0.0);
    }

    let bt_base = seq as usize * block_tables.stride(0);
    let mut m = f32::new(-1.0e30);
    let mut l = f32::new(0.0);
    let mut p = lane;
    // The row's first key inside its sliding window (0 without one).
    let w = window as usize;
    let mut first = 0usize;
    if pos + 1 > w {
        first = pos + 1 - w;
    }
    if w == 0 {
        first = 0;
    }
    p += first;
    while p <= pos {
        let block = block_tables[bt_base + (p / block_size) * block_tables.stride(1)] as usize;
        let slot = block * block_size + p % block_size;
        let kb = slot * k_cache.stride(0) + kv_col * k_cache.stride(1);
        let vb = slot * v_cache.stride(0) + kv_col * v_cache.stride(1);
        let mut s = f32::new(0.0);
        for j in 0..head_dim {
            s += qv[j] * f32::cast_from(k_cache[kb + j * k_cache.stride(1)]);
        }
        let m_new = cubecl::prelude::select(s > m, s, m);
        let corr = (m - m_new).exp();
        let w = (s - m_new).exp();
        l = l * corr + w;
        for j in 0..head_dim {
            acc[j] = acc[j] * corr + w * f32::cast_from(v_cache[vb + j * v_cache.stride(1)]);
        }
        m = m_new;
        p += units;
    }

    let mut sh_m = SharedMemory::<f32>::new(units);
    let mut sh_l = SharedMemory::<f32>::new(units);
    let mut sh_acc = SharedMemory::<f32>::new(comptime!(units * head_dim));
    sh_m[lane] = m;
    sh_l[lane] = l;
    for j in 0..head_dim {
        sh_acc[lane * head_dim + j] = acc[j];
    }
    sync_cube();

    let mut mx = f32::new(-1.0e30);
    for i in 0..units {
        mx = cubecl::prelude::select(sh_m[i] > mx, sh_m[i], mx);
    }
    let mut denom = f32::new(0.0);
    for i in 0..units {
        denom += sh_l[i] * (sh_m[i] - mx).exp();
    }
    let mut j = lane;
    while j < head_dim {
        let mut num = f32::new(0.0);
        for i in 0..units {
            num += sh_acc[i * head_dim + j] * (sh_m[i] - mx).exp();
        }
        out[o_base + j * out.stride(1)] = F::cast_from(num / denom);
        j += units;
    }
}

/// `cache[slots[r], :] = new[r, :]` (converted to the pool's type), one element per unit.
#[cube(launch)]
pub fn scatter_rows_kernel<F: Float, K: Float>(
    new: &Tensor<F>,
    slots: &Tensor<u32>,
    cache: &mut Tensor<K>,
    #[define(F, K)] _dtypes: [StorageType; 2],
) {
    let width = new.shape(1);
    if ABSOLUTE_POS >= new.shape(0) * width {
        terminate!();
    }
    let r = ABSOLUTE_POS / width;
    let c = ABSOLUTE_POS % width;
    let slot = slots[r] as usize;
    cache[slot * cache.stride(0) + c * cache.stride(1)] =
        K::cast_from(new[r * new.stride(0) + c * new.stride(1)]);
}
