//! Decoding one 30 s window as CTranslate2's `Whisper.generate` does for faster-whisper
//! 1.2.1 (`src/models/whisper.cc`, `src/decoding.cc`): the prompt runs through the decoder
//! at once; `no_speech_prob` is the softmax of the raw logits at `<|startoftranscript|>`;
//! every step then suppresses `suppress_ids` (and `suppress_ids_begin` at the first step),
//! applies Whisper's timestamp rules, and picks the best token of the log-softmax (or samples
//! from it at a temperature). The score of a sequence is the sum of the chosen tokens'
//! log-probabilities, the final `<|endoftext|>` included.

use rand_chacha::rand_core::RngCore;
use rand_chacha::ChaCha8Rng;

use super::batch::StepBatcher;
use super::model::{DecoderState, WhisperNetwork};
use super::tokens::SpecialTokens;
use crate::sampler::{apply_penalties, draw, unit_interval, Penalties, Truncation};

/// How a window is decoded.
pub(crate) struct DecodeRules<'a> {
    pub special: &'a SpecialTokens,
    /// Always suppressed (`suppress_ids` plus the task/control tokens).
    pub suppress: &'a [u32],
    /// Suppressed at the first step (`suppress_ids_begin`: blank and `<|endoftext|>`).
    pub suppress_begin: &'a [u32],
    /// Timestamp tokens on (the prompt does not end with `<|notimestamps|>`).
    pub timestamps: bool,
    /// Index of the last timestamp allowed first (`max_initial_timestamp / 0.02`).
    pub max_initial_timestamp_index: u32,
    pub max_new_tokens: usize,
    /// 0: greedy (the truncation is then moot; penalties still apply, as in vLLM).
    pub temperature: f32,
    pub truncation: Truncation,
    pub penalties: Penalties,
}

/// Where a window's decoding steps run: on `pool`, batched with other transcriptions'
/// steps through `batcher` when there is one.
pub(crate) struct Stepper<'a> {
    pub pool: &'a rayon::ThreadPool,
    pub batcher: Option<&'a StepBatcher>,
}

/// The outcome of one window.
#[derive(Debug, Clone)]
pub(crate) struct WindowResult {
    /// Generated ids, the final `<|endoftext|>` excluded.
    pub tokens: Vec<u32>,
    /// Sum of the chosen tokens' log-probabilities (with `<|endoftext|>` when it was chosen).
    pub sum_logprob: f64,
    pub no_speech_prob: f64,
}

/// Decode after `prompt` (which contains `<|startoftranscript|>` at `sot_index`). The state
/// must hold this window's cross-attention keys/values ([`WhisperNetwork::begin_window`]).
pub(crate) fn decode_window(
    model: &dyn WhisperNetwork,
    state: &mut DecoderState,
    prompt: &[u32],
    sot_index: usize,
    rules: &DecodeRules<'_>,
    rng: &mut ChaCha8Rng,
    stepper: &Stepper<'_>,
) -> WindowResult {
    let sp = rules.special;
    let no_speech_prob = stepper.pool.install(|| {
        model.truncate(state, 0);
        model.decode(state, prompt);
        let last = prompt.len() - 1;
        model.logits(state, sot_index);
        let no_speech_prob = softmax_at(&state.logits, sp.no_speech as usize);
        if sot_index != last {
            model.logits(state, last);
        }
        no_speech_prob
    });
    let mut tokens: Vec<u32> = Vec::with_capacity(rules.max_new_tokens);
    let mut scratch = PickScratch::default();
    let mut sum_logprob = 0f64;
    let _member = stepper.batcher.map(StepBatcher::join);
    for step in 0..rules.max_new_tokens {
        if step > 0 {
            let token = tokens[tokens.len() - 1];
            match stepper.batcher {
                Some(b) => b.step(model, stepper.pool, state, token),
                None => stepper.pool.install(|| {
                    model.decode(state, &[token]);
                    model.logits(state, 0);
                }),
            }
        }
        let logits = &mut state.logits;
        // CTranslate2's processor order: penalties first, then suppression and timestamps.
        // Its penalties count the tokens generated in this window, not the prompt (which
        // holds the previous window's text).
        apply_penalties(logits, rules.penalties, &[], &tokens, &mut scratch.counts);
        for &t in rules.suppress {
            mask(logits, t);
        }
        if step == 0 {
            for &t in rules.suppress_begin {
                mask(logits, t);
            }
        }
        if rules.timestamps {
            apply_timestamp_rules(logits, &tokens, step, rules);
        }
        let (token, logprob) = pick(logits, rules, rng, &mut scratch);
        sum_logprob += logprob;
        if token == sp.eot {
            break;
        }
        tokens.push(token);
    }
    WindowResult {
        tokens,
        sum_logprob,
        no_speech_prob,
    }
}

fn mask(logits: &mut [f32], t: u32) {
    if let Some(v) = logits.get_mut(t as usize) {
        *v = f32::NEG_INFINITY;
    }
}

fn mask_range(logits: &mut [f32], from: usize, to: usize) {
    let to = to.min(logits.len());
    if from < to {
        logits[from..to].fill(f32::NEG_INFINITY);
    }
}

/// CTranslate2's `ApplyTimestampRules` for a decode without a forced prefix (the first
/// generated token is step 0).
fn apply_timestamp_rules(logits: &mut [f32], tokens: &[u32], step: usize, rules: &DecodeRules<'_>) {
    let sp = rules.special;
    let (eot, ts_begin, ts_end) = (
        sp.eot as usize,
        sp.timestamp_begin as usize,
        sp.timestamp_end() as usize,
    );
    mask(logits, sp.no_timestamps);
    if step == 0 {
        // The first token is a timestamp, at most max_initial_timestamp.
        mask_range(logits, 0, ts_begin);
        mask_range(
            logits,
            ts_begin + rules.max_initial_timestamp_index as usize + 1,
            ts_end + 1,
        );
        return;
    }
    let last = tokens[step - 1] as usize;
    let mut check_timestamp_prob = false;
    if last >= ts_begin {
        let penultimate = if step >= 2 {
            tokens[step - 2] as usize
        } else {
            last
        };
        if penultimate >= ts_begin {
            // A pair is complete: the next token is text (or the end).
            mask_range(logits, ts_begin, ts_end + 1);
        } else {
            // An opening timestamp: the next is its closing timestamp (not earlier) or EOT.
            mask_range(logits, 0, eot);
            mask_range(logits, ts_begin, last);
            check_timestamp_prob = true;
        }
    } else {
        check_timestamp_prob = true;
        // Timestamps never decrease.
        if let Some(&t) = tokens.iter().rev().find(|&&t| t as usize >= ts_begin) {
            mask_range(logits, ts_begin, t as usize + 1);
        }
    }
    if check_timestamp_prob {
        // When the timestamps' total probability beats every single text token, force a
        // timestamp. Both sides share the softmax normalizer, so compare in logit space.
        let max_text = logits[..ts_begin]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let ts_logsumexp = logsumexp(&logits[ts_begin..=ts_end.min(logits.len() - 1)]);
        if ts_logsumexp > max_text as f64 {
            mask_range(logits, 0, ts_begin);
        }
    }
}

fn logsumexp(v: &[f32]) -> f64 {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let sum: f64 = v.iter().map(|&x| ((x - max) as f64).exp()).sum();
    max as f64 + sum.ln()
}

fn softmax_at(logits: &[f32], i: usize) -> f64 {
    let lse = logsumexp(logits);
    logits.get(i).map_or(0.0, |&x| (x as f64 - lse).exp())
}

/// Buffers [`pick`] reuses across the steps of a window.
#[derive(Default)]
struct PickScratch {
    scaled: Vec<f32>,
    order: Vec<u32>,
    counts: Vec<u32>,
}

/// The next token and its log-probability under the (penalized, masked) distribution, as
/// CTranslate2 scores it: the argmax (the first on ties), or at `temperature > 0` a draw
/// through the engine's sampler (min_p → top_k → top_p on the scaled logits).
fn pick(
    logits: &[f32],
    rules: &DecodeRules<'_>,
    rng: &mut ChaCha8Rng,
    scratch: &mut PickScratch,
) -> (u32, f64) {
    let lse = logsumexp(logits);
    let best = if rules.temperature > 0.0 {
        let inv_t = 1.0 / rules.temperature;
        scratch.scaled.clear();
        scratch.scaled.extend(logits.iter().map(|&x| x * inv_t));
        let u = unit_interval(rng.next_u64());
        draw(&mut scratch.scaled, rules.truncation, u, &mut scratch.order) as usize
    } else {
        let mut best = 0;
        for (i, &x) in logits.iter().enumerate() {
            if x > logits[best] {
                best = i;
            }
        }
        best
    };
    (best as u32, logits[best] as f64 - lse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;

    fn special() -> SpecialTokens {
        // A toy vocabulary: text 0..10, eot 10, sot 11, …, no_timestamps 17, timestamps 18..30.
        SpecialTokens {
            eot: 10,
            sot: 11,
            translate: 12,
            transcribe: 13,
            sot_lm: 14,
            sot_prev: 15,
            no_speech: 16,
            no_timestamps: 17,
            timestamp_begin: 18,
            n_vocab: 30,
            languages: vec![],
        }
    }

    fn rules(sp: &SpecialTokens) -> DecodeRules<'_> {
        DecodeRules {
            special: sp,
            suppress: &[],
            suppress_begin: &[],
            timestamps: true,
            max_initial_timestamp_index: 2,
            max_new_tokens: 10,
            temperature: 0.0,
            truncation: Truncation::NONE,
            penalties: Penalties::NONE,
        }
    }

    fn allowed(logits: &[f32]) -> Vec<usize> {
        (0..logits.len())
            .filter(|&i| logits[i] > f32::NEG_INFINITY)
            .collect()
    }

    #[test]
    fn first_token_is_an_early_timestamp() {
        let sp = special();
        let mut l = vec![0f32; 30];
        apply_timestamp_rules(&mut l, &[], 0, &rules(&sp));
        assert_eq!(allowed(&l), vec![18, 19, 20]);
    }

    #[test]
    fn timestamps_pair_and_never_decrease() {
        let sp = special();
        let r = rules(&sp);
        // After text following <|0.04|>: text, eot, or a timestamp ≥ 0.06 (ids > 20). A
        // strong text token keeps the timestamps from being forced.
        let mut l = vec![0f32; 30];
        l[3] = 5.0;
        apply_timestamp_rules(&mut l, &[20, 3], 2, &r);
        let a = allowed(&l);
        assert!(a.contains(&3) && a.contains(&10) && a.contains(&21) && !a.contains(&20));
        assert!(!a.contains(&17), "<|notimestamps|> is never allowed");
        // After an opening timestamp: only EOT, specials and timestamps not before it.
        let mut l = vec![0f32; 30];
        l[5] = 10.0; // a strong text token does not matter here
        l[10] = 5.0; // a likely end keeps the timestamps from being forced
        apply_timestamp_rules(&mut l, &[20, 3, 24], 3, &r);
        let a = allowed(&l);
        assert!(!a.contains(&5) && a.contains(&10) && !a.contains(&23) && a.contains(&24));
        // After a complete pair: no timestamp.
        let mut l = vec![0f32; 30];
        apply_timestamp_rules(&mut l, &[20, 3, 24, 24], 4, &r);
        assert!(allowed(&l).iter().all(|&i| i < 18));
    }

    #[test]
    fn timestamps_are_forced_when_their_mass_beats_the_best_text_token() {
        let sp = special();
        let r = rules(&sp);
        let mut l = vec![0f32; 30];
        l[3] = 2.0; // best text token, e^2 ≈ 7.4 < 11 timestamps (19..=29) × e^0
        apply_timestamp_rules(&mut l, &[18, 3], 2, &r);
        assert!(allowed(&l).iter().all(|&i| i >= 18));
        let mut l = vec![0f32; 30];
        l[3] = 3.0; // e^3 ≈ 20 > 11
        apply_timestamp_rules(&mut l, &[18, 3], 2, &r);
        assert!(allowed(&l).contains(&3));
    }

    #[test]
    fn greedy_and_seeded_sampling() {
        let sp = special();
        let greedy = rules(&sp);
        let mut scratch = PickScratch::default();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let l = vec![0.0f32, 2.0, 2.0, f32::NEG_INFINITY];
        let (t, lp) = pick(&l, &greedy, &mut rng, &mut scratch);
        assert_eq!(t, 1, "ties go to the first");
        assert!((lp - (2.0 - logsumexp(&l))).abs() < 1e-9);
        let sample = |rules: &DecodeRules<'_>, seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut scratch = PickScratch::default();
            (0..40)
                .map(|_| pick(&l, rules, &mut rng, &mut scratch).0)
                .collect::<Vec<_>>()
        };
        let hot = DecodeRules {
            temperature: 1.0,
            ..rules(&sp)
        };
        let draws = sample(&hot, 7);
        assert_eq!(draws, sample(&hot, 7), "a seed repeats its draws");
        assert!(
            draws.iter().all(|&t| t < 3),
            "a masked token is never sampled"
        );
        assert!(
            draws.contains(&0),
            "at T=1 the unlikely token 0 comes up in 40 draws"
        );
        // top_k = 2 keeps the two tied best; min_p = 0.5 drops token 0 (e^-2 < 0.5) too.
        for truncation in [
            Truncation {
                top_k: 2,
                ..Truncation::NONE
            },
            Truncation {
                min_p: 0.5,
                ..Truncation::NONE
            },
        ] {
            let filtered = DecodeRules { truncation, ..hot };
            let draws = sample(&filtered, 7);
            assert!(
                draws.iter().all(|&t| t == 1 || t == 2),
                "{truncation:?}: {draws:?}"
            );
        }
    }
}
