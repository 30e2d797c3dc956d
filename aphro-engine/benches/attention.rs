//! The CPU paged-attention kernel alone, at SmolLM2-135M's shape (9 query heads, 3 KV heads,
//! head dim 64, 16-token blocks): one layer's attention for a prefill chunk at a given
//! context, and for decode rows at 2k and 8k context. Prints a Markdown table of time per
//! call and the arithmetic rate (QKᵀ and PV multiply-adds, causal), so a kernel change shows
//! where it moves. `cargo bench -p aphro-engine --bench attention` (`RAYON_NUM_THREADS` for
//! threads).

use std::time::Instant;

use aphro_engine::model::flash::{paged_attention, KvElement};
use aphro_engine::model::ops::{AttnSeq, AttnShape};

fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// One case: `(name, [(start_pos, q_len)] per sequence)`; every sequence owns its own blocks.
/// `T` is the cache element (`f32`, or `half::f16` / `half::bf16` as `--kv-cache-dtype
/// float16 | bfloat16` stores it; a bf16 cache takes the AVX-512 BF16 kernels where the CPU has
/// them).
/// Cases whose name contains one of the command line's words run (all without words), so a
/// profile can cover one case: `cargo bench ... --bench attention -- "bf16 cache"`.
fn run<T: KvElement>(name: &str, seqs: &[(usize, usize)], shape: &AttnShape, seed: &mut u64) {
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if !words.is_empty() && !words.iter().any(|w| name.contains(w.as_str())) {
        return;
    }
    let (h, kvh, d, bs) = (
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
        shape.block_size,
    );
    let blocks_each: Vec<usize> = seqs.iter().map(|&(s, l)| (s + l).div_ceil(bs)).collect();
    let total_blocks: usize = blocks_each.iter().sum();
    let store = |x: Vec<f32>| x.into_iter().map(T::from_f32).collect::<Vec<T>>();
    let kc = store(rand(total_blocks * bs * kvh * d, seed));
    let vc = store(rand(total_blocks * bs * kvh * d, seed));
    let mut tables = Vec::new();
    let mut next = 0u32;
    for &n in &blocks_each {
        tables.push((next..next + n as u32).collect::<Vec<u32>>());
        next += n as u32;
    }
    let rows: usize = seqs.iter().map(|&(_, l)| l).sum();
    let q = rand(rows * h * d, seed);
    let mut offset = 0;
    let attn: Vec<AttnSeq<'_>> = seqs
        .iter()
        .zip(&tables)
        .map(|(&(start, len), table)| {
            let s = AttnSeq {
                q_offset: offset,
                q_len: len,
                start_pos: start,
                block_table: table,
            };
            offset += len;
            s
        })
        .collect();
    // Causal query-key pairs, times heads, times 2 multiply-adds (QKᵀ and PV) of `d` each.
    let pairs: f64 = seqs
        .iter()
        .map(|&(s, l)| (0..l).map(|r| (s + r + 1) as f64).sum::<f64>())
        .sum();
    let flops = pairs * h as f64 * d as f64 * 4.0;
    let _ = paged_attention(&q, &kc, &vc, &attn, shape);
    let mut best = f64::MAX;
    let start = Instant::now();
    let mut reps = 0;
    while reps < 3 || (start.elapsed().as_secs_f64() < 2.0 && reps < 200) {
        let t = Instant::now();
        std::hint::black_box(paged_attention(&q, &kc, &vc, &attn, shape));
        best = best.min(t.elapsed().as_secs_f64());
        reps += 1;
    }
    println!("| {name} | {:.3} | {:.1} |", best * 1e3, flops / best / 1e9);
}

fn main() {
    let shape = AttnShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        block_size: 16,
        scale: 0.125,
        window: None,
    };
    let mut seed = 7;
    println!(
        "threads: {}\n\n| one layer's attention | ms (best) | GFLOP/s |\n| --- | ---: | ---: |",
        rayon::current_num_threads()
    );
    run::<f32>("prefill 512 from 0", &[(0, 512)], &shape, &mut seed);
    run::<f32>("prefill 2048 from 0", &[(0, 2048)], &shape, &mut seed);
    run::<half::f16>(
        "prefill 2048 from 0, f16 cache",
        &[(0, 2048)],
        &shape,
        &mut seed,
    );
    run::<half::bf16>(
        "prefill 2048 from 0, bf16 cache",
        &[(0, 2048)],
        &shape,
        &mut seed,
    );
    run::<f32>(
        "prefill chunk 512 at 7680",
        &[(7680, 512)],
        &shape,
        &mut seed,
    );
    run::<half::f16>(
        "prefill chunk 512 at 7680, f16 cache",
        &[(7680, 512)],
        &shape,
        &mut seed,
    );
    run::<half::bf16>(
        "prefill chunk 512 at 7680, bf16 cache",
        &[(7680, 512)],
        &shape,
        &mut seed,
    );
    run::<f32>("decode 1 row at 2048", &[(2047, 1)], &shape, &mut seed);
    run::<f32>("decode 1 row at 8192", &[(8191, 1)], &shape, &mut seed);
    run::<f32>("decode 8 rows at 2048", &[(2047, 1); 8], &shape, &mut seed);
    run::<f32>(
        "decode 1 row at 8192 + chunk 16 at 8000",
        &[(8191, 1), (8000, 16)],
        &shape,
        &mut seed,
    );
}
