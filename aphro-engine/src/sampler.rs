//! Token sampling on one row of logits, following vLLM v1's sampler order:
//! allowed ids → bad words → min_tokens → logit bias → penalties → (greedy argmax | temperature
//! → min_p → top_k → top_p → draw).
//!
//! Logprobs are vLLM's default `logprobs_mode = "raw_logprobs"`: the log-softmax of the
//! model's *raw* logits, before any penalty, bias, mask or temperature. Ranks count the
//! candidates whose logprob is `>=` the token's (so the argmax has rank 1), as vLLM does.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha12Rng;

use crate::request::{Logprob, PositionLogprobs, SamplingPlan, TokenMask};

/// A per-sequence random stream. Each random (non-greedy) token consumes exactly one draw,
/// so a seeded sequence samples the same tokens whatever else shares its batch.
#[derive(Debug, Clone)]
pub struct SeqRng(ChaCha12Rng);

impl SeqRng {
    pub fn from_seed(seed: u64) -> Self {
        Self(ChaCha12Rng::seed_from_u64(seed))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        unit_interval(self.0.next_u64())
    }
}

/// Uniform in [0, 1) from the top 53 bits of a random `u64`.
pub fn unit_interval(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Reusable buffers so a step does not allocate per token.
#[derive(Debug, Default)]
pub struct SamplerScratch {
    logits: Vec<f32>,
    order: Vec<u32>,
    marks: Vec<u32>,
}

/// What the sampler needs to know about the sequence it samples for.
pub struct SampleInput<'a> {
    pub plan: &'a SamplingPlan,
    pub prompt: &'a [u32],
    pub output: &'a [u32],
    /// Structured outputs: the tokens the grammar allows here.
    pub grammar_mask: Option<&'a TokenMask>,
}

/// The sampled token and, when requested, its logprobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token_id: u32,
    pub logprobs: Option<PositionLogprobs>,
}

/// Sample one token from `row` (one vocabulary-sized row of raw logits).
pub fn sample(
    row: &[f32],
    input: &SampleInput<'_>,
    rng: &mut SeqRng,
    scratch: &mut SamplerScratch,
) -> Sampled {
    let plan = input.plan;
    let token_id = if plan.greedy && !edits_logits(plan, input) {
        // Nothing changes the logits: no copy of the row (a vocabulary's worth, per
        // sequence and step).
        argmax(row)
    } else {
        edit_and_pick(row, input, rng, scratch)
    };
    // Every token the grammar allows was masked by another rule (min_tokens, bad words,
    // allowed ids): nothing valid remains, so the sequence ends rather than break the grammar.
    let token_id = match input.grammar_mask {
        Some(m) if !m.is_allowed(token_id) => plan
            .eos_token_id
            .or_else(|| plan.all_stop_token_ids.first().copied())
            .unwrap_or(token_id),
        _ => token_id,
    };
    let logprobs = plan.logprobs.map(|k| match &plan.logprob_token_ids {
        Some(ids) => {
            let mut lp = position_logprobs(row, token_id, 0, &mut scratch.order);
            lp.top = ids.iter().map(|&t| token_logprob(row, t)).collect();
            lp
        }
        None => position_logprobs(row, token_id, k, &mut scratch.order),
    });
    Sampled { token_id, logprobs }
}

fn set(l: &mut [f32], t: u32, v: f32) {
    if let Some(x) = l.get_mut(t as usize) {
        *x = v;
    }
}

/// The penalties on tokens already seen; the neutral values (1, 0, 0) leave logits alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    pub repetition: f32,
    pub frequency: f32,
    pub presence: f32,
}

impl Penalties {
    pub const NONE: Penalties = Penalties {
        repetition: 1.0,
        frequency: 0.0,
        presence: 0.0,
    };

    /// Whether these penalties leave every logit as it is.
    pub fn is_neutral(&self) -> bool {
        self.repetition == 1.0 && self.frequency == 0.0 && self.presence == 0.0
    }
}

impl Default for Penalties {
    fn default() -> Self {
        Self::NONE
    }
}

/// The filters on the temperature-scaled distribution before a random draw; the neutral
/// values (`min_p` 0, `top_k` 0, `top_p` 1) keep every candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Truncation {
    pub min_p: f32,
    /// 0 = disabled.
    pub top_k: usize,
    pub top_p: f32,
}

impl Truncation {
    pub const NONE: Truncation = Truncation {
        min_p: 0.0,
        top_k: 0,
        top_p: 1.0,
    };
}

impl Default for Truncation {
    fn default() -> Self {
        Self::NONE
    }
}

impl SamplingPlan {
    pub fn penalties(&self) -> Penalties {
        Penalties {
            repetition: self.repetition_penalty,
            frequency: self.frequency_penalty,
            presence: self.presence_penalty,
        }
    }

    pub fn truncation(&self) -> Truncation {
        Truncation {
            min_p: self.min_p,
            top_k: self.top_k,
            top_p: self.top_p,
        }
    }
}

/// vLLM `apply_penalties`: repetition over prompt+output (divide positive logits, multiply
/// negative ones), frequency (× count) and presence (once) over the output only. `counts` is
/// scratch space.
pub fn apply_penalties(
    l: &mut [f32],
    penalties: Penalties,
    prompt: &[u32],
    output: &[u32],
    counts: &mut Vec<u32>,
) {
    if penalties.is_neutral() {
        return;
    }
    let Penalties {
        repetition: rep,
        frequency: freq,
        presence: pres,
    } = penalties;
    counts.clear();
    counts.resize(l.len(), 0);
    // Bit 31 marks "seen in the prompt"; the low bits count output occurrences.
    const IN_PROMPT: u32 = 1 << 31;
    for &t in prompt {
        if let Some(c) = counts.get_mut(t as usize) {
            *c |= IN_PROMPT;
        }
    }
    for &t in output {
        if let Some(c) = counts.get_mut(t as usize) {
            *c = (*c & IN_PROMPT) | ((*c & !IN_PROMPT) + 1);
        }
    }
    for (x, &c) in l.iter_mut().zip(counts.iter()) {
        if c == 0 {
            continue;
        }
        let n_out = c & !IN_PROMPT;
        if rep != 1.0 {
            *x = if *x > 0.0 { *x / rep } else { *x * rep };
        }
        if n_out > 0 {
            *x -= freq * n_out as f32 + pres;
        }
    }
}

/// Whether any rule of `plan` changes this step's logits before the pick (so greedy
/// sampling must work on a copy).
fn edits_logits(plan: &SamplingPlan, input: &SampleInput<'_>) -> bool {
    input.grammar_mask.is_some()
        || plan.allowed_token_ids.is_some()
        || plan.bad_words_token_ids.iter().any(|w| {
            w.split_last()
                .is_some_and(|(_, prefix)| input.output.ends_with(prefix))
        })
        || (input.output.len() < plan.min_tokens && !plan.all_stop_token_ids.is_empty())
        || !plan.logit_bias.is_empty()
        || !plan.penalties().is_neutral()
}

/// The logits of `row` edited by every rule of the plan (grammar, allowed ids, bad words,
/// min_tokens, bias, penalties) in a scratch copy, then the greedy pick or the random draw.
fn edit_and_pick(
    row: &[f32],
    input: &SampleInput<'_>,
    rng: &mut SeqRng,
    scratch: &mut SamplerScratch,
) -> u32 {
    let plan = input.plan;
    let vocab = row.len();
    let l = &mut scratch.logits;
    l.clear();
    l.extend_from_slice(row);
    if let Some(mask) = input.grammar_mask {
        mask.apply(l);
    }
    if let Some(allowed) = &plan.allowed_token_ids {
        let marks = &mut scratch.marks;
        marks.clear();
        marks.resize(vocab, 0);
        for &t in allowed {
            if let Some(m) = marks.get_mut(t as usize) {
                *m = 1;
            }
        }
        for (x, &m) in l.iter_mut().zip(marks.iter()) {
            if m == 0 {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    for word in &plan.bad_words_token_ids {
        if let Some((&last, prefix)) = word.split_last() {
            if input.output.ends_with(prefix) {
                set(l, last, f32::NEG_INFINITY);
            }
        }
    }
    if input.output.len() < plan.min_tokens {
        for &t in &plan.all_stop_token_ids {
            set(l, t, f32::NEG_INFINITY);
        }
    }
    for &(t, b) in &plan.logit_bias {
        if let Some(x) = l.get_mut(t as usize) {
            *x += b;
        }
    }
    apply_penalties(
        l,
        plan.penalties(),
        input.prompt,
        input.output,
        &mut scratch.marks,
    );

    if plan.greedy {
        argmax(l)
    } else {
        let inv_t = 1.0 / plan.temperature;
        for x in l.iter_mut() {
            *x *= inv_t;
        }
        draw(l, plan.truncation(), rng.next_f64(), &mut scratch.order)
    }
}

/// The first index of the largest value (ties → lowest id, like `torch.argmax`; NaN never
/// wins; all `-inf`/NaN gives 0), in two passes that vectorise — the max over 16 lanes,
/// then the first index holding it — rather than one loop carrying an index, which stays
/// scalar.
fn argmax(l: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = l.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        return 0;
    }
    l.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// min_p → top_k → top_p on temperature-scaled logits `l`, then the token that the uniform
/// draw `u` in [0, 1) lands on. `order` is scratch space.
pub fn draw(l: &mut [f32], trunc: Truncation, u: f64, order: &mut Vec<u32>) -> u32 {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY || max.is_nan() {
        // Everything masked: nothing sensible to draw; the lowest id keeps it deterministic.
        return argmax(l);
    }
    if trunc.min_p > 0.0 {
        // p_i >= min_p * p_max  <=>  l_i - l_max >= ln(min_p).
        let cut = max + trunc.min_p.ln();
        for x in l.iter_mut() {
            if *x < cut {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    let needs_sort = trunc.top_k > 0 || trunc.top_p < 1.0;
    order.clear();
    order.extend((0..l.len() as u32).filter(|&i| l[i as usize] > f32::NEG_INFINITY));
    if needs_sort {
        // Descending by logit, ties by id, so the result does not depend on sort internals.
        order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
        if trunc.top_k > 0 && trunc.top_k < order.len() {
            // Keep every candidate tied with the k-th (vLLM masks `logits < kth`).
            let kth = l[order[trunc.top_k - 1] as usize];
            let keep = order.iter().take_while(|&&i| l[i as usize] >= kth).count();
            order.truncate(keep);
        }
        if trunc.top_p < 1.0 {
            let z: f64 = order
                .iter()
                .map(|&i| ((l[i as usize] - max) as f64).exp())
                .sum();
            let p = trunc.top_p as f64;
            let mut before = 0.0f64;
            let mut keep = 0usize;
            for &i in order.iter() {
                // vLLM removes a token when the ascending cumulative mass up to it is <= 1 - p,
                // i.e. when the mass strictly above it is >= p; the top token always stays.
                if keep > 0 && before >= p {
                    break;
                }
                before += ((l[i as usize] - max) as f64).exp() / z;
                keep += 1;
            }
            order.truncate(keep);
        }
    }
    let z: f64 = order
        .iter()
        .map(|&i| ((l[i as usize] - max) as f64).exp())
        .sum();
    let target = u * z;
    let mut acc = 0.0f64;
    for &i in order.iter() {
        acc += ((l[i as usize] - max) as f64).exp();
        if acc > target {
            return i;
        }
    }
    // Rounding left `target` just past the sum: the last candidate.
    order.last().copied().unwrap_or_else(|| argmax(l))
}

/// Log-softmax of the raw row at `token`, with its rank (1 = the most likely).
pub fn token_logprob(row: &[f32], token: u32) -> Logprob {
    position_logprobs(row, token, 0, &mut Vec::new()).chosen
}

/// Log-softmax of the raw row for `token`, plus the `k` most likely candidates by rank.
pub fn position_logprobs(
    row: &[f32],
    token: u32,
    k: usize,
    order: &mut Vec<u32>,
) -> PositionLogprobs {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = if max.is_finite() {
        max as f64
            + row
                .iter()
                .map(|&x| ((x - max) as f64).exp())
                .sum::<f64>()
                .ln()
    } else {
        max as f64
    };
    let lp = |t: u32| -> f32 {
        row.get(t as usize)
            .map_or(f32::NEG_INFINITY, |&x| (x as f64 - lse) as f32)
    };
    let chosen_lp = lp(token);
    let rank = row
        .iter()
        .filter(|&&x| (x as f64 - lse) as f32 >= chosen_lp)
        .count()
        .max(1);
    let k = k.min(row.len());
    let mut top = Vec::with_capacity(k);
    if k > 0 {
        order.clear();
        order.extend(0..row.len() as u32);
        let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
        if k < order.len() {
            order.select_nth_unstable_by(k - 1, cmp);
            order.truncate(k);
        }
        order.sort_by(cmp);
        for (r, &t) in order.iter().enumerate() {
            if t != token {
                top.push(Logprob {
                    token_id: t,
                    logprob: lp(t),
                    rank: r + 1,
                });
            }
        }
    }
    PositionLogprobs {
        chosen: Logprob {
            token_id: token,
            logprob: chosen_lp,
            rank,
        },
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{SamplingConfig, ValidationLimits};

    fn plan(cfg: SamplingConfig) -> SamplingPlan {
        let limits = ValidationLimits {
            vocab_size: 8,
            max_model_len: 64,
            max_num_seqs: 16,
            max_logprobs: -1,
        };
        cfg.plan(1, &[7], &limits).expect("valid")
    }

    fn run(row: &[f32], cfg: SamplingConfig, output: &[u32], seed: u64) -> Sampled {
        let p = plan(cfg);
        let input = SampleInput {
            plan: &p,
            prompt: &[1],
            output,
            grammar_mask: None,
        };
        sample(
            row,
            &input,
            &mut SeqRng::from_seed(seed),
            &mut SamplerScratch::default(),
        )
    }

    /// The vectorised argmax against the one-loop definition: first index of the strict
    /// maximum, NaN never winning, 0 when nothing beats `-inf`; over lengths that leave a
    /// partial chunk.
    #[test]
    fn argmax_is_the_first_index_of_the_maximum() {
        let reference = |l: &[f32]| {
            let (mut best, mut best_v) = (0usize, f32::NEG_INFINITY);
            for (i, &v) in l.iter().enumerate() {
                if v > best_v {
                    (best, best_v) = (i, v);
                }
            }
            best as u32
        };
        let mut seed = 5u64;
        for n in [1usize, 15, 16, 17, 100, 1000] {
            for trial in 0..20 {
                let mut l: Vec<f32> = (0..n)
                    .map(|_| {
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        // Few distinct values, so ties are common.
                        ((seed >> 40) % 7) as f32 - 3.0
                    })
                    .collect();
                if trial % 4 == 1 {
                    l[(seed as usize) % n] = f32::NAN;
                }
                if trial % 4 == 2 {
                    l.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                }
                if trial % 4 == 3 {
                    l.iter_mut().for_each(|v| *v = f32::NAN);
                }
                assert_eq!(argmax(&l), reference(&l), "{l:?}");
            }
        }
    }

    /// Greedy sampling with no rule that edits the logits reads the row in place; a rule
    /// that leaves the values as they are (a zero bias) takes the copying path: both pick
    /// the same token.
    #[test]
    fn greedy_without_edits_equals_the_editing_path() {
        let row = [0.5, 3.0, 1.0, 3.0, -2.0, 0.0, 2.9, 0.0];
        let plain = run(&row, SamplingConfig::greedy(4), &[], 0).token_id;
        let cfg = SamplingConfig {
            logit_bias: vec![(0, 0.0)],
            ..SamplingConfig::greedy(4)
        };
        let p = plan(cfg.clone());
        let input = SampleInput {
            plan: &p,
            prompt: &[1],
            output: &[],
            grammar_mask: None,
        };
        assert!(edits_logits(&p, &input));
        assert!(!edits_logits(
            &plan(SamplingConfig::greedy(4)),
            &SampleInput {
                plan: &plan(SamplingConfig::greedy(4)),
                ..input
            }
        ));
        assert_eq!(run(&row, cfg, &[], 0).token_id, plain);
        assert_eq!(plain, 1);
    }

    #[test]
    fn greedy_ties_pick_lowest_id() {
        let row = [0.0, 3.0, 1.0, 3.0, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(run(&row, SamplingConfig::greedy(4), &[], 0).token_id, 1);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        // Prompt token 1 is penalized below token 2.
        let row = [0.0, 2.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0];
        let cfg = SamplingConfig {
            repetition_penalty: 2.0,
            ..SamplingConfig::greedy(4)
        };
        assert_eq!(run(&row, cfg, &[], 0).token_id, 2);
        // Negative logits are multiplied: -0.1 * 20 = -2 < -1.
        let row = [-1.0, -0.1, -1.5, -9.0, -9.0, -9.0, -9.0, -9.0];
        let cfg = SamplingConfig {
            repetition_penalty: 20.0,
            ..SamplingConfig::greedy(4)
        };
        assert_eq!(run(&row, cfg, &[], 0).token_id, 0);
    }

    #[test]
    fn frequency_and_presence_use_output_only() {
        let row = [0.0, 2.0, 1.5, 1.8, 0.0, 0.0, 0.0, 0.0];
        // Token 1 is in the prompt only: untouched by presence.
        let cfg = SamplingConfig {
            presence_penalty: 1.0,
            ..SamplingConfig::greedy(8)
        };
        assert_eq!(run(&row, cfg.clone(), &[], 0).token_id, 1);
        assert_eq!(run(&row, cfg, &[1], 0).token_id, 3);
        let cfg = SamplingConfig {
            frequency_penalty: 0.2,
            ..SamplingConfig::greedy(8)
        };
        // 2.0 - 0.2*3 = 1.4 < 1.5.
        assert_eq!(run(&row, cfg, &[1, 1, 1], 0).token_id, 3);
    }

    #[test]
    fn masks_bias_and_min_tokens() {
        let row = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0];
        let cfg = SamplingConfig {
            min_tokens: 2,
            ..SamplingConfig::greedy(8)
        };
        // EOS (7) masked until two tokens exist.
        assert_eq!(run(&row, cfg.clone(), &[0], 0).token_id, 0);
        assert_eq!(run(&row, cfg, &[0, 0], 0).token_id, 7);
        let cfg = SamplingConfig {
            logit_bias: vec![(4, 200.0)],
            ..SamplingConfig::greedy(8)
        };
        assert_eq!(run(&row, cfg, &[], 0).token_id, 4);
        let cfg = SamplingConfig {
            allowed_token_ids: Some(vec![2, 3]),
            ..SamplingConfig::greedy(8)
        };
        assert_eq!(run(&row, cfg, &[], 0).token_id, 2);
        let cfg = SamplingConfig {
            bad_words_token_ids: vec![vec![5, 7]],
            ..SamplingConfig::greedy(8)
        };
        assert_eq!(run(&row, cfg.clone(), &[5], 0).token_id, 0);
        assert_eq!(run(&row, cfg, &[4], 0).token_id, 7);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_argmax() {
        let row = [0.1, 0.2, 2.0, 0.3, 1.9, 0.0, 0.0, 0.0];
        for seed in 0..20 {
            let cfg = SamplingConfig {
                top_k: 1,
                ..SamplingConfig::default()
            };
            assert_eq!(run(&row, cfg, &[], seed).token_id, 2);
            let cfg = SamplingConfig {
                top_p: 1e-6,
                ..SamplingConfig::default()
            };
            assert_eq!(run(&row, cfg, &[], seed).token_id, 2);
        }
        // top_k 2 only ever draws 2 or 4; over many seeds both show up.
        let mut seen = [false; 8];
        for seed in 0..200 {
            let cfg = SamplingConfig {
                top_k: 2,
                ..SamplingConfig::default()
            };
            seen[run(&row, cfg, &[], seed).token_id as usize] = true;
        }
        assert_eq!(seen, [false, false, true, false, true, false, false, false]);
    }

    #[test]
    fn min_p_cuts_unlikely_tokens() {
        let row = [5.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let mut seen = [false; 8];
        for seed in 0..200 {
            let cfg = SamplingConfig {
                min_p: 0.5,
                ..SamplingConfig::default()
            };
            seen[run(&row, cfg, &[], seed).token_id as usize] = true;
        }
        assert_eq!(seen, [true, true, false, false, false, false, false, false]);
    }

    #[test]
    fn logprobs_are_raw_with_ranks() {
        let row = [1.0, 3.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        // A bias flips the sampled token but logprobs stay the raw model's.
        let cfg = SamplingConfig {
            logprobs: Some(2),
            logit_bias: vec![(2, 10.0)],
            ..SamplingConfig::greedy(4)
        };
        let s = run(&row, cfg, &[], 0);
        assert_eq!(s.token_id, 2);
        let lp = s.logprobs.expect("requested");
        let lse = row
            .iter()
            .map(|x: &f32| (*x as f64).exp())
            .sum::<f64>()
            .ln();
        assert_eq!(lp.chosen.token_id, 2);
        assert_eq!(lp.chosen.rank, 2);
        assert!((lp.chosen.logprob as f64 - (2.0 - lse)).abs() < 1e-6);
        // Top-2 = tokens 1 and 2; 2 is the chosen token so only 1 remains in `top`.
        assert_eq!(lp.top.len(), 1);
        assert_eq!((lp.top[0].token_id, lp.top[0].rank), (1, 1));
    }

    #[test]
    fn penalties_count_the_prompt_and_the_output() {
        let (prompt, output) = ([1u32], [2u32, 2]);
        let mut counts = Vec::new();
        let mut l = vec![1.0f32, 4.0, 4.0, -1.0];
        let rep = Penalties {
            repetition: 2.0,
            ..Penalties::NONE
        };
        apply_penalties(&mut l, rep, &prompt, &output, &mut counts);
        assert_eq!(l, vec![1.0, 2.0, 2.0, -1.0]);
        let mut l = vec![1.0f32, 4.0, 4.0, -1.0];
        let freq = Penalties {
            frequency: 0.5,
            presence: 1.0,
            ..Penalties::NONE
        };
        apply_penalties(&mut l, freq, &prompt, &output, &mut counts);
        assert_eq!(
            l,
            vec![1.0, 4.0, 2.0, -1.0],
            "frequency and presence count the output only"
        );
    }
}
