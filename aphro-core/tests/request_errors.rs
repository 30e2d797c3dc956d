//! Request errors as vLLM 0.33.0 reports them: structural 400s naming the field and the
//! expected type, an empty `messages` list the template cannot render, content parts vLLM
//! refuses, tool choices that need a tool parser, and the `content` of a tool-call message.
mod common;
use aphro_core::protocol::{parse_derender_chat_body, DerenderChatBody};
use aphro_core::renderer::{parse_chat_request, parse_completion_request};
use aphro_core::{DerenderOptions, Derenderer, Error, Model, RenderOptions, Renderer};
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

fn model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let p = common::asset("tokenizers/qwen3");
            Arc::new(Model::load(p.to_str().unwrap_or_default()).expect("qwen3 tokenizer"))
        })
        .clone()
}

fn renderer(options: RenderOptions) -> Renderer {
    Renderer::new(
        model(),
        RenderOptions {
            served_model_names: Some(vec!["Qwen/Qwen3-0.6B".into()]),
            ..options
        },
    )
    .expect("renderer")
}

fn user(content: Value) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    body
}

/// Status, envelope `type`, `param` and message of a refused request.
fn refusal(e: &Error) -> (u16, &'static str, Option<String>, String) {
    (
        e.status(),
        e.error_type(),
        e.param().map(str::to_owned),
        e.to_string(),
    )
}

fn structural(body: Value) -> (Option<String>, String) {
    let e = parse_chat_request(&body).expect_err("structurally invalid");
    assert_eq!(e.status(), 400, "{e}");
    assert_eq!(e.error_type(), "Bad Request", "{e}");
    (e.param().map(str::to_owned), e.to_string())
}

fn one(entry: &str) -> String {
    format!("1 validation error:\n  {entry}")
}

#[test]
fn structural_errors_name_the_field_and_the_expected_type() {
    let hi = user(json!("hi"));
    assert_eq!(
        structural(with(hi.clone(), json!({"temperature": "hot"}))),
        (
            Some("body.temperature".into()),
            one(
                "{'type': 'float_parsing', 'loc': 'body.temperature', 'msg': 'Input should be \
                 a valid number, unable to parse string as a number', 'input': 'hot'}"
            )
        )
    );
    assert_eq!(
        structural(with(hi.clone(), json!({"session_id": 123}))),
        (
            Some("body.session_id".into()),
            one(
                "{'type': 'string_type', 'loc': 'body.session_id', 'msg': 'Input should be a \
                 valid string', 'input': '123'}"
            )
        )
    );
    assert_eq!(
        structural(with(hi.clone(), json!({"n": 1.5}))),
        (
            Some("body.n".into()),
            one(
                "{'type': 'int_from_float', 'loc': 'body.n', 'msg': 'Input should be a valid \
                 integer, got a number with a fractional part', 'input': '1.5'}"
            )
        )
    );
    assert_eq!(
        structural(with(hi.clone(), json!({"logprobs": "x"}))),
        (
            Some("body.logprobs".into()),
            one(
                "{'type': 'bool_parsing', 'loc': 'body.logprobs', 'msg': 'Input should be a \
                 valid boolean, unable to interpret input', 'input': 'x'}"
            )
        )
    );
    assert_eq!(
        structural(with(hi.clone(), json!({"stop_token_ids": [1, "a"]}))),
        (
            Some("body.stop_token_ids.1".into()),
            one(
                "{'type': 'int_parsing', 'loc': 'body.stop_token_ids.1', 'msg': 'Input should \
                 be a valid integer, unable to parse string as an integer', 'input': 'a'}"
            )
        )
    );
    assert_eq!(
        structural(with(hi.clone(), json!({"stream_options": "x"}))),
        (
            Some("body.stream_options".into()),
            one(
                "{'type': 'model_attributes_type', 'loc': 'body.stream_options', 'msg': \
                 'Input should be a valid dictionary or object to extract fields from', \
                 'input': 'x'}"
            )
        )
    );
    assert_eq!(
        structural(json!({"model": "m"})),
        (
            Some("body.messages".into()),
            one(
                "{'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', \
                 'input': '<dict of 1 items>'}"
            )
        )
    );
    // A union (`str | list[str]`) reports each branch, as pydantic does.
    assert_eq!(
        structural(with(hi.clone(), json!({"stop": 5}))),
        (
            Some("body.stop".into()),
            "2 validation errors:\n  \
             {'type': 'string_type', 'loc': 'body.stop', 'msg': 'Input should be a valid \
             string', 'input': '5'}\n  \
             {'type': 'list_type', 'loc': 'body.stop', 'msg': 'Input should be a valid list', \
             'input': '5'}"
                .into()
        )
    );
    // Inside the messages: the message's own path.
    assert_eq!(
        structural(user(json!(5))),
        (
            Some("body.messages.0.content".into()),
            "2 validation errors:\n  \
             {'type': 'string_type', 'loc': 'body.messages.0.content', 'msg': 'Input should be \
             a valid string', 'input': '5'}\n  \
             {'type': 'list_type', 'loc': 'body.messages.0.content', 'msg': 'Input should be a \
             valid list', 'input': '5'}"
                .into()
        )
    );
    let (param, message) = structural(user(json!([{"type": "text", "text": 5}])));
    assert_eq!(param.as_deref(), Some("body.messages.0.content"));
    assert!(
        message.ends_with(
            "{'type': 'string_type', 'loc': 'body.messages.0.content.0.text', 'msg': 'Input \
             should be a valid string', 'input': '5'}"
        ),
        "{message}"
    );
    assert_eq!(
        structural(json!({"messages": [{"role": 5, "content": "hi"}]})).0,
        Some("body.messages.0.role".into())
    );
    assert_eq!(
        structural(json!({"messages": ["hi"]})),
        (
            Some("body.messages.0".into()),
            one(
                "{'type': 'dict_type', 'loc': 'body.messages.0', 'msg': 'Input should be a \
                 valid dictionary', 'input': 'hi'}"
            )
        )
    );
    // Unknown keys are accepted and ignored, as vLLM does.
    assert!(parse_chat_request(&with(hi, json!({"not_a_field": {"x": 1}}))).is_ok());

    let e = parse_completion_request(&json!({"prompt": 5})).expect_err("prompt type");
    assert_eq!(e.param(), Some("body.prompt"));
    assert_eq!(
        e.to_string(),
        "4 validation errors:\n  \
         {'type': 'list_type', 'loc': 'body.prompt', 'msg': 'Input should be a valid list', \
         'input': '5'}\n  \
         {'type': 'list_type', 'loc': 'body.prompt', 'msg': 'Input should be a valid list', \
         'input': '5'}\n  \
         {'type': 'string_type', 'loc': 'body.prompt', 'msg': 'Input should be a valid string', \
         'input': '5'}\n  \
         {'type': 'list_type', 'loc': 'body.prompt', 'msg': 'Input should be a valid list', \
         'input': '5'}"
    );
}

#[test]
fn reasoning_effort_outside_the_literal_is_a_literal_error() {
    let r = renderer(RenderOptions::default());
    let req = parse_chat_request(&with(
        user(json!("hi")),
        json!({"reasoning_effort": "extreme"}),
    ))
    .expect("parses");
    let e = r.render_chat(&req).expect_err("unknown effort");
    assert_eq!(
        refusal(&e),
        (
            400,
            "Bad Request",
            Some("body.reasoning_effort".into()),
            one(
                "{'type': 'literal_error', 'loc': 'body.reasoning_effort', 'msg': \"Input \
                 should be 'none', 'minimal', 'low', 'medium', 'high', 'xhigh' or 'max'\", \
                 'input': 'extreme', 'ctx': {'expected': \"'none', 'minimal', 'low', 'medium', \
                 'high', 'xhigh' or 'max'\"}}"
            )
        )
    );
}

#[test]
fn empty_messages_are_named_when_the_template_cannot_render_them() {
    let r = renderer(RenderOptions::default());
    let req = parse_chat_request(&json!({"messages": []})).expect("an empty list parses");
    let e = r
        .render_chat(&req)
        .expect_err("qwen3's template indexes messages[0]");
    // The template's own error is kept.
    assert_eq!(
        refusal(&e),
        (
            400,
            "BadRequestError",
            Some("messages".into()),
            "The `messages` list is empty and the chat template cannot render an empty \
             conversation: undefined value (in chat_template:13) (parameter=messages)"
                .into()
        )
    );

    // A template that handles an empty list renders it, as in vLLM.
    let lenient = renderer(RenderOptions {
        chat_template: Some("{% for m in messages %}{{ m.content }}{% endfor %}hello".into()),
        ..RenderOptions::default()
    });
    let out = lenient.render_chat(&req).expect("renders");
    assert_eq!(
        model()
            .tokenizer
            .decode(&out.token_ids, false)
            .expect("decode"),
        "hello"
    );
}

#[test]
fn unknown_and_multimodal_content_parts_are_refused() {
    let r = renderer(RenderOptions::default());
    let render = |content: Value| {
        let req = parse_chat_request(&user(content)).expect("parses");
        r.render_chat(&req)
    };
    let e = render(json!([{"type": "text", "text": "a"}, {"type": "foo", "text": "x"}]))
        .expect_err("unknown part type");
    assert_eq!(
        refusal(&e),
        (
            400,
            "BadRequestError",
            Some("type".into()),
            "Unsupported chat content part type: 'foo'. Supported types: audio_embeds, \
             audio_url, image_embeds, image_pil, image_url, input_audio, input_image, \
             input_text, output_text, prompt_embeds, refusal, text, thinking, tool_reference, \
             video_embeds, video_url. (parameter=type, value=foo)"
                .into()
        )
    );
    for part in [
        json!({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}),
        json!({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}),
        json!({"type": "video_url", "video_url": {"url": "https://example.com/cat.mp4"}}),
        json!({"type": "audio_url", "audio_url": {"url": "https://example.com/cat.wav"}}),
    ] {
        let e = render(json!([{"type": "text", "text": "what is this?"}, part]))
            .expect_err("media on a text-only model");
        assert_eq!(
            refusal(&e),
            (
                400,
                "BadRequestError",
                None,
                "Qwen/Qwen3-0.6B is not a multimodal model".into()
            ),
            "{part}"
        );
    }
    let e = render(json!([{"type": "image_embeds", "image_embeds": "AAAA"}])).expect_err("embeds");
    assert_eq!(
        refusal(&e),
        (
            400,
            "BadRequestError",
            None,
            "The model is not multimodal.".into()
        )
    );
    // The first refused part decides.
    let e = render(json!([{"type": "foo"}, {"type": "image_url", "image_url": {"url": "u"}}]))
        .expect_err("unknown first");
    assert_eq!(e.param(), Some("type"));
    // Text-like parts still render.
    let ok = render(json!([{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}]))
        .expect("text parts");
    let text = model()
        .tokenizer
        .decode(&ok.token_ids, false)
        .expect("decode");
    assert!(text.contains("<|im_start|>user\na\nb<|im_end|>"), "{text}");
}

#[test]
fn tool_choice_needs_a_tool_parser() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let req = |tool_choice: Option<Value>| {
        let mut body = with(user(json!("Weather in Paris?")), json!({"tools": tools}));
        if let Some(tc) = tool_choice {
            body["tool_choice"] = tc;
        }
        parse_chat_request(&body).expect("parses")
    };
    let plain = renderer(RenderOptions::default());
    let refused = |r: &Renderer, tc: Option<Value>| {
        let e = r.render_chat(&req(tc)).expect_err("needs a parser");
        let (status, kind, param, message) = refusal(&e);
        assert_eq!((status, kind, param), (400, "BadRequestError", None));
        message
    };
    let auto = "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser \
                to be set";
    // `tool_choice` defaults to "auto" when tools are given.
    assert_eq!(refused(&plain, None), auto);
    assert_eq!(refused(&plain, Some(json!("auto"))), auto);
    assert_eq!(
        refused(&plain, Some(json!("required"))),
        "tool_choice=\"required\" requires --tool-call-parser to be set"
    );
    assert_eq!(
        refused(
            &plain,
            Some(json!({"type": "function", "function": {"name": "get_weather"}}))
        ),
        "tool_choice=function \"get_weather\" requires --tool-call-parser to be set"
    );
    plain
        .render_chat(&req(Some(json!("none"))))
        .expect("\"none\" needs no parser");

    // A parser without --enable-auto-tool-choice is no parser to vLLM.
    let parser_only = renderer(RenderOptions {
        tool_call_parser: Some("hermes".into()),
        ..RenderOptions::default()
    });
    assert_eq!(refused(&parser_only, None), auto);
    assert_eq!(
        refused(&parser_only, Some(json!("required"))),
        "tool_choice=\"required\" requires --tool-call-parser to be set"
    );
    // --enable-auto-tool-choice alone lets "auto" through (vLLM's check reads the flag).
    let auto_only = renderer(RenderOptions {
        enable_auto_tool_choice: true,
        ..RenderOptions::default()
    });
    auto_only.render_chat(&req(None)).expect("auto allowed");
    assert_eq!(
        refused(&auto_only, Some(json!("required"))),
        "tool_choice=\"required\" requires --tool-call-parser to be set"
    );
    let both = renderer(RenderOptions {
        tool_call_parser: Some("hermes".into()),
        enable_auto_tool_choice: true,
        ..RenderOptions::default()
    });
    for tc in [
        None,
        Some(json!("auto")),
        Some(json!("required")),
        Some(json!({"type": "function", "function": {"name": "get_weather"}})),
    ] {
        both.render_chat(&req(tc)).expect("tool parsing available");
    }
    // /tokenize renders tools without the check, as vLLM's tokenizer route does.
    let tok: aphro_core::protocol::TokenizeRequest = serde_json::from_value(with(
        user(json!("Weather in Paris?")),
        json!({"tools": tools}),
    ))
    .expect("tokenize request");
    plain.tokenize(&tok).expect("tokenize ignores tool_choice");
}

#[test]
fn empty_content_stays_empty_next_to_tool_calls() {
    // xLAM's parser returns content "" beside its calls (corpus `xlam-extra-2`, run on vLLM
    // 0.33.0), and vLLM's message assembly keeps it.
    let d = Derenderer::new(
        model(),
        DerenderOptions {
            tool_call_parser: Some("xlam".into()),
            enable_auto_tool_choice: true,
            ..DerenderOptions::default()
        },
    )
    .expect("derenderer");
    let text = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]"#;
    let ids = model().tokenizer.encode(text, false).expect("encode");
    let body = json!({
        "generate_response": {"request_id": "generate-tokens-chatcmpl-x", "choices": [
            {"index": 0, "finish_reason": "stop", "stop_reason": null, "token_ids": ids}]},
        "prompt_tokens": 3,
        "prompt_token_ids": [1, 2, 3],
        "chat_request": {
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
                {"type": "object", "properties": {"city": {"type": "string"},
                 "unit": {"type": "string"}}}}}],
            "tool_choice": "auto"
        }
    });
    let DerenderChatBody::Full(req) = parse_derender_chat_body(&body).expect("body") else {
        panic!("not a full body");
    };
    let out = serde_json::to_value(d.derender_chat(*req).expect("derender")).expect("json");
    let choice = &out["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(choice["message"]["content"], json!(""), "{out}");
}
