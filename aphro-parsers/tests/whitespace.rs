//! Whitespace at the reasoning / content / tool-call boundaries, as vLLM 0.33.0 decides it.
//!
//! Rules (vLLM 0.33.0 sources):
//! * `vllm/parser/engine/parser_engine.py` `extract_reasoning` / `_single_pass_parse`: the
//!   joined reasoning text is `.rstrip()`ed when the grammar's
//!   `strip_trailing_reasoning_whitespace` is set (`parser_engine_config.py`, default `True`).
//!   `qwen3.py` (and `seed_oss.py`, which inherits it) turn it off; `glm47_moe.py` (`glm45`,
//!   `glm47`) and `minimax_m2.py` keep the default; `mistral.py` and `kimi_k2.py` set it.
//!
//! Every case is checked one-shot and streamed (every single cut point and char by char).
use aphro_parsers::{Aggregator, ParsedMessage, ParserConfig, ParserRegistry};

fn one_shot(
    tool: Option<&str>,
    reasoning: Option<&str>,
    ctx: &ParserConfig,
    text: &str,
) -> ParsedMessage {
    let mut p = ParserRegistry::new()
        .new_parser(tool, reasoning, ctx)
        .expect("registered");
    aphro_parsers::parse(p.as_mut(), text)
}

fn pieces(
    tool: Option<&str>,
    reasoning: Option<&str>,
    ctx: &ParserConfig,
    parts: &[&str],
) -> ParsedMessage {
    let mut p = ParserRegistry::new()
        .new_parser(tool, reasoning, ctx)
        .expect("registered");
    let mut agg = Aggregator::new();
    for s in parts {
        agg.add(&p.push(s));
    }
    agg.add(&p.finish());
    agg.into_message()
}

fn no_ids(mut m: ParsedMessage) -> ParsedMessage {
    for c in &mut m.tool_calls {
        c.id.clear();
    }
    m
}

/// Parses `text` one-shot, checks content / reasoning / call names, then checks that every
/// single cut and char-by-char streaming aggregate to the same message.
fn check(
    tool: Option<&str>,
    reasoning: Option<&str>,
    ctx: &ParserConfig,
    text: &str,
    want_reasoning: Option<&str>,
    want_content: Option<&str>,
    want_calls: &[&str],
) {
    let got = one_shot(tool, reasoning, ctx, text);
    let label = format!("{tool:?}+{reasoning:?} on {text:?}");
    assert_eq!(
        got.reasoning.as_deref(),
        want_reasoning,
        "reasoning, {label}"
    );
    assert_eq!(got.content.as_deref(), want_content, "content, {label}");
    let names: Vec<&str> = got.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, want_calls, "calls, {label}");
    let want = no_ids(got);
    for c in (0..=text.len()).filter(|c| text.is_char_boundary(*c)) {
        let st = no_ids(pieces(tool, reasoning, ctx, &[&text[..c], &text[c..]]));
        assert_eq!(st, want, "streamed, cut at {c}, {label}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(
        no_ids(pieces(tool, reasoning, ctx, &chars)),
        want,
        "char by char, {label}"
    );
}

fn auto() -> ParserConfig {
    ParserConfig::default()
}

// ---- reasoning: trailing whitespace before the end marker -------------------------------

#[test]
fn glm45_reasoning_drops_newline_before_end_marker() {
    for name in ["glm45", "glm47"] {
        check(
            None,
            Some(name),
            &auto(),
            "<think>\nLet me think.\n</think>\n\nThe answer.",
            Some("\nLet me think."),
            Some("\n\nThe answer."),
            &[],
        );
    }
}

#[test]
fn minimax_m2_reasoning_drops_newline_before_end_marker() {
    // MiniMax-M2 outputs start inside reasoning (no `<think>`).
    check(
        None,
        Some("minimax_m2"),
        &auto(),
        "Let me think.\n</think>\n\nThe answer.",
        Some("Let me think."),
        Some("\n\nThe answer."),
        &[],
    );
}

#[test]
fn mistral_reasoning_drops_newline_before_end_marker() {
    check(
        None,
        Some("mistral"),
        &auto(),
        "[THINK]Let me think.\n[/THINK]The answer.",
        Some("Let me think."),
        Some("The answer."),
        &[],
    );
}

#[test]
fn mistral_rstrips_the_joined_reasoning_of_several_blocks() {
    // Non-streaming joins every reasoning chunk, then rstrips once: whitespace that ends an
    // earlier block stays when more reasoning follows.
    check(
        None,
        Some("mistral"),
        &auto(),
        "[THINK]a\n[/THINK]b[THINK]c \n[/THINK]d",
        Some("a\nc"),
        Some("bd"),
        &[],
    );
}

#[test]
fn stripped_reasoning_that_is_only_whitespace_is_null() {
    for (name, text) in [
        ("glm45", "<think>\n\n</think>Hi"),
        ("minimax_m2", " \n</think>Hi"),
        ("mistral", "[THINK]\n[/THINK]Hi"),
    ] {
        check(None, Some(name), &auto(), text, None, Some("Hi"), &[]);
    }
}

#[test]
fn unterminated_reasoning_is_rstripped_too() {
    check(
        None,
        Some("glm45"),
        &auto(),
        "<think>abc \n",
        Some("abc"),
        None,
        &[],
    );
    check(
        None,
        Some("minimax_m2"),
        &auto(),
        "abc\n\n",
        Some("abc"),
        None,
        &[],
    );
    check(
        None,
        Some("mistral"),
        &auto(),
        "[THINK]abc\n",
        Some("abc"),
        None,
        &[],
    );
}

#[test]
fn reasoning_ended_by_a_tool_opener_is_rstripped() {
    check(
        Some("glm45"),
        Some("glm45"),
        &auto(),
        "<think>I need the time.\n<tool_call>get_time\n</tool_call>",
        Some("I need the time."),
        None,
        &["get_time"],
    );
    check(
        Some("minimax_m2"),
        Some("minimax_m2"),
        &auto(),
        "I need the time.\n<minimax:tool_call><invoke name=\"get_time\"></invoke></minimax:tool_call>",
        Some("I need the time."),
        None,
        &["get_time"],
    );
    check(
        Some("mistral"),
        Some("mistral"),
        &auto(),
        "[THINK]I need the time.\n[TOOL_CALLS]get_time{}",
        Some("I need the time."),
        None,
        &["get_time"],
    );
}

#[test]
fn qwen3_and_seed_oss_keep_trailing_reasoning_whitespace() {
    // strip_trailing_reasoning_whitespace=False in vllm/parser/qwen3.py (seed_oss inherits it).
    check(
        None,
        Some("qwen3"),
        &auto(),
        "<think>\nabc\n</think>x",
        Some("\nabc\n"),
        Some("x"),
        &[],
    );
    check(
        None,
        Some("seed_oss"),
        &auto(),
        "<seed:think>\nabc\n</seed:think>x",
        Some("\nabc\n"),
        Some("x"),
        &[],
    );
    // Legacy R1-style parsers return the text before `</think>` as it is.
    check(
        None,
        Some("deepseek_r1"),
        &auto(),
        "<think>abc\n</think>x",
        Some("abc\n"),
        Some("x"),
        &[],
    );
}
