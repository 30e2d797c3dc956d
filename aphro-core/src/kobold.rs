//! The KoboldAI API's generate request (`/api/v1/generate`, `/api/extra/generate/stream`) as
//! a completion request over the same render → generate → derender path (`endpoints.md` §5,
//! from Aphrodite, the only server with it).
//!
//! Kobold's sampler names map onto the engine's (`rep_pen` → `repetition_penalty`,
//! `sampler_seed` → `seed`, `stop_sequence` → `stop`, `max_length` → `max_tokens`, `top_k: 0`
//! → off). A sampler the engine lacks (`top_a`, `tfs`, `typical`, `eps_cutoff`, `eta_cutoff`,
//! `smoothing_factor`, `xtc_probability`, `dynatemp_range`, `mirostat`, a partial
//! `rep_pen_range`) is a 400 naming it when set to anything but its neutral value, never
//! silently ignored. Unlike Aphrodite, `temperature: 0` is greedy (Aphrodite sends
//! `temperature or 1.0`, turning 0 into 1).
use crate::Error;
use serde::Deserialize;
use serde_json::{json, Map, Value};

fn one() -> f64 {
    1.0
}
fn one_i() -> i64 {
    1
}
fn xtc_threshold() -> f64 {
    0.1
}

/// `KAIGenerationInputSchema` (extra fields allowed: clients send UI settings such as
/// `sampler_order` or `frmttriminc`, which shape nothing the server does).
#[derive(Debug, Clone, Deserialize)]
pub struct KoboldGenerateRequest {
    pub prompt: String,
    pub max_context_length: i64,
    pub max_length: i64,
    #[serde(default)]
    pub genkey: Option<String>,
    #[serde(default = "one_i")]
    pub n: i64,
    #[serde(default = "one")]
    pub rep_pen: f64,
    #[serde(default)]
    pub rep_pen_range: Option<i64>,
    #[serde(default)]
    pub rep_pen_slope: Option<f64>,
    #[serde(default)]
    pub top_k: i64,
    #[serde(default)]
    pub top_a: f64,
    #[serde(default = "one")]
    pub top_p: f64,
    #[serde(default)]
    pub min_p: f64,
    #[serde(default = "one")]
    pub tfs: f64,
    #[serde(default)]
    pub eps_cutoff: f64,
    #[serde(default)]
    pub eta_cutoff: f64,
    #[serde(default = "one")]
    pub typical: f64,
    #[serde(default = "one")]
    pub temperature: f64,
    #[serde(default)]
    pub dynatemp_range: f64,
    #[serde(default = "one")]
    pub dynatemp_exponent: f64,
    #[serde(default)]
    pub smoothing_factor: f64,
    #[serde(default = "one")]
    pub smoothing_curve: f64,
    #[serde(default = "xtc_threshold")]
    pub xtc_threshold: f64,
    #[serde(default)]
    pub xtc_probability: f64,
    #[serde(default)]
    pub mirostat: Option<i64>,
    #[serde(default)]
    pub use_default_badwordsids: Option<bool>,
    #[serde(default)]
    pub quiet: Option<bool>,
    #[serde(default)]
    pub sampler_seed: Option<i64>,
    #[serde(default)]
    pub stop_sequence: Option<Vec<String>>,
    #[serde(default)]
    pub include_stop_str_in_output: bool,
}

/// The `{"genkey"}` body of `/api/extra/generate/check` and `/api/extra/abort`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenKey {
    #[serde(default)]
    pub genkey: Option<String>,
}

/// The `{"prompt"}` body of `/api/extra/tokencount`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenCountRequest {
    pub prompt: String,
}

fn refuse(param: &str, why: &str) -> Error {
    Error::for_param(
        format!("The Kobold sampler '{param}' is not supported by this server ({why})."),
        param,
    )
}

/// Parses and checks a Kobold generate body.
pub fn parse_generate(body: &Value) -> Result<KoboldGenerateRequest, Error> {
    let req: KoboldGenerateRequest = crate::validation::from_body(body)?;
    if req.max_length > req.max_context_length {
        return Err(Error::for_param(
            "max_length must not be larger than max_context_length",
            "max_length",
        ));
    }
    if req.max_length < 1 {
        return Err(Error::for_param(
            "max_length must be at least 1",
            "max_length",
        ));
    }
    let unsupported = [
        ("top_a", req.top_a != 0.0),
        ("tfs", req.tfs < 1.0),
        ("typical", req.typical < 1.0),
        ("eps_cutoff", req.eps_cutoff != 0.0),
        ("eta_cutoff", req.eta_cutoff != 0.0),
        ("smoothing_factor", req.smoothing_factor != 0.0),
        ("xtc_probability", req.xtc_probability != 0.0),
        ("dynatemp_range", req.dynatemp_range != 0.0),
        ("mirostat", req.mirostat.is_some_and(|m| m != 0)),
        (
            "use_default_badwordsids",
            req.use_default_badwordsids == Some(true),
        ),
    ];
    if let Some((name, _)) = unsupported.iter().find(|(_, set)| *set) {
        return Err(refuse(
            name,
            "set it to its neutral value to run without it",
        ));
    }
    Ok(req)
}

impl KoboldGenerateRequest {
    /// The prompt tokens the engine sees: `encode(prompt, add_special_tokens=False)`, cut to
    /// the last `max(1, max_context_length - max_length)` tokens, as Aphrodite does.
    pub fn prompt_window<'a>(&self, ids: &'a [u32]) -> &'a [u32] {
        let keep = (self.max_context_length - self.max_length).max(1) as usize;
        &ids[ids.len().saturating_sub(keep)..]
    }

    /// The `/v1/completions` body this request runs as, over the windowed prompt tokens.
    /// `rep_pen_range` is checked here, where the prompt length is known: the engine's
    /// penalty covers the whole sequence, which equals a range of 0 or one at least as long
    /// as the prompt plus the output; a shorter range would need a windowed penalty.
    pub fn to_completion_body(&self, prompt_ids: &[u32], stream: bool) -> Result<Value, Error> {
        let whole = prompt_ids.len() as i64 + self.max_length;
        if self.rep_pen != 1.0 && self.rep_pen_range.is_some_and(|r| r > 0 && r < whole) {
            return Err(refuse(
                "rep_pen_range",
                "the repetition penalty covers the whole context; send 0 or at least the \
                 prompt plus max_length tokens",
            ));
        }
        let greedy = self.temperature < 1e-5;
        let mut b = Map::new();
        b.insert("prompt".into(), json!(prompt_ids));
        b.insert("max_tokens".into(), self.max_length.into());
        b.insert("n".into(), (if greedy { 1 } else { self.n }).into());
        b.insert(
            "temperature".into(),
            json!(if greedy { 0.0 } else { self.temperature }),
        );
        b.insert("top_p".into(), json!(if greedy { 1.0 } else { self.top_p }));
        let top_k = if greedy || self.top_k <= 0 {
            -1
        } else {
            self.top_k
        };
        b.insert("top_k".into(), top_k.into());
        b.insert("min_p".into(), json!(self.min_p));
        b.insert("repetition_penalty".into(), json!(self.rep_pen));
        if let Some(seed) = self.sampler_seed {
            b.insert("seed".into(), seed.into());
        }
        if let Some(stop) = &self.stop_sequence {
            b.insert("stop".into(), json!(stop));
        }
        b.insert(
            "include_stop_str_in_output".into(),
            self.include_stop_str_in_output.into(),
        );
        if stream {
            b.insert("stream".into(), true.into());
        }
        Ok(Value::Object(b))
    }
}

/// The Kobold API version Aphrodite reports (`/api/v1/info/version`).
pub const KOBOLD_API_VERSION: &str = "1.2.4";
/// What `/api/extra/version` reports: the KoboldCpp feature level clients probe for.
pub const KOBOLDCPP_VERSION: &str = "1.63";

#[cfg(test)]
mod tests {
    use super::*;

    fn req(extra: Value) -> Result<KoboldGenerateRequest, Error> {
        let mut body = json!({"prompt": "p", "max_context_length": 10, "max_length": 4});
        body.as_object_mut()
            .expect("object")
            .extend(extra.as_object().cloned().unwrap_or_default());
        parse_generate(&body)
    }

    #[test]
    fn maps_kobold_samplers_and_keeps_temperature_zero_greedy() {
        let r = req(
            json!({"rep_pen": 1.1, "top_k": 0, "sampler_seed": 7, "temperature": 0,
                           "stop_sequence": ["\n"], "n": 3, "sampler_order": [6, 0, 1],
                           "rep_pen_range": 0}),
        )
        .expect("valid");
        let b = r.to_completion_body(&[1, 2], false).expect("body");
        assert_eq!(b["repetition_penalty"], 1.1);
        assert_eq!(b["top_k"], -1);
        assert_eq!(b["seed"], 7);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["n"], 1);
        assert_eq!(b["stop"], json!(["\n"]));
        assert_eq!(b["max_tokens"], 4);
        let b = req(json!({"temperature": 0.7, "top_k": 40}))
            .expect("valid")
            .to_completion_body(&[1], true)
            .expect("body");
        assert_eq!(
            (b["temperature"].clone(), b["top_k"].clone()),
            (json!(0.7), json!(40))
        );
        assert_eq!(b["stream"], true);
    }

    #[test]
    fn windows_the_prompt_to_the_context_left_for_generation() {
        let r = req(json!({})).expect("valid");
        assert_eq!(
            r.prompt_window(&[1, 2, 3, 4, 5, 6, 7, 8]),
            &[3, 4, 5, 6, 7, 8]
        );
        let r = req(json!({"max_length": 10})).expect("valid");
        assert_eq!(r.prompt_window(&[1, 2, 3]), &[3]);
    }

    #[test]
    fn refuses_what_it_cannot_honour_by_name() {
        for name in [
            "top_a",
            "tfs",
            "typical",
            "eps_cutoff",
            "smoothing_factor",
            "xtc_probability",
        ] {
            let v = if name == "tfs" || name == "typical" {
                0.9
            } else {
                0.2
            };
            let e = req(json!({name: v})).expect_err("refused");
            assert_eq!((e.status(), e.param()), (400, Some(name)));
        }
        // Neutral values, as KoboldAI Lite sends them, are accepted.
        assert!(req(json!({"top_a": 0, "tfs": 1, "typical": 1, "rep_pen_slope": 0.7})).is_ok());
        let e = req(json!({"max_length": 11})).expect_err("too long");
        assert_eq!(e.param(), Some("max_length"));
        let r = req(json!({"rep_pen": 1.2, "rep_pen_range": 3})).expect("parses");
        let e = r
            .to_completion_body(&[1, 2, 3], false)
            .expect_err("partial range");
        assert_eq!(e.param(), Some("rep_pen_range"));
        assert!(r.to_completion_body(&[], false).is_err());
        let r = req(json!({"rep_pen": 1.2, "rep_pen_range": 64})).expect("parses");
        assert!(r.to_completion_body(&[1, 2, 3], false).is_ok());
        let e = parse_generate(&json!({"prompt": "p"})).expect_err("missing fields");
        assert_eq!(e.status(), 400);
    }
}
