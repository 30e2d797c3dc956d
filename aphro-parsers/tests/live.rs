//! Streaming is live where the format allows it: final content and reasoning leave the parser
//! before the output ends; partial markers are held back.
use aphro_parsers::{ParserConfig, ParserRegistry, StreamParser};

fn parser(tool: Option<&str>, reasoning: Option<&str>) -> Box<dyn StreamParser> {
    ParserRegistry::new()
        .new_parser(tool, reasoning, &ParserConfig::default())
        .expect("registered")
}

#[test]
fn hermes_prefix_streams_and_holds_partial_marker() {
    let mut p = parser(Some("hermes"), None);
    assert_eq!(p.push("Hello <tool").content.as_deref(), Some("Hello "));
    assert!(p.push("_call>{\"name\": \"f\", ").is_empty());
    assert!(p.push("\"arguments\": {}}</tool_call>").is_empty());
    let d = p.finish();
    assert_eq!(d.content, None);
    assert_eq!(d.tool_calls.len(), 1);
    assert_eq!(d.tool_calls[0].name.as_deref(), Some("f"));
    assert!(d.tool_calls[0]
        .id
        .as_deref()
        .is_some_and(|i| i.starts_with("chatcmpl-tool-") && i.len() == 30));
}

#[test]
fn partial_marker_that_is_not_a_marker_is_released() {
    let mut p = parser(Some("hermes"), None);
    assert_eq!(p.push("a <tool").content.as_deref(), Some("a "));
    assert_eq!(p.push("box> b").content.as_deref(), Some("<toolbox> b"));
}

#[test]
fn qwen3_reasoning_streams_live() {
    let mut p = parser(Some("qwen3_coder"), Some("qwen3"));
    assert_eq!(p.push("<think>abc</th").reasoning.as_deref(), Some("abc"));
    let d = p.push("ink>Answer is  ");
    assert_eq!(d.reasoning, None);
    // engine-style content is stripped when calls follow: trailing spaces wait for the end.
    assert_eq!(d.content.as_deref(), Some("Answer is"));
    assert_eq!(p.finish().content.as_deref(), Some("  "));
}

#[test]
fn malformed_never_loses_text() {
    let text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": </tool_call> trailing";
    let mut p = parser(Some("hermes"), None);
    let m = aphro_parsers::parse(p.as_mut(), text);
    assert_eq!(m.content.as_deref(), Some(text));
    assert!(m.tool_calls.is_empty());
}

#[test]
fn unknown_names_are_errors() {
    let r = ParserRegistry::new();
    assert!(r
        .new_parser(Some("nope"), None, &ParserConfig::default())
        .is_err());
    assert!(r
        .new_parser(None, Some("nope"), &ParserConfig::default())
        .is_err());
}

#[test]
fn parallel_false_and_tool_choice_none() {
    let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
    let ctx = ParserConfig {
        parallel_tool_calls: false,
        ..ParserConfig::default()
    };
    let mut p = ParserRegistry::new()
        .new_parser(Some("hermes"), None, &ctx)
        .expect("registered");
    assert_eq!(aphro_parsers::parse(p.as_mut(), text).tool_calls.len(), 1);
    let ctx = ParserConfig {
        tool_choice: aphro_parsers::ToolChoice::None,
        ..ParserConfig::default()
    };
    let mut p = ParserRegistry::new()
        .new_parser(Some("hermes"), None, &ctx)
        .expect("registered");
    let m = aphro_parsers::parse(p.as_mut(), text);
    assert!(m.tool_calls.is_empty());
    assert_eq!(m.content.as_deref(), Some(text));
}

/// When a format sends a call before `finish()`.
#[derive(Clone, Copy, Debug)]
enum When {
    /// id + name once the name is final, then verbatim argument fragments as they arrive.
    Fragments,
    /// id + name once the name is final (before the call's closing marker), arguments whole
    /// at the closing marker.
    NameEarly,
    /// The whole call at its closing marker (or the format's certain point).
    AtClose,
}

/// (tool parser, text up to and including the first call's closing marker, closing marker,
/// text that continues after it, name, arguments, when)
type EarlyCase = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    When,
);

const CITY: &str = "{\"city\": \"Paris\"}";

const EARLY: &[EarlyCase] = &[
    ("kimi_k2", "Sure. <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>", "<|tool_call_end|>", "<|tool_call_begin|>functions.f:1<|tool_call_argument_begin|>{}", "get_weather", CITY, When::Fragments),
    ("openai", "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>", "<|call|>", "<|start|>assistant<|channel|>final<|message|>ok<|end|>", "get_weather", CITY, When::Fragments),
    ("mistral", "Sure. [TOOL_CALLS]get_weather{\"city\": \"Paris\"}", "}", " [TOOL_CALLS]f{}", "get_weather", CITY, When::Fragments),
    ("deepseek_v3", "Sure. <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>", "<｜tool▁call▁end｜>", "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```", "get_weather", CITY, When::AtClose),
    ("deepseek_v31", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>", "<｜tool▁call▁end｜>", "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{", "get_weather", CITY, When::AtClose),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", "</tool_call>", "\n<tool_call>f\n<arg_key>x", "get_weather", CITY, When::NameEarly),
    ("glm47", "Sure.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", "</tool_call>", "<tool_call>f", "get_weather", CITY, When::NameEarly),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>", "</function>", "\n</tool_call>\n<tool_call>\n<function=f>\n", "get_weather", CITY, When::NameEarly),
    ("qwen3_xml", "Sure. <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>", "</function>", "\n</tool_call>", "get_weather", CITY, When::NameEarly),
    ("seed_oss", "<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>", "</function>", "\n</seed:tool_call>", "get_weather", CITY, When::NameEarly),
    ("minimax_m2", "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n</invoke>", "</invoke>", "\n<invoke name=\"f\">\n</invoke>\n</minimax:tool_call>", "get_weather", CITY, When::NameEarly),
    ("step3", "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"get_weather\"><steptml:parameter name=\"city\">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜>", "<｜tool_call_end｜>", "<｜tool_calls_end｜>", "get_weather", CITY, When::AtClose),
    ("granite", "Sure. <|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", "}", ", {\"name\": \"f\", \"arguments\": {}}]", "get_weather", CITY, When::AtClose),
    ("jamba", "<tool_calls>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]</tool_calls>", "</tool_calls>", " trailing", "get_weather", CITY, When::AtClose),
    ("hunyuan_a13b", "<tool_calls>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]</tool_calls>", "</tool_calls>", "\n", "get_weather", CITY, When::AtClose),
    ("internlm", "Sure. <|action_start|><|plugin|>\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|action_end|>", "<|action_end|>", " more", "get_weather", CITY, When::AtClose),
    ("olmo3", "<function_calls>get_weather(city=\"Paris\")</function_calls>", "</function_calls>", "\n", "get_weather", CITY, When::AtClose),
    ("phi4_mini_json", "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", "]", " ok", "get_weather", CITY, When::AtClose),
];

/// Formats that send calls at `finish()` because a later block can still void every call.
const AT_FINISH: &[&str] = &[
    "hermes",
    "qwen3_json",
    "longcat",
    "granite4",
    "ernie45",
    "llama3_json",
    "llama4_json",
    "pythonic",
    "llama4_pythonic",
    "granite-20b-fc",
    "xlam",
];

/// Pushes `pieces` one by one; returns (name, id, argument text) of call 0 as sent so far.
fn sent_call0(
    p: &mut dyn StreamParser,
    agg: &mut aphro_parsers::Aggregator,
    pieces: &[&str],
) -> (Option<String>, Option<String>, String) {
    let mut name = None;
    let mut id = None;
    let mut args = String::new();
    for piece in pieces {
        let d = p.push(piece);
        agg.add(&d);
        for tc in d.tool_calls.iter().filter(|t| t.index == 0) {
            if tc.name.is_some() {
                assert!(name.is_none(), "call 0 started twice");
                name = tc.name.clone();
                id = tc.id.clone();
            }
            args.push_str(&tc.arguments);
        }
    }
    (name, id, args)
}

#[test]
fn calls_stream_before_finish() {
    for &(tool, head, close, tail, name, args, when) in EARLY {
        let ctx = || format!("{tool} ({when:?})");
        // Everything up to the closing marker, then the closing marker, then more output.
        let cut = head.len() - close.len();
        let mut p = parser(Some(tool), None);
        let mut agg = aphro_parsers::Aggregator::new();
        let open = sent_call0(p.as_mut(), &mut agg, &[&head[..cut]]);
        match when {
            When::Fragments => {
                assert_eq!(
                    open.0.as_deref(),
                    Some(name),
                    "{}: name before close",
                    ctx()
                );
                assert!(
                    !open.2.is_empty() && args.starts_with(&open.2),
                    "{}: argument fragments before close, got {:?}",
                    ctx(),
                    open.2
                );
            }
            When::NameEarly => {
                assert_eq!(
                    open.0.as_deref(),
                    Some(name),
                    "{}: name before close",
                    ctx()
                );
                assert!(args.starts_with(&open.2), "{}", ctx());
            }
            When::AtClose => assert_eq!(open.0, None, "{}: nothing before close", ctx()),
        }
        let rest = sent_call0(p.as_mut(), &mut agg, &[&head[cut..], tail]);
        let got_name = open.0.clone().or(rest.0.clone());
        assert_eq!(
            got_name.as_deref(),
            Some(name),
            "{}: name before finish",
            ctx()
        );
        assert_eq!(
            format!("{}{}", open.2, rest.2),
            args,
            "{}: whole arguments before finish",
            ctx()
        );
        let id = open.1.or(rest.1).unwrap_or_default();
        if tool == "kimi_k2" {
            assert_eq!(id, "functions.get_weather:0");
        } else {
            assert!(!id.is_empty(), "{}: id with the name", ctx());
        }
        // finish() only completes: the aggregate is the one-shot result.
        agg.add(&p.finish());
        let mut streamed = agg.into_message();
        let mut one =
            aphro_parsers::parse(parser(Some(tool), None).as_mut(), &format!("{head}{tail}"));
        for c in streamed
            .tool_calls
            .iter_mut()
            .chain(one.tool_calls.iter_mut())
        {
            c.id.clear();
        }
        assert_eq!(streamed, one, "{}", ctx());
        assert_eq!(one.tool_calls[0].name, name, "{}", ctx());
        assert_eq!(one.tool_calls[0].arguments, args, "{}", ctx());
    }
}

#[test]
fn fragment_formats_stream_arguments_piecewise() {
    for &(tool, head, close, _, name, args, when) in EARLY {
        if !matches!(when, When::Fragments) {
            continue;
        }
        let cut = head.len() - close.len();
        let start = head.rfind(args).expect("arguments in head");
        assert!(
            start + args.len() >= cut,
            "{tool}: arguments end at the close"
        );
        let mut p = parser(Some(tool), None);
        let mut agg = aphro_parsers::Aggregator::new();
        sent_call0(p.as_mut(), &mut agg, &[&head[..start]]);
        // Feed the arguments one character at a time: each one is sent as it arrives.
        let mut so_far = String::new();
        for (i, ch) in args.char_indices() {
            let got = sent_call0(p.as_mut(), &mut agg, &[&args[i..i + ch.len_utf8()]]);
            so_far.push_str(&got.2);
            assert_eq!(so_far, args[..i + ch.len_utf8()], "{tool}: fragment at {i}");
        }
        assert!(so_far == args, "{tool} {name}");
    }
}

#[test]
fn every_tool_parser_is_classified() {
    for name in aphro_parsers::TOOL_PARSERS {
        // Aliases share their format's class.
        let name = &match *name {
            "internlm2" => "internlm",
            n => n,
        };
        let early = EARLY.iter().any(|c| c.0 == *name);
        let late = AT_FINISH.contains(name);
        assert!(early ^ late, "{name}: early {early}, at finish {late}");
    }
}

#[test]
fn whole_text_formats_keep_calls_until_finish() {
    let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"g\", ";
    for tool in ["hermes", "qwen3_json", "granite4", "ernie45"] {
        let mut p = parser(Some(tool), None);
        assert!(p.push(text).tool_calls.is_empty(), "{tool}");
    }
}

#[test]
fn parallel_false_streams_only_the_first_call() {
    let ctx = ParserConfig {
        parallel_tool_calls: false,
        ..ParserConfig::default()
    };
    let mut p = ParserRegistry::new()
        .new_parser(Some("kimi_k2"), None, &ctx)
        .expect("registered");
    let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|>";
    let mut agg = aphro_parsers::Aggregator::new();
    let d = p.push(text);
    assert!(d.tool_calls.iter().all(|t| t.index == 0));
    agg.add(&d);
    agg.add(&p.finish());
    let m = agg.into_message();
    assert_eq!(m.tool_calls.len(), 1);
    assert_eq!(m.tool_calls[0].name, "f");
}

#[test]
fn early_cases_stream_equal_one_shot_at_every_cut() {
    for &(tool, head, _, tail, ..) in EARLY {
        let text = format!("{head}{tail}");
        let norm = |mut m: aphro_parsers::ParsedMessage| {
            for c in &mut m.tool_calls {
                c.id.clear();
            }
            m
        };
        let one = norm(aphro_parsers::parse(
            parser(Some(tool), None).as_mut(),
            &text,
        ));
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|c| text.is_char_boundary(*c))
            .collect();
        for &c in &bounds {
            let mut p = parser(Some(tool), None);
            let mut agg = aphro_parsers::Aggregator::new();
            agg.add(&p.push(&text[..c]));
            agg.add(&p.push(&text[c..]));
            agg.add(&p.finish());
            assert_eq!(norm(agg.into_message()), one, "{tool} cut at {c}");
        }
        let mut p = parser(Some(tool), None);
        let mut agg = aphro_parsers::Aggregator::new();
        for w in bounds.windows(2) {
            agg.add(&p.push(&text[w[0]..w[1]]));
        }
        agg.add(&p.finish());
        assert_eq!(norm(agg.into_message()), one, "{tool} char by char");
    }
}
