//! Stop-string matching over streamed text (spec `api.md` §6.1 step 3, vLLM
//! `check_stop_strings` + `get_next_output_text`).
//!
//! Text arrives per token ([`StopStringMatcher::push`] takes the text each
//! token produced, possibly empty). The matcher:
//! * releases text as soon as it cannot be part of a stop string, holding back
//!   at most `longest stop − 1` characters (vLLM's `output_text_buffer_length`);
//! * checks, after each pushed chunk, the stop strings **in request order**
//!   and takes the first one that occurs in the newly searchable window (as
//!   vLLM does: not necessarily the leftmost match);
//! * only accepts matches that end after the text of the first `min_tokens`
//!   tokens (and none at all until more than `min_tokens` tokens were seen);
//! * cuts before the stop string, or after it with `include_stop_str_in_output`.
//!
//! Lengths are counted in Unicode scalar values, as Python does; cuts are
//! always on character boundaries. Per-push work is proportional to the
//! pushed text plus the hold-back, independent of the text already released.
//! [`StopState`] is small and serializable for client-carried streaming state.

use serde::{Deserialize, Serialize};

/// Stop strings and how to apply them (immutable per request).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopStringMatcher {
    stops: Vec<String>,
    include_stop_str_in_output: bool,
    min_tokens: usize,
    /// `max(chars(stop)) - 1`, 0 without stops.
    hold_chars: usize,
}

/// Mutable per-stream state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopState {
    /// Text not released yet (at most `hold_chars` characters between pushes).
    pub held: String,
    /// Tokens seen so far (for `min_tokens`).
    pub tokens: usize,
    /// The stop string that ended the stream, once matched.
    pub stopped: Option<String>,
}

/// Result of one [`StopStringMatcher::push`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopStep {
    /// Text that may be sent now.
    pub text: String,
    /// Set when a stop string matched in this push: the stream is over and
    /// `text` already ends at the cut. This is the `stop_reason`.
    pub stop: Option<String>,
}

impl StopStringMatcher {
    /// `stops` as in `SamplingParams.stop` (empty strings are ignored; the
    /// request validator rejects them anyway).
    pub fn new(stops: Vec<String>, include_stop_str_in_output: bool, min_tokens: usize) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let hold_chars = stops
            .iter()
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(0)
            .saturating_sub(1);
        Self {
            stops,
            include_stop_str_in_output,
            min_tokens,
            hold_chars,
        }
    }

    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Characters held back between pushes (`output_text_buffer_length`).
    pub fn hold_chars(&self) -> usize {
        self.hold_chars
    }

    /// Pushes the texts of one chunk of tokens (one item per token, possibly
    /// empty) and returns what can be released. After a stop matched, further
    /// pushes return nothing.
    pub fn push<'a, I>(&self, state: &mut StopState, token_texts: I) -> StopStep
    where
        I: IntoIterator<Item = &'a str>,
    {
        if state.stopped.is_some() {
            return StopStep::default();
        }
        let mut region = std::mem::take(&mut state.held);
        // Byte offset in `region` after which new text must be searched
        // (vLLM's stop_check_offset).
        let mut check_from = region.len();
        for text in token_texts {
            state.tokens = state.tokens.saturating_add(1);
            region.push_str(text);
            if self.min_tokens > 0 && state.tokens <= self.min_tokens {
                check_from = region.len();
            }
        }
        if !self.stops.is_empty() && state.tokens > self.min_tokens && check_from < region.len() {
            if let Some((stop, cut)) = self.find(&region, check_from) {
                region.truncate(cut);
                state.stopped = Some(stop.clone());
                return StopStep {
                    text: region,
                    stop: Some(stop),
                };
            }
        }
        let keep_from = back_chars(&region, region.len(), self.hold_chars);
        state.held = region.split_off(keep_from);
        StopStep {
            text: region,
            stop: None,
        }
    }

    /// End of stream without a stop string: releases the held-back text.
    pub fn finish(&self, state: &mut StopState) -> String {
        std::mem::take(&mut state.held)
    }

    /// Applies the stop strings to a complete text in one go (non-streaming
    /// derender): `token_texts` are the per-token texts. Returns the
    /// (possibly cut) text and the matched stop string.
    pub fn apply_all<'a, I>(&self, token_texts: I) -> (String, Option<String>)
    where
        I: IntoIterator<Item = &'a str>,
    {
        let mut state = StopState::default();
        let step = self.push(&mut state, token_texts);
        let mut text = step.text;
        if step.stop.is_none() {
            text.push_str(&self.finish(&mut state));
        }
        (text, step.stop)
    }

    /// First stop (request order) occurring at or after `check_from` minus
    /// `len(stop) − 1` chars; returns it and the byte index to cut at.
    fn find(&self, region: &str, check_from: usize) -> Option<(String, usize)> {
        for stop in &self.stops {
            let stop_chars = stop.chars().count();
            let start = back_chars(region, check_from, stop_chars.saturating_sub(1));
            let Some(rel) = region.get(start..).and_then(|s| s.find(stop.as_str())) else {
                continue;
            };
            let idx = start + rel;
            let cut = if self.include_stop_str_in_output {
                (idx + stop.len()).min(region.len())
            } else {
                idx
            };
            return Some((stop.clone(), cut));
        }
        None
    }
}

/// Byte index `n` characters before byte index `from` (clamped at 0);
/// `from` must be a char boundary.
fn back_chars(s: &str, from: usize, n: usize) -> usize {
    if n == 0 {
        return from;
    }
    let head = s.get(..from).unwrap_or(s);
    head.char_indices()
        .rev()
        .nth(n - 1)
        .map(|(i, _)| i)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(stops: &[&str], include: bool, min_tokens: usize) -> StopStringMatcher {
        StopStringMatcher::new(
            stops.iter().map(|s| s.to_string()).collect(),
            include,
            min_tokens,
        )
    }

    /// Streams one token per item, returns (released pieces, stop, tail).
    fn run(matcher: &StopStringMatcher, tokens: &[&str]) -> (String, Option<String>) {
        let mut st = StopState::default();
        let mut out = String::new();
        for t in tokens {
            let step = matcher.push(&mut st, [*t]);
            // Never more than hold_chars characters are held back.
            assert!(st.held.chars().count() <= matcher.hold_chars());
            out.push_str(&step.text);
            if step.stop.is_some() {
                return (out, step.stop);
            }
        }
        out.push_str(&matcher.finish(&mut st));
        (out, None)
    }

    #[test]
    fn no_stops_releases_everything_immediately() {
        let matcher = m(&[], false, 0);
        let mut st = StopState::default();
        assert_eq!(matcher.push(&mut st, ["abc"]).text, "abc");
        assert_eq!(matcher.hold_chars(), 0);
        assert!(st.held.is_empty());
    }

    #[test]
    fn cuts_before_stop_and_reports_it() {
        let matcher = m(&["END"], false, 0);
        assert_eq!(
            run(&matcher, &["Hello", " wor", "ld E", "ND more"]),
            ("Hello world ".to_string(), Some("END".to_string()))
        );
    }

    #[test]
    fn include_stop_str_keeps_it_and_cuts_after() {
        let matcher = m(&["END"], true, 0);
        assert_eq!(
            run(&matcher, &["Hello E", "ND more"]),
            ("Hello END".to_string(), Some("END".to_string()))
        );
        // Stop at the very end: nothing to cut.
        assert_eq!(
            run(&matcher, &["xEND"]),
            ("xEND".to_string(), Some("END".to_string()))
        );
    }

    #[test]
    fn holds_back_only_longest_minus_one_chars() {
        let matcher = m(&["ab", "wxyz"], false, 0);
        assert_eq!(matcher.hold_chars(), 3);
        let mut st = StopState::default();
        let step = matcher.push(&mut st, ["hello wx"]);
        assert_eq!(step.text, "hello");
        assert_eq!(st.held, " wx");
        let step = matcher.push(&mut st, ["q"]);
        assert_eq!(step.text, " ");
        assert_eq!(matcher.finish(&mut st), "wxq");
    }

    #[test]
    fn stop_split_over_many_tokens_and_multibyte() {
        let matcher = m(&["🦀停"], false, 0);
        assert_eq!(
            run(&matcher, &["naïve ", "🦀", "停", "x"]),
            ("naïve ".to_string(), Some("🦀停".to_string()))
        );
        assert_eq!(
            run(&matcher, &["🦀", "🦀", "x"]),
            ("🦀🦀x".to_string(), None)
        );
    }

    #[test]
    fn request_order_wins_within_one_chunk() {
        // vLLM checks stops in list order over the whole new window.
        let matcher = m(&["b", "a"], false, 0);
        let mut st = StopState::default();
        let step = matcher.push(&mut st, ["xab"]);
        assert_eq!(step.text, "xa");
        assert_eq!(step.stop.as_deref(), Some("b"));
        // Per token, the earlier text is checked first.
        assert_eq!(
            run(&matcher, &["x", "a", "b"]),
            ("x".to_string(), Some("a".to_string()))
        );
    }

    #[test]
    fn min_tokens_ignores_matches_ending_in_first_tokens_text() {
        // Stop text produced entirely by the first 2 tokens is ignored.
        let matcher = m(&["STOP"], false, 2);
        assert_eq!(
            run(&matcher, &["ST", "OP", "go", "STOP"]),
            ("STOPgo".to_string(), Some("STOP".to_string()))
        );
        // A match that starts inside the min_tokens text but ends after it counts.
        assert_eq!(
            run(&matcher, &["a", "ST", "OP"]),
            ("a".to_string(), Some("STOP".to_string()))
        );
        // Within one chunk the rule is per token too.
        let mut st = StopState::default();
        let step = matcher.push(&mut st, ["STOP", "x", "y"]);
        assert_eq!(step.stop, None);
        assert_eq!(step.text, "STO");
        assert_eq!(matcher.finish(&mut st), "Pxy");
    }

    #[test]
    fn min_tokens_checks_nothing_until_exceeded() {
        let matcher = m(&["x"], false, 3);
        assert_eq!(run(&matcher, &["x", "x", "x"]), ("xxx".to_string(), None));
        assert_eq!(
            run(&matcher, &["x", "x", "x", "x"]),
            ("xxx".to_string(), Some("x".to_string()))
        );
    }

    #[test]
    fn empty_token_texts_count_as_tokens() {
        let matcher = m(&["x"], false, 2);
        assert_eq!(
            run(&matcher, &["", "", "x"]),
            (String::new(), Some("x".to_string()))
        );
    }

    #[test]
    fn after_stop_nothing_more_is_released() {
        let matcher = m(&["."], false, 0);
        let mut st = StopState::default();
        assert_eq!(matcher.push(&mut st, ["a.b"]).text, "a");
        assert_eq!(matcher.push(&mut st, ["c"]), StopStep::default());
        assert_eq!(matcher.finish(&mut st), "");
    }

    #[test]
    fn apply_all_and_state_serde() {
        let matcher = m(&["</s>", "\n\n"], false, 0);
        assert_eq!(
            matcher.apply_all(["a", "b\n", "\nc"]),
            ("ab".to_string(), Some("\n\n".to_string()))
        );
        assert_eq!(matcher.apply_all(["a", "b"]), ("ab".to_string(), None));

        let mut st = StopState::default();
        let mut out = matcher.push(&mut st, ["hello </"]).text;
        let json = serde_json::to_string(&st).unwrap_or_default();
        let mut st2: StopState = match serde_json::from_str(&json) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let step = matcher.push(&mut st2, ["s> tail"]);
        out.push_str(&step.text);
        assert_eq!(out, "hello ");
        assert_eq!(step.stop.as_deref(), Some("</s>"));
    }

    #[test]
    fn random_streams_match_one_shot() {
        // Chunking must not change the result when only one stop can match.
        let text = "The quick brown 🦊 jumps over the lazy dog. END of story";
        let chars: Vec<char> = text.chars().collect();
        for include in [false, true] {
            let matcher = m(&["END", "zzz"], include, 0);
            let want = matcher.apply_all([text]);
            for chunk in 1..8 {
                let pieces: Vec<String> = chars.chunks(chunk).map(|c| c.iter().collect()).collect();
                let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
                assert_eq!(run(&matcher, &refs), want, "chunk {chunk}");
            }
        }
    }
}
