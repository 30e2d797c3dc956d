//! Chat content parts as vLLM parses them (`vllm/renderers/chat_utils/chat_message.py`,
//! `parse_chat_message_content_mm_part` / `parse_chat_message_content_part`): text-like parts
//! become text, `tool_reference` parts stay references, media parts are checked against what
//! the model accepts ([`ContentCapabilities`]) and anything else is a 400.
use crate::error::{Error, Result};
use crate::protocol::ContentPart;
use serde_json::Value;
use std::collections::BTreeSet;

/// The media kinds of vLLM's content parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Modality {
    Image,
    Audio,
    Video,
}

impl Modality {
    /// vLLM's modality name (`image`, `audio`, `video`).
    pub fn as_str(self) -> &'static str {
        match self {
            Modality::Image => "image",
            Modality::Audio => "audio",
            Modality::Video => "video",
        }
    }
}

/// What non-text content a renderer accepts: vLLM's multimodal config of the served model.
/// The default (no modalities) is a text-only model, which is all aphro serves today; a
/// multimodal renderer lists its modalities here and handles the [`Part::Media`] parts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContentCapabilities {
    /// Modalities the model takes. Empty: not a multimodal model.
    pub modalities: BTreeSet<Modality>,
    /// The name vLLM's errors use (`served_model_name or model`).
    pub model_name: String,
}

impl ContentCapabilities {
    /// A text-only model called `model_name`.
    pub fn text_only(model_name: impl Into<String>) -> Self {
        ContentCapabilities {
            modalities: BTreeSet::new(),
            model_name: model_name.into(),
        }
    }

    fn is_multimodal(&self) -> bool {
        !self.modalities.is_empty()
    }

    /// vLLM's refusal of one media item the model cannot take.
    fn check_media(&self, modality: Modality) -> Result<()> {
        if self.modalities.contains(&modality) {
            return Ok(());
        }
        if !self.is_multimodal() {
            // `MultiModalRegistry.create_processor` (a `ValueError`: 400, no param).
            return Err(Error::bad_request(format!(
                "{} is not a multimodal model",
                self.model_name
            )));
        }
        // `BaseProcessingInfo.validate_num_items` with a limit of 0.
        Err(Error::for_param(
            format!(
                "At most 0 {}(s) may be provided in one prompt.",
                modality.as_str()
            ),
            modality.as_str(),
        ))
    }

    /// `image_embeds` / `audio_embeds` / `video_embeds`: need `--enable-mm-embeds`, which
    /// aphro does not have.
    fn check_embeds(&self, part_type: &str) -> Result<()> {
        if !self.is_multimodal() {
            // `ModelConfig.get_multimodal_config` (a `ValueError`).
            return Err(Error::bad_request("The model is not multimodal."));
        }
        Err(Error::for_param(
            format!("You must set `--enable-mm-embeds` to input `{part_type}`"),
            part_type,
        ))
    }
}

/// One content part after vLLM's parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// `text`, `input_text`, `output_text`, `refusal` and `thinking` parts.
    Text(String),
    /// `tool_reference`: a deferred tool the template expands, by name.
    ToolReference(String),
    /// A media item the model accepts (only with a multimodal [`ContentCapabilities`]).
    Media(Modality),
}

/// The keys of `MM_PARSER_MAP`, plus `PART_TYPES_TO_SKIP_NONE_CONTENT`.
const PART_TYPES: [&str; 16] = [
    "text",
    "thinking",
    "input_text",
    "output_text",
    "input_image",
    "image_url",
    "image_embeds",
    "audio_embeds",
    "video_embeds",
    "prompt_embeds",
    "image_pil",
    "audio_url",
    "input_audio",
    "refusal",
    "video_url",
    "tool_reference",
];

fn unsupported(part_type: &str) -> Error {
    let mut supported = PART_TYPES.to_vec();
    supported.sort_unstable();
    Error::invalid_param(
        format!(
            "Unsupported chat content part type: {}. Supported types: {}.",
            crate::validation::py_repr(part_type),
            supported.join(", ")
        ),
        "type",
        part_type,
    )
}

fn field<'a>(p: &'a ContentPart, key: &str) -> Option<&'a Value> {
    p.extra.get(key).filter(|v| !v.is_null())
}

fn text_field(p: &ContentPart, key: &str) -> Option<String> {
    if key == "text" {
        return p.text.clone();
    }
    field(p, key).and_then(Value::as_str).map(str::to_owned)
}

/// A `prompt_embeds` part: refused, with vLLM's message for an empty or a present tensor.
fn prompt_embeds(data: Option<&Value>) -> Error {
    let empty = match data {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(_) => false,
    };
    if empty {
        Error::for_param(
            "prompt_embeds content part requires a non-empty `data` field with base64-encoded \
             tensor bytes.",
            "prompt_embeds",
        )
    } else {
        Error::for_param(
            "You must set `--enable-prompt-embeds` to input `prompt_embeds`",
            "prompt_embeds",
        )
    }
}

/// One part, as vLLM parses it: `Ok(None)` for a text part without text (skipped).
pub fn parse_part(p: &ContentPart, caps: &ContentCapabilities) -> Result<Option<Part>> {
    let has_uuid = field(p, "uuid").is_some();
    let media = |m: Modality| caps.check_media(m).map(|()| Some(Part::Media(m)));
    match p.kind.as_deref() {
        Some(kind) if !has_uuid && PART_TYPES.contains(&kind) => match kind {
            "text" | "input_text" | "output_text" => Ok(text_field(p, "text").map(Part::Text)),
            "thinking" => Ok(text_field(p, "thinking").map(Part::Text)),
            "refusal" => Ok(text_field(p, "refusal").map(Part::Text)),
            "tool_reference" => Ok(text_field(p, "name").map(Part::ToolReference)),
            "image_url" | "input_image" | "image_pil" => media(Modality::Image),
            "audio_url" | "input_audio" => media(Modality::Audio),
            "video_url" => media(Modality::Video),
            "prompt_embeds" => Err(prompt_embeds(field(p, "data"))),
            embeds => caps.check_embeds(embeds).map(|()| None),
        },
        // No `type` (or a `uuid`): the part is recognised by its payload key.
        None => typeless(p, caps),
        Some(_) if has_uuid => typeless(p, caps),
        Some(kind) => Err(unsupported(kind)),
    }
}

/// vLLM's "direct URL fields" branch for a part without `type` (or with a `uuid`).
fn typeless(p: &ContentPart, caps: &ContentCapabilities) -> Result<Option<Part>> {
    let has = |k: &str| p.extra.contains_key(k);
    let media = |m: Modality| caps.check_media(m).map(|()| Some(Part::Media(m)));
    if has("image_url") || has("image_pil") {
        media(Modality::Image)
    } else if has("image_embeds") {
        caps.check_embeds("image_embeds").map(|()| None)
    } else if has("audio_embeds") && p.kind.as_deref() != Some("video_embeds") {
        caps.check_embeds("audio_embeds").map(|()| None)
    } else if has("video_embeds") {
        caps.check_embeds("video_embeds").map(|()| None)
    } else if has("prompt_embeds") {
        Err(prompt_embeds(field(p, "data")))
    } else if has("audio_url") || has("input_audio") {
        media(Modality::Audio)
    } else if has("video_url") {
        media(Modality::Video)
    } else if has("tool_reference") {
        Ok(text_field(p, "name").map(Part::ToolReference))
    } else {
        Err(Error::for_param(
            "Missing 'type' field in multimodal part.",
            "type",
        ))
    }
}

/// Every part of a message's content list, in order; the first refused part is the error.
pub fn parse_parts(parts: &[ContentPart], caps: &ContentCapabilities) -> Result<Vec<Part>> {
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        if let Some(part) = parse_part(p, caps)? {
            out.push(part);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn part(v: Value) -> ContentPart {
        serde_json::from_value(v).expect("content part")
    }

    fn text_only() -> ContentCapabilities {
        ContentCapabilities::text_only("Qwen/Qwen3-0.6B")
    }

    #[test]
    fn unknown_part_type_is_refused_with_vllm_message() {
        let err = parse_part(&part(json!({"type": "foo", "text": "x"})), &text_only())
            .expect_err("unknown type");
        assert_eq!(err.status(), 400);
        assert_eq!(err.error_type(), "BadRequestError");
        assert_eq!(err.param(), Some("type"));
        assert_eq!(
            err.to_string(),
            "Unsupported chat content part type: 'foo'. Supported types: audio_embeds, \
             audio_url, image_embeds, image_pil, image_url, input_audio, input_image, \
             input_text, output_text, prompt_embeds, refusal, text, thinking, tool_reference, \
             video_embeds, video_url. (parameter=type, value=foo)"
        );
        let err = parse_part(&part(json!({"text": "x"})), &text_only()).expect_err("no type");
        assert_eq!(
            err.to_string(),
            "Missing 'type' field in multimodal part. (parameter=type)"
        );
        assert_eq!(err.param(), Some("type"));
    }

    #[test]
    fn media_parts_are_refused_on_a_text_only_model() {
        for p in [
            json!({"type": "image_url", "image_url": {"url": "http://x/y.png"}}),
            json!({"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}}),
            json!({"type": "audio_url", "audio_url": {"url": "http://x/a.wav"}}),
            json!({"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}),
            json!({"type": "input_image", "image_url": "http://x/y.png"}),
            json!({"image_url": "http://x/y.png"}),
        ] {
            let err = parse_part(&part(p.clone()), &text_only()).expect_err("media");
            assert_eq!(err.status(), 400, "{p}");
            assert_eq!(err.error_type(), "BadRequestError");
            assert_eq!(err.param(), None);
            assert_eq!(err.to_string(), "Qwen/Qwen3-0.6B is not a multimodal model");
        }
        for kind in ["image_embeds", "audio_embeds", "video_embeds"] {
            let err = parse_part(&part(json!({"type": kind, kind: "AAAA"})), &text_only())
                .expect_err("embeds");
            assert_eq!(err.to_string(), "The model is not multimodal.");
        }
        let err = parse_part(
            &part(json!({"type": "prompt_embeds", "data": "AAAA"})),
            &text_only(),
        )
        .expect_err("prompt embeds");
        assert_eq!(
            err.to_string(),
            "You must set `--enable-prompt-embeds` to input `prompt_embeds` \
             (parameter=prompt_embeds)"
        );
    }

    #[test]
    fn capabilities_decide_which_media_pass() {
        let caps = ContentCapabilities {
            modalities: [Modality::Image].into_iter().collect(),
            model_name: "vlm".into(),
        };
        let image = part(json!({"type": "image_url", "image_url": {"url": "u"}}));
        assert_eq!(
            parse_part(&image, &caps).expect("image accepted"),
            Some(Part::Media(Modality::Image))
        );
        let err = parse_part(
            &part(json!({"type": "video_url", "video_url": {"url": "u"}})),
            &caps,
        )
        .expect_err("video refused");
        assert_eq!(
            err.to_string(),
            "At most 0 video(s) may be provided in one prompt. (parameter=video)"
        );
        assert_eq!(err.param(), Some("video"));
    }

    #[test]
    fn text_like_parts_become_text() {
        let parts: Vec<ContentPart> = serde_json::from_value(json!([
            {"type": "text", "text": "a"},
            {"type": "refusal", "refusal": "b"},
            {"type": "thinking", "thinking": "c"},
            {"type": "input_text", "text": "d"},
            {"type": "text"},
            {"type": "tool_reference", "name": "search"}
        ]))
        .expect("parts");
        assert_eq!(
            parse_parts(&parts, &text_only()).expect("all text"),
            vec![
                Part::Text("a".into()),
                Part::Text("b".into()),
                Part::Text("c".into()),
                Part::Text("d".into()),
                Part::ToolReference("search".into()),
            ]
        );
    }
}
