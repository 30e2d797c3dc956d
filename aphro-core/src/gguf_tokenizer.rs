//! Builds an HF `tokenizers` tokenizer from GGUF metadata (`tokenizer.ggml.*`), the way
//! llama.cpp interprets it: GPT-2 byte-level BPE with llama.cpp's named pre-tokenizers, or
//! SentencePiece-style BPE with byte fallback (`llama` vocab).
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

// llama.cpp token types.
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;
const TOKEN_TYPE_BYTE: i64 = 6;

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split_then_byte_level(regex: &str) -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
        byte_level(false),
    ]})
}

/// The pre-tokenizer of a llama.cpp `tokenizer.ggml.pre` name.
fn gpt2_pre_tokenizer(pre: &str) -> Result<Value> {
    Ok(match pre {
        "default" | "gpt2" | "gpt-2" | "olmo" | "jais" | "poro-chat" | "viking" => byte_level(true),
        "smollm" | "starcoder" | "refact" | "codeshell" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true),
        ]}),
        "llama-bpe" | "llama3" | "llama-v3" | "dbrx" | "smaug-bpe" | "falcon3" | "pixtral" | "exaone" => {
            split_then_byte_level(LLAMA3_REGEX)
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "hunyuan" => split_then_byte_level(QWEN2_REGEX),
        other => {
            return Err(Error::ModelFiles(format!(
                "GGUF tokenizer pre-type `{other}` is not supported (supported: default/gpt2, smollm/starcoder, \
                 llama-bpe, qwen2); put a tokenizer.json next to the model instead"
            )))
        }
    })
}

fn opt_id(g: &GgufFile, key: &str) -> Option<u32> {
    g.get(key)
        .and_then(|v| v.as_i64())
        .and_then(|v| u32::try_from(v).ok())
}

/// Special token ids and flags read from GGUF metadata.
#[derive(Debug, Clone, Default)]
pub struct GgufSpecials {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
}

/// Reads the tokenizer of a GGUF file.
pub fn tokenizer_from_gguf(g: &GgufFile) -> Result<(Tokenizer, GgufSpecials)> {
    let model = g.get_str("tokenizer.ggml.model")?;
    let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
    let types: Vec<i64> = match g
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array())
    {
        Some(a) => a.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
        None => vec![1; tokens.len()],
    };
    let specials = GgufSpecials {
        bos: opt_id(g, "tokenizer.ggml.bos_token_id"),
        eos: opt_id(g, "tokenizer.ggml.eos_token_id"),
        unk: opt_id(g, "tokenizer.ggml.unknown_token_id"),
        pad: opt_id(g, "tokenizer.ggml.padding_token_id"),
        add_bos: g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.as_bool())
            .unwrap_or(model == "llama"),
        add_eos: g
            .get("tokenizer.ggml.add_eos_token")
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
    };
    let mut vocab = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert((*t).to_owned(), json!(i));
    }
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types.get(i).copied().unwrap_or(1);
        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
            added.push(json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": ty == TOKEN_TYPE_USER_DEFINED && model == "llama", "special": ty == TOKEN_TYPE_CONTROL}));
        }
    }
    let token_str = |id: Option<u32>| {
        id.and_then(|i| tokens.get(i as usize))
            .map(|s| (*s).to_owned())
    };
    let post_processor = {
        let mut single = Vec::new();
        let mut special_tokens = Map::new();
        let mut add = |flag: bool, id: Option<u32>, seq: &mut Vec<Value>| {
            if let (true, Some(id), Some(s)) = (flag, id, token_str(id)) {
                seq.push(json!({"SpecialToken": {"id": s, "type_id": 0}}));
                special_tokens.insert(s.clone(), json!({"id": s, "ids": [id], "tokens": [s]}));
            }
        };
        add(specials.add_bos, specials.bos, &mut single);
        single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        add(specials.add_eos, specials.eos, &mut single);
        let mut pair = single.clone();
        pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special_tokens})
    };
    let tok_json = match model {
        "gpt2" => {
            let merges: Vec<Value> = g
                .get_str_array("tokenizer.ggml.merges")?
                .into_iter()
                .map(|m| Value::from(m.to_owned()))
                .collect();
            let pre = g
                .get("tokenizer.ggml.pre")
                .and_then(|v| v.as_str())
                .unwrap_or("default");
            json!({
                "version": "1.0", "truncation": null, "padding": null,
                "added_tokens": added,
                "normalizer": null,
                "pre_tokenizer": gpt2_pre_tokenizer(pre)?,
                "post_processor": post_processor,
                "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
                "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                    "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                    "vocab": vocab, "merges": merges}
            })
        }
        "llama" => {
            let scores: Vec<f64> = match g.get("tokenizer.ggml.scores").and_then(|v| v.as_array()) {
                Some(a) => a.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect(),
                None => vec![0.0; tokens.len()],
            };
            let merges = spm_merges(&tokens, &types, &scores);
            // SentencePiece's dummy prefix ("▁" before the text); Gemma turns it off.
            let add_space_prefix = g
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(|v| v.as_bool())
                .unwrap_or(true);
            let mut normalizers = Vec::new();
            if add_space_prefix {
                normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
            }
            normalizers
                .push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if add_space_prefix {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            json!({
                "version": "1.0", "truncation": null, "padding": null,
                "added_tokens": added,
                "normalizer": {"type": "Sequence", "normalizers": normalizers},
                "pre_tokenizer": null,
                "post_processor": post_processor,
                "decoder": {"type": "Sequence", "decoders": decoders},
                "model": {"type": "BPE", "dropout": null, "unk_token": token_str(specials.unk),
                    "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
                    "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges}
            })
        }
        other => {
            return Err(Error::ModelFiles(format!(
                "GGUF tokenizer model `{other}` is not supported (supported: gpt2, llama)"
            )))
        }
    };
    let text = serde_json::to_string(&tok_json).map_err(|e| Error::json("GGUF tokenizer", e))?;
    Ok((Tokenizer::from_json_str(&text)?, specials))
}

/// SentencePiece scores → BPE merges, as HF's `SentencePieceExtractor` does: every split of a
/// vocab piece into two vocab pieces is a merge, ranked by the merged piece's score.
fn spm_merges(tokens: &[&str], types: &[i64], scores: &[f64]) -> Vec<Value> {
    let index: std::collections::HashMap<&str, usize> =
        tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut merges: Vec<(f64, usize, usize, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        let ty = types.get(id).copied().unwrap_or(1);
        if ty == TOKEN_TYPE_BYTE || ty == TOKEN_TYPE_CONTROL {
            continue;
        }
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                merges.push((scores.get(id).copied().unwrap_or(0.0), id, li, ri));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges
        .into_iter()
        // Pairs, not "left right" strings: SentencePiece pieces may contain spaces.
        .map(|(_, _, l, r)| json!([tokens[l], tokens[r]]))
        .collect()
}
