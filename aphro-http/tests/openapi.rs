//! `/openapi.json` is checked against the real servers: each role that serves routes
//! (`aphro serve` integrated, `aphro launch render`, `aphro serve --tokens-only`) is started,
//! its own document fetched, and then every route is called with a few real requests. Each
//! request body is validated against the operation's request schema, and each response
//! against the schema the document declares for that status and content type: JSON bodies
//! whole, SSE streams event by event (every `data:` line but `[DONE]`). `$ref`s resolve into
//! the document's `components/schemas`, so a wrong component schema fails here.
//!
//! A validator that accepts everything would pass too, so the test also shows that the
//! schemas bite: bodies the server answers with a structural 400 are rejected by the request
//! schema, every response schema rejects `{}` and a number, and corrupting a nested field of
//! a real response (a wrong type deep inside) makes it invalid.
mod common;

use common::{assets, json, Server};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Mutex;

fn gguf() -> String {
    assets()
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        .to_string_lossy()
        .into_owned()
}

const ENGINE_FLAGS: [&str; 6] = [
    "--kv-cache-memory",
    "16777216",
    "--max-model-len",
    "auto",
    "--max-num-seqs",
    "16",
];

/// One role's document and the operations the test called on it.
struct Doc {
    doc: Value,
    called: Mutex<BTreeSet<(String, String)>>,
}

impl Doc {
    fn fetch(s: &Server) -> Doc {
        let (status, body) = s.get("/openapi.json", &[]);
        assert_eq!(status, 200, "{body}");
        let doc = json(&body);
        assert!(
            doc["openapi"]
                .as_str()
                .is_some_and(|v| v.starts_with("3.1")),
            "{}",
            doc["openapi"]
        );
        Doc {
            doc,
            called: Mutex::new(BTreeSet::new()),
        }
    }

    fn operation(&self, method: &str, path: &str) -> &Value {
        let path = self.template_of(path);
        let op = &self.doc["paths"][path.as_str()][method];
        assert!(op.is_object(), "{method} {path} is not in the document");
        op
    }

    /// The document's path for a concrete one: itself, or the template whose `{param}`
    /// segments it fills (`/v1/models/smol` → `/v1/models/{model}`).
    fn template_of(&self, path: &str) -> String {
        let path = path.split('?').next().unwrap_or(path);
        let paths = self.doc["paths"].as_object();
        if paths.is_some_and(|p| p.contains_key(path)) {
            return path.to_owned();
        }
        let segs: Vec<&str> = path.split('/').collect();
        paths
            .into_iter()
            .flatten()
            .map(|(t, _)| t)
            .find(|t| {
                let ts: Vec<&str> = t.split('/').collect();
                ts.len() == segs.len()
                    && ts
                        .iter()
                        .zip(&segs)
                        .all(|(a, b)| a == b || (a.starts_with('{') && a.ends_with('}')))
            })
            .cloned()
            .unwrap_or_else(|| path.to_owned())
    }

    /// A validator for `schema`, with the document's components beside it so that
    /// `#/components/schemas/…` references resolve.
    fn validator(&self, schema: &Value) -> jsonschema::Validator {
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "allOf": [schema],
            "components": self.doc["components"],
        });
        jsonschema::draft202012::new(&root)
            .unwrap_or_else(|e| panic!("not a valid schema ({e}): {schema}"))
    }

    fn errors(&self, schema: &Value, instance: &Value) -> Vec<String> {
        self.validator(schema)
            .iter_errors(instance)
            .map(|e| format!("at {}: {e}", e.instance_path()))
            .collect()
    }

    /// Panics with every validation error of `instance`.
    fn assert_valid(&self, what: &str, schema: &Value, instance: &Value) {
        let errors = self.errors(schema, instance);
        assert!(
            errors.is_empty(),
            "{what} does not match its schema:\n  {}\nschema: {schema}\ninstance: {instance}",
            errors.join("\n  ")
        );
    }

    fn request_schema(&self, path: &str) -> Value {
        let op = self.operation("post", path);
        let schema = &op["requestBody"]["content"]["application/json"]["schema"];
        assert!(
            schema.is_object(),
            "POST {path} declares no JSON request body"
        );
        schema.clone()
    }

    /// The schema declared for `status` and `content_type`, `None` when that response has
    /// no content at all; panics when the status or the content type is undeclared.
    fn response_schema(
        &self,
        method: &str,
        path: &str,
        status: u16,
        content_type: &str,
    ) -> Option<Value> {
        let op = self.operation(method, path);
        let resp = &op["responses"][status.to_string()];
        assert!(
            resp.is_object(),
            "{method} {path} answered {status}, which the document does not declare"
        );
        let content = resp.get("content")?;
        let media = content_type.split(';').next().unwrap_or("").trim();
        let schema = &content[media]["schema"];
        assert!(
            schema.is_object(),
            "{method} {path} {status}: no `{media}` content declared (has {content})"
        );
        Some(schema.clone())
    }

    fn mark(&self, method: &str, path: &str) {
        if let Ok(mut c) = self.called.lock() {
            c.insert((method.to_owned(), path.to_owned()));
        }
    }

    /// Every operation of the document was called.
    fn assert_all_called(&self) {
        let called = self.called.lock().map(|c| c.clone()).unwrap_or_default();
        let mut missing = Vec::new();
        for (path, item) in self.doc["paths"].as_object().into_iter().flatten() {
            for method in item.as_object().into_iter().flatten().map(|(m, _)| m) {
                if !called.contains(&(method.clone(), path.clone())) {
                    missing.push(format!("{method} {path}"));
                }
            }
        }
        assert!(missing.is_empty(), "routes not exercised: {missing:?}");
    }

    /// Shows the schemas are not vacuous: `{}` and a number are not a valid response.
    fn assert_rejects_junk(&self, what: &str, schema: &Value) {
        for junk in [json!({}), json!(42)] {
            assert!(
                !self.errors(schema, &junk).is_empty(),
                "{what}: the schema accepts {junk}: {schema}"
            );
        }
    }

    /// `instance` with `pointer` set to `wrong` must fail `schema`.
    fn assert_rejects_corrupted(
        &self,
        what: &str,
        schema: &Value,
        instance: &Value,
        pointer: &str,
        wrong: Value,
    ) {
        let mut bad = instance.clone();
        let slot = bad
            .pointer_mut(pointer)
            .unwrap_or_else(|| panic!("{what}: {pointer} not in {instance}"));
        *slot = wrong.clone();
        assert!(
            !self.errors(schema, &bad).is_empty(),
            "{what}: {pointer} = {wrong} still validates"
        );
    }
}

/// A server, its document, and checked calls.
struct Api<'a> {
    server: &'a Server,
    doc: &'a Doc,
    headers: Vec<(&'static str, &'static str)>,
}

/// One checked response.
struct Answer {
    status: u16,
    /// The JSON body, or for SSE the `data:` events before `[DONE]`.
    body: Value,
    events: Vec<Value>,
}

impl Api<'_> {
    fn new<'a>(server: &'a Server, doc: &'a Doc) -> Api<'a> {
        Api {
            server,
            doc,
            headers: Vec::new(),
        }
    }

    fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Answer {
        let mut req = ureq::request(method, &self.server.url(path));
        for (k, v) in &self.headers {
            req = req.set(k, v);
        }
        let resp = match body {
            Some(b) => req
                .set("content-type", "application/json")
                .send_string(&b.to_string()),
            None => req.call(),
        };
        let resp = match resp {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: transport error: {e}"),
        };
        let status = resp.status();
        let content_type = resp.header("content-type").unwrap_or("").to_owned();
        let text = resp.into_string().unwrap_or_default();
        self.doc
            .mark(&method.to_lowercase(), &self.doc.template_of(path));
        let what = format!("{method} {path} → {status}");
        let Some(schema) =
            self.doc
                .response_schema(&method.to_lowercase(), path, status, &content_type)
        else {
            assert!(text.is_empty(), "{what}: undeclared body {text}");
            return Answer {
                status,
                body: Value::Null,
                events: Vec::new(),
            };
        };
        if content_type.starts_with("text/event-stream") {
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            // Named-event streams (Anthropic, Kobold) end without `[DONE]`; vLLM's always
            // end with it.
            let named = text.lines().any(|l| l.starts_with("event: "));
            let data = if named {
                assert!(!data.contains(&"[DONE]"), "{what}: {text}");
                &data[..]
            } else {
                assert_eq!(data.last().copied(), Some("[DONE]"), "{what}: {text}");
                &data[..data.len() - 1]
            };
            let events: Vec<Value> = data.iter().map(|d| json(d)).collect();
            assert!(!events.is_empty(), "{what}: no events");
            for (i, ev) in events.iter().enumerate() {
                self.doc
                    .assert_valid(&format!("{what}, event {i}"), &schema, ev);
            }
            self.doc.assert_rejects_junk(&what, &schema);
            return Answer {
                status,
                body: Value::Null,
                events,
            };
        }
        if content_type.starts_with("application/json") {
            let body = json(&text);
            self.doc.assert_valid(&what, &schema, &body);
            self.doc.assert_rejects_junk(&what, &schema);
            return Answer {
                status,
                body,
                events: Vec::new(),
            };
        }
        // text/plain (/metrics, a dead engine's /health): a string schema.
        assert_eq!(schema["type"], "string", "{what}: {content_type}");
        Answer {
            status,
            body: Value::String(text),
            events: Vec::new(),
        }
    }

    fn get(&self, path: &str) -> Answer {
        self.send("GET", path, None)
    }

    /// POST a body the request schema accepts; the answer must be 200.
    fn post(&self, path: &str, body: &Value) -> Answer {
        self.doc.assert_valid(
            &format!("request to {path}"),
            &self.doc.request_schema(path),
            body,
        );
        let a = self.send("POST", path, Some(body));
        assert_eq!(a.status, 200, "POST {path}: {}", a.body);
        a
    }

    /// POST a body the server refuses with `status`; with `schema_rejects` the request
    /// schema must refuse it too (a structural error), else it must accept it (a semantic
    /// check the schema cannot express).
    fn post_refused(&self, path: &str, body: &Value, status: u16, schema_rejects: bool) {
        let errors = self.doc.errors(&self.doc.request_schema(path), body);
        assert_eq!(
            !errors.is_empty(),
            schema_rejects,
            "request schema of {path} on {body}: {errors:?}"
        );
        let a = self.send("POST", path, Some(body));
        assert_eq!(a.status, status, "POST {path} {body}: {}", a.body);
    }
}

fn chat(extra: Value) -> Value {
    let mut v = json!({"model": "smol", "max_tokens": 5, "temperature": 0,
        "messages": [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]});
    for (k, x) in extra.as_object().into_iter().flatten() {
        v[k] = x.clone();
    }
    v
}

/// The routes every role mounts.
fn common_routes(api: &Api<'_>, served: &str) {
    let v = api.get("/version").body;
    assert_eq!(v["version"], "0.33.0");
    let models = api.get("/v1/models").body;
    api.doc.assert_rejects_corrupted(
        "models",
        &api.doc
            .response_schema("get", "/v1/models", 200, "application/json")
            .unwrap_or_default(),
        &models,
        "/data/0/permission/0/allow_sampling",
        json!("yes"),
    );
    assert_eq!(api.get("/health").status, 200);
    assert_eq!(api.get("/ping").status, 200);
    assert_eq!(api.send("POST", "/ping", None).status, 200);
    let card = api.get(&format!("/v1/models/{served}"));
    assert_eq!(card.status, 200);
    assert_eq!(card.body["id"], served);
    assert_eq!(api.get("/v1/models/nope").status, 404);
    assert!(api
        .get("/metrics")
        .body
        .as_str()
        .is_some_and(|t| !t.is_empty()));
}

/// `aphro serve MODEL`: every route, the coupled OpenAI streams, all generate output modes.
#[test]
fn integrated_server_matches_its_document() {
    let model = gguf();
    let mut args = vec![
        "serve",
        model.as_str(),
        "--served-model-name",
        "smol",
        "--enable-scale-out",
        "--launch-kobold-api",
    ];
    args.extend(ENGINE_FLAGS);
    let s = Server::start(&args);
    let doc = Doc::fetch(&s);
    let api = Api::new(&s, &doc);
    common_routes(&api, "smol");
    anthropic_routes(&api, &doc);
    kobold_routes(&api, &doc);
    let g = api
        .post(
            "/generative_scoring",
            &json!({"model": "smol", "query": "The capital of France is",
                    "items": [" Paris.", " Rome."], "label_token_ids": [1, 2]}),
        )
        .body;
    assert_eq!(g["data"].as_array().map(Vec::len), Some(2), "{g}");
    api.post_refused(
        "/generative_scoring",
        &json!({"query": "q", "items": ["a"], "label_token_ids": []}),
        400,
        false,
    );
    api.post_refused("/generative_scoring", &json!({"query": "q"}), 400, true);

    // Chat, non-streaming with logprobs and a stop list.
    let chat_req = chat(json!({"logprobs": true, "top_logprobs": 2, "stop": ["\n\n"]}));
    let full = api.post("/v1/chat/completions", &chat_req).body;
    let schema = doc
        .response_schema("post", "/v1/chat/completions", 200, "application/json")
        .unwrap_or_default();
    doc.assert_rejects_corrupted(
        "chat",
        &schema,
        &full,
        "/choices/0/message/content",
        json!(5),
    );
    doc.assert_rejects_corrupted("chat", &schema, &full, "/usage/prompt_tokens", json!("9"));
    doc.assert_rejects_corrupted(
        "chat",
        &schema,
        &full,
        "/choices/0/logprobs/content/0/top_logprobs/0/logprob",
        json!(null),
    );
    // Streaming, with usage on every chunk and the prompt ids on the first.
    let events = api
        .post(
            "/v1/chat/completions",
            &chat(
                json!({"stream": true, "logprobs": true, "return_token_ids": true, "stop": "\n",
                "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
            ),
        )
        .events;
    assert!(events.len() >= 3, "{events:?}");
    let schema = doc
        .response_schema("post", "/v1/chat/completions", 200, "text/event-stream")
        .unwrap_or_default();
    doc.assert_rejects_corrupted(
        "chat chunk",
        &schema,
        &events[1],
        "/choices/0/index",
        json!(-1),
    );

    // Completions: a batch, token-id prompts, streamed.
    let c = api
        .post(
            "/v1/completions",
            &json!({"model": "smol", "prompt": ["The sky is", "Once upon"], "max_tokens": 3,
                    "temperature": 0, "logprobs": 2, "echo": false}),
        )
        .body;
    assert_eq!(c["choices"].as_array().map(Vec::len), Some(2));
    let schema = doc
        .response_schema("post", "/v1/completions", 200, "application/json")
        .unwrap_or_default();
    doc.assert_rejects_corrupted("completion", &schema, &c, "/choices/0/text", json!(null));
    api.post(
        "/v1/completions",
        &json!({"prompt": [[1, 504, 3370, 314]], "max_tokens": 2, "temperature": 0,
                "return_token_ids": true}),
    );
    api.post(
        "/v1/completions",
        &json!({"prompt": ["Hi", "Yo"], "max_tokens": 3, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}}),
    );

    // Render, then every generate output mode on the rendered request.
    let rendered = api
        .post("/v1/chat/completions/render", &chat(json!({})))
        .body;
    let renders = api
        .post(
            "/v1/completions/render",
            &json!({"prompt": ["a", "b"], "max_tokens": 2}),
        )
        .body;
    assert_eq!(renders.as_array().map(Vec::len), Some(2));
    let mut gen = rendered.clone();
    gen["sampling_params"]["logprobs"] = json!(1);
    let tokens = api.post("/inference/v1/generate", &gen).body;
    let schema = doc
        .response_schema("post", "/inference/v1/generate", 200, "application/json")
        .unwrap_or_default();
    doc.assert_rejects_corrupted(
        "generate",
        &schema,
        &tokens,
        "/choices/0/token_ids/0",
        json!("x"),
    );
    let mut text = rendered.clone();
    text["output_mode"] = json!("text");
    text["stream"] = json!(true);
    text["return_token_ids"] = json!(true);
    text["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    text["sampling_params"]["logprobs"] = json!(true);
    let events = api.post("/inference/v1/generate", &text).events;
    let schema = doc
        .response_schema("post", "/inference/v1/generate", 200, "text/event-stream")
        .unwrap_or_default();
    doc.assert_rejects_corrupted(
        "generate event",
        &schema,
        &events[0],
        "/request_id",
        json!(1),
    );
    let mut der = rendered.clone();
    der["output_mode"] = json!("derender");
    let d = api.post("/inference/v1/generate", &der).body;
    assert_eq!(d["output_mode"], "derender");

    // Derender the tokens-mode response, whole and as a stream of two events.
    let prompt_ids = rendered["token_ids"].clone();
    let out_ids: Vec<Value> = tokens["choices"][0]["token_ids"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    api.post(
        "/v1/chat/completions/derender",
        &json!({"generate_response": tokens, "prompt_token_ids": prompt_ids,
                "chat_request": chat(json!({}))}),
    );
    let mut state = Value::Null;
    for (i, ids) in out_ids.chunks(out_ids.len().div_ceil(2).max(1)).enumerate() {
        let last = (i + 1) * out_ids.len().div_ceil(2).max(1) >= out_ids.len();
        let ev = json!({"request_id": "generate-tokens-x", "output_mode": "tokens", "choices": [
            {"index": 0, "token_ids": ids, "finish_reason": if last { json!("length") } else { Value::Null }}]});
        let v = api
            .post(
                "/v1/chat/completions/derender",
                &json!({"stream": true, "generate_chunk": ev, "stream_state": state,
                        "chat_request": chat(json!({}))}),
            )
            .body;
        state = v["stream_state"].clone();
    }
    let comp_gen = json!({"request_id": "generate-tokens-cmpl-1-0", "output_mode": "tokens",
        "choices": [{"index": 0, "finish_reason": "length", "token_ids": out_ids}]});
    api.post(
        "/v1/completions/derender",
        &json!({"generate_responses": [comp_gen], "prompt_tokens": [3],
                "completion_request": {"prompt": "The sky is", "max_tokens": 5}}),
    );
    api.post(
        "/v1/completions/derender",
        &json!({"stream": true, "generate_chunk": comp_gen, "prompt_tokens": 3}),
    );

    api.post(
        "/tokenize",
        &json!({"prompt": "Hello world", "return_token_strs": true}),
    );
    api.post(
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    );
    api.post("/detokenize", &json!({"tokens": [19556, 905]}));
    api.post(
        "/inference/v1/abort_requests",
        &json!({"request_ids": ["generate-tokens-none"]}),
    );

    // Refusals: structural (the schema refuses too) and semantic; unknown model.
    api.post_refused(
        "/v1/chat/completions",
        &json!({"messages": "hi"}),
        400,
        true,
    );
    api.post_refused("/v1/chat/completions", &chat(json!({"stop": 7})), 400, true);
    api.post_refused("/v1/completions", &json!({"prompt": {"a": 1}}), 400, true);
    api.post_refused(
        "/v1/completions",
        &json!({"prompt": "x", "temperature": 9}),
        400,
        false,
    );
    api.post_refused(
        "/v1/chat/completions",
        &chat(json!({"model": "nope"})),
        404,
        false,
    );
    api.post_refused(
        "/inference/v1/generate",
        &json!({"token_ids": "1 2", "sampling_params": {}}),
        400,
        true,
    );
    api.post_refused(
        "/inference/v1/generate",
        &json!({"token_ids": [1], "sampling_params": {}, "output_mode": "x"}),
        400,
        true,
    );
    api.post_refused("/tokenize", &json!({"prompt": 5}), 400, true);
    api.post_refused(
        "/v1/chat/completions/derender",
        &json!({"stream": true}),
        400,
        true,
    );
    api.post_refused(
        "/inference/v1/abort_requests",
        &json!({"ids": []}),
        400,
        true,
    );
    doc.assert_all_called();
}

/// `/v1/messages` (JSON and SSE) and `count_tokens`, with Anthropic-shaped errors.
fn anthropic_routes(api: &Api<'_>, doc: &Doc) {
    let body = json!({"model": "smol", "max_tokens": 4, "temperature": 0,
        "system": [{"type": "text", "text": "Be terse."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]});
    let m = api.post("/v1/messages", &body).body;
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    let schema = doc
        .response_schema("post", "/v1/messages", 200, "application/json")
        .unwrap_or_default();
    doc.assert_rejects_corrupted("message", &schema, &m, "/usage/input_tokens", json!("9"));
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = api.post("/v1/messages", &streamed).events;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"message_stop"), "{kinds:?}");
    let n = api
        .post(
            "/v1/messages/count_tokens",
            &json!({"model": "smol", "messages": body["messages"]}),
        )
        .body;
    assert!(n["input_tokens"].as_u64().is_some_and(|n| n > 0), "{n}");
    api.post_refused(
        "/v1/messages",
        &json!({"model": "smol", "messages": [{"role": "user", "content": "q"}]}),
        400,
        true,
    );
    api.post_refused(
        "/v1/messages",
        &json!({"model": "smol", "max_tokens": 2, "messages": []}),
        400,
        false,
    );
    api.post_refused(
        "/v1/messages/count_tokens",
        &json!({"model": "nope", "messages": [{"role": "user", "content": "q"}]}),
        404,
        false,
    );
}

/// Every Kobold route of `--launch-kobold-api`.
fn kobold_routes(api: &Api<'_>, doc: &Doc) {
    let gen = json!({"prompt": "Once upon a time", "max_context_length": 64, "max_length": 4,
                     "temperature": 0});
    for path in ["/api/v1/generate", "/api/latest/generate"] {
        let r = api.post(path, &gen).body;
        assert!(r["results"][0]["text"].is_string(), "{r}");
    }
    let events = api.post("/api/extra/generate/stream", &gen).events;
    assert!(!events.is_empty() && events.iter().all(|e| e["token"].is_string()));
    let check = api
        .post("/api/extra/generate/check", &json!({"genkey": "none"}))
        .body;
    assert_eq!(check, json!({"results": [{"text": ""}]}));
    assert_eq!(api.get("/api/extra/generate/check?genkey=none").body, check);
    assert_eq!(
        api.post("/api/extra/abort", &json!({"genkey": "none"}))
            .body,
        json!({"success": false})
    );
    let n = api
        .post(
            "/api/extra/tokencount",
            &json!({"prompt": "Once upon a time"}),
        )
        .body;
    assert!(n["value"].as_u64().is_some_and(|n| n > 0), "{n}");
    for v in ["v1", "latest"] {
        for p in [
            "info/version",
            "model",
            "config/max_length",
            "config/max_context_length",
            "config/soft_prompts_list",
            "config/soft_prompt",
        ] {
            assert_eq!(api.get(&format!("/api/{v}/{p}")).status, 200);
        }
    }
    assert_eq!(
        api.get("/api/v1/model").body,
        json!({"result": "aphro/smol"})
    );
    assert_eq!(api.get("/api/extra/true_max_context_length").status, 200);
    assert_eq!(api.get("/api/extra/version").body["result"], "KoboldCpp");
    api.post_refused("/api/v1/generate", &json!({"prompt": 5}), 400, true);
    api.post_refused(
        "/api/v1/generate",
        &json!({"prompt": "p", "max_context_length": 8, "max_length": 4, "top_a": 0.5}),
        400,
        false,
    );
    let _ = doc;
}

const MODEL_OUTPUT: &str = "<think>Need weather</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>";

/// `aphro launch render` with tool and reasoning parsers: tool calls and reasoning in the
/// derendered shapes, and the API key's 401.
#[test]
fn render_server_matches_its_document() {
    let dir = assets().join("tokenizers/qwen3");
    let s = Server::start(&[
        "launch",
        "render",
        dir.to_str().expect("utf-8 path"),
        "--served-model-name",
        "qwen3",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--enable-auto-tool-choice",
        "--api-key",
        "sekret",
    ]);
    let doc = Doc::fetch(&s);
    let mut api = Api::new(&s, &doc);
    let refused = api.send("GET", "/v1/models", None);
    assert_eq!(refused.status, 401);
    api.headers.push(("authorization", "Bearer sekret"));
    common_routes(&api, "qwen3");

    let chat_req = json!({"model": "qwen3", "max_tokens": 64,
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                     {"role": "user", "content": "And Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "auto", "stop": ["END"]});
    let rendered = api.post("/v1/chat/completions/render", &chat_req).body;
    assert_eq!(rendered["parse_context"]["tool_choice"], "auto");
    api.post(
        "/v1/completions/render",
        &json!({"model": "qwen3", "prompt": [[1, 2, 3], [4, 5]], "max_tokens": 3}),
    );
    let out_ids = api
        .post(
            "/tokenize",
            &json!({"prompt": MODEL_OUTPUT, "add_special_tokens": false}),
        )
        .body["tokens"]
        .clone();
    api.post(
        "/tokenize",
        &json!({"messages": chat_req["messages"], "tools": chat_req["tools"], "return_token_strs": true}),
    );
    api.post("/detokenize", &json!({"model": "qwen3", "tokens": out_ids}));

    let gen = json!({"request_id": "generate-tokens-chatcmpl-abc", "output_mode": "tokens",
        "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": null, "token_ids": out_ids}],
        "usage": {"prompt_tokens": 10, "total_tokens": 30, "completion_tokens": 20}});
    let resp = api
        .post(
            "/v1/chat/completions/derender",
            &json!({"generate_response": gen, "prompt_tokens": 10, "chat_request": chat_req}),
        )
        .body;
    let call = &resp["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    let schema = doc
        .response_schema(
            "post",
            "/v1/chat/completions/derender",
            200,
            "application/json",
        )
        .unwrap_or_default();
    doc.assert_rejects_corrupted(
        "tool call",
        &schema,
        &resp,
        "/choices/0/message/tool_calls/0/function/arguments",
        json!({"city": "Paris"}),
    );
    // Streamed in chunks of 5 ids through the client-carried state (streaming derender
    // refuses stop strings: text already sent cannot be cut).
    let mut stream_req = chat_req.clone();
    if let Some(o) = stream_req.as_object_mut() {
        o.remove("stop");
    }
    let ids: Vec<Value> = out_ids.as_array().cloned().unwrap_or_default();
    let chunks: Vec<&[Value]> = ids.chunks(5).collect();
    let mut state = Value::Null;
    let mut saw_call = false;
    for (i, part) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let ev = json!({"request_id": "generate-tokens-chatcmpl-abc", "output_mode": "tokens",
            "choices": [{"index": 0, "finish_reason": if last { json!("stop") } else { Value::Null },
                         "stop_reason": null, "token_ids": part}]});
        let v = api
            .post(
                "/v1/chat/completions/derender",
                &json!({"stream": true, "generate_chunk": ev, "stream_state": state,
                        "prompt_token_ids": rendered["token_ids"], "chat_request": stream_req}),
            )
            .body;
        saw_call |= v["chunk"]["choices"][0]["delta"]["tool_calls"].is_array();
        state = v["stream_state"].clone();
    }
    assert!(saw_call, "no tool-call delta was streamed");
    api.post(
        "/v1/completions/derender",
        &json!({"generate_responses": [gen], "prompt_token_ids": [[1, 2, 3]]}),
    );
    api.post(
        "/v1/completions/derender",
        &json!({"stream": true, "generate_chunk": gen, "stream_state": null}),
    );

    api.post_refused(
        "/v1/chat/completions/derender",
        &json!({"generate_response": {"request_id": "x", "choices": [{"index": 0}]},
                "chat_request": {"messages": [], "tool_choice": "sometimes"}}),
        400,
        true,
    );
    api.post_refused(
        "/v1/chat/completions/derender",
        &json!({"generate_response": {"request_id": "x", "choices": [], "output_mode": "text"}}),
        400,
        false,
    );
    api.post_refused("/detokenize", &json!({"tokens": [-1]}), 400, true);
    api.post_refused(
        "/v1/chat/completions/render",
        &json!({"model": "qwen3"}),
        400,
        true,
    );
    // count_tokens needs only the renderer: the render role serves it, tools included.
    let plain = json!({"model": "qwen3", "messages": [{"role": "user", "content": "Weather?"}]});
    let mut with_tools = plain.clone();
    with_tools["tools"] = json!([{"name": "get_weather", "input_schema": {"properties": {}}}]);
    let a = api.post("/v1/messages/count_tokens", &plain).body["input_tokens"].as_u64();
    let b = api.post("/v1/messages/count_tokens", &with_tools).body["input_tokens"].as_u64();
    assert!(a.is_some() && b > a, "{a:?} {b:?}");
    api.post_refused(
        "/v1/messages/count_tokens",
        &json!({"model": "qwen3"}),
        400,
        true,
    );
    doc.assert_all_called();
}

/// `aphro serve MODEL --tokens-only`: generate (tokens mode, n>1, streamed) and both aborts.
#[test]
fn tokens_only_server_matches_its_document() {
    let model = gguf();
    let mut args = vec![
        "serve",
        model.as_str(),
        "--tokens-only",
        "--served-model-name",
        "smol",
    ];
    args.extend(ENGINE_FLAGS);
    let s = Server::start(&args);
    let doc = Doc::fetch(&s);
    let api = Api::new(&s, &doc);
    common_routes(&api, "smol");

    let ids = json!([1, 9690, 198, 2683, 359, 253, 5356, 2, 198, 1, 4093, 198, 19556, 2, 198]);
    let g = api
        .post(
            "/inference/v1/generate",
            &json!({"request_id": "t1", "token_ids": ids, "return_token_ids": true,
                    "sampling_params": {"temperature": 0.8, "seed": 7, "n": 2, "max_tokens": 3,
                                        "logprobs": 2, "stop_token_ids": [2]}}),
        )
        .body;
    assert_eq!(g["choices"].as_array().map(Vec::len), Some(2));
    let events = api
        .post(
            "/inference/v1/generate",
            &json!({"token_ids": ids, "stream": true, "stream_options": {"include_usage": true},
                    "sampling_params": {"temperature": 0, "max_tokens": 3, "logprobs": 1}}),
        )
        .events;
    assert!(
        events.last().is_some_and(|e| e["choices"] == json!([])),
        "no usage-only event: {events:?}"
    );
    api.post("/inference/v1/abort_requests", &json!({"request_ids": []}));
    api.post(
        "/abort_requests",
        &json!({"request_ids": ["generate-tokens-t1"]}),
    );

    api.post_refused(
        "/inference/v1/generate",
        &json!({"token_ids": ids, "sampling_params": {"max_tokens": 2, "stop": ["x"]}}),
        400,
        false,
    );
    api.post_refused(
        "/inference/v1/generate",
        &json!({"token_ids": ids}),
        400,
        true,
    );
    api.post_refused("/abort_requests", &json!({"request_ids": [1]}), 400, true);
    doc.assert_all_called();
}

/// `aphro serve <MiniLM folder>` (the runner detected from the folder): the pooling routes an
/// embedding model mounts, each called, answers valid against the document; no text routes.
#[test]
fn pooling_server_matches_its_document() {
    let model = assets()
        .join("models/all-MiniLM-L6-v2")
        .to_string_lossy()
        .into_owned();
    let s = Server::start(&["serve", model.as_str(), "--served-model-name", "minilm"]);
    let doc = Doc::fetch(&s);
    let api = Api::new(&s, &doc);
    common_routes(&api, "minilm");
    let paths: BTreeSet<&str> = doc.doc["paths"]
        .as_object()
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    for p in [
        "/v1/embeddings",
        "/v2/embed",
        "/pooling",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
    ] {
        assert!(paths.contains(p), "{p} not documented: {paths:?}");
    }
    for p in [
        "/classify",
        "/v1/chat/completions",
        "/v1/completions",
        "/tokenize",
        "/generative_scoring",
    ] {
        assert!(!paths.contains(p), "{p} documented on a pooling server");
    }

    let e = api
        .post(
            "/v1/embeddings",
            &json!({"model": "minilm", "input": ["a", "b"]}),
        )
        .body;
    assert_eq!(e["data"].as_array().map(Vec::len), Some(2));
    api.post(
        "/v1/embeddings",
        &json!({"input": [101, 7592, 102], "encoding_format": "base64"}),
    );
    api.post(
        "/v2/embed",
        &json!({"texts": ["a"], "embedding_types": ["float", "binary", "ubinary", "base64"]}),
    );
    api.post("/pooling", &json!({"input": "a"}));
    api.post("/score", &json!({"queries": "a", "documents": ["a", "b"]}));
    api.post(
        "/v1/score",
        &json!({"text_1": ["a", "b"], "text_2": ["a", "b"]}),
    );
    for path in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        let r = api
            .post(
                path,
                &json!({"query": "a", "documents": ["b", "a"], "top_n": 1}),
            )
            .body;
        assert_eq!(r["results"][0]["index"], 1);
    }

    api.post_refused("/v1/embeddings", &json!({"inputs": "a"}), 400, true);
    api.post_refused(
        "/v1/embeddings",
        &json!({"model": "other", "input": "a"}),
        404,
        false,
    );
    api.post_refused("/v2/embed", &json!({"model": "minilm"}), 400, false);
    api.post_refused(
        "/pooling",
        &json!({"input": "a", "dimensions": 3}),
        400,
        false,
    );
    api.post_refused(
        "/score",
        &json!({"queries": ["a", "b"], "documents": ["a", "b", "c"]}),
        400,
        false,
    );
    api.post_refused("/rerank", &json!({"documents": ["a"]}), 400, true);
    // An undocumented text route is not mounted: FastAPI's 404.
    let chat_status = match ureq::post(&s.url("/v1/chat/completions"))
        .set("content-type", "application/json")
        .send_string(&chat(json!({})).to_string())
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("transport error: {e}"),
    };
    assert_eq!(chat_status, 404);
    doc.assert_all_called();
}
