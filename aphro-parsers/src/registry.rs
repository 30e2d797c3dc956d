//! Parser registry keyed by vLLM's `--tool-call-parser` / `--reasoning-parser` names.
use crate::pipeline::CombinedParser;
use crate::reasoning::think::{ThinkConfig, ThinkStage};
use crate::reasoning::{append_think::AppendThink, Buffered, Passthrough, ReasoningStage};
use crate::tools::*;
use crate::{ParserConfig, ParserError, ParserSnapshot, StreamParser};
use std::sync::Arc;

/// Registered tool-call parser names.
pub const TOOL_PARSERS: &[&str] = &[
    "hermes",
    "qwen3_json",
    "longcat",
    "granite4",
    "ernie45",
    "llama3_json",
    "llama4_json",
    "pythonic",
    "llama4_pythonic",
    "olmo3",
    "mistral",
    "deepseek_v3",
    "deepseek_v31",
    "glm45",
    "glm47",
    "kimi_k2",
    "minimax_m2",
    "qwen3_coder",
    "qwen3_xml",
    "seed_oss",
    "jamba",
    "hunyuan_a13b",
    "internlm",
    "internlm2",
    "xlam",
    "phi4_mini_json",
    "granite-20b-fc",
    "granite",
    "step3",
    "openai",
];

/// Registered reasoning parser names.
pub const REASONING_PARSERS: &[&str] = &[
    "deepseek_r1",
    "step5",
    "holo2",
    "deepseek_v3",
    "ernie45",
    "step3",
    "qwen3",
    "glm45",
    "glm47",
    "kimi_k2",
    "minimax_m2",
    "minimax_m2_append_think",
    "seed_oss",
    "mistral",
    "hunyuan_a13b",
    "granite",
    "openai_gptoss",
];

/// Builds parsers by vLLM name. Cheap to create; holds no state between requests.
#[derive(Debug, Default, Clone)]
pub struct ParserRegistry {}

fn tool_format(name: &str) -> Option<Arc<dyn ToolFormat>> {
    Some(match name {
        "hermes" | "qwen3_json" | "ernie45" => Arc::new(hermes::HERMES),
        "longcat" => Arc::new(hermes::LONGCAT),
        "granite4" => Arc::new(hermes::GRANITE4),
        "llama3_json" | "llama4_json" => Arc::new(llama3_json::Llama3Json),
        "pythonic" | "llama4_pythonic" => Arc::new(pythonic::Pythonic),
        "olmo3" => Arc::new(olmo3::Olmo3),
        "mistral" => Arc::new(mistral::Mistral),
        "deepseek_v3" => Arc::new(deepseek_v3::DeepSeekV3),
        "deepseek_v31" => Arc::new(deepseek_v31::DeepSeekV31),
        "glm45" | "glm47" => Arc::new(glm45::Glm45),
        "kimi_k2" => Arc::new(kimi_k2::KimiK2),
        "minimax_m2" => Arc::new(minimax_m2::MinimaxM2),
        "qwen3_coder" | "qwen3_xml" => Arc::new(qwen3_coder::QWEN3_CODER),
        "seed_oss" => Arc::new(qwen3_coder::SEED_OSS),
        "jamba" => Arc::new(jamba::Jamba),
        "hunyuan_a13b" => Arc::new(hunyuan::Hunyuan),
        "internlm" | "internlm2" => Arc::new(internlm::InternLm),
        "xlam" => Arc::new(xlam::Xlam),
        "phi4_mini_json" => Arc::new(phi4_mini::Phi4Mini),
        "granite-20b-fc" => Arc::new(granite_20b_fc::Granite20bFc),
        "granite" => Arc::new(granite::Granite),
        "step3" => Arc::new(step3::Step3),
        "openai" => Arc::new(harmony::Harmony),
        _ => return None,
    })
}

/// `thinking`/`enable_thinking` kwarg, whichever is set.
fn thinking_flag(ctx: &ParserConfig) -> Option<bool> {
    ctx.kwarg_bool("thinking")
        .or_else(|| ctx.kwarg_bool("enable_thinking"))
}

fn think(cfg: ThinkConfig, ctx: &ParserConfig) -> Box<dyn ReasoningStage> {
    let mut in_reasoning = cfg.start_in_reasoning;
    if cfg.start_in_reasoning {
        if let Some(x) = ctx.prompt_in_reasoning(cfg.start, cfg.end) {
            in_reasoning = x;
        }
    }
    Box::new(ThinkStage::new(cfg, in_reasoning))
}

fn reasoning_stage(name: &str, ctx: &ParserConfig) -> Option<Box<dyn ReasoningStage>> {
    let disabled = thinking_flag(ctx) == Some(false);
    let engine = |start, end, implicit, rstrip_reasoning| {
        if disabled {
            Box::new(Passthrough::default()) as Box<dyn ReasoningStage>
        } else {
            let cfg = ThinkConfig {
                rstrip_reasoning,
                ..ThinkConfig::engine(start, end, implicit)
            };
            think(cfg, ctx)
        }
    };
    Some(match name {
        "deepseek_r1" | "step5" | "ernie45" => think(ThinkConfig::r1(), ctx),
        // holo2 is the DeepSeek-V3 wrapper with thinking on by default.
        "holo2" if disabled => Box::new(Passthrough::default()),
        "holo2" => think(ThinkConfig::r1(), ctx),
        // DeepSeek-V3: reasoning only when the request turns thinking on.
        "deepseek_v3" if thinking_flag(ctx) == Some(true) => think(ThinkConfig::r1(), ctx),
        "deepseek_v3" => Box::new(Passthrough::default()),
        "step3" => think(
            ThinkConfig {
                strip_leading_start: false,
                ..ThinkConfig::r1()
            },
            ctx,
        ),
        // Reasoning whitespace (`ThinkConfig::rstrip_reasoning`): vLLM's engine grammars rstrip
        // the reasoning by default; `vllm/parser/qwen3.py` turns that off for qwen3 and the
        // seed_oss grammar it shares, `glm47_moe.py` and `minimax_m2.py` keep it on.
        "qwen3" => engine("<think>", "</think>", &["<tool_call>"], false),
        "glm45" | "glm47" => engine("<think>", "</think>", &["<tool_call>"], true),
        "minimax_m2" => engine("<think>", "</think>", &["<minimax:tool_call>"], true),
        "seed_oss" => engine(
            "<seed:think>",
            "</seed:think>",
            &["<seed:tool_call>"],
            false,
        ),
        "kimi_k2" if disabled => Box::new(Passthrough::default()),
        "kimi_k2" => think(
            ThinkConfig {
                rstrip_reasoning: true,
                ..ThinkConfig::engine("<think>", "</think>", &["<|tool_calls_section_begin|>"])
            },
            ctx,
        ),
        // `vllm/parser/mistral.py`: strip_trailing_reasoning_whitespace=True.
        "mistral" => Box::new(ThinkStage::new(
            ThinkConfig {
                start_in_reasoning: false,
                start_in_content: true,
                rstrip_reasoning: true,
                ..ThinkConfig::engine("[THINK]", "[/THINK]", &["[TOOL_CALLS]"])
            },
            false,
        )),
        "minimax_m2_append_think" => Box::new(AppendThink::default()),
        "hunyuan_a13b" => Box::new(Buffered::new(crate::reasoning::hunyuan::split)),
        "granite" => Box::new(Buffered::new(crate::reasoning::granite::split)),
        "openai_gptoss" => Box::new(Passthrough::default()),
        _ => return None,
    })
}

impl ParserRegistry {
    pub fn new() -> Self {
        Self {}
    }

    /// True if `name` is a registered tool-call parser.
    pub fn has_tool_parser(&self, name: &str) -> bool {
        tool_format(name).is_some()
    }

    /// True if `name` is a registered reasoning parser.
    pub fn has_reasoning_parser(&self, name: &str) -> bool {
        REASONING_PARSERS.contains(&name)
    }

    /// The combined parser for one choice. `None` names disable that side.
    pub fn new_parser(
        &self,
        tool_name: Option<&str>,
        reasoning_name: Option<&str>,
        ctx: &ParserConfig,
    ) -> Result<Box<dyn StreamParser>, ParserError> {
        Ok(Box::new(self.combined(tool_name, reasoning_name, ctx)?))
    }

    /// The parser a [`StreamParser::snapshot`] was taken from, ready to continue: built like
    /// [`new_parser`](Self::new_parser) with the same names and configuration, then set to the
    /// snapshot's state. A snapshot that does not fit (another parser, offsets outside its
    /// text, another version) is [`ParserError::InvalidSnapshot`].
    pub fn restore(
        &self,
        tool_name: Option<&str>,
        reasoning_name: Option<&str>,
        ctx: &ParserConfig,
        snapshot: ParserSnapshot,
    ) -> Result<Box<dyn StreamParser>, ParserError> {
        let mut p = self.combined(tool_name, reasoning_name, ctx)?;
        p.restore(snapshot)?;
        Ok(Box::new(p))
    }

    /// Same as [`new_parser`](Self::new_parser), concrete type.
    pub fn combined(
        &self,
        tool_name: Option<&str>,
        reasoning_name: Option<&str>,
        ctx: &ParserConfig,
    ) -> Result<CombinedParser, ParserError> {
        let reasoning: Box<dyn ReasoningStage> = match reasoning_name {
            None => Box::new(Passthrough::default()),
            Some(n) => reasoning_stage(n, ctx)
                .ok_or_else(|| ParserError::UnknownReasoningParser(n.to_string()))?,
        };
        let tool: Box<dyn ToolStage> = match tool_name {
            None => Box::new(NoTools),
            Some(n) => {
                let fmt =
                    tool_format(n).ok_or_else(|| ParserError::UnknownToolParser(n.to_string()))?;
                Box::new(FormatStage::new(fmt, Arc::new(ctx.clone())))
            }
        };
        Ok(CombinedParser::new(reasoning, tool))
    }
}
