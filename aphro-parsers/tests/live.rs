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
