//! Render-time hooks of the configured reasoning / tool parsers (`api.md` §3, §11).
//!
//! * `reasoning_ended`: whether the rendered prompt already closed reasoning (e.g. Qwen3 with
//!   `enable_thinking: false` renders `<think>\n\n</think>` into the prompt), found as vLLM's
//!   `is_reasoning_end` does: the last reasoning marker in the prompt decides.
//! * `adjust_sampling_params`: tool parsers need their markers (often special tokens) to
//!   survive detokenization, so with tools offered they turn `skip_special_tokens` off, as
//!   vLLM's parsers do in `adjust_request` (spec §13 shows it for hermes).
use crate::model::Model;
use crate::protocol::{ChatCompletionRequest, SamplingParams};
use crate::renderer::RenderHooks;
use crate::tool_grammar::PromptReasoning;
use serde_json::{Map, Value};
use std::sync::Arc;

/// How many trailing prompt ids are decoded to look for reasoning markers.
const PROMPT_TAIL_IDS: usize = 64;

pub struct ParserHooks {
    model: Arc<Model>,
    tool_parser: Option<String>,
    reasoning_markers: Option<(&'static str, &'static str)>,
    reasoning_parser: Option<String>,
}

/// The (start, end) markers of a reasoning parser, where it has textual markers.
fn reasoning_markers(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "seed_oss" => ("<seed:think>", "</seed:think>"),
        "mistral" => ("[THINK]", "[/THINK]"),
        "deepseek_r1"
        | "deepseek_v3"
        | "qwen3"
        | "glm45"
        | "glm47"
        | "kimi_k2"
        | "minimax_m2"
        | "step3"
        | "step5"
        | "holo2"
        | "ernie45"
        | "hunyuan_a13b"
        | "minimax_m2_append_think" => ("<think>", "</think>"),
        _ => return None,
    })
}

impl ParserHooks {
    pub fn new(
        model: Arc<Model>,
        tool_parser: Option<&str>,
        reasoning_parser: Option<&str>,
    ) -> Self {
        ParserHooks {
            model,
            tool_parser: tool_parser.map(str::to_owned),
            reasoning_markers: reasoning_parser.and_then(reasoning_markers),
            reasoning_parser: reasoning_parser.map(str::to_owned),
        }
    }
}

/// `Some(true)` when the last marker is an end marker, `Some(false)` when it is a start marker
/// or there is none.
pub fn reasoning_ended_in(text: &str, start: &str, end: &str) -> bool {
    match (text.rfind(start), text.rfind(end)) {
        (Some(s), Some(e)) => e > s,
        (None, Some(_)) => true,
        _ => false,
    }
}

/// The vLLM tool parsers whose `adjust_request` sets `skip_special_tokens = False` when tools
/// are offered and `tool_choice` is not `none` (their call markers are special tokens, which
/// decoding would otherwise drop); found with the class hierarchy of vllm/tool_parsers/ at
/// vLLM 0.33.0. The other parsers (llama3_json, mistral, pythonic, ...) leave it as it is.
const KEEPS_SPECIAL_TOKENS: [&str; 19] = [
    "apertus",
    "functiongemma",
    "gemma4",
    "gigachat3",
    "granite4",
    "hermes",
    "internlm",
    "jamba",
    "kimi_k2",
    "kimi_k3",
    "lfm2",
    "longcat",
    "minicpm5",
    "muse",
    "muse_glimmer",
    "musespark1x",
    "poolside_v1",
    "qwen3_json",
    "step3",
];

impl RenderHooks for ParserHooks {
    fn reasoning_ended(&self, prompt_ids: &[u32], _kwargs: &Map<String, Value>) -> Option<bool> {
        self.reasoning_markers?;
        Some(self.prompt_reasoning(prompt_ids) == PromptReasoning::Closed)
    }

    fn has_reasoning_parser(&self) -> bool {
        self.reasoning_parser.is_some()
    }

    fn reasoning_parser(&self) -> Option<&str> {
        self.reasoning_parser.as_deref()
    }

    fn prompt_reasoning(&self, prompt_ids: &[u32]) -> PromptReasoning {
        let Some((start, end)) = self.reasoning_markers else {
            return PromptReasoning::Absent;
        };
        let tail = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_TAIL_IDS)..];
        match self.model.tokenizer.decode(tail, false) {
            Ok(text) if reasoning_ended_in(&text, start, end) => PromptReasoning::Closed,
            Ok(text) if text.contains(start) => PromptReasoning::Open,
            _ => PromptReasoning::Absent,
        }
    }

    fn adjust_sampling_params(&self, req: &ChatCompletionRequest, params: &mut SamplingParams) {
        if !self
            .tool_parser
            .as_deref()
            .is_some_and(|p| KEEPS_SPECIAL_TOKENS.contains(&p))
        {
            return;
        }
        let tools_offered = req.tools.as_ref().is_some_and(|t| !t.is_empty());
        let choice_none = req
            .tool_choice
            .as_ref()
            .is_some_and(|c| c.as_str() == Some("none"));
        if tools_offered && !choice_none {
            params.skip_special_tokens = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_marker_decides() {
        assert!(!reasoning_ended_in(
            "<|im_start|>assistant\n",
            "<think>",
            "</think>"
        ));
        assert!(!reasoning_ended_in(
            "assistant\n<think>\n",
            "<think>",
            "</think>"
        ));
        assert!(reasoning_ended_in(
            "<think>\n\n</think>\n\n",
            "<think>",
            "</think>"
        ));
        assert!(!reasoning_ended_in(
            "<think>a</think> user <think>",
            "<think>",
            "</think>"
        ));
    }
}
