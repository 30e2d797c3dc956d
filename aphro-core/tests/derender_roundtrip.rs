//! Round trip over the parser corpus: tokenize `model_output` with the model family's real
//! tokenizer, derender (non-streaming, and streaming in chunks of 1 and 7 tokens through the
//! stateless wire form with the state round-tripped through JSON) and compare with the corpus
//! `expected` message and finish reason.
mod common;
use aphro_core::protocol::{
    parse_derender_chat_body, DerenderChatBody, DerenderChatStreamResponse, DerenderStreamState,
};
use aphro_core::{DerenderOptions, Derenderer, Model};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Cases where aphro-parsers deliberately follows a later upstream fix (see aphro-parsers'
/// corpus test); their `expected` is vLLM 0.33.0's.
const UPSTREAM_FIXES: &[&str] = &["hermes-extra-1", "kimi_k2-t-bare-counter-infer"];

fn family(parser: &str) -> Option<&'static str> {
    Some(match parser {
        "hermes" | "qwen3_json" | "qwen3_coder" | "qwen3_xml" | "qwen3" => "qwen3",
        "llama3_json" | "pythonic" => "llama3",
        "glm45" | "glm47" => "glm4_7_flash",
        "deepseek_v3" => "deepseek_v3",
        "deepseek_r1" => "deepseek_r1",
        "deepseek_v31" => "deepseek_v3_1",
        "openai" => "gpt_oss",
        _ => return None,
    })
}

#[derive(Debug, Default, PartialEq)]
struct Msg {
    content: Option<String>,
    reasoning: Option<String>,
    calls: Vec<(String, String)>,
    finish: String,
}

fn expected(case: &Value) -> Msg {
    let e = &case["expected"];
    Msg {
        content: e["content"].as_str().map(str::to_owned),
        reasoning: e["reasoning"].as_str().map(str::to_owned),
        calls: e["tool_calls"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        (
                            c["name"].as_str().unwrap_or("").to_owned(),
                            c["arguments"].as_str().unwrap_or("").to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        finish: case["expected_finish_reason"]
            .as_str()
            .unwrap_or("stop")
            .to_owned(),
    }
}

fn chat_request(case: &Value) -> Value {
    let mut r = json!({"messages": [{"role": "user", "content": "hi"}]});
    for k in [
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "chat_template_kwargs",
    ] {
        if let Some(v) = case.get(k) {
            r[k] = v.clone();
        }
    }
    r
}

fn one_shot(d: &Derenderer, case: &Value, ids: &[u32], prompt: &[u32]) -> Result<Msg, String> {
    let body = json!({
        "generate_response": {"request_id": "generate-tokens-chatcmpl-rt", "choices": [
            {"index": 0, "finish_reason": "stop", "stop_reason": null, "token_ids": ids}]},
        "prompt_tokens": prompt.len(),
        "prompt_token_ids": prompt,
        "chat_request": chat_request(case),
    });
    let DerenderChatBody::Full(req) = parse_derender_chat_body(&body).map_err(|e| e.to_string())?
    else {
        return Err("not a full body".into());
    };
    let resp = d.derender_chat(*req).map_err(|e| e.to_string())?;
    let v = serde_json::to_value(&resp).map_err(|e| e.to_string())?;
    let m = &v["choices"][0]["message"];
    Ok(Msg {
        content: m["content"].as_str().map(str::to_owned),
        reasoning: m["reasoning"].as_str().map(str::to_owned),
        calls: m["tool_calls"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        (
                            c["function"]["name"].as_str().unwrap_or("").to_owned(),
                            c["function"]["arguments"].as_str().unwrap_or("").to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        finish: v["choices"][0]["finish_reason"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
    })
}

/// How the client carries the state between calls.
#[derive(Clone, Copy, Debug)]
enum Carry {
    /// Unchanged, as returned (the issuing server resumes its live state).
    AsReturned,
    /// Without the session id, as if another server answered each call: every call restores
    /// the parser from the carried snapshot — the portable path must give the same result.
    NoSession,
    /// With the carried parser snapshot removed: only correct if the server really resumes
    /// its live state instead of restoring (proves the LRU path is the one taken).
    NoParserState,
}

fn streamed(
    d: &Derenderer,
    case: &Value,
    ids: &[u32],
    prompt: &[u32],
    size: usize,
    carry: Carry,
) -> Result<Msg, String> {
    let mut state: Option<Value> = None;
    let mut content: Option<String> = None;
    let mut reasoning: Option<String> = None;
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut finish = String::new();
    let chunks: Vec<&[u32]> = ids.chunks(size.max(1)).collect();
    let n = chunks.len();
    for (i, chunk) in chunks.into_iter().enumerate() {
        let last = i + 1 == n;
        let body = json!({
            "stream": true,
            "generate_chunk": {"request_id": "generate-tokens-chatcmpl-rt", "choices": [
                {"index": 0, "finish_reason": if last { json!("stop") } else { Value::Null },
                 "stop_reason": null, "token_ids": chunk}], "usage": null},
            "stream_state": state.clone().unwrap_or(Value::Null),
            "prompt_tokens": prompt.len(),
            "prompt_token_ids": prompt,
            "chat_request": chat_request(case),
        });
        let DerenderChatBody::Stream(req) =
            parse_derender_chat_body(&body).map_err(|e| e.to_string())?
        else {
            return Err("not a stream body".into());
        };
        let resp: DerenderChatStreamResponse =
            d.derender_chat_stream(*req).map_err(|e| e.to_string())?;
        // The state travels as JSON text, as a client would carry it.
        let text = serde_json::to_string(&resp.stream_state).map_err(|e| e.to_string())?;
        let mut back: DerenderStreamState =
            serde_json::from_str(&text).map_err(|e| e.to_string())?;
        if let Some(a) = back.aphro.as_mut() {
            match carry {
                Carry::AsReturned => {}
                Carry::NoSession => a.session = None,
                Carry::NoParserState => a.parser = None,
            }
        }
        state = Some(serde_json::to_value(&back).map_err(|e| e.to_string())?);
        let chunk = serde_json::to_value(&resp.chunk).map_err(|e| e.to_string())?;
        let c = &chunk["choices"][0];
        let delta = &c["delta"];
        if let Some(s) = delta["content"].as_str() {
            content.get_or_insert_with(String::new).push_str(s);
        }
        if let Some(s) = delta["reasoning"].as_str() {
            reasoning.get_or_insert_with(String::new).push_str(s);
        }
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let idx = tc["index"].as_u64().unwrap_or(0) as usize;
            if let Some(name) = tc["function"]["name"].as_str() {
                while calls.len() <= idx {
                    calls.push((String::new(), String::new()));
                }
                calls[idx].0 = name.to_owned();
            }
            if let Some(a) = tc["function"]["arguments"].as_str() {
                while calls.len() <= idx {
                    calls.push((String::new(), String::new()));
                }
                calls[idx].1.push_str(a);
            }
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_owned();
        }
    }
    Ok(Msg {
        content,
        reasoning,
        calls,
        finish,
    })
}

/// Streaming deltas drop empty strings, so `Some("")` and `None` are the same there.
fn stream_eq(want: &Msg, got: &Msg) -> bool {
    let norm = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    norm(&want.content) == norm(&got.content)
        && norm(&want.reasoning) == norm(&got.reasoning)
        && want.calls == got.calls
        && want.finish == got.finish
}

#[test]
fn corpus_round_trip_through_real_tokenizers() {
    let dir = common::testdata("parsers");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata/parsers")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut models: BTreeMap<&str, Arc<Model>> = BTreeMap::new();
    // parser -> (one-shot ok, stream-1 ok, stream-7 ok, total)
    let mut per: BTreeMap<String, [usize; 4]> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut skipped = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("corpus file");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let case: Value = serde_json::from_str(line).expect("corpus JSON");
            let parser = case["parser"].as_str().unwrap_or("").to_owned();
            let id = case["id"].as_str().unwrap_or("").to_owned();
            let Some(fam) = family(&parser) else { continue };
            if UPSTREAM_FIXES.contains(&id.as_str()) {
                skipped.push(id);
                continue;
            }
            let model = models
                .entry(fam)
                .or_insert_with(|| {
                    let p = common::asset(&format!("tokenizers/{fam}"));
                    Arc::new(Model::load(p.to_str().unwrap_or_default()).expect("tokenizer dir"))
                })
                .clone();
            let (tool, reasoning) = if case["kind"].as_str() == Some("reasoning") {
                (None, Some(parser.clone()))
            } else {
                (
                    Some(parser.clone()),
                    case["reasoning_parser"].as_str().map(str::to_owned),
                )
            };
            let d = Derenderer::new(
                model.clone(),
                DerenderOptions {
                    served_model_name: Some("m".into()),
                    tool_call_parser: tool,
                    reasoning_parser: reasoning,
                    enable_auto_tool_choice: true,
                    max_model_len: Some(1 << 16),
                    ..DerenderOptions::default()
                },
            )
            .expect("derenderer");
            let output = case["model_output"].as_str().unwrap_or("");
            let ids = model.tokenizer.encode(output, false).expect("encode");
            let prompt: Vec<u32> = match case["prompt_text"].as_str() {
                Some(p) => model.tokenizer.encode(p, false).expect("encode prompt"),
                None => model.tokenizer.encode("hello", false).expect("encode"),
            };
            let e = per.entry(parser.clone()).or_default();
            e[3] += 1;
            let want = expected(&case);
            if ids.is_empty() {
                // Nothing to derender (an empty output cannot be sent: 400 by design).
                e[0] += 1;
                e[1] += 1;
                e[2] += 1;
                continue;
            }
            match one_shot(&d, &case, &ids, &prompt) {
                Ok(got) if got == want => e[0] += 1,
                Ok(got) => failures.push(format!("{id} one-shot: want {want:?}\n   got {got:?}")),
                Err(err) => failures.push(format!("{id} one-shot: error {err}")),
            }
            for (slot, size, carry) in [
                (1usize, 1usize, Carry::AsReturned),
                (2, 7, Carry::AsReturned),
                (2, 7, Carry::NoSession),
                (2, 7, Carry::NoParserState),
                (1, 1, Carry::NoSession),
            ] {
                match streamed(&d, &case, &ids, &prompt, size, carry) {
                    // Counted once per size; any disagreeing way of carrying is a failure.
                    Ok(got) if stream_eq(&want, &got) => {
                        if matches!(carry, Carry::AsReturned) {
                            e[slot] += 1;
                        }
                    }
                    Ok(got) => failures.push(format!(
                        "{id} stream/{size} {carry:?}: want {want:?}\n   got {got:?}"
                    )),
                    Err(err) => failures.push(format!("{id} stream/{size} {carry:?}: error {err}")),
                }
            }
        }
    }
    println!("round trip per parser (one-shot / stream-1 / stream-7 of total):");
    let mut tot = [0usize; 4];
    for (p, c) in &per {
        println!(
            "  {p:<14} {:>3} / {:>3} / {:>3} of {:>3}",
            c[0], c[1], c[2], c[3]
        );
        for i in 0..4 {
            tot[i] += c[i];
        }
    }
    println!(
        "  {:<14} {:>3} / {:>3} / {:>3} of {:>3}   (skipped, upstream fixes: {skipped:?})",
        "TOTAL", tot[0], tot[1], tot[2], tot[3]
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
