//! Multimodal parity against vLLM 0.33.0's own render responses
//! (`testdata/multimodal/render_cases.jsonl`, cut from the shared goldens by
//! `scripts/extract_mm_goldens.py`): per image the mm_hash, grid, token count,
//! `pixel_values` bytes and the `kwargs_data` / `mm_metadata` base64, and the placeholder
//! runs in the token ids. Every case must match.
use aphro_core::multimodal::{
    decode_data_url, features_json, ImageFeature, ImageInput, MultimodalOptions, VisionModel,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/multimodal")
}

fn cases() -> Vec<Value> {
    let text = std::fs::read_to_string(root().join("render_cases.jsonl")).expect("goldens");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `{{b64:images/NAME}}` → the file's base64, as the generator materialized the requests.
fn materialize(url: &str) -> String {
    let Some(start) = url.find("{{b64:") else {
        return url.to_owned();
    };
    let end = url[start..].find("}}").expect("closed template") + start;
    let file = &url[start + 6..end];
    let bytes = std::fs::read(root().join(file)).expect("image file");
    let b64 = aphro_core::multimodal::kwargs::to_base64(&bytes);
    format!("{}{b64}{}", &url[..start], &url[end + 2..])
}

/// The request's image parts in prompt order, as `(url, uuid)`.
fn image_parts(request: &Value) -> Vec<(Option<String>, Option<String>)> {
    let mut out = Vec::new();
    for m in request["messages"].as_array().into_iter().flatten() {
        for part in m["content"].as_array().into_iter().flatten() {
            let Some(iu) = part.get("image_url") else {
                continue;
            };
            let url = match iu {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("url").and_then(Value::as_str).map(str::to_owned),
                _ => None,
            };
            let uuid = part.get("uuid").and_then(Value::as_str).map(str::to_owned);
            out.push((url.map(|u| materialize(&u)), uuid));
        }
    }
    out
}

fn vision_model(model: &str) -> VisionModel {
    let dir = root()
        .join("models")
        .join(model.rsplit('/').next().expect("name"));
    VisionModel::from_model_dir(&dir, model)
        .expect("model files")
        .expect("a Qwen-VL config")
}

fn options(flags: &str) -> MultimodalOptions {
    MultimodalOptions {
        device_normalize: flags != "nonorm",
        trust_request_mm_kwargs: flags == "trusted",
    }
}

/// Runs the image pipeline of one case: `Ok(features)` or the error status + message.
fn run_case(case: &Value) -> Result<(VisionModel, Vec<ImageFeature>), (u16, String)> {
    let model = vision_model(case["model"].as_str().expect("model"));
    let err = |e: aphro_core::Error| (e.status(), e.to_string());
    let mut inputs = Vec::new();
    for (url, uuid) in image_parts(&case["request"]) {
        let file = match url {
            Some(u) if u.starts_with("data:") => Some(decode_data_url(&u).map_err(err)?),
            Some(u) => return Err((500, format!("no fetch in this test: {u}"))),
            None => None,
        };
        inputs.push(ImageInput { file, uuid });
    }
    let kwargs = case["request"]
        .get("mm_processor_kwargs")
        .and_then(Value::as_object);
    let flags = case["server_flags"].as_str().unwrap_or("default");
    let feats = model
        .process_images(&inputs, kwargs, options(flags))
        .map_err(err)?;
    Ok((model, feats))
}

/// Collapses each placeholder run of vLLM's ids back to the template's single pad.
fn template_ids(ids: &[u32], runs: &[(usize, usize)]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut i = 0;
    for &(offset, length) in runs {
        out.extend_from_slice(&ids[i..offset]);
        out.push(ids[offset]);
        i = offset + length;
    }
    out.extend_from_slice(&ids[i..]);
    out
}

fn check_success(case: &Value, model: &VisionModel, feats: &[ImageFeature]) -> Vec<String> {
    let mut bad = Vec::new();
    let resp = &case["response"];
    let f = &resp["features"];
    let want_hashes: Vec<&str> = f["mm_hashes"]["image"]
        .as_array()
        .expect("hashes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let got_hashes: Vec<&str> = feats.iter().map(|i| i.mm_hash.as_str()).collect();
    if got_hashes != want_hashes {
        bad.push(format!("mm_hashes {got_hashes:?} != {want_hashes:?}"));
    }
    let runs: Vec<(usize, usize)> = f["mm_placeholders"]["image"]
        .as_array()
        .expect("placeholders")
        .iter()
        .map(|p| {
            (
                p["offset"].as_u64().expect("offset") as usize,
                p["length"].as_u64().expect("length") as usize,
            )
        })
        .collect();
    let ids: Vec<u32> = resp["token_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect();
    match model.expand_placeholders(&template_ids(&ids, &runs), feats) {
        Ok((got_ids, got_runs)) => {
            let got_runs: Vec<(usize, usize)> =
                got_runs.iter().map(|p| (p.offset, p.length)).collect();
            if got_runs != runs {
                bad.push(format!("placeholders {got_runs:?} != {runs:?}"));
            }
            if got_ids != ids {
                bad.push("token ids differ after expansion".into());
            }
        }
        Err(e) => bad.push(format!("expansion failed: {e}")),
    }
    let with_payload = !f["kwargs_data"].is_null();
    let placeholders: Vec<_> = runs
        .iter()
        .map(|&(offset, length)| aphro_core::multimodal::Placeholder { offset, length })
        .collect();
    let ours = features_json(feats, &placeholders, with_payload);
    if !with_payload {
        if !ours["kwargs_data"].is_null() || !ours["mm_metadata"].is_null() {
            bad.push("payload present with mm_payload none".into());
        }
        return bad;
    }
    for key in ["kwargs_data", "mm_metadata"] {
        for (i, want) in f[key]["image"]
            .as_array()
            .expect("blobs")
            .iter()
            .enumerate()
        {
            let got = ours[key]["image"][i].as_str().expect("our blob");
            if sha256_hex(got.as_bytes()) != want["b64_sha256"] {
                bad.push(format!("{key}[{i}] base64 differs"));
            }
            for (field, t) in want["tensors"].as_object().expect("tensors") {
                let ours = match field.as_str() {
                    "pixel_values" => feats[i].processed.pixel_values.clone(),
                    _ => aphro_core::multimodal::Tensor {
                        dtype: "int64",
                        shape: vec![3],
                        data: feats[i]
                            .processed
                            .grid_thw
                            .iter()
                            .flat_map(|v| v.to_le_bytes())
                            .collect(),
                    },
                };
                let shape: Vec<usize> = t["shape"]
                    .as_array()
                    .expect("shape")
                    .iter()
                    .map(|v| v.as_u64().expect("dim") as usize)
                    .collect();
                if ours.dtype != t["dtype"] || ours.shape != shape {
                    bad.push(format!(
                        "{key}[{i}].{field}: {} {:?} != {} {shape:?}",
                        ours.dtype, ours.shape, t["dtype"]
                    ));
                } else if sha256_hex(&ours.data) != t["sha256"] {
                    bad.push(format!("{key}[{i}].{field}: tensor bytes differ"));
                }
            }
        }
    }
    bad
}

#[test]
fn image_pipeline_matches_vllm_for_every_chat_case() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in cases() {
        if case["endpoint"] != "/v1/chat/completions/render" {
            continue;
        }
        let id = case["id"].as_str().expect("id").to_owned();
        let status = case["status"].as_u64().expect("status") as u16;
        checked += 1;
        match (run_case(&case), status) {
            (Ok((model, feats)), 200) => {
                for b in check_success(&case, &model, &feats) {
                    failures.push(format!("{id}: {b}"));
                }
            }
            (Ok(_), s) => failures.push(format!("{id}: accepted, vLLM answered {s}")),
            (Err((got, msg)), 200) => failures.push(format!("{id}: refused {got} {msg}")),
            (Err((got, msg)), want) => {
                let want_msg = case["response"]["error"]["message"].as_str().unwrap_or("");
                // The network case is answered by the fetch layer, not this pipeline.
                if got != want && want != 500 {
                    failures.push(format!("{id}: status {got} != {want}"));
                }
                if want != 500 && msg != want_msg {
                    failures.push(format!("{id}: message {msg:?} != {want_msg:?}"));
                }
            }
        }
    }
    assert!(checked >= 26, "only {checked} cases read");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
