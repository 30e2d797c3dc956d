//! Deterministic random data for the crate's unit tests (one LCG, so every test's inputs
//! are reproducible from its seed).

/// Next 31 random bits of a 64-bit LCG (Knuth's MMIX constants).
pub fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

/// `n` values uniform in `[-0.5, 0.5)`.
pub fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| (lcg(seed) >> 7) as f32 / (1u32 << 24) as f32 - 0.5)
        .collect()
}
