//! Structured outputs on the real model (SmolLM2-135M-Instruct Q4_1): every output of 30
//! JSON schemas parses and validates against its schema (the `jsonschema` crate), greedy and
//! sampled; regex, choice, Lark and GBNF grammars hold; a constraint gives the same output
//! through the coupled layer and through a render → JSON wire → generate → derender split;
//! constraints that cannot compile are 400s.

use std::path::PathBuf;
use std::sync::Arc;

use aphro_core::{DerenderOptions, RenderOptions, Renderer};
use aphro_engine::openai::{parse_chat, OpenAiServing};
use aphro_engine::serving::{parse_generate_request, MaxModelLen, ServingConfig, ServingEngine};
use futures::executor::block_on;
use serde_json::{json, Value};

fn gguf() -> String {
    let dir = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let p = dir.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run `python scripts/fetch_assets.py`",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

fn serving() -> OpenAiServing {
    serving_with(None, None)
}

/// A coupled layer whose renderer and derenderer run `--tool-call-parser tool` (with
/// `--enable-auto-tool-choice`) and `--reasoning-parser reasoning`.
fn serving_with(tool: Option<&str>, reasoning: Option<&str>) -> OpenAiServing {
    build(tool, reasoning).0
}

fn build(tool: Option<&str>, reasoning: Option<&str>) -> (OpenAiServing, Arc<ServingEngine>) {
    let engine = Arc::new(
        ServingEngine::new(ServingConfig {
            model: gguf(),
            kv_cache_memory: Some(256 << 20),
            max_model_len: MaxModelLen::Tokens(2048),
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            seed: Some(0),
            ..ServingConfig::default()
        })
        .expect("engine starts"),
    );
    let model = Arc::clone(engine.model().expect("tokenizer loaded"));
    let hooks: Option<Arc<dyn aphro_core::RenderHooks>> = (tool.is_some() || reasoning.is_some())
        .then(|| {
            Arc::new(aphro_core::parser_hooks::ParserHooks::new(
                Arc::clone(&model),
                tool,
                reasoning,
            )) as Arc<dyn aphro_core::RenderHooks>
        });
    let renderer = Renderer::new(
        Arc::clone(&model),
        RenderOptions {
            hooks,
            tool_call_parser: tool.map(str::to_owned),
            enable_auto_tool_choice: tool.is_some(),
            ..RenderOptions::default()
        },
    )
    .expect("renderer");
    let derenderer = aphro_core::Derenderer::new(
        model,
        DerenderOptions {
            tool_call_parser: tool.map(str::to_owned),
            reasoning_parser: reasoning.map(str::to_owned),
            enable_auto_tool_choice: tool.is_some(),
            ..DerenderOptions::default()
        },
    )
    .expect("derenderer");
    let serving = OpenAiServing::new(
        Arc::new(renderer),
        Arc::new(derenderer),
        Arc::clone(&engine),
    );
    (serving, engine)
}

fn chat(s: &OpenAiServing, body: Value) -> Result<Value, aphro_engine::openai::OpenAiError> {
    let req = parse_chat(&body)?;
    let resp = block_on(s.chat(req, None))?;
    Ok(serde_json::to_value(resp).expect("serializes"))
}

/// Many chat requests at once (one batch), answers in order.
fn chat_all(s: &OpenAiServing, bodies: Vec<Value>) -> Vec<Value> {
    let futs = bodies.into_iter().map(|b| {
        let s = s.clone();
        async move {
            let req = parse_chat(&b).unwrap_or_else(|e| panic!("{b}: {e}"));
            let resp = s
                .chat(req, None)
                .await
                .unwrap_or_else(|e| panic!("{b}: {e}"));
            serde_json::to_value(resp).expect("serializes")
        }
    });
    block_on(futures::future::join_all(futs))
}

fn content(resp: &Value) -> &str {
    resp["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content: {resp}"))
}

fn schemas() -> Vec<(&'static str, Value)> {
    let name = json!({"type": "string", "minLength": 1, "maxLength": 12});
    vec![
        (
            "a person",
            json!({"type": "object", "properties": {"name": name, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
        ),
        ("a yes or no answer", json!({"type": "boolean"})),
        (
            "a small integer",
            json!({"type": "integer", "minimum": -5, "maximum": 5}),
        ),
        (
            "a temperature",
            json!({"type": "number", "minimum": -50, "maximum": 50, "multipleOf": 0.5}),
        ),
        (
            "a colour",
            json!({"type": "string", "enum": ["red", "green", "blue"]}),
        ),
        ("a constant", json!({"const": "fixed"})),
        ("a null", json!({"type": "null"})),
        (
            "a list of tags",
            json!({"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}),
        ),
        (
            "exactly two numbers",
            json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2, "maxItems": 2}),
        ),
        ("an empty list", json!({"type": "array", "maxItems": 0})),
        (
            "a point",
            json!({"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"], "additionalProperties": false}),
        ),
        (
            "an address",
            json!({"type": "object", "properties": {"street": name, "city": name, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"], "additionalProperties": false}),
        ),
        (
            "a nested object",
            json!({"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 1000}, "profile": {"type": "object", "properties": {"nick": name}, "required": ["nick"], "additionalProperties": false}}, "required": ["id", "profile"], "additionalProperties": false}}, "required": ["user"], "additionalProperties": false}),
        ),
        (
            "a string or a number",
            json!({"anyOf": [{"type": "string", "maxLength": 10}, {"type": "integer", "minimum": 0, "maximum": 100}]}),
        ),
        (
            "a shape",
            json!({"anyOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "r"], "additionalProperties": false},
            {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "side"], "additionalProperties": false}]}),
        ),
        (
            "a nullable name",
            json!({"type": ["string", "null"], "maxLength": 10}),
        ),
        ("a date", json!({"type": "string", "format": "date"})),
        ("a time", json!({"type": "string", "format": "time"})),
        (
            "an email",
            json!({"type": "string", "format": "email", "maxLength": 30}),
        ),
        ("a uuid", json!({"type": "string", "format": "uuid"})),
        (
            "a code",
            json!({"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}),
        ),
        (
            "a rating",
            json!({"type": "object", "properties": {"stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "comment": {"type": "string", "maxLength": 20}}, "required": ["stars"], "additionalProperties": false}),
        ),
        (
            "a list of people",
            json!({"type": "array", "items": {"type": "object", "properties": {"name": name, "age": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["name", "age"], "additionalProperties": false}, "minItems": 1, "maxItems": 2}),
        ),
        (
            "a matrix",
            json!({"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}),
        ),
        (
            "a tuple",
            json!({"type": "array", "prefixItems": [{"type": "string", "maxLength": 5}, {"type": "integer", "minimum": 0, "maximum": 9}], "items": false}),
        ),
        (
            "a line",
            json!({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"], "additionalProperties": false}}, "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"], "additionalProperties": false}),
        ),
        (
            "a price",
            json!({"type": "object", "properties": {"amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000}, "currency": {"enum": ["EUR", "USD"]}}, "required": ["amount", "currency"], "additionalProperties": false}),
        ),
        (
            "optional fields",
            json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}, "c": {"type": "string", "maxLength": 5}}, "required": ["a"], "additionalProperties": false}),
        ),
        (
            "all of two parts",
            json!({"allOf": [{"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 50}, "ok": {"type": "boolean"}}, "additionalProperties": false}, {"required": ["id", "ok"]}]}),
        ),
        (
            "a multiple of five",
            json!({"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5}),
        ),
        (
            "a short word",
            json!({"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^[a-z]+$"}),
        ),
    ]
}

#[test]
fn json_schema_outputs_validate_greedy_and_sampled() {
    let s = serving();
    let cases = schemas();
    assert!(cases.len() >= 30);
    let mut bodies = Vec::new();
    for (what, schema) in &cases {
        for sampled in [false, true] {
            let mut body = json!({
                "messages": [{"role": "user", "content": format!("Reply with {what} as JSON.")}],
                "max_tokens": 200,
                "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
            });
            body["temperature"] = if sampled { json!(1.0) } else { json!(0.0) };
            if sampled {
                body["seed"] = json!(7);
            }
            bodies.push(body);
        }
    }
    let answers = chat_all(&s, bodies);
    let mut failures = Vec::new();
    for (i, resp) in answers.iter().enumerate() {
        let (what, schema) = &cases[i / 2];
        let text = content(resp);
        let finish = &resp["choices"][0]["finish_reason"];
        let parsed: Result<Value, _> = serde_json::from_str(text);
        let ok = match &parsed {
            Ok(v) => jsonschema::validator_for(schema)
                .expect("schema compiles")
                .is_valid(v),
            Err(_) => false,
        };
        if !ok || finish != "stop" {
            failures.push(format!(
                "{what} (sampled={}): finish={finish} output={text:?}",
                i % 2 == 1
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} outputs broke their schema:\n{}",
        failures.len(),
        answers.len(),
        failures.join("\n")
    );
}

#[test]
fn regex_choice_and_grammars_hold() {
    let s = serving();
    let ask = |so: Value, temperature: f64| {
        json!({"messages": [{"role": "user", "content": "Answer now."}], "max_tokens": 60,
               "temperature": temperature, "seed": 3, "structured_outputs": so})
    };
    let arithmetic = "start: expr\nexpr: term ((\"+\" | \"-\") term){0,3}\nterm: factor ((\"*\" | \"/\") factor){0,2}\nfactor: NUMBER | \"(\" expr \")\"\nNUMBER: /[0-9]{1,3}/\n";
    let gbnf = "root ::= \"The answer is \" digit digit? \".\"\ndigit ::= [0-9]\n";
    let mut bodies = Vec::new();
    for t in [0.0, 1.0] {
        bodies.push(ask(json!({"regex": "[0-9]{3}-[0-9]{4}"}), t));
        bodies.push(ask(json!({"choice": ["yes", "no", "maybe later"]}), t));
        bodies.push(ask(json!({"grammar": arithmetic}), t));
        bodies.push(ask(json!({"grammar": gbnf}), t));
        // Greedy: sampled, the model wanders into ever longer objects within its budget.
        let mut obj = ask(json!({"json_object": true}), 0.0);
        // Any object at all: a small model given no shape can nest without end, so the prompt
        // names a short one (a schema is how a client bounds it).
        obj["messages"][0]["content"] = json!("Reply with exactly this JSON: {\"ok\": true}");
        obj["max_tokens"] = json!(100);
        bodies.push(obj);
    }
    let answers = chat_all(&s, bodies);
    for pair in answers.chunks(5) {
        let phone = content(&pair[0]);
        assert!(
            phone.len() == 8
                && phone.chars().enumerate().all(|(i, c)| if i == 3 {
                    c == '-'
                } else {
                    c.is_ascii_digit()
                }),
            "{phone:?}"
        );
        assert!(
            ["yes", "no", "maybe later"].contains(&content(&pair[1])),
            "{}",
            content(&pair[1])
        );
        let expr = content(&pair[2]);
        assert!(
            !expr.is_empty()
                && expr
                    .chars()
                    .all(|c| c.is_ascii_digit() || "+-*/()".contains(c)),
            "{expr:?}"
        );
        assert_eq!(
            expr.matches('(').count(),
            expr.matches(')').count(),
            "{expr:?}"
        );
        let sentence = content(&pair[3]);
        let digits = sentence
            .strip_prefix("The answer is ")
            .and_then(|r| r.strip_suffix('.'))
            .unwrap_or_else(|| panic!("{sentence:?}"));
        assert!(
            (1..=2).contains(&digits.len()) && digits.chars().all(|c| c.is_ascii_digit()),
            "{sentence:?}"
        );
        let obj: Value = serde_json::from_str(content(&pair[4]))
            .unwrap_or_else(|e| panic!("{e}: {:?}", content(&pair[4])));
        assert!(obj.is_object());
        for r in pair {
            assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        }
    }
}

/// render → JSON (the wire between the renderer and the engine) → generate → derender.
fn split_chat(s: &OpenAiServing, body: Value) -> Value {
    let req = parse_chat(&body).expect("valid");
    let mut rendered = s.render_chat(req, None).expect("renders");
    let wire = serde_json::to_value(&rendered.generate).expect("serializes");
    assert!(
        wire["sampling_params"]["structured_outputs"].is_object(),
        "{wire}"
    );
    rendered.generate = parse_generate_request(&wire).expect("engine reads the wire");
    let generated = block_on(s.generate_chat(rendered)).expect("generates");
    serde_json::to_value(s.derender_chat(generated).expect("derenders")).expect("serializes")
}

#[test]
fn split_render_generate_derender_gives_the_coupled_output() {
    let s = serving();
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 15}, "sunny": {"type": "boolean"}}, "required": ["city", "sunny"], "additionalProperties": false});
    for temperature in [0.0, 0.8] {
        let body = json!({"messages": [{"role": "user", "content": "Weather report for Paris as JSON."}], "max_tokens": 80,
                          "temperature": temperature, "seed": 5,
                          "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": true}}});
        let coupled = chat(&s, body.clone()).expect("coupled");
        let split = split_chat(&s, body);
        assert_eq!(content(&coupled), content(&split));
        let v: Value = serde_json::from_str(content(&coupled)).expect("JSON");
        assert!(
            jsonschema::validator_for(&schema)
                .expect("compiles")
                .is_valid(&v),
            "{v}"
        );
    }
}

#[test]
fn constraints_that_cannot_compile_are_400s() {
    let s = serving();
    let ask = |so: Value| json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "structured_outputs": so});
    let huge_schema = json!({"type": "object", "properties": (0..40_000).map(|i| (format!("field_{i}"), json!({"type": "integer"}))).collect::<serde_json::Map<_, _>>()});
    assert!(huge_schema.to_string().len() > 1 << 20);
    for (so, needle) in [
        (json!({"regex": "(unclosed"}), "Grammar error"),
        (
            json!({"json": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}),
            "Grammar error",
        ),
        (
            json!({"json": {"type": "string", "minLength": 5, "maxLength": 2}}),
            "Grammar error",
        ),
        (json!({"json": "{oops"}), "not valid JSON"),
        (json!({"grammar": "start: undefined_rule"}), "Grammar error"),
        (
            json!({"grammar": "root ::= \"a\" missing"}),
            "never defined",
        ),
        (json!({"choice": []}), "at least one"),
        (
            json!({"regex": "a".repeat(1 << 20)}),
            "this server accepts at most",
        ),
        (json!({"json": huge_schema}), "this server accepts at most"),
    ] {
        let err = chat(&s, ask(so.clone())).expect_err("must be refused");
        let text = err.to_string();
        assert!(text.contains(needle), "{so:.80}: {text}");
        let core = match &err {
            aphro_engine::openai::OpenAiError::Serving(
                aphro_engine::serving::ServingError::Request(e),
            ) => e,
            aphro_engine::openai::OpenAiError::Core(e) => e,
            other => panic!("{other}"),
        };
        assert_eq!(
            (core.status(), core.param()),
            (400, Some("structured_outputs")),
            "{text}"
        );
    }
    // The engine is still serving.
    let ok = chat(&s, ask(json!({"choice": ["fine"]}))).expect("serves");
    assert_eq!(content(&ok), "fine");
}

/// Both tools are `strict`, so their arguments follow the schema (a tool that is not strict
/// gets any JSON as arguments, as in vLLM, and a 135M model can ramble on in it).
fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "strict": true,
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
                        "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone", "strict": true,
         "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 30}},
                        "required": ["tz"], "additionalProperties": false}}}
    ])
}

/// The tool calls of a chat answer as (name, parsed arguments).
fn calls_of(resp: &Value) -> Vec<(String, Value)> {
    let msg = &resp["choices"][0]["message"];
    msg["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool calls: {resp}"))
        .iter()
        .map(|c| {
            let f = &c["function"];
            let args = f["arguments"].as_str().expect("arguments string");
            (
                f["name"].as_str().expect("name").to_owned(),
                serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {args:?}")),
            )
        })
        .collect()
}

#[test]
fn tool_choice_required_and_named_always_call_an_offered_tool() {
    for parser in ["hermes", "llama3_json"] {
        let s = serving_with(Some(parser), None);
        let schema_of = |i: usize| {
            jsonschema::validator_for(&tools()[i]["function"]["parameters"]).expect("compiles")
        };
        let (weather, time) = (schema_of(0), schema_of(1));
        for temperature in [0.0, 1.0] {
            for (choice, question) in [
                (json!("required"), "What should I wear in Oslo today?"),
                (json!("required"), "Tell me a joke."),
                (
                    json!({"type": "function", "function": {"name": "get_time"}}),
                    "Hello!",
                ),
                (
                    json!({"type": "function", "function": {"name": "get_weather"}}),
                    "Hi",
                ),
            ] {
                let body = json!({"messages": [{"role": "user", "content": question}],
                    "tools": tools(), "tool_choice": choice, "max_tokens": 120,
                    "temperature": temperature, "seed": 11, "parallel_tool_calls": false});
                let coupled = chat(&s, body.clone()).unwrap_or_else(|e| panic!("{parser}: {e}"));
                let calls = calls_of(&coupled);
                assert_eq!(calls.len(), 1, "{parser}: {coupled}");
                let (name, args) = &calls[0];
                if let Some(want) = choice.pointer("/function/name") {
                    assert_eq!(name, want, "{parser}: {coupled}");
                }
                match name.as_str() {
                    "get_time" => assert!(time.is_valid(args), "{parser}: {args}"),
                    "get_weather" => assert!(weather.is_valid(args), "{parser}: {args}"),
                    other => panic!("{parser}: called {other}, not an offered tool"),
                }
                let finish = &coupled["choices"][0]["finish_reason"];
                assert!(finish == "tool_calls" || finish == "stop", "{coupled}");
                let split = split_chat(&s, body);
                assert_eq!(
                    split["choices"][0]["message"]["tool_calls"][0]["function"],
                    coupled["choices"][0]["message"]["tool_calls"][0]["function"],
                    "{parser}: split and coupled differ"
                );
            }
        }
    }
}

#[test]
fn structural_tags_from_the_request_hold() {
    let s = serving();
    // Free text, then a call in tags, as a request's own `structural_tag` (xgrammar's format).
    let tag = json!({"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "triggered_tags", "triggers": ["<call>"], "at_least_one": true, "stop_after_first": true,
         "tags": [{"type": "tag", "begin": "<call>", "end": "</call>",
                   "content": {"type": "json_schema", "json_schema": {"type": "object",
                       "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"],
                       "additionalProperties": false}}}]}
    ]}});
    let legacy = json!({"type": "structural_tag", "triggers": ["<n="],
        "structures": [{"begin": "<n=a>", "schema": {"type": "object", "properties": {"v": {"type": "boolean"}}, "required": ["v"]}, "end": "</n>"}]});
    for temperature in [0.0, 1.0] {
        let body = json!({"messages": [{"role": "user", "content": "Pick a number."}], "max_tokens": 80,
            "temperature": temperature, "seed": 2, "structured_outputs": {"structural_tag": tag.to_string()}});
        let out = content(&chat(&s, body).expect("serves")).to_owned();
        let rest = out
            .strip_prefix("Answer: <call>")
            .unwrap_or_else(|| panic!("{out:?}"));
        let json_text = rest
            .strip_suffix("</call>")
            .unwrap_or_else(|| panic!("{out:?}"));
        let v: Value = serde_json::from_str(json_text).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        assert!(
            v["n"].as_i64().is_some_and(|n| (0..=99).contains(&n)),
            "{out:?}"
        );

        // response_format carries the same tag (vLLM serializes it into structured_outputs).
        let body = json!({"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 60,
            "temperature": temperature, "seed": 4, "response_format": legacy});
        let resp = chat(&s, body).expect("serves");
        let out = content(&resp);
        if let Some(i) = out.find("<n=") {
            let call = &out[i..];
            let body = call
                .strip_prefix("<n=a>")
                .and_then(|c| c.split("</n>").next())
                .unwrap_or_else(|| panic!("{out:?}"));
            let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {out:?}"));
            assert!(v["v"].is_boolean(), "{out:?}");
        }
    }
    for (tag, needle) in [
        (
            json!({"type": "structural_tag", "format": {"type": "token", "token": "<x>"}}),
            "not supported",
        ),
        (
            json!({"type": "structural_tag", "format": {"type": "nope"}}),
            "unknown format type",
        ),
        (json!("{not json"), "not valid JSON"),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
            "structured_outputs": {"structural_tag": if tag.is_string() { tag.clone() } else { Value::from(tag.to_string()) }}});
        let err = chat(&s, body).expect_err("refused").to_string();
        assert!(
            err.contains("Invalid structural_tag specification") && err.contains(needle),
            "{err}"
        );
    }
}

#[test]
fn a_reasoning_parser_lets_the_model_think_before_the_constraint() {
    let s = serving_with(None, Some("qwen3"));
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    let valid = jsonschema::validator_for(&schema).expect("compiles");
    for temperature in [0.0, 1.0] {
        let body = json!({"messages": [{"role": "user", "content": "Think, then answer as JSON."}], "max_tokens": 200,
            "temperature": temperature, "seed": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}});
        let req = parse_chat(&body).expect("valid");
        let rendered = s.render_chat(req, None).expect("renders");
        let wire = serde_json::to_value(&rendered.generate).expect("serializes");
        assert_eq!(wire["reasoning_ended"], true, "{wire}");
        assert!(
            wire["sampling_params"]["structured_outputs"]["structural_tag"].is_string(),
            "{wire}"
        );
        let resp = chat(&s, body).expect("serves");
        let msg = &resp["choices"][0]["message"];
        // The model may skip the optional block; qwen3's parser then reads the unmarked
        // answer as reasoning (vLLM's behaviour), so the JSON is in one of the two fields.
        let text = msg["content"]
            .as_str()
            .or_else(|| msg["reasoning"].as_str())
            .unwrap_or_else(|| panic!("{msg}"));
        let answer: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {msg}"));
        assert!(valid.is_valid(&answer), "{msg}");
    }
}

#[test]
fn forced_tokens_are_fast_forwarded_not_sampled_one_by_one() {
    let (s, engine) = build(None, None);
    let sentence = "The quick brown fox jumps over the lazy dog, twice, and then sleeps.";
    let body = |logprobs: bool| {
        json!({"messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 60, "temperature": 0, "logprobs": logprobs,
        "structured_outputs": {"choice": [sentence]}})
    };
    let before = engine.metrics_synced();
    let resp = chat(&s, body(false)).expect("serves");
    let after = engine.metrics_synced();
    let tokens = resp["usage"]["completion_tokens"].as_u64().expect("usage");
    assert_eq!(content(&resp), sentence);
    // After the first sampled token the rest of the sentence is forced: appended without
    // sampling, and computed in one step rather than one step per token (the EOS after it
    // is sampled).
    let forced = after.grammar_forced_tokens - before.grammar_forced_tokens;
    assert!(
        forced + 2 >= tokens && forced > 5,
        "{forced} of {tokens} forced"
    );
    let steps = after.steps - before.steps;
    assert!(steps <= 4, "{steps} steps for {tokens} tokens");
    // With logprobs every token is sampled (each has a distribution to report), and the
    // text is the same.
    let with_lp = chat(&s, body(true)).expect("serves");
    assert_eq!(content(&with_lp), content(&resp));
    let pieces: String = with_lp["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs")
        .iter()
        .map(|e| e["token"].as_str().expect("token"))
        .collect();
    assert_eq!(
        pieces, sentence,
        "a logprob entry for every token of the text"
    );
    // The split path (generate API) gives the same answer.
    assert_eq!(content(&split_chat(&s, body(false))), content(&resp));
}
