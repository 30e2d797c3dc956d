//! Whitespace at the reasoning / content / tool-call boundaries, as vLLM 0.33.0 decides it.
//!
//! Rules (vLLM 0.33.0 sources):
//! * `vllm/parser/engine/parser_engine.py` `extract_reasoning` / `_single_pass_parse`: the
//!   joined reasoning text is `.rstrip()`ed when the grammar's
//!   `strip_trailing_reasoning_whitespace` is set (`parser_engine_config.py`, default `True`).
//!   `qwen3.py` (and `seed_oss.py`, which inherits it) turn it off; `glm47_moe.py` (`glm45`,
//!   `glm47`) and `minimax_m2.py` keep the default; `mistral.py` and `kimi_k2.py` set it.
//! * `vllm/parser/abstract_parser.py` `DelegatingParser._extract_tool_calls`: when the tool
//!   parser returned calls, `if content and content.strip() == "": content = None` — for every
//!   tool parser, legacy ones included, so whitespace between reasoning and a call is dropped.
//!   With `tool_choice` `required`/named parsed like auto and no call found, `None` or
//!   whitespace-only content becomes `None`; message assembly
//!   (`entrypoints/openai/chat_completion/message_assembly.py`) then turns `None` into `""` for
//!   those forced choices.
//!
//! Every case is checked one-shot and streamed (every single cut point and char by char).
use aphro_parsers::{Aggregator, ParsedMessage, ParserConfig, ParserRegistry, ToolChoice};

const WEATHER: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

fn ctx_with(choice: ToolChoice) -> ParserConfig {
    ParserConfig {
        tool_choice: choice,
        ..ParserConfig::default()
    }
}

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

// ---- content between reasoning and a tool call -----------------------------------------

#[test]
fn hermes_after_reasoning_gives_null_for_whitespace_content() {
    let text = format!("<think>\nThe user wants weather.\n</think>\n\n{WEATHER}");
    check(
        Some("hermes"),
        Some("qwen3"),
        &auto(),
        &text,
        Some("\nThe user wants weather.\n"),
        None,
        &["get_weather"],
    );
    check(
        Some("hermes"),
        Some("glm45"),
        &auto(),
        &text,
        Some("\nThe user wants weather."),
        None,
        &["get_weather"],
    );
    check(
        Some("hermes"),
        Some("deepseek_r1"),
        &auto(),
        &text,
        Some("\nThe user wants weather.\n"),
        None,
        &["get_weather"],
    );
}

#[test]
fn legacy_tool_parsers_drop_whitespace_only_content_with_calls() {
    let cases: &[(&str, String)] = &[
        ("hermes", format!("\n\n{WEATHER}")),
        ("qwen3_json", format!(" \n{WEATHER}")),
        ("ernie45", format!("\n{WEATHER}")),
        (
            "longcat",
            "\n<longcat_tool_call>{\"name\": \"get_time\", \"arguments\": {}}</longcat_tool_call>"
                .into(),
        ),
        ("granite4", format!("\n\n{WEATHER}")),
        (
            "granite-20b-fc",
            "\n<function_call> {\"name\": \"get_time\", \"arguments\": {}}".into(),
        ),
        (
            "internlm",
            "\n<|action_start|><|plugin|>\n{\"name\": \"get_time\", \"parameters\": {}}<|action_end|>"
                .into(),
        ),
        (
            "hunyuan_a13b",
            "\n\n<tool_calls>[{\"name\": \"get_time\", \"arguments\": {}}]</tool_calls>".into(),
        ),
        (
            "deepseek_v31",
            "\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
                .into(),
        ),
        (
            // Content before the section and after its end are joined, then checked.
            "deepseek_v3",
            "\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n"
                .into(),
        ),
        (
            // Engine-based, content kept unstripped, but whitespace-only content is dropped.
            "kimi_k2",
            "\n<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
                .into(),
        ),
    ];
    for (name, text) in cases {
        let call = match *name {
            "hermes" | "qwen3_json" | "ernie45" | "granite4" => "get_weather",
            _ => "get_time",
        };
        check(Some(name), None, &auto(), text, None, None, &[call]);
    }
}

#[test]
fn text_around_calls_is_kept_verbatim_when_not_only_whitespace() {
    check(
        Some("hermes"),
        Some("qwen3"),
        &auto(),
        &format!("<think>r</think>\n\nSure.\n{WEATHER}"),
        Some("r"),
        Some("\n\nSure.\n"),
        &["get_weather"],
    );
}

#[test]
fn whitespace_without_calls_stays_content() {
    // No call: the tool parser's content is returned unchanged.
    check(
        Some("hermes"),
        Some("qwen3"),
        &auto(),
        "<think>r</think>\n\n",
        Some("r"),
        Some("\n\n"),
        &[],
    );
}

#[test]
fn forced_tool_choice_gives_empty_content_not_whitespace() {
    // hermes does not take the required/named fast path: parsed like auto. With a call, the
    // whitespace-only content is None, and message assembly makes it "" for forced choices.
    for choice in [
        ToolChoice::Required,
        ToolChoice::Named("get_weather".into()),
    ] {
        let ctx = ctx_with(choice.clone());
        check(
            Some("hermes"),
            None,
            &ctx,
            &format!("\n\n{WEATHER}"),
            None,
            Some(""),
            &["get_weather"],
        );
        check(
            Some("hermes"),
            None,
            &ctx,
            WEATHER,
            None,
            Some(""),
            &["get_weather"],
        );
        // No call and whitespace-only content: None, then "".
        check(Some("hermes"), None, &ctx, " \n", None, Some(""), &[]);
        // No call and real text: unchanged.
        check(
            Some("hermes"),
            None,
            &ctx,
            " text ",
            None,
            Some(" text "),
            &[],
        );
    }
}

#[test]
fn tool_choice_none_keeps_whitespace() {
    let ctx = ctx_with(ToolChoice::None);
    let text = format!("\n\n{WEATHER}");
    check(
        Some("hermes"),
        None,
        &ctx,
        &text,
        None,
        Some(text.as_str()),
        &[],
    );
}

#[test]
fn engine_tool_parsers_return_null_for_empty_content() {
    // `ParserEngine._strip_content_whitespace` ends in `content or None`, and
    // `DelegatingParser._extract_tool_calls` returns `tool_call_info.content or None` when an
    // engine parser finds no call (`tool_choice: "none"` goes through the same engine call).
    for name in [
        "qwen3_coder",
        "qwen3_xml",
        "seed_oss",
        "glm45",
        "glm47",
        "kimi_k2",
        "minimax_m2",
        "mistral",
        "granite",
    ] {
        check(Some(name), None, &auto(), "", None, None, &[]);
        check(
            Some(name),
            None,
            &ctx_with(ToolChoice::None),
            "",
            None,
            None,
            &[],
        );
    }
    // Legacy parsers hand the (empty) text back as it is.
    check(Some("hermes"), None, &auto(), "", None, Some(""), &[]);
}

#[test]
fn forced_tool_choice_without_any_content_gives_empty_string() {
    // The reasoning parser returns content None; required parsed like auto finds no call →
    // None → message assembly makes it "".
    let ctx = ctx_with(ToolChoice::Required);
    check(
        Some("hermes"),
        Some("qwen3"),
        &ctx,
        "<think>abc</think>",
        Some("abc"),
        Some(""),
        &[],
    );
    check(
        Some("hermes"),
        Some("qwen3"),
        &auto(),
        "<think>abc</think>",
        Some("abc"),
        None,
        &[],
    );
}

#[test]
fn python_whitespace_set_is_used() {
    // Python's str.isspace counts U+001C..U+001F (Rust's char::is_whitespace does not).
    check(
        None,
        Some("glm45"),
        &auto(),
        "<think>abc\u{1f}</think>x",
        Some("abc"),
        Some("x"),
        &[],
    );
    check(
        Some("hermes"),
        None,
        &auto(),
        &format!("\u{1c}\n{WEATHER}"),
        None,
        None,
        &["get_weather"],
    );
    check(
        Some("qwen3_coder"),
        None,
        &auto(),
        "\u{1d}Hi\u{1e} <function=get_time>\n</function>",
        None,
        Some("Hi"),
        &["get_time"],
    );
}
