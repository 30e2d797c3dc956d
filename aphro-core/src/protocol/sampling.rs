//! `SamplingParams` (`api.md` §2.3): vLLM's post-init normalization, range validation with vLLM's
//! messages, and msgspec's "omit defaults" dump.
use crate::error::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// `output_kind` values.
pub const OUTPUT_KIND_CUMULATIVE: u8 = 0;
pub const OUTPUT_KIND_DELTA: u8 = 1;
pub const OUTPUT_KIND_FINAL_ONLY: u8 = 2;

/// Sampling parameters after vLLM's `__post_init__`. Keys starting with `_` and unknown keys
/// are ignored on input. Every key is optional; the render routes write the keys vLLM's
/// msgspec dump writes (defaults omitted, see [`SamplingParams::to_json`]).
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(default)]
pub struct SamplingParams {
    pub n: i64,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
    pub repetition_penalty: f64,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: i64,
    pub min_p: f64,
    pub seed: Option<i64>,
    #[serde(deserialize_with = "de_stop")]
    #[schema(value_type = Option<super::StopSpec>)]
    pub stop: Vec<String>,
    #[serde(deserialize_with = "de_null_vec")]
    #[schema(value_type = Option<Vec<i64>>)]
    pub stop_token_ids: Vec<i64>,
    pub ignore_eos: bool,
    /// `None` = the key was absent: a generate server recomputes it (§10).
    #[schema(schema_with = super::schema::max_tokens)]
    pub max_tokens: Option<i64>,
    pub min_tokens: i64,
    #[serde(deserialize_with = "de_logprobs")]
    #[schema(schema_with = super::schema::int_or_bool)]
    pub logprobs: Option<i64>,
    #[serde(deserialize_with = "de_logprobs")]
    #[schema(schema_with = super::schema::int_or_bool)]
    pub prompt_logprobs: Option<i64>,
    pub logprob_token_ids: Option<Vec<i64>>,
    pub prompt_logprob_token_ids: Option<Vec<Vec<i64>>>,
    pub prompt_logprob_start: Option<i64>,
    pub flat_logprobs: bool,
    pub detokenize: bool,
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
    pub include_stop_str_in_output: bool,
    pub output_kind: u8,
    pub skip_clone: bool,
    pub output_text_buffer_length: i64,
    pub stream_interval: Option<i64>,
    #[schema(value_type = Option<Object>)]
    pub structured_outputs: Option<Value>,
    #[schema(value_type = Option<HashMap<String, f64>>)]
    pub logit_bias: Option<Map<String, Value>>,
    pub allowed_token_ids: Option<Vec<i64>>,
    pub extra_args: Option<Map<String, Value>>,
    #[serde(deserialize_with = "de_null_vec")]
    #[schema(value_type = Option<Vec<String>>)]
    pub bad_words: Vec<String>,
    pub skip_reading_prefix_cache: Option<bool>,
    pub thinking_token_budget: Option<i64>,
    #[schema(value_type = Option<Object>)]
    pub repetition_detection: Option<Value>,
    pub watermarking: Option<bool>,
    pub routed_experts_prompt_start: i64,
    pub trace_decode_token_ids: Option<Vec<i64>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            max_tokens: Some(16),
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            logprob_token_ids: None,
            prompt_logprob_token_ids: None,
            prompt_logprob_start: None,
            flat_logprobs: false,
            detokenize: true,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            include_stop_str_in_output: false,
            output_kind: OUTPUT_KIND_CUMULATIVE,
            skip_clone: false,
            output_text_buffer_length: 0,
            stream_interval: None,
            structured_outputs: None,
            logit_bias: None,
            allowed_token_ids: None,
            extra_args: None,
            bad_words: Vec::new(),
            skip_reading_prefix_cache: None,
            thinking_token_budget: None,
            repetition_detection: None,
            watermarking: None,
            routed_experts_prompt_start: 0,
            trace_decode_token_ids: None,
        }
    }
}

fn de_stop<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<String>, D::Error> {
    Ok(match Option::<super::StopSpec>::deserialize(d)? {
        None => Vec::new(),
        Some(s) => s.into_vec(),
    })
}

fn de_null_vec<'de, D, T>(d: D) -> std::result::Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// `logprobs: true` is coerced to 1 (pydantic/msgspec bool→int).
fn de_logprobs<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum IntOrBool {
        I(i64),
        B(bool),
    }
    Ok(match Option::<IntOrBool>::deserialize(d)? {
        None => None,
        Some(IntOrBool::I(i)) => Some(i),
        Some(IntOrBool::B(b)) => Some(i64::from(b)),
    })
}

/// Python's `repr(float)` for the values vLLM echoes in messages (`0.0`, `2.5`, `1e-05`).
use aphro_parsers::pyjson::float_repr as py_float;

/// vLLM's `_SAMPLING_EPS`: a temperature below this is greedy sampling.
pub const SAMPLING_EPS: f64 = 1e-5;

/// `VLLM_MAX_N_SEQUENCES`' default: the most sequences one request may ask for.
pub const MAX_N_SEQUENCES: i64 = 16384;

/// The numeric fields vLLM's `SamplingParams._verify_args` range-checks. Both the wire
/// [`SamplingParams`] and the engine's own sampling config are checked through this, so a
/// request gets the same message whichever door it came in by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingArgs {
    pub n: i64,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
    pub repetition_penalty: f64,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: i64,
    pub min_p: f64,
    pub max_tokens: Option<i64>,
    pub min_tokens: i64,
    pub stream_interval: Option<i64>,
    pub logprobs: Option<i64>,
    pub prompt_logprobs: Option<i64>,
}

/// A failed sampling check: vLLM's message, and the `parameter`/`value` its
/// `VLLMValidationError` carries (only where vLLM sets them).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingArgError {
    pub message: String,
    pub param: Option<&'static str>,
    pub value: Option<String>,
}

impl SamplingArgError {
    fn plain(message: String) -> Self {
        SamplingArgError {
            message,
            param: None,
            value: None,
        }
    }

    fn tagged(message: String, param: &'static str, value: impl std::fmt::Display) -> Self {
        SamplingArgError {
            message,
            param: Some(param),
            value: Some(value.to_string()),
        }
    }

    /// The HTTP-facing error: `str(VLLMValidationError)` (the message with its
    /// `(parameter=…, value=…)` suffix) and the parameter as the envelope's `param`.
    pub fn into_error(self) -> Error {
        match (self.param, self.value) {
            (Some(p), Some(v)) => Error::invalid_param(self.message, p, v),
            _ => Error::bad_request(self.message),
        }
    }
}

/// vLLM's `SamplingParams._verify_args` range checks, in its order and with its messages
/// (floats printed as Python's `repr`).
pub fn verify_sampling_args(a: &SamplingArgs) -> std::result::Result<(), SamplingArgError> {
    use SamplingArgError as E;
    if a.n < 1 {
        return Err(E::plain(format!("n must be at least 1, got {}.", a.n)));
    }
    if a.n > MAX_N_SEQUENCES {
        return Err(E::plain(format!(
            "n must be at most {MAX_N_SEQUENCES}, got {}. To increase this limit, set the \
             VLLM_MAX_N_SEQUENCES environment variable.",
            a.n
        )));
    }
    // NaN fails every `contains`, as it fails Python's chained comparisons.
    for (name, v) in [
        ("presence_penalty", a.presence_penalty),
        ("frequency_penalty", a.frequency_penalty),
    ] {
        if !(-2.0..=2.0).contains(&v) {
            return Err(E::plain(format!(
                "{name} must be in [-2, 2], got {}.",
                py_float(v)
            )));
        }
    }
    if !a.repetition_penalty.is_finite() {
        return Err(E::plain(format!(
            "repetition_penalty must be a finite number, got {}.",
            py_float(a.repetition_penalty)
        )));
    }
    if a.repetition_penalty <= 0.0 {
        return Err(E::plain(format!(
            "repetition_penalty must be greater than zero, got {}.",
            py_float(a.repetition_penalty)
        )));
    }
    let t = py_float(a.temperature);
    if !a.temperature.is_finite() {
        let m = format!("temperature must be a finite number, got {t}.");
        return Err(E::tagged(m, "temperature", t));
    }
    if a.temperature < 0.0 {
        let m = format!("temperature must be non-negative, got {t}.");
        return Err(E::tagged(m, "temperature", t));
    }
    if a.temperature > 2.0 {
        let m = format!("temperature must be in [0, 2], got {t}.");
        return Err(E::tagged(m, "temperature", t));
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        let v = py_float(a.top_p);
        return Err(E::tagged(
            format!("top_p must be in (0, 1], got {v}."),
            "top_p",
            v,
        ));
    }
    if a.top_k < -1 {
        return Err(E::plain(format!(
            "top_k must be 0 (disable), or at least 1, got {}.",
            a.top_k
        )));
    }
    if !(0.0..=1.0).contains(&a.min_p) {
        return Err(E::plain(format!(
            "min_p must be in [0, 1], got {}.",
            py_float(a.min_p)
        )));
    }
    if let Some(m) = a.max_tokens {
        if m < 1 {
            return Err(E::tagged(
                format!("max_tokens must be at least 1, got {m}."),
                "max_tokens",
                m,
            ));
        }
    }
    if a.min_tokens < 0 {
        return Err(E::plain(format!(
            "min_tokens must be greater than or equal to 0, got {}.",
            a.min_tokens
        )));
    }
    if let Some(m) = a.max_tokens {
        if a.min_tokens > m {
            return Err(E::plain(format!(
                "min_tokens must be less than or equal to max_tokens={m}, got {}.",
                a.min_tokens
            )));
        }
    }
    if let Some(si) = a.stream_interval {
        if si < 1 {
            return Err(E::tagged(
                format!("stream_interval must be at least 1, got {si}."),
                "stream_interval",
                si,
            ));
        }
    }
    for (name, lp) in [
        ("logprobs", a.logprobs),
        ("prompt_logprobs", a.prompt_logprobs),
    ] {
        if let Some(v) = lp {
            if v < -1 {
                return Err(E::tagged(
                    format!("{name} must be non-negative or -1, got {v}."),
                    name,
                    v,
                ));
            }
        }
    }
    Ok(())
}

/// vLLM's `_verify_greedy_sampling`, which `__post_init__` runs after `_verify_args`.
pub fn verify_greedy(n: i64, temperature: f64) -> std::result::Result<(), SamplingArgError> {
    if temperature < SAMPLING_EPS && n > 1 {
        return Err(SamplingArgError::plain(format!(
            "n must be 1 when using greedy sampling, got {n}."
        )));
    }
    Ok(())
}

impl SamplingParams {
    /// vLLM's `SamplingParams.__post_init__` + `_verify_args`: normalize, then validate with
    /// vLLM's messages (semantic 400s).
    pub fn normalize_and_validate(&mut self) -> Result<()> {
        if self.seed == Some(-1) {
            self.seed = None;
        }
        if self.temperature > 0.0 && self.temperature < 0.01 {
            self.temperature = 0.01;
        }
        // Dedupe stop_token_ids keeping order.
        let mut seen = std::collections::HashSet::new();
        self.stop_token_ids.retain(|id| seen.insert(*id));
        if !self.stop.is_empty() && !self.include_stop_str_in_output {
            let longest = self
                .stop
                .iter()
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0);
            self.output_text_buffer_length = longest.saturating_sub(1) as i64;
        }
        if self.skip_reading_prefix_cache.is_none() {
            self.skip_reading_prefix_cache = Some(self.prompt_logprobs.is_some());
        }
        if let Some(bias) = self.logit_bias.as_mut() {
            for (k, v) in bias.iter_mut() {
                if k.parse::<i64>().is_err() {
                    return Err(Error::invalid_param(
                        format!("logit_bias keys must be integer token ids, got {k:?}."),
                        "logit_bias",
                        k,
                    ));
                }
                if let Some(f) = v.as_f64() {
                    *v = Value::from(f.clamp(-100.0, 100.0));
                }
            }
        }
        self.verify()?;
        if self.temperature < 1e-5 {
            // Greedy sampling.
            self.top_p = 1.0;
            self.top_k = 0;
            self.min_p = 0.0;
        }
        if self.top_k == -1 {
            self.top_k = 0;
        }
        Ok(())
    }

    fn verify(&self) -> Result<()> {
        verify_sampling_args(&SamplingArgs {
            n: self.n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            max_tokens: self.max_tokens,
            min_tokens: self.min_tokens,
            stream_interval: self.stream_interval,
            logprobs: self.logprobs,
            prompt_logprobs: self.prompt_logprobs,
        })
        .map_err(SamplingArgError::into_error)?;
        if let Some(ids) = &self.logprob_token_ids {
            if ids.len() > 128 {
                return Err(Error::invalid_param(
                    format!(
                        "logprob_token_ids must have at most 128 ids, got {}.",
                        ids.len()
                    ),
                    "logprob_token_ids",
                    ids.len(),
                ));
            }
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(Error::invalid_param(
                "stop cannot contain an empty string.",
                "stop",
                "''",
            ));
        }
        if !self.stop.is_empty() && !self.detokenize {
            return Err(Error::invalid_param(
                "stop strings are only supported when detokenize is True. Set detokenize=True to use stop.",
                "stop",
                format!("{:?}", self.stop),
            ));
        }
        if self.bad_words.iter().any(String::is_empty) {
            return Err(Error::invalid_param(
                "bad_words cannot contain an empty string.",
                "bad_words",
                "''",
            ));
        }
        verify_greedy(self.n, self.temperature).map_err(SamplingArgError::into_error)?;
        if let Some(obj) = self.structured_outputs.as_ref().and_then(Value::as_object) {
            check_structured_outputs_params(obj)?;
        }
        Ok(())
    }

    /// msgspec's `omit_defaults` dump as vLLM's render produces it. msgspec omits a field only
    /// when the value *is* the default object (identity) or an empty default collection; the
    /// float fields vLLM fills from its defaults dict are fresh objects and therefore always
    /// present, as are the lists `__post_init__` creates.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_owned(), v);
        };
        if self.n != 1 {
            put("n", self.n.into());
        }
        put("presence_penalty", self.presence_penalty.into());
        put("frequency_penalty", self.frequency_penalty.into());
        put("repetition_penalty", self.repetition_penalty.into());
        put("temperature", self.temperature.into());
        put("top_p", self.top_p.into());
        if self.top_k != 0 {
            put("top_k", self.top_k.into());
        }
        put("min_p", self.min_p.into());
        if let Some(s) = self.seed {
            put("seed", s.into());
        }
        put("stop", self.stop.clone().into());
        put("stop_token_ids", self.stop_token_ids.clone().into());
        if self.ignore_eos {
            put("ignore_eos", true.into());
        }
        if let Some(mt) = self.max_tokens {
            put("max_tokens", mt.into());
        }
        if self.min_tokens != 0 {
            put("min_tokens", self.min_tokens.into());
        }
        if let Some(v) = self.logprobs {
            put("logprobs", v.into());
        }
        if let Some(v) = self.prompt_logprobs {
            put("prompt_logprobs", v.into());
        }
        if let Some(v) = &self.logprob_token_ids {
            put("logprob_token_ids", v.clone().into());
        }
        if let Some(v) = &self.prompt_logprob_token_ids {
            put("prompt_logprob_token_ids", serde_json::json!(v));
        }
        if let Some(v) = self.prompt_logprob_start {
            put("prompt_logprob_start", v.into());
        }
        if self.flat_logprobs {
            put("flat_logprobs", true.into());
        }
        if !self.detokenize {
            put("detokenize", false.into());
        }
        if !self.skip_special_tokens {
            put("skip_special_tokens", false.into());
        }
        if !self.spaces_between_special_tokens {
            put("spaces_between_special_tokens", false.into());
        }
        if self.include_stop_str_in_output {
            put("include_stop_str_in_output", true.into());
        }
        if self.output_kind != OUTPUT_KIND_CUMULATIVE {
            put("output_kind", self.output_kind.into());
        }
        if self.skip_clone {
            put("skip_clone", true.into());
        }
        if self.output_text_buffer_length != 0 {
            put(
                "output_text_buffer_length",
                self.output_text_buffer_length.into(),
            );
        }
        if let Some(v) = self.stream_interval {
            put("stream_interval", v.into());
        }
        if let Some(v) = &self.structured_outputs {
            put("structured_outputs", v.clone());
        }
        if let Some(v) = &self.logit_bias {
            put("logit_bias", Value::Object(v.clone()));
        }
        if let Some(v) = &self.allowed_token_ids {
            put("allowed_token_ids", v.clone().into());
        }
        if let Some(v) = &self.extra_args {
            put("extra_args", Value::Object(v.clone()));
        }
        put("bad_words", self.bad_words.clone().into());
        if let Some(v) = self.skip_reading_prefix_cache {
            put("skip_reading_prefix_cache", v.into());
        }
        if let Some(v) = self.thinking_token_budget {
            put("thinking_token_budget", v.into());
        }
        if let Some(v) = &self.repetition_detection {
            put("repetition_detection", v.clone());
        }
        if let Some(v) = self.watermarking {
            put("watermarking", v.into());
        }
        if self.routed_experts_prompt_start != 0 {
            put(
                "routed_experts_prompt_start",
                self.routed_experts_prompt_start.into(),
            );
        }
        if let Some(v) = &self.trace_decode_token_ids {
            put("trace_decode_token_ids", v.clone().into());
        }
        Value::Object(m)
    }
}

impl Serialize for SamplingParams {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

/// `StructuredOutputsParams.__post_init__` (sampling_params.py): exactly one constraint kind.
/// Its message shows the dataclass's `__dict__` (every field, in declaration order, with the
/// defaults pydantic fills in, including the two `init=False` backend fields).
fn check_structured_outputs_params(obj: &Map<String, Value>) -> Result<()> {
    const KINDS: [&str; 6] = [
        "json",
        "regex",
        "choice",
        "grammar",
        "json_object",
        "structural_tag",
    ];
    let count = KINDS
        .iter()
        .filter(|k| obj.get(**k).is_some_and(|v| !v.is_null()))
        .count();
    if count == 1 {
        return Ok(());
    }
    let fields: [(&str, Value); 11] = [
        ("json", Value::Null),
        ("regex", Value::Null),
        ("choice", Value::Null),
        ("grammar", Value::Null),
        ("json_object", Value::Null),
        ("disable_any_whitespace", Value::Bool(false)),
        ("disable_additional_properties", Value::Bool(false)),
        ("whitespace_pattern", Value::Null),
        ("structural_tag", Value::Null),
        ("_backend", Value::Null),
        ("_backend_was_auto", Value::Bool(false)),
    ];
    let dict: Map<String, Value> = fields
        .into_iter()
        .map(|(k, default)| {
            let v = match k {
                "_backend" | "_backend_was_auto" => default,
                _ => obj.get(k).cloned().unwrap_or(default),
            };
            (k.to_owned(), v)
        })
        .collect();
    let dict = crate::template::json::py_str_json(&Value::Object(dict));
    Err(Error::bad_request(if count > 1 {
        format!(
            "You can only use one kind of structured outputs constraint but multiple are \
             specified: {dict}"
        )
    } else {
        format!(
            "You must use one kind of structured outputs constraint but none are specified: \
             {dict}"
        )
    }))
}
