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
