//! gpt-oss chats render as Harmony exactly as vLLM's Rust render server renders them.
//!
//! Goldens: `testdata/render_harmony/gpt_oss_vllm_rs.jsonl`, every chat request of the render
//! corpus with vllm-rs's status and prompt ids (`scripts/make_harmony_goldens.py`). Every case
//! must pass, except the two the HTTP layer answers before any rendering: an unknown `model`
//! (404) and a body sent without a JSON content type; `aphro-http`'s tests cover those.
mod common;

use aphro_core::harmony::HarmonyOptions;
use aphro_core::parser_hooks::ParserHooks;
use aphro_core::renderer::parse_chat_request;
use aphro_core::{Model, RenderOptions, Renderer};
use serde_json::Value;
use std::sync::Arc;

/// The gpt-oss tokenizer fixture as the model vllm-rs was run on (`model_type: gpt_oss`).
fn gpt_oss() -> Arc<Model> {
    let dir = common::asset("tokenizers/gpt_oss");
    let mut model = Model::load(dir.to_str().expect("utf-8 path")).expect("load tokenizer dir");
    model.model_type = Some("gpt_oss".into());
    Arc::new(model)
}

/// The flags compare_render.py gives `aphro launch render` for this model.
fn renderer(model: &Arc<Model>, start_date: &str) -> Renderer {
    let hooks = ParserHooks::new(model.clone(), Some("openai"), Some("openai_gptoss"));
    let options = RenderOptions {
        hooks: Some(Arc::new(hooks)),
        max_model_len: Some(131_072),
        strict_template_kwargs: true,
        tool_call_parser: Some("openai".into()),
        enable_auto_tool_choice: true,
        harmony: HarmonyOptions {
            start_date: Some(start_date.into()),
            system_instructions: false,
        },
        ..RenderOptions::default()
    };
    Renderer::new(model.clone(), options).expect("renderer")
}

/// Cases decided by routing or headers rather than by the renderer.
const HTTP_LAYER_CASES: &[&str] = &[
    "chat_invalid/unknown_model",
    "chat_invalid/wrong_content_type",
];

/// Where aphro's status differs from vllm-rs's on purpose, each listed with its reason in
/// `docs/render-compat.md` ("Documented differences"): vllm-rs departs from vLLM's Python
/// server and aphro answers as Python does, or (template kwargs) aphro refuses on purpose.
/// The ids of every other case, and the status of these, are checked.
const DOCUMENTED_STATUS_DIFFERENCES: &[&str] = &[
    "chat/template_kwargs_unknown",
    "chat/content_parts_empty_list",
    "chat/content_part_refusal",
    "chat/content_empty_string",
    "chat/content_null_user",
    "chat/n_and_seed",
    "chat/special_tokens_flags",
    "chat_invalid/empty_messages",
    "chat_invalid/text_part_missing_text",
    "chat_invalid/max_tokens_over_context",
    "chat_invalid/top_logprobs_too_many",
];

#[test]
fn gpt_oss_renders_as_vllm_rs_renders_harmony() {
    let model = gpt_oss();
    let path = common::testdata("render_harmony/gpt_oss_vllm_rs.jsonl");
    let text = std::fs::read_to_string(&path).expect("harmony goldens");
    let (mut total, mut ok_200, mut failures) = (0, 0, Vec::new());
    // One renderer per pinned date (building one loads the tokenizer twice).
    let mut renderers: std::collections::HashMap<String, Renderer> = Default::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: Value = serde_json::from_str(line).expect("golden line");
        let name = case["name"].as_str().unwrap_or("?");
        let start_date = case["start_date"].as_str().expect("start_date");
        let status = case["status"].as_u64().expect("status");
        if HTTP_LAYER_CASES.contains(&name) {
            continue;
        }
        total += 1;
        let body = case["body"].as_str().expect("body");
        // A body serde_json refuses (a lone surrogate escape) is the server's 400 too.
        let got = serde_json::from_str::<Value>(body)
            .map_err(|e| aphro_core::Error::bad_request(e.to_string()))
            .and_then(|v| parse_chat_request(&v))
            .and_then(|req| {
                renderers
                    .entry(start_date.to_owned())
                    .or_insert_with(|| renderer(&model, start_date))
                    .render_chat(&req)
            })
            .map_err(|e| (e.status(), e.to_string()));
        let got_status = got.as_ref().map_or_else(|(s, _)| u64::from(*s), |_| 200);
        if DOCUMENTED_STATUS_DIFFERENCES.contains(&name) {
            if got_status == status {
                failures.push(format!(
                    "{name}: now answers {status} as vllm-rs does; drop it from the list"
                ));
            }
            continue;
        }
        match (status, got) {
            (200, Ok(g)) => {
                let want: Vec<u32> =
                    serde_json::from_value(case["token_ids"].clone()).expect("token_ids");
                if g.token_ids == want {
                    ok_200 += 1;
                } else {
                    let at = want.iter().zip(&g.token_ids).position(|(a, b)| a != b);
                    failures.push(format!(
                        "{name}: ids differ at {at:?} ({} vs {} ids)",
                        g.token_ids.len(),
                        want.len()
                    ));
                }
            }
            (200, Err((s, e))) => failures.push(format!("{name}: vllm-rs 200, aphro {s}: {e}")),
            (want, Ok(_)) => failures.push(format!("{name}: vllm-rs {want}, aphro 200")),
            (want, Err((s, e))) if u64::from(s) != want => {
                failures.push(format!("{name}: vllm-rs {want}, aphro {s}: {e}"))
            }
            _ => {}
        }
    }
    println!("harmony: {total} cases, {ok_200} rendered ids equal vllm-rs");
    assert!(total > 50, "too few harmony goldens: {total}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
