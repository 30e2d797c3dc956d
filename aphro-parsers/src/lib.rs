//! Reasoning and tool-call parsers (vLLM formats). Text in, parsed assistant message out.
