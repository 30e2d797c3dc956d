//! Server-level render options reach the template as vLLM passes them.
mod common;

use aphro_core::protocol::ChatCompletionRequest;
use aphro_core::{Model, RenderOptions, Renderer};
use serde_json::json;
use std::sync::Arc;

fn chat(body: serde_json::Value) -> ChatCompletionRequest {
    serde_json::from_value(body).expect("chat request")
}

/// `--default-chat-template-kwargs` are template variables for every request; a request's own
/// `chat_template_kwargs` win key by key.
#[test]
fn default_chat_template_kwargs_reach_the_template() {
    let model = Arc::new(
        Model::load(&common::asset(common::SMOLLM2_GGUF).to_string_lossy()).expect("model"),
    );
    let mut options = RenderOptions {
        chat_template: Some(
            "{{ 'mode=' ~ (mode | default('unset')) ~ ' other=' ~ (other | default('unset')) ~ '|' }}\
             {% for m in messages %}{{ m.content }}{% endfor %}"
                .into(),
        ),
        ..RenderOptions::default()
    };
    options
        .default_chat_template_kwargs
        .insert("mode".into(), json!("server"));
    options
        .default_chat_template_kwargs
        .insert("other".into(), json!("kept"));
    let r = Renderer::new(model.clone(), options).expect("renderer");
    let messages = json!([{"role": "user", "content": "hi"}]);
    let plain = r
        .render_chat_prompt(&chat(json!({"messages": messages})))
        .expect("render");
    assert_eq!(plain.prompt, "mode=server other=kept|hi");
    let overridden = r
        .render_chat_prompt(&chat(
            json!({"messages": messages, "chat_template_kwargs": {"mode": "request"}}),
        ))
        .expect("render");
    assert_eq!(overridden.prompt, "mode=request other=kept|hi");
    // Without server defaults the template sees only the request's.
    let bare = Renderer::new(
        model,
        RenderOptions {
            chat_template: Some("{{ mode | default('unset') }}".into()),
            ..RenderOptions::default()
        },
    )
    .expect("renderer");
    assert_eq!(
        bare.render_chat_prompt(&chat(json!({"messages": messages})))
            .expect("render")
            .prompt,
        "unset"
    );
}

/// A model whose generation config sets `skip_special_tokens: false` shows special tokens
/// in derendered text unless the request says otherwise (vLLM fills the request's unset
/// field from the model's defaults).
#[test]
fn generation_config_skip_special_tokens_reaches_derender() {
    use aphro_core::protocol::DerenderCompletionRequest;
    use aphro_core::{DerenderOptions, Derenderer};
    let load = |skip: Option<bool>| {
        let mut m =
            Model::load(&common::asset(common::SMOLLM2_GGUF).to_string_lossy()).expect("model");
        m.generation_defaults.skip_special_tokens = skip;
        Derenderer::new(Arc::new(m), DerenderOptions::default()).expect("derenderer")
    };
    // "<|im_start|>" (id 1) between two ordinary tokens.
    let body = |extra: serde_json::Value| -> DerenderCompletionRequest {
        let mut req = json!({"prompt": "x", "max_tokens": 3});
        for (k, v) in extra.as_object().expect("object") {
            req[k] = v.clone();
        }
        serde_json::from_value(json!({
            "generate_responses": [{"request_id": "r", "choices": [
                {"index": 0, "token_ids": [34, 1, 35], "finish_reason": "length"}]}],
            "completion_request": req,
        }))
        .expect("derender body")
    };
    let text = |d: &Derenderer, extra| {
        d.derender_completion(body(extra))
            .expect("derender")
            .choices[0]
            .text
            .clone()
    };
    assert_eq!(text(&load(None), json!({})), "23");
    assert_eq!(text(&load(Some(false)), json!({})), "2<|im_start|>3");
    assert_eq!(
        text(&load(Some(false)), json!({"skip_special_tokens": true})),
        "23"
    );
}

/// An unknown `response_format` type is refused as pydantic refuses it, on render too.
#[test]
fn unknown_response_format_type_is_a_structural_400() {
    let model = Arc::new(
        Model::load(&common::asset(common::SMOLLM2_GGUF).to_string_lossy()).expect("model"),
    );
    let r = Renderer::new(model, RenderOptions::default()).expect("renderer");
    let err = r
        .render_chat(&chat(
            json!({"messages": [{"role": "user", "content": "hi"}],
                                   "response_format": {"type": "xml"}}),
        ))
        .expect_err("refused");
    assert_eq!(err.param(), Some("body.response_format.type"));
    assert!(err.to_string().contains("literal_error"), "{err}");
    assert!(err.to_string().contains("'json_schema'"), "{err}");
    for ok in ["text", "json_object"] {
        r.render_chat(&chat(
            json!({"messages": [{"role": "user", "content": "hi"}],
                                   "response_format": {"type": ok}}),
        ))
        .expect("accepted");
    }
}

/// `prompt_embeds` of any shape needs `--enable-prompt-embeds`, which aphro does not have: a
/// 400 naming it, also next to a prompt and whatever its type, never a render that ignores it.
#[test]
fn prompt_embeds_are_refused_in_any_shape() {
    let model = Arc::new(
        Model::load(&common::asset(common::SMOLLM2_GGUF).to_string_lossy()).expect("model"),
    );
    let r = Renderer::new(model, RenderOptions::default()).expect("renderer");
    for embeds in [json!("AAAA"), json!(["AAAA"]), json!(5), json!({"x": 1})] {
        let req = aphro_core::renderer::parse_completion_request(
            &json!({"prompt": "hi", "prompt_embeds": embeds.clone()}),
        )
        .expect("structurally valid");
        let err = r.render_completion(&req).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "You must set `--enable-prompt-embeds` to input `prompt_embeds`. \
             (parameter=prompt_embeds)",
            "{embeds}"
        );
    }
    // An empty list is no embeddings.
    let req = aphro_core::renderer::parse_completion_request(
        &json!({"prompt": "hi", "prompt_embeds": []}),
    )
    .expect("structurally valid");
    assert!(r.render_completion(&req).is_ok());
}
