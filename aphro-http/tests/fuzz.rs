//! Property-based fuzzing of every route's body, per server role, in process (the real
//! router and the real model, no sockets): whatever a client sends, the server answers
//! without a 5xx, without a panic, within a deadline, and stays healthy.
//!
//! `APHRO_FUZZ_CASES` sets the cases per role (default 10,000; e.g. 1000000 for a long local
//! run); `APHRO_FUZZ_VERBOSE=1` prints every 400 body, to see which checks the cases reach.
//! A failing case is shrunk and printed in full (no failure files are written).
use aphro_core::derenderer::{DerenderOptions, Derenderer};
use aphro_core::{Model, RenderOptions, Renderer};
use aphro_engine::serving::{MaxModelLen, ServingConfig, ServingEngine};
use aphro_http::server::{router, AppState, Role, ServerSettings};
use axum::body::Body;
use axum::http::Request;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// The longest any single response may take (a request that generates is bounded by the
/// tiny context these servers run with).
const DEADLINE: Duration = Duration::from_secs(20);

fn gguf() -> String {
    let dir = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    dir.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        .to_string_lossy()
        .into_owned()
}

fn cases() -> u32 {
    std::env::var("APHRO_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

const MAX_MODEL_LEN: usize = 80;

fn settings(role: Role) -> ServerSettings {
    ServerSettings {
        role,
        served_model_names: vec!["smol".into()],
        model_root: gguf(),
        max_model_len: MAX_MODEL_LEN,
        api_keys: vec![],
        enable_request_id_headers: true,
        max_body_bytes: 1 << 20,
        body_read_timeout: Duration::from_secs(5),
        enable_scale_out: true,
        skip_tokenizer_init: false,
        launch_kobold_api: false,
    }
}

fn frontend(state: AppState, model: &Arc<Model>) -> AppState {
    let renderer = Renderer::new(
        model.clone(),
        RenderOptions {
            max_model_len: Some(MAX_MODEL_LEN),
            served_model_names: Some(vec!["smol".into()]),
            strict_template_kwargs: true,
            ..RenderOptions::default()
        },
    )
    .expect("renderer");
    let derenderer = Derenderer::new(
        model.clone(),
        DerenderOptions {
            served_model_name: Some("smol".into()),
            max_model_len: Some(MAX_MODEL_LEN),
            ..DerenderOptions::default()
        },
    )
    .expect("derenderer");
    state
        .with_renderer(Arc::new(renderer))
        .with_derenderer(Arc::new(derenderer))
}

fn engine(tokens_only: bool) -> Arc<ServingEngine> {
    Arc::new(
        ServingEngine::new(ServingConfig {
            model: gguf(),
            kv_cache_memory: Some(16 << 20),
            max_model_len: MaxModelLen::Tokens(MAX_MODEL_LEN),
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            served_model_name: Some("smol".into()),
            tokens_only,
            seed: Some(0),
            ..ServingConfig::default()
        })
        .expect("engine"),
    )
}

// ---------------------------------------------------------------------------------------
// Strategies.

fn scalar() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..40).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e3f64..1e3).prop_map(Value::from),
        prop_oneof![Just(1e308), Just(-1e308), Just(5e-324), Just(-0.0)].prop_map(Value::from),
        "[a-z_]{0,8}".prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        Just(Value::from("\u{0}\r\n\u{1b}[31m<|im_start|>")),
    ]
    .boxed()
}

fn any_json() -> BoxedStrategy<Value> {
    scalar()
        .prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::Array),
                btree_map("[a-z_]{1,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
        .boxed()
}

/// Mostly a plausible value for a field, sometimes anything at all.
fn field(plausible: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    prop_oneof![12 => plausible, 1 => any_json()].boxed()
}

fn small_int(lo: i64, hi: i64) -> BoxedStrategy<Value> {
    (lo..hi).prop_map(Value::from).boxed()
}

fn unit_float(hi: f64) -> BoxedStrategy<Value> {
    (0.0f64..hi).prop_map(Value::from).boxed()
}

fn text() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => "[a-zA-Z ,.?]{1,40}".prop_map(Value::from),
        2 => any::<String>().prop_map(Value::from),
        1 => Just(Value::from("<|im_start|>user\nhi<|im_end|>")),
    ]
    .boxed()
}

fn token_ids() -> BoxedStrategy<Value> {
    prop_oneof![
        8 => vec(0u32..49_152, 1..12).prop_map(Value::from),
        1 => vec(0u32..49_152, 0..40).prop_map(Value::from),
        1 => vec(any::<i64>(), 0..4).prop_map(Value::from),
    ]
    .boxed()
}

fn content_part() -> BoxedStrategy<Value> {
    (
        prop_oneof![
            Just("text"),
            Just("image_url"),
            Just("input_audio"),
            Just("refusal"),
            Just("bogus")
        ],
        text(),
    )
        .prop_map(|(kind, t)| serde_json::json!({"type": kind, "text": t}))
        .boxed()
}

fn message() -> BoxedStrategy<Value> {
    (
        prop_oneof![
            8 => Just("user"),
            2 => Just("assistant"),
            2 => Just("system"),
            1 => Just("tool"),
            1 => Just("developer"),
            1 => Just("nobody")
        ],
        prop_oneof![
            3 => text(),
            1 => vec(content_part(), 0..3).prop_map(Value::Array),
            1 => Just(Value::Null),
        ],
    )
        .prop_map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .boxed()
}

fn messages() -> BoxedStrategy<Value> {
    vec(message(), 1..4).prop_map(Value::Array).boxed()
}

fn tool() -> BoxedStrategy<Value> {
    "[a-z_]{1,8}"
        .prop_map(|name| {
            serde_json::json!({"type": "function", "function": {"name": name,
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}})
        })
        .boxed()
}

fn stop() -> BoxedStrategy<Value> {
    prop_oneof![text(), vec(text(), 0..3).prop_map(Value::Array)].boxed()
}

/// Sampling fields shared by chat, completions and generate's `sampling_params`.
fn sampling_fields() -> Vec<(&'static str, BoxedStrategy<Value>)> {
    vec![
        ("max_tokens", small_int(-1, 6)),
        ("temperature", unit_float(2.0)),
        ("top_p", unit_float(1.2)),
        ("top_k", small_int(-2, 50)),
        ("min_p", unit_float(1.0)),
        ("n", small_int(0, 3)),
        ("seed", small_int(-1, 100)),
        ("stop", stop()),
        ("stop_token_ids", token_ids()),
        ("presence_penalty", unit_float(2.5)),
        ("frequency_penalty", unit_float(2.5)),
        ("repetition_penalty", unit_float(2.5)),
        ("min_tokens", small_int(0, 6)),
        ("logprobs", small_int(-1, 6)),
        ("prompt_logprobs", small_int(-1, 3)),
        ("ignore_eos", any::<bool>().prop_map(Value::from).boxed()),
        (
            "skip_special_tokens",
            any::<bool>().prop_map(Value::from).boxed(),
        ),
        (
            "include_stop_str_in_output",
            any::<bool>().prop_map(Value::from).boxed(),
        ),
        ("logit_bias", any_json()),
        ("allowed_token_ids", token_ids()),
        (
            "bad_words",
            vec(text(), 0..2).prop_map(Value::Array).boxed(),
        ),
    ]
}

fn request_fields(kind: &str) -> Vec<(&'static str, BoxedStrategy<Value>)> {
    let common = || -> Vec<(&'static str, BoxedStrategy<Value>)> {
        vec![
            (
                "model",
                prop_oneof![9 => Just(Value::from("smol")), 1 => text()].boxed(),
            ),
            ("stream", any::<bool>().prop_map(Value::from).boxed()),
            (
                "stream_options",
                prop_oneof![
                    Just(serde_json::json!({"include_usage": true})),
                    Just(
                        serde_json::json!({"include_usage": true, "continuous_usage_stats": true})
                    ),
                ]
                .boxed(),
            ),
            ("request_id", text()),
            ("priority", small_int(-2, 2)),
        ]
    };
    match kind {
        "chat" => {
            let mut f = common();
            f.extend(sampling_fields());
            f.extend([
                ("messages", messages()),
                ("max_completion_tokens", small_int(-1, 8)),
                ("top_logprobs", small_int(-1, 6)),
                ("tools", vec(tool(), 0..3).prop_map(Value::Array).boxed()),
                (
                    "tool_choice",
                    prop_oneof![
                        Just(Value::from("auto")),
                        Just(Value::from("none")),
                        Just(Value::from("required"))
                    ]
                    .boxed(),
                ),
                ("response_format", any_json()),
                ("chat_template_kwargs", any_json()),
                (
                    "add_generation_prompt",
                    any::<bool>().prop_map(Value::from).boxed(),
                ),
                (
                    "continue_final_message",
                    any::<bool>().prop_map(Value::from).boxed(),
                ),
                ("echo", any::<bool>().prop_map(Value::from).boxed()),
                (
                    "return_token_ids",
                    any::<bool>().prop_map(Value::from).boxed(),
                ),
                ("truncate_prompt_tokens", small_int(-1, 30)),
            ]);
            f
        }
        "completion" => {
            let mut f = common();
            f.extend(sampling_fields());
            f.extend([
                (
                    "prompt",
                    prop_oneof![
                        text(),
                        vec(text(), 0..3).prop_map(Value::Array).boxed(),
                        token_ids(),
                        vec(token_ids(), 0..3).prop_map(Value::Array).boxed(),
                    ]
                    .boxed(),
                ),
                ("echo", any::<bool>().prop_map(Value::from).boxed()),
                ("suffix", text()),
                ("best_of", small_int(0, 3)),
                (
                    "return_token_ids",
                    any::<bool>().prop_map(Value::from).boxed(),
                ),
            ]);
            f
        }
        "tokenize" => vec![
            ("prompt", text()),
            ("messages", messages()),
            (
                "add_special_tokens",
                any::<bool>().prop_map(Value::from).boxed(),
            ),
            (
                "return_token_strs",
                any::<bool>().prop_map(Value::from).boxed(),
            ),
            (
                "add_generation_prompt",
                any::<bool>().prop_map(Value::from).boxed(),
            ),
            (
                "model",
                prop_oneof![9 => Just(Value::from("smol")), 1 => text()].boxed(),
            ),
        ],
        "detokenize" => vec![
            ("tokens", token_ids()),
            (
                "model",
                prop_oneof![9 => Just(Value::from("smol")), 1 => text()].boxed(),
            ),
        ],
        "derender" => {
            let choice = (token_ids(), small_int(0, 2), prop_oneof![Just("stop"), Just("length"), Just("abort")])
                .prop_map(|(ids, idx, fin)| {
                    serde_json::json!({"index": idx, "token_ids": ids, "finish_reason": fin})
                })
                .boxed();
            let response = vec(choice, 0..3)
                .prop_map(|choices| serde_json::json!({"request_id": "g", "choices": choices}))
                .boxed();
            vec![
                ("stream", any::<bool>().prop_map(Value::from).boxed()),
                ("generate_response", field(response.clone())),
                (
                    "generate_responses",
                    vec(response.clone(), 0..3).prop_map(Value::Array).boxed(),
                ),
                ("generate_chunk", field(response)),
                (
                    "stream_state",
                    prop_oneof![
                        any_json(),
                        (vec("[a-zĠ]{1,4}", 0..4), 0usize..5, 0usize..5, token_ids())
                            .prop_map(|(prev, p, r, ids)| serde_json::json!({"prev_tokens": prev,
                                "prefix_offset": p, "read_offset": r, "output_token_ids": ids}))
                    ]
                    .boxed(),
                ),
                ("prompt_token_ids", token_ids()),
                ("prompt_tokens", small_int(-1, 30)),
                (
                    "chat_request",
                    prop_oneof![Just(serde_json::json!({"messages": []})), any_json()].boxed(),
                ),
                (
                    "model",
                    prop_oneof![9 => Just(Value::from("smol")), 1 => text()].boxed(),
                ),
            ]
        }
        "generate" => vec![
            ("token_ids", token_ids()),
            (
                "sampling_params",
                prop_oneof![
                    4 => body_from(sampling_fields()),
                    1 => any_json(),
                ]
                .boxed(),
            ),
            ("stream", any::<bool>().prop_map(Value::from).boxed()),
            (
                "output_mode",
                prop_oneof![Just("tokens"), Just("text"), Just("derender"), Just("x")]
                    .prop_map(Value::from)
                    .boxed(),
            ),
            ("request_id", text()),
            (
                "model",
                prop_oneof![9 => Just(Value::from("smol")), 1 => text()].boxed(),
            ),
            ("priority", small_int(-2, 2)),
            (
                "return_token_ids",
                any::<bool>().prop_map(Value::from).boxed(),
            ),
            (
                "stream_options",
                Just(serde_json::json!({"include_usage": true})).boxed(),
            ),
        ],
        "abort" => vec![(
            "request_ids",
            prop_oneof![vec(text(), 0..3).prop_map(Value::Array).boxed(), any_json()].boxed(),
        )],
        _ => vec![],
    }
}

/// The fields a request of each kind needs to be valid at all: nearly always sent, so
/// that most cases get past parsing into the code that does the work.
const REQUIRED: &[&str] = &[
    "messages",
    "prompt",
    "token_ids",
    "tokens",
    "request_ids",
    "generate_response",
    "generate_responses",
    "sampling_params",
    "model",
    // Keeps most generating cases short; the rest fill the (small) context.
    "max_tokens",
];

/// An object with a random subset of `fields`, each with a (mostly plausible) value.
fn body_from(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> BoxedStrategy<Value> {
    let parts: Vec<BoxedStrategy<Option<(&'static str, Value)>>> = fields
        .into_iter()
        .map(|(k, s)| {
            let p = if REQUIRED.contains(&k) { 0.9 } else { 0.12 };
            proptest::option::weighted(p, field(s).prop_map(move |v| (k, v))).boxed()
        })
        .collect();
    parts
        .prop_map(|kv| {
            let mut m = Map::new();
            for (k, v) in kv.into_iter().flatten() {
                m.insert(k.to_owned(), v);
            }
            Value::Object(m)
        })
        .boxed()
}

#[derive(Debug, Clone)]
enum Payload {
    Json(Value),
    /// Valid JSON followed by bytes.
    Trailing(Value, Vec<u8>),
    Raw(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Case {
    method: &'static str,
    path: &'static str,
    content_type: &'static str,
    payload: Payload,
}

fn routes(role: Role) -> Vec<(&'static str, &'static str, &'static str)> {
    let mut r = vec![
        ("GET", "/health", ""),
        ("GET", "/version", ""),
        ("GET", "/v1/models", ""),
        ("GET", "/metrics", ""),
        ("GET", "/nope", ""),
    ];
    if matches!(role, Role::Render | Role::Full) {
        r.extend([
            ("POST", "/v1/chat/completions/render", "chat"),
            ("POST", "/v1/completions/render", "completion"),
            ("POST", "/v1/chat/completions/derender", "derender"),
            ("POST", "/v1/completions/derender", "derender"),
            ("POST", "/tokenize", "tokenize"),
            ("POST", "/detokenize", "detokenize"),
        ]);
    }
    if matches!(role, Role::TokensOnly | Role::Full) {
        r.extend([
            ("POST", "/inference/v1/generate", "generate"),
            ("POST", "/inference/v1/abort_requests", "abort"),
        ]);
    }
    if role == Role::TokensOnly {
        r.push(("POST", "/abort_requests", "abort"));
    }
    if role == Role::Full {
        r.extend([
            ("POST", "/v1/chat/completions", "chat"),
            ("POST", "/v1/completions", "completion"),
        ]);
    }
    r
}

fn case_strategy(role: Role) -> BoxedStrategy<Case> {
    let per_route: Vec<BoxedStrategy<Case>> = routes(role)
        .into_iter()
        .map(|(method, path, kind)| {
            let body = body_from(request_fields(kind));
            let payload = prop_oneof![
                12 => body.clone().prop_map(Payload::Json),
                1 => any_json().prop_map(Payload::Json),
                1 => (body, vec(any::<u8>(), 1..8)).prop_map(|(v, t)| Payload::Trailing(v, t)),
                1 => vec(any::<u8>(), 0..64).prop_map(Payload::Raw),
            ];
            let content_type = prop_oneof![
                20 => Just("application/json"),
                1 => Just("text/plain"),
                1 => Just(""),
            ];
            (payload, content_type)
                .prop_map(move |(payload, content_type)| Case {
                    method,
                    path,
                    content_type,
                    payload,
                })
                .boxed()
        })
        .collect();
    proptest::strategy::Union::new(per_route).boxed()
}

fn request(case: &Case) -> Request<Body> {
    let bytes = match &case.payload {
        Payload::Json(v) => v.to_string().into_bytes(),
        Payload::Trailing(v, t) => {
            let mut b = v.to_string().into_bytes();
            b.extend_from_slice(t);
            b
        }
        Payload::Raw(b) => b.clone(),
    };
    let mut req = Request::builder().method(case.method).uri(case.path);
    if !case.content_type.is_empty() {
        req = req.header("content-type", case.content_type);
    }
    req.body(Body::from(bytes)).expect("request")
}

fn run_role(role: Role, state: AppState) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let app = router(state.clone());
    let n = cases();
    let mut runner = TestRunner::new(Config {
        cases: n,
        failure_persistence: None,
        max_shrink_iters: 200,
        ..Config::default()
    });
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<(&str, u16), u32>::new());
    let started = Instant::now();
    let result = runner.run(&case_strategy(role), |case| {
        let app = app.clone();
        let req = request(&case);
        let path = case.path;
        let t = Instant::now();
        let outcome = rt.block_on(async move {
            tokio::time::timeout(DEADLINE, async move {
                let resp = app.oneshot(req).await.expect("infallible");
                let status = resp.status();
                let body = axum::body::to_bytes(resp.into_body(), 64 << 20).await;
                (status, body)
            })
            .await
        });
        let Ok((status, body)) = outcome else {
            return Err(TestCaseError::fail(format!(
                "no complete response within {DEADLINE:?}"
            )));
        };
        let body = body.map_err(|e| TestCaseError::fail(format!("body: {e}")))?;
        *statuses
            .borrow_mut()
            .entry((path, status.as_u16()))
            .or_default() += 1;
        if std::env::var_os("APHRO_FUZZ_VERBOSE").is_some() && status.as_u16() == 400 {
            eprintln!("{path} 400: {}", String::from_utf8_lossy(&body));
        }
        if status.is_server_error() {
            return Err(TestCaseError::fail(format!(
                "{status} after {:?}: {}",
                t.elapsed(),
                String::from_utf8_lossy(&body)
            )));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{role:?}: {e}");
    }
    eprintln!(
        "{role:?}: {n} cases in {:.1} s, statuses {:?}",
        started.elapsed().as_secs_f64(),
        statuses.borrow()
    );
    // Healthy after, with nothing left running.
    let health = rt.block_on(
        router(state.clone()).oneshot(
            Request::builder()
                .uri("/health")
                .body(Body::empty())
                .expect("request"),
        ),
    );
    assert_eq!(health.expect("response").status(), 200, "{role:?}");
    if let Some(engine) = &state.engine {
        let m = engine.metrics_synced();
        assert_eq!((m.num_running, m.num_waiting), (0, 0), "{role:?}: {m:?}");
        assert_eq!(m.kv_blocks_in_use, 0, "{role:?}: {m:?}");
    }
}

#[test]
fn fuzz_render_role() {
    let model = Arc::new(Model::load(&gguf()).expect("model"));
    let state = frontend(AppState::new(settings(Role::Render)), &model);
    run_role(Role::Render, state);
}

#[test]
fn fuzz_tokens_only_role() {
    let state = AppState::new(settings(Role::TokensOnly)).with_engine(engine(true));
    run_role(Role::TokensOnly, state);
}

#[test]
fn fuzz_integrated_role() {
    let model = Arc::new(Model::load(&gguf()).expect("model"));
    let state = frontend(AppState::new(settings(Role::Full)), &model).with_engine(engine(false));
    run_role(Role::Full, state);
}
