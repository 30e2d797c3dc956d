//! Request parameters aphro does not implement yet are refused with a 400 that names them,
//! never silently ignored: a client asking for JSON-constrained output must not receive
//! unconstrained text that merely looks like success. The render routes are exempt: like
//! vLLM's, they only carry these fields into `sampling_params` for whichever engine runs next.
use crate::error::ApiError;
use serde_json::Value;

fn is_set(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

fn refuse(param: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{what} is not supported by this server yet. (parameter={param})"
    ))
    .with_param(param)
}

/// Checks an OpenAI chat/completions body (and render bodies).
pub fn check_openai(body: &Value) -> Result<(), ApiError> {
    for key in [
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
    ] {
        if is_set(body.get(key)) {
            return Err(refuse(key, "Structured output (guided decoding)"));
        }
    }
    if let Some(kind) = body
        .pointer("/response_format/type")
        .and_then(Value::as_str)
    {
        if kind != "text" {
            return Err(refuse(
                "response_format",
                &format!("response_format type '{kind}'"),
            ));
        }
    }
    for key in [
        "logprob_token_ids",
        "prompt_logprob_token_ids",
        "prompt_embeds",
        "thinking_token_budget",
        "repetition_detection",
    ] {
        if is_set(body.get(key)) {
            return Err(refuse(key, key));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refuses_by_name_and_accepts_defaults() {
        assert!(check_openai(
            &json!({"messages": [], "response_format": {"type": "text"}, "logprob_token_ids": null})
        )
        .is_ok());
        let e = check_openai(&json!({"response_format": {"type": "json_schema"}}))
            .expect_err("must be refused");
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some("response_format"))
        );
        let e = check_openai(&json!({"structured_outputs": {"json": {}}}))
            .expect_err("must be refused");
        assert_eq!(e.param.as_deref(), Some("structured_outputs"));
        assert_eq!(e.kind, "BadRequestError");
    }
}
