//! Multimodal parity against vLLM 0.33.0's own render responses
//! (`testdata/multimodal/render_cases.jsonl`, cut from the shared goldens by
//! `scripts/extract_mm_goldens.py`): per image the mm_hash, grid, token count,
//! `pixel_values` bytes and the `kwargs_data` / `mm_metadata` base64, and the placeholder
//! runs in the token ids. Every case must match.
mod common;

use aphro_core::multimodal::{
    decode_data_url, features_json, features_json_pending, ImageFeature, ImageInput,
    MultimodalOptions, VisionModel,
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
    // The pending path (the Python binding's): same features but nulls, and blobs written
    // into buffers of the announced length give vLLM's text.
    let (pending, payload) = features_json_pending(feats.to_vec(), &placeholders, with_payload);
    let payload = payload.expect("a payload");
    let mut nulls = ours.clone();
    for slot in nulls["kwargs_data"]["image"].as_array_mut().expect("blobs") {
        *slot = Value::Null;
    }
    if pending != nulls {
        bad.push("pending features differ beyond kwargs_data".into());
    }
    for (i, want) in f["kwargs_data"]["image"]
        .as_array()
        .expect("blobs")
        .iter()
        .enumerate()
    {
        let blob = payload.blob(i).expect("a blob per image");
        let mut buf = vec![0u8; blob.base64_len()];
        blob.write_base64(&mut buf).expect("exact length");
        if sha256_hex(&buf) != want["b64_sha256"] {
            bad.push(format!("pending kwargs_data[{i}] differs"));
        }
        if blob.write_base64(&mut buf[1..]).is_ok() {
            bad.push("a short buffer was accepted".into());
        }
    }
    if payload.blob(payload.len()).is_some() {
        bad.push("a blob past the end".into());
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
                    "pixel_values" => feats[i].processed.pixel_values(),
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

/// vLLM's `/inference/v1/generate` decisions on `features` (`generate_validation.jsonl`):
/// 501 means vLLM's validation accepted the body (its test app has no engine behind it).
/// The scale-out switch (403) and the token-id checks are not about features and are
/// answered by the route, not by this validator.
#[test]
fn generate_feature_validation_matches_vllm() {
    let text = std::fs::read_to_string(root().join("generate_validation.jsonl")).expect("goldens");
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in text.lines() {
        let case: Value = serde_json::from_str(line).expect("json");
        let id = case["id"].as_str().expect("id");
        let status = case["status"].as_u64().expect("status");
        let msg = case["response"]["error"]["message"].as_str().unwrap_or("");
        if status == 403 || msg.contains("'loc': 'body.token_ids'") {
            continue;
        }
        checked += 1;
        let body = case["request"].as_object().expect("body");
        match (
            aphro_core::multimodal::validate_generate_features(body),
            status,
        ) {
            (Ok(()), 501) => {}
            (Ok(()), s) => failures.push(format!("{id}: accepted, vLLM answered {s}")),
            (Err(e), 501) => failures.push(format!("{id}: refused: {e}")),
            (Err(e), s) => {
                let param = case["response"]["error"]["param"].as_str();
                if u64::from(e.status()) != s || e.to_string() != msg || e.param() != param {
                    failures.push(format!(
                        "{id}: {} {:?} {:?} != {s} {msg:?} {param:?}",
                        e.status(),
                        e.to_string(),
                        e.param()
                    ));
                }
            }
        }
    }
    assert!(checked >= 17, "only {checked} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// aphro's own render output fed back to the generate validator: accepted with kwargs_data,
/// with kwargs and metadata, and hash-only; refused as metadata-only unless
/// `ec_transfer_params` is set (vLLM's decisions in `generate_validation.jsonl`).
#[test]
fn render_output_round_trips_through_generate_validation() {
    let case = cases()
        .into_iter()
        .find(|c| c["id"] == "q2/tiny_32x32_min_pixels")
        .expect("case");
    let (_, feats) = run_case(&case).expect("renders");
    let runs = [aphro_core::multimodal::Placeholder {
        offset: 15,
        length: 4,
    }];
    let features = features_json(&feats, &runs, true);
    let body = |features: Value, ec: Option<Value>| {
        let mut b = serde_json::json!({"token_ids": [1, 2, 3], "features": features, "sampling_params": {}});
        if let Some(ec) = ec {
            b["ec_transfer_params"] = ec;
        }
        b.as_object().expect("object").clone()
    };
    let validate = aphro_core::multimodal::validate_generate_features;
    assert!(
        validate(&body(features.clone(), None)).is_ok(),
        "full kwargs"
    );
    let mut meta_only = features.clone();
    meta_only["kwargs_data"] = Value::Null;
    let refused = validate(&body(meta_only.clone(), None)).expect_err("metadata-only");
    assert!(refused
        .to_string()
        .contains("metadata-only multimodal items require ec_transfer_params"));
    assert_eq!(refused.status(), 400);
    assert!(validate(&body(meta_only.clone(), Some(serde_json::json!({})))).is_err());
    assert!(validate(&body(
        meta_only,
        Some(serde_json::json!({"encoder": "ec-1"}))
    ))
    .is_ok());
    let mut hash_only = features;
    hash_only
        .as_object_mut()
        .expect("object")
        .retain(|k, _| k == "mm_hashes" || k == "mm_placeholders");
    assert!(validate(&body(hash_only, None)).is_ok(), "hash only");
}

/// A Qwen-VL model dir as vLLM served it: the golden's config files plus the shared Qwen
/// tokenizer.json (byte-identical to the one the goldens were made with).
fn model_dir(model: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = root()
        .join("models")
        .join(model.rsplit('/').next().expect("name"));
    for entry in std::fs::read_dir(&src).expect("model files") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, dir.path().join(path.file_name().expect("name"))).expect("copy");
    }
    std::fs::copy(
        common::asset("tokenizers/qwen3/tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .expect("qwen tokenizer asset");
    dir
}

/// The full render path (`Renderer::render_chat`): token ids and `features` equal vLLM's
/// response for every chat case, and every error case gets vLLM's status.
#[test]
fn renderer_matches_vllm_render_responses() {
    use aphro_core::{Model, RenderOptions, Renderer};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    let mut renderers: BTreeMap<(String, String), Renderer> = BTreeMap::new();
    // One tokenizer load per model; the flags only change the renderer options.
    let mut models: BTreeMap<String, (Arc<Model>, VisionModel)> = BTreeMap::new();
    let mut dirs = Vec::new();
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in cases() {
        let id = case["id"].as_str().expect("id").to_owned();
        let model = case["model"].as_str().expect("model").to_owned();
        let flags = case["server_flags"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let renderer = renderers
            .entry((model.clone(), flags.clone()))
            .or_insert_with(|| {
                let (loaded, vision) = models
                    .entry(model.clone())
                    .or_insert_with(|| {
                        let dir = model_dir(&model);
                        let loaded =
                            Model::load(dir.path().to_str().expect("utf-8")).expect("model dir");
                        let vision = VisionModel::from_model_dir(dir.path(), &model)
                            .expect("configs")
                            .expect("vision");
                        dirs.push(dir);
                        (Arc::new(loaded), vision)
                    })
                    .clone();
                let opts = RenderOptions {
                    vision: Some(Arc::new(vision)),
                    multimodal: options(&flags),
                    ..RenderOptions::default()
                };
                Renderer::new(loaded, opts).expect("renderer")
            });
        if case["endpoint"] == "/v1/completions/render" {
            // Text prompts only: vision tokens written as text stay as they are, no features.
            checked += 1;
            let req = aphro_core::renderer::parse_completion_request(&case["request"])
                .expect("completion request");
            let got = renderer.render_completion(&req).expect("renders");
            let want = case["response"].as_array().expect("one per prompt");
            for (g, w) in got.iter().zip(want) {
                let ids: Vec<u64> = g.token_ids.iter().map(|&t| u64::from(t)).collect();
                let want_ids: Vec<u64> = w["token_ids"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .filter_map(Value::as_u64)
                    .collect();
                if ids != want_ids || g.features.is_some() == w["features"].is_null() {
                    failures.push(format!("{id}: completion render differs"));
                }
            }
            continue;
        }
        let mut body = case["request"].clone();
        for m in body["messages"].as_array_mut().into_iter().flatten() {
            for part in m["content"].as_array_mut().into_iter().flatten() {
                match part.get_mut("image_url") {
                    Some(Value::String(u)) => *u = materialize(u),
                    Some(Value::Object(o)) => {
                        if let Some(Value::String(u)) = o.get_mut("url") {
                            *u = materialize(u);
                        }
                    }
                    _ => {}
                }
            }
        }
        checked += 1;
        let want_status = case["status"].as_u64().expect("status") as u16;
        let result =
            aphro_core::renderer::parse_chat_request(&body).and_then(|r| renderer.render_chat(&r));
        match (result, want_status) {
            (Ok(got), 200) => {
                let want = &case["response"];
                let want_ids: Vec<u32> = want["token_ids"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|v| v.as_u64().expect("id") as u32)
                    .collect();
                if got.token_ids != want_ids {
                    failures.push(format!(
                        "{id}: token ids differ ({} vs {})",
                        got.token_ids.len(),
                        want_ids.len()
                    ));
                }
                let f = got.features.expect("features");
                let wf = &want["features"];
                for key in ["mm_hashes", "mm_placeholders"] {
                    if f[key] != wf[key] {
                        failures.push(format!("{id}: {key} {} != {}", f[key], wf[key]));
                    }
                }
                for key in ["kwargs_data", "mm_metadata"] {
                    if wf[key].is_null() != f[key].is_null() {
                        failures.push(format!("{id}: {key} presence differs"));
                        continue;
                    }
                    for (i, w) in wf[key]["image"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .enumerate()
                    {
                        let ours = f[key]["image"][i].as_str().unwrap_or("");
                        if sha256_hex(ours.as_bytes()) != w["b64_sha256"] {
                            failures.push(format!("{id}: {key}[{i}] differs"));
                        }
                    }
                }
            }
            (Ok(_), s) => failures.push(format!("{id}: rendered, vLLM answered {s}")),
            (Err(e), 200) => failures.push(format!("{id}: refused {} {e}", e.status())),
            (Err(e), s) => {
                if e.status() != s {
                    failures.push(format!("{id}: status {} != {s} ({e})", e.status()));
                }
            }
        }
    }
    assert!(checked >= 27, "only {checked} cases");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A loopback HTTP server (127.0.0.1 only) for the image-URL tests: `/scene.jpg` serves the
/// fixture image, `/missing.png` 404s, `/big.jpg` announces 2 MiB, `/big-stream.jpg` streams
/// 2 MiB without a length, `/slow.jpg` answers after 3 s, `/hop.jpg` redirects to
/// `localhost` (another host name) and `/via.jpg` to `/scene.jpg` on the same host.
fn serve_images() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = listener.local_addr().expect("addr").port();
    let image = std::fs::read(root().join("images/scene_640x480.jpg")).expect("fixture image");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let image = image.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let path = req.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let head = |status: &str, extra: &str| {
                    format!("HTTP/1.1 {status}\r\nConnection: close\r\n{extra}\r\n")
                };
                let _ = match path.as_str() {
                    "/scene.jpg" => s
                        .write_all(
                            head(
                                "200 OK",
                                &format!(
                                    "Content-Type: image/jpeg\r\nContent-Length: {}\r\n",
                                    image.len()
                                ),
                            )
                            .as_bytes(),
                        )
                        .and_then(|_| s.write_all(&image)),
                    "/big.jpg" => s.write_all(
                        head("200 OK", &format!("Content-Length: {}\r\n", 2 << 20)).as_bytes(),
                    ),
                    "/big-stream.jpg" => s
                        .write_all(head("200 OK", "").as_bytes())
                        .and_then(|_| s.write_all(&vec![0u8; 2 << 20])),
                    "/slow.jpg" => {
                        std::thread::sleep(std::time::Duration::from_secs(3));
                        s.write_all(head("200 OK", "Content-Length: 0\r\n").as_bytes())
                    }
                    "/hop.jpg" => s.write_all(
                        head(
                            "302 Found",
                            &format!(
                                "Location: http://localhost:{port}/scene.jpg\r\nContent-Length: 0\r\n"
                            ),
                        )
                        .as_bytes(),
                    ),
                    "/via.jpg" => s.write_all(
                        head(
                            "302 Found",
                            "Location: /scene.jpg\r\nContent-Length: 0\r\n",
                        )
                        .as_bytes(),
                    ),
                    _ => s.write_all(
                        head("404 Not Found", "Content-Length: 9\r\n").as_bytes(),
                    )
                    .and_then(|_| s.write_all(b"not found")),
                };
            });
        }
    });
    format!("http://127.0.0.1:{port}")
}

/// `http(s)` image URLs: fetched only from `--allowed-media-domains`, within the time and
/// size limits, with vLLM's statuses and messages; a fetched image renders exactly as the
/// same file sent as a `data:` URL.
#[test]
fn image_urls_are_fetched_within_limits_from_allowed_domains_only() {
    use aphro_core::multimodal::{MediaFetchOptions, MediaFetcher};
    use aphro_core::{Model, RenderOptions, Renderer};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let base = serve_images();
    let model = "Qwen/Qwen2-VL-2B-Instruct";
    let dir = model_dir(model);
    let loaded = Arc::new(Model::load(dir.path().to_str().expect("utf-8")).expect("model"));
    let vision = Arc::new(
        VisionModel::from_model_dir(dir.path(), model)
            .expect("configs")
            .expect("vision"),
    );
    let renderer = |domains: &[&str]| {
        let fetch = MediaFetcher::new(MediaFetchOptions {
            allowed_media_domains: domains.iter().map(|d| d.to_string()).collect(),
            timeout: Duration::from_secs(1),
            max_attempts: 1,
            max_download_mb: 1,
            ..MediaFetchOptions::default()
        })
        .expect("fetcher");
        let opts = RenderOptions {
            vision: Some(vision.clone()),
            media_fetch: Some(Arc::new(fetch)),
            ..RenderOptions::default()
        };
        Renderer::new(loaded.clone(), opts).expect("renderer")
    };
    let request = |url: &str| {
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "Describe."}]}]})
    };
    let render = |r: &Renderer, url: &str| {
        aphro_core::renderer::parse_chat_request(&request(url)).and_then(|q| r.render_chat(&q))
    };
    let allowed = renderer(&["127.0.0.1"]);
    let data_url = materialize("data:image/jpeg;base64,{{b64:images/scene_640x480.jpg}}");
    let want = render(&allowed, &data_url).expect("data url renders");
    for path in ["/scene.jpg", "/via.jpg"] {
        let got = render(&allowed, &format!("{base}{path}")).expect("fetched");
        assert_eq!(got.token_ids, want.token_ids, "{path}");
        assert_eq!(got.features, want.features, "{path}");
    }
    assert!(aphro_core::renderer::chat_fetches_media(
        &aphro_core::renderer::parse_chat_request(&request(&format!("{base}/scene.jpg")))
            .expect("request")
    ));

    let err = |r: &Renderer, path: &str| {
        let e = render(r, &format!("{base}{path}")).expect_err(path);
        (e.status(), e.to_string(), e.param().map(str::to_owned))
    };
    let other = renderer(&["images.example"]);
    assert_eq!(
        err(&other, "/scene.jpg"),
        (
            400,
            "The URL must be from one of the allowed domains: ['images.example']. \
             Input URL domain: 127.0.0.1"
                .to_owned(),
            None
        )
    );
    // A redirect to a host that is not allowed is refused like the first URL would be.
    let (status, msg, _) = err(&allowed, "/hop.jpg");
    assert_eq!(status, 400);
    assert!(msg.ends_with("Input URL domain: localhost"), "{msg}");
    assert_eq!(
        err(&allowed, "/missing.png"),
        (
            422,
            format!(
                "Failed to fetch media from URL: HTTP 404 error (parameter=image_url, \
                 value={base}/missing.png)"
            ),
            Some("image_url".to_owned())
        )
    );
    for path in ["/big.jpg", "/big-stream.jpg"] {
        let (status, msg, param) = err(&allowed, path);
        assert_eq!(
            (status, param.as_deref()),
            (422, Some("image_url")),
            "{path}"
        );
        assert!(
            msg.starts_with(
                "Failed to fetch media from URL: Remote media download exceeds \
                 VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB=1 (received at least"
            ),
            "{path}: {msg}"
        );
    }
    let started = Instant::now();
    let (status, msg, _) = err(&allowed, "/slow.jpg");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "gave up in time"
    );
    assert_eq!(status, 500, "{msg}");
    assert!(
        msg.starts_with("Timed out fetching media from URL"),
        "{msg}"
    );
    // Fetching off (no allowed domain): refused before any connection.
    let off = Renderer::new(
        loaded.clone(),
        RenderOptions {
            vision: Some(vision.clone()),
            ..RenderOptions::default()
        },
    )
    .expect("renderer");
    let (status, msg, _) = err(&off, "/scene.jpg");
    assert_eq!(status, 500);
    assert!(msg.contains("--allowed-media-domains"), "{msg}");
}
