//! Whisper's tokenizer side: the special token ids (read from `tokenizer.json`, the timestamp
//! ids following `<|notimestamps|>`), the language tokens, text encoding and decoding.

use std::path::Path;

use tokenizers::Tokenizer;

use super::SpeechError;

/// Whisper's languages in its token order (openai-whisper `tokenizer.LANGUAGES`), which is
/// also the order of the `<|xx|>` tokens after `<|startoftranscript|>`.
pub const WHISPER_LANGUAGES: [&str; 100] = [
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it",
    "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur",
    "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn",
    "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si",
    "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo",
    "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln",
    "ha", "ba", "jw", "su", "yue",
];

/// vLLM's `ISO639_1_SUPPORTED_LANGS` for Whisper (the languages OpenAI documents), in its
/// order: the list its "Unsupported language" message names. Other Whisper languages are
/// accepted with a warning, as vLLM does.
pub const VLLM_SUPPORTED_LANGUAGES: [&str; 57] = [
    "af", "ar", "hy", "az", "be", "bs", "bg", "ca", "zh", "hr", "cs", "da", "nl", "en", "et", "fi",
    "fr", "gl", "de", "el", "he", "hi", "hu", "is", "id", "it", "ja", "kn", "kk", "ko", "lv", "lt",
    "mk", "ms", "mr", "mi", "ne", "no", "fa", "pl", "pt", "ro", "ru", "sr", "sk", "sl", "es", "sw",
    "sv", "tl", "ta", "th", "tr", "uk", "ur", "vi", "cy",
];

/// vLLM's rejection of a language code outside Whisper's list.
pub fn unsupported_language(code: &str) -> SpeechError {
    let list = VLLM_SUPPORTED_LANGUAGES
        .iter()
        .map(|l| format!("'{l}'"))
        .collect::<Vec<_>>()
        .join(", ");
    SpeechError::UnsupportedLanguage {
        language: code.to_string(),
        supported: format!("[{list}]"),
    }
}

/// The special token ids of one checkpoint.
#[derive(Debug, Clone)]
pub struct SpecialTokens {
    pub eot: u32,
    pub sot: u32,
    pub translate: u32,
    pub transcribe: u32,
    pub sot_lm: u32,
    pub sot_prev: u32,
    /// `<|nospeech|>` (v3) or `<|nocaptions|>` (earlier checkpoints).
    pub no_speech: u32,
    pub no_timestamps: u32,
    /// `<|0.00|>`; each following id is 0.02 s later, up to the last id of the vocabulary.
    pub timestamp_begin: u32,
    pub n_vocab: u32,
    /// `(code, token id)` of each language token the checkpoint has.
    pub languages: Vec<(&'static str, u32)>,
}

impl SpecialTokens {
    pub fn timestamp_end(&self) -> u32 {
        self.n_vocab - 1
    }

    pub fn language_token(&self, code: &str) -> Option<u32> {
        self.languages
            .iter()
            .find(|(c, _)| *c == code)
            .map(|&(_, id)| id)
    }
}

/// The checkpoint's `tokenizer.json` and its special ids.
pub struct WhisperTokenizer {
    tokenizer: Tokenizer,
    pub special: SpecialTokens,
}

impl WhisperTokenizer {
    /// `n_vocab`: the model's output size (the timestamp ids fill it after
    /// `<|notimestamps|>`); `lang_ids`: the language token ids of a multilingual checkpoint.
    pub fn load(path: &Path, n_vocab: usize, multilingual: bool) -> Result<Self, SpeechError> {
        let tokenizer = Tokenizer::from_file(path)
            .map_err(|e| SpeechError::Tokenizer(format!("{}: {e}", path.display())))?;
        let id = |t: &str| {
            tokenizer
                .token_to_id(t)
                .ok_or_else(|| SpeechError::Tokenizer(format!("tokenizer.json lacks {t}")))
        };
        let no_timestamps = id("<|notimestamps|>")?;
        let special = SpecialTokens {
            eot: id("<|endoftext|>")?,
            sot: id("<|startoftranscript|>")?,
            translate: id("<|translate|>")?,
            transcribe: id("<|transcribe|>")?,
            sot_lm: id("<|startoflm|>")?,
            sot_prev: id("<|startofprev|>")?,
            no_speech: id("<|nospeech|>").or_else(|_| id("<|nocaptions|>"))?,
            no_timestamps,
            timestamp_begin: no_timestamps + 1,
            n_vocab: n_vocab as u32,
            languages: if multilingual {
                WHISPER_LANGUAGES
                    .iter()
                    .filter_map(|&c| tokenizer.token_to_id(&format!("<|{c}|>")).map(|i| (c, i)))
                    .filter(|&(_, i)| (i as usize) < n_vocab)
                    .collect()
            } else {
                Vec::new()
            },
        };
        if special.timestamp_begin as usize >= n_vocab {
            return Err(SpeechError::Tokenizer(format!(
                "the model's {n_vocab} outputs leave no room for timestamp tokens after id {no_timestamps}"
            )));
        }
        Ok(Self { tokenizer, special })
    }

    /// Token ids of `text`, without special tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, SpeechError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| SpeechError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of the ids below `<|endoftext|>` (faster-whisper's `Tokenizer.decode`).
    pub fn decode_text(&self, ids: &[u32]) -> Result<String, SpeechError> {
        let text: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&t| t < self.special.eot)
            .collect();
        self.tokenizer
            .decode(&text, false)
            .map_err(|e| SpeechError::Tokenizer(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_message_for_an_unknown_language() {
        let msg = unsupported_language("xx").to_string();
        assert!(
            msg.starts_with("Unsupported language: 'xx'.  Must be one of ['af', 'ar', 'hy',"),
            "{msg}"
        );
        assert!(msg.ends_with("'vi', 'cy']."), "{msg}");
        assert_eq!(unsupported_language("xx").status(), 400);
    }

    #[test]
    fn every_vllm_language_is_a_whisper_language() {
        for l in VLLM_SUPPORTED_LANGUAGES {
            assert!(WHISPER_LANGUAGES.contains(&l), "{l}");
        }
    }
}
