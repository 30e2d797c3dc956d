//! Wire-shape checks: error envelope, SamplingParams "omit defaults" dump and validation.
use aphro_core::protocol::SamplingParams;
use aphro_core::Error;
use serde_json::json;

#[test]
fn sampling_params_dump_matches_vllm_render() {
    // `api.md` §2.3's observed render: temperature 0.7, max_tokens 32, stream, stop ["END"],
    // logprobs 2, server defaults top_p 0.95 / top_k 20.
    let mut sp = SamplingParams {
        temperature: 0.7,
        top_p: 0.95,
        top_k: 20,
        stop: vec!["END".into()],
        max_tokens: Some(32),
        logprobs: Some(2),
        output_kind: 1,
        skip_clone: true,
        ..SamplingParams::default()
    };
    sp.normalize_and_validate().expect("valid");
    assert_eq!(
        serde_json::to_string(&sp).expect("json"),
        r#"{"presence_penalty":0.0,"frequency_penalty":0.0,"repetition_penalty":1.0,"temperature":0.7,"top_p":0.95,"top_k":20,"min_p":0.0,"stop":["END"],"stop_token_ids":[],"max_tokens":32,"logprobs":2,"output_kind":1,"skip_clone":true,"output_text_buffer_length":2,"bad_words":[],"skip_reading_prefix_cache":false}"#
    );
}

#[test]
fn sampling_params_validation_uses_vllm_messages() {
    let mut sp: SamplingParams =
        serde_json::from_value(json!({"top_p": 0, "stop": "x", "logprobs": true})).expect("parse");
    assert_eq!(sp.stop, vec!["x".to_owned()]);
    assert_eq!(sp.logprobs, Some(1));
    let err = sp.normalize_and_validate().expect_err("top_p 0");
    assert_eq!(
        err.to_envelope(),
        json!({"error": {"message": "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)",
            "type": "BadRequestError", "param": "top_p", "code": 400}})
    );
}

/// The checks vLLM raises without `parameter=` carry no param and no suffix; floats print as
/// Python's repr (`-1e-05`, not `-0.00001`); values are vLLM 0.33.0's `_verify_args` text.
#[test]
fn sampling_params_untagged_checks_and_float_repr() {
    for (body, message) in [
        (
            json!({"presence_penalty": 3.0}),
            "presence_penalty must be in [-2, 2], got 3.0.",
        ),
        (
            json!({"repetition_penalty": -1e-5}),
            "repetition_penalty must be greater than zero, got -1e-05.",
        ),
        (
            json!({"min_p": 1e20}),
            "min_p must be in [0, 1], got 1e+20.",
        ),
        (
            json!({"n": 2, "temperature": 0.0}),
            "n must be 1 when using greedy sampling, got 2.",
        ),
        (
            json!({"n": 20000}),
            "n must be at most 16384, got 20000. To increase this limit, set the \
             VLLM_MAX_N_SEQUENCES environment variable.",
        ),
    ] {
        let mut sp: SamplingParams = serde_json::from_value(body).expect("parse");
        let err = sp.normalize_and_validate().expect_err(message);
        assert_eq!(
            err.to_envelope(),
            json!({"error": {"message": message, "type": "BadRequestError", "param": null,
                "code": 400}})
        );
    }
}
#[test]
fn error_envelopes() {
    let e = Error::PromptTooLong {
        prompt_len: 5000,
        max_model_len: 4096,
    };
    assert_eq!(e.status(), 400);
    assert_eq!(
        e.to_envelope()["error"]["message"],
        "Input length (5000) exceeds model's maximum context length (4096)."
    );
    let e = Error::ModelNotFound("nope".into());
    assert_eq!(e.to_envelope()["error"]["type"], "NotFoundError");
    assert_eq!(e.to_envelope()["error"]["param"], "model");
    assert_eq!(
        Error::validation("x", Some("body.messages")).error_type(),
        "Bad Request"
    );
}
