//! Render parity against the goldens in `testdata/render/*.jsonl` (HF transformers driven as
//! vLLM drives it). Every case must pass; per-family counts are printed.
mod common;

use aphro_core::chat_prompt::{ChatPrompter, ToolArguments};
use aphro_core::protocol::{ChatCompletionRequest, CompletionRequest};
use aphro_core::{ContentFormat, FixedClock, Model, RenderOptions, Renderer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

fn clock(now: &str) -> Arc<FixedClock> {
    let t = chrono::NaiveDateTime::parse_from_str(now, "%Y-%m-%dT%H:%M:%S")
        .expect("frozen clock in case");
    Arc::new(FixedClock(t))
}

/// The model a golden's `tokenizer` path refers to. SmolLM2 has no tokenizer.json in the
/// asset cache: its cases run on the GGUF's own tokenizer and template.
fn load_model(tokenizer_path: &str) -> Model {
    let family = tokenizer_path
        .split('/')
        .nth(2)
        .expect("fixtures/tokenizers/<family>/…");
    if family == "smollm2" {
        Model::load(
            common::asset(common::SMOLLM2_GGUF)
                .to_str()
                .expect("utf-8 path"),
        )
        .expect("load gguf")
    } else {
        let dir = common::asset(&format!("tokenizers/{family}"));
        Model::load(dir.to_str().expect("utf-8 path")).expect("load tokenizer dir")
    }
}

/// Template text for a golden's `chat_template` reference (`None` = the model's own).
fn template_source(reference: &str) -> Option<String> {
    if reference.ends_with("#chat_template") {
        return None;
    }
    let path = if let Some(rest) = reference.strip_prefix("fixtures/templates/") {
        common::testdata(&format!("templates/{rest}"))
    } else if let Some(rest) = reference.strip_prefix("fixtures/tokenizers/") {
        common::asset(&format!("tokenizers/{rest}"))
    } else {
        panic!("unknown template reference {reference}");
    };
    Some(std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

#[derive(Default)]
struct Tally {
    pass: usize,
    total: usize,
    failures: Vec<String>,
}

fn check_chat(case: &Value, model: Option<&Arc<Model>>) -> Result<(), String> {
    let id = case["id"].as_str().unwrap_or("?");
    let req: ChatCompletionRequest = serde_json::from_value(case["request"].clone())
        .map_err(|e| format!("{id}: request: {e}"))?;
    let tool_arguments = match case["tool_arguments"].as_str() {
        Some("string") => ToolArguments::String,
        _ => ToolArguments::Object,
    };
    let template = template_source(case["chat_template"].as_str().unwrap_or_default());
    let expected_format = match case["content_format"].as_str() {
        Some("openai") => ContentFormat::OpenAi,
        _ => ContentFormat::String,
    };
    let clock = clock(case["now"].as_str().unwrap_or("2025-07-15T10:30:00"));
    let expects_error = case.get("error").is_some();

    let (prompter_owned, renderer);
    let prompter: &ChatPrompter = match model {
        Some(m) => {
            let opts = RenderOptions {
                chat_template: template,
                tool_arguments,
                clock,
                ..RenderOptions::default()
            };
            renderer =
                Renderer::new(m.clone(), opts).map_err(|e| format!("{id}: renderer: {e}"))?;
            renderer
                .prompter()
                .ok_or_else(|| format!("{id}: no template"))?
        }
        None => {
            // Template-only family: the special tokens are whatever the reference passed.
            let ctx = case["template_context"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let kw = req.chat_template_kwargs.clone().unwrap_or_default();
            let specials: Map<String, Value> = ctx
                .into_iter()
                .filter(|(k, _)| {
                    !["messages", "tools", "documents", "add_generation_prompt"]
                        .contains(&k.as_str())
                        && !kw.contains_key(k)
                })
                .collect();
            prompter_owned = ChatPrompter::new(
                &template.ok_or_else(|| format!("{id}: template-only case without template"))?,
                specials,
                ContentFormat::Auto,
                tool_arguments,
                clock,
            )
            .map_err(|e| format!("{id}: template: {e}"))?;
            &prompter_owned
        }
    };
    if prompter.content_format() != expected_format {
        return Err(format!(
            "{id}: content format detected {:?}, golden {:?}",
            prompter.content_format(),
            expected_format
        ));
    }
    let rendered = prompter.render(&req);
    match (rendered, expects_error) {
        (Err(_), true) => return Ok(()),
        (Ok(r), true) => {
            return Err(format!(
                "{id}: expected error {}, got prompt {:?}",
                case["error"], r.prompt
            ))
        }
        (Err(e), false) => return Err(format!("{id}: unexpected error: {e}")),
        (Ok(r), false) => {
            let want = case["prompt"].as_str().unwrap_or_default();
            if r.prompt != want {
                return Err(format!(
                    "{id}: prompt differs\n  got:  {:?}\n  want: {:?}\n  context: {}\n  golden context: {}",
                    r.prompt,
                    want,
                    Value::Object(r.context()),
                    case["template_context"]
                ));
            }
        }
    }
    if let Some(m) = model {
        let want = case
            .get("prompt_token_ids_tokenizers_lib")
            .unwrap_or(&case["prompt_token_ids"]);
        let want: Vec<u32> =
            serde_json::from_value(want.clone()).map_err(|e| format!("{id}: ids: {e}"))?;
        let ids = m
            .tokenizer
            .encode(
                case["prompt"].as_str().unwrap_or_default(),
                req.add_special_tokens,
            )
            .map_err(|e| e.to_string())?;
        if ids != want {
            return Err(format!(
                "{id}: token ids differ\n  got:  {ids:?}\n  want: {want:?}"
            ));
        }
        // The full render path gives the same ids. The goldens come from the template alone;
        // a server rendering tool requests has tool parsing on (else vLLM refuses them).
        let opts = RenderOptions {
            chat_template: template_source(case["chat_template"].as_str().unwrap_or_default()),
            tool_arguments,
            clock: self::clock(case["now"].as_str().unwrap_or("2025-07-15T10:30:00")),
            max_model_len: Some(1 << 20),
            tool_call_parser: Some("hermes".into()),
            enable_auto_tool_choice: true,
            ..RenderOptions::default()
        };
        let r = Renderer::new(m.clone(), opts).map_err(|e| e.to_string())?;
        let g = r
            .render_chat(&req)
            .map_err(|e| format!("{id}: render_chat: {e}"))?;
        if g.token_ids != want {
            return Err(format!("{id}: render_chat ids differ"));
        }
    }
    Ok(())
}

fn check_completion(case: &Value, model: &Arc<Model>) -> Result<(), String> {
    let id = case["id"].as_str().unwrap_or("?");
    let req: CompletionRequest = serde_json::from_value(case["request"].clone())
        .map_err(|e| format!("{id}: request: {e}"))?;
    let want = case
        .get("prompt_token_ids_tokenizers_lib")
        .unwrap_or(&case["prompt_token_ids"]);
    let want: Vec<u32> =
        serde_json::from_value(want.clone()).map_err(|e| format!("{id}: ids: {e}"))?;
    let r = Renderer::new(
        model.clone(),
        RenderOptions {
            max_model_len: Some(1 << 20),
            ..RenderOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let prompt = case["request"]["prompt"].as_str();
    if prompt == Some("") {
        // The golden is the tokenizer's answer, but vLLM's request validator refuses an empty
        // prompt before tokenizing (`validate_prompt_and_prompt_embeds`), and so does aphro.
        let ids = model
            .tokenizer
            .encode("", req.add_special_tokens)
            .map_err(|e| e.to_string())?;
        if ids != want {
            return Err(format!("{id}: encode(\"\") = {ids:?}, want {want:?}"));
        }
        return match r.render_completion(&req) {
            Err(e) if e.to_string().starts_with("Either prompt or prompt_embeds") => Ok(()),
            other => Err(format!("{id}: empty prompt: {other:?}")),
        };
    }
    if want.is_empty() {
        // The tokenizer gives nothing; the renderer must refuse (vLLM: no empty prompts).
        let ids = model
            .tokenizer
            .encode(prompt.unwrap_or_default(), req.add_special_tokens)
            .map_err(|e| e.to_string())?;
        if !ids.is_empty() {
            return Err(format!("{id}: expected no ids, got {ids:?}"));
        }
        return match r.render_completion(&req) {
            Err(_) => Ok(()),
            Ok(_) => Err(format!("{id}: empty prompt rendered")),
        };
    }
    let out = r
        .render_completion(&req)
        .map_err(|e| format!("{id}: {e}"))?;
    let got = &out.first().ok_or("no output")?.token_ids;
    if *got != want {
        return Err(format!(
            "{id}: completion ids differ\n  got:  {got:?}\n  want: {want:?}"
        ));
    }
    Ok(())
}

/// Every golden case of `testdata/render`, file by file in name order.
fn golden_cases() -> Vec<Value> {
    let dir = common::testdata("render");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata/render")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).expect("read golden");
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|line| serde_json::from_str(line).expect("golden json"))
                .collect::<Vec<Value>>()
        })
        .collect()
}

#[test]
fn render_parity_all_families() {
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    let mut models: BTreeMap<String, Arc<Model>> = BTreeMap::new();
    for case in golden_cases() {
        let family = case["family"].as_str().unwrap_or("?").to_owned();
        let model = case["tokenizer"].as_str().map(|t| {
            models
                .entry(t.to_owned())
                .or_insert_with(|| Arc::new(load_model(t)))
                .clone()
        });
        let result = match case["kind"].as_str() {
            Some("chat") => check_chat(&case, model.as_ref()),
            Some("completion") => {
                check_completion(&case, model.as_ref().expect("completion needs a tokenizer"))
            }
            other => Err(format!("unknown kind {other:?}")),
        };
        let t = tallies.entry(family).or_default();
        t.total += 1;
        match result {
            Ok(()) => t.pass += 1,
            Err(e) => t.failures.push(e),
        }
    }
    let mut all_ok = true;
    for (family, t) in &tallies {
        println!("{family:>20}: {}/{}", t.pass, t.total);
        for f in &t.failures {
            all_ok = false;
            println!("    FAIL {f}");
        }
    }
    assert!(all_ok, "render parity failures (see output above)");
}

/// The fast encoder (`fastokens`) against `tokenizers` on every prompt of the render corpus:
/// the same ids, on a first encode and on a second one answered from its segment cache, and
/// it is on for every tokenizer of the corpus (a silent fallback would hide a regression of
/// the render path's speed, and a disagreement would hide behind the fallback).
#[test]
fn fast_encoder_matches_tokenizers_on_the_corpus() {
    let mut models: BTreeMap<String, Arc<Model>> = BTreeMap::new();
    let (mut checked, mut failures) = (0usize, Vec::new());
    for case in golden_cases() {
        let Some(tok_path) = case["tokenizer"].as_str() else {
            continue;
        };
        let model = models
            .entry(tok_path.to_owned())
            .or_insert_with(|| Arc::new(load_model(tok_path)))
            .clone();
        let (prompt, add_special) = match case["kind"].as_str() {
            Some("chat") => (
                case["prompt"].as_str(),
                case["request"]["add_special_tokens"]
                    .as_bool()
                    .unwrap_or(false),
            ),
            _ => (
                case["request"]["prompt"].as_str(),
                case["request"]["add_special_tokens"]
                    .as_bool()
                    .unwrap_or(true),
            ),
        };
        let Some(prompt) = prompt else { continue };
        let tok = &model.tokenizer;
        let reference = tok
            .encode_reference(prompt, add_special)
            .expect("tokenizers encodes");
        for pass in ["first", "cached"] {
            let fast = tok.encode(prompt, add_special).expect("fast encodes");
            if fast != reference {
                let at = fast.iter().zip(&reference).position(|(a, b)| a != b);
                failures.push(format!(
                    "{} ({pass} encode): {} vs {} ids, first difference at {at:?}",
                    case["id"],
                    fast.len(),
                    reference.len()
                ));
            }
        }
        checked += 1;
    }
    for (path, model) in &models {
        if let aphro_core::tokenizer::EncoderBackend::Tokenizers { reason } =
            model.tokenizer.encoder_backend()
        {
            failures.push(format!("{path}: no fast encoder: {reason}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // 414 of the corpus's cases name a tokenizer (the rest are template-only families).
    assert!(checked >= 400, "only {checked} prompts checked");
}
