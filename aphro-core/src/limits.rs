//! Per-request limits, checked before the expensive work they bound.
//!
//! Tokenizing is the costly step of a render (an HF `Encoding` keeps ~100 bytes per token),
//! so a prompt is measured in characters *before* it is tokenized: a prompt longer than
//! `max_model_len` × the longest token (in characters) cannot fit the context whatever it
//! tokenizes to, and is refused without being tokenized. The other limits cap the fan-out a
//! single request can ask for (prompts, choices, stop strings, tools). Every front end (HTTP,
//! Python, CLI) gets them through [`crate::Renderer`] and the serving engine.
use crate::error::{Error, Result};
use crate::protocol::SamplingParams;
use crate::Tokenizer;

/// The limits; each is a server flag (`--max-prompt-chars`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestLimits {
    /// Characters of a rendered prompt before tokenization; `None` = `max_model_len` × the
    /// longest token of the vocabulary, the most that can still fit the context.
    pub max_prompt_chars: Option<usize>,
    /// Prompts in one `/v1/completions` request (each becomes an engine request).
    pub max_prompts_per_request: usize,
    /// `n` (choices per prompt).
    pub max_n: usize,
    /// Stop strings per request.
    pub max_stop_strings: usize,
    /// Characters of one stop string.
    pub max_stop_string_chars: usize,
    /// Tools in one chat request.
    pub max_tools: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_prompt_chars: None,
            max_prompts_per_request: 1024,
            max_n: 128,
            max_stop_strings: 64,
            max_stop_string_chars: 1024,
            max_tools: 512,
        }
    }
}

fn over(what: &str, got: usize, limit: usize, flag: &str, param: &str) -> Error {
    Error::BadRequest {
        message: format!(
            "{what} is {got}, more than this server accepts ({limit}; {flag}). \
             (parameter={param}, value={got})"
        ),
        param: Some(param.to_owned()),
    }
}

impl RequestLimits {
    /// The prompt-character limit for a model: the flag, or `max_model_len` × the longest
    /// token. A token's vocabulary string is at least as long as the text it stands for
    /// (byte-level BPE spells each byte as one char; SentencePiece's byte-fallback tokens
    /// are six chars for one byte), so the bound never refuses a prompt that could fit.
    pub fn prompt_chars_limit(&self, max_model_len: usize, tokenizer: &Tokenizer) -> usize {
        self.max_prompt_chars.unwrap_or_else(|| {
            let longest = tokenizer
                .hf()
                .get_vocab(true)
                .keys()
                .map(|t| t.chars().count())
                .max()
                .unwrap_or(1)
                .max(1);
            max_model_len.saturating_mul(longest)
        })
    }

    /// Refuse a prompt of `chars` characters over `limit`, before it is tokenized.
    pub fn check_prompt_chars(chars: usize, limit: usize, max_model_len: usize) -> Result<()> {
        if chars > limit {
            return Err(Error::BadRequest {
                message: format!(
                    "The prompt is {chars} characters long; a prompt this long cannot fit this \
                     model's maximum context length of {max_model_len} tokens (at most {limit} \
                     characters are tokenized; --max-prompt-chars). Please reduce the length \
                     of the messages or prompt."
                ),
                param: Some("prompt".into()),
            });
        }
        Ok(())
    }

    pub fn check_prompt_count(&self, prompts: usize) -> Result<()> {
        if prompts > self.max_prompts_per_request {
            return Err(over(
                "The number of prompts",
                prompts,
                self.max_prompts_per_request,
                "--max-prompts-per-request",
                "prompt",
            ));
        }
        Ok(())
    }

    pub fn check_tools(&self, tools: usize) -> Result<()> {
        if tools > self.max_tools {
            return Err(over(
                "The number of tools",
                tools,
                self.max_tools,
                "--max-tools",
                "tools",
            ));
        }
        Ok(())
    }

    /// `n` and the stop strings of resolved sampling parameters.
    pub fn check_sampling(&self, sp: &SamplingParams) -> Result<()> {
        let n = usize::try_from(sp.n).unwrap_or(0);
        if n > self.max_n {
            return Err(over("n", n, self.max_n, "--max-n", "n"));
        }
        if sp.stop.len() > self.max_stop_strings {
            return Err(over(
                "The number of stop strings",
                sp.stop.len(),
                self.max_stop_strings,
                "--max-stop-strings",
                "stop",
            ));
        }
        if let Some(longest) = sp.stop.iter().map(|s| s.chars().count()).max() {
            if longest > self.max_stop_string_chars {
                return Err(over(
                    "The longest stop string's length",
                    longest,
                    self.max_stop_string_chars,
                    "--max-stop-string-chars",
                    "stop",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_limits_name_their_parameter() {
        let limits = RequestLimits {
            max_n: 2,
            max_stop_strings: 1,
            max_stop_string_chars: 3,
            ..RequestLimits::default()
        };
        let mut sp = SamplingParams {
            n: 3,
            ..SamplingParams::default()
        };
        let err = limits.check_sampling(&sp).expect_err("n over the limit");
        assert_eq!(err.param(), Some("n"));
        assert_eq!(err.status(), 400);
        sp.n = 2;
        sp.stop = vec!["a".into(), "b".into()];
        assert_eq!(
            limits.check_sampling(&sp).expect_err("two stops").param(),
            Some("stop")
        );
        sp.stop = vec!["abcd".into()];
        assert!(limits.check_sampling(&sp).is_err());
        sp.stop = vec!["abc".into()];
        assert!(limits.check_sampling(&sp).is_ok());
        assert!(limits.check_prompt_count(1024).is_ok());
        assert!(limits.check_prompt_count(1025).is_err());
    }

    #[test]
    fn prompt_chars_over_the_limit_are_refused() {
        assert!(RequestLimits::check_prompt_chars(10, 10, 5).is_ok());
        let err = RequestLimits::check_prompt_chars(11, 10, 5).expect_err("over");
        assert_eq!(err.status(), 400);
        assert!(err.to_string().contains("5 tokens"), "{err}");
    }
}
