//! `/inference/v1/generate`'s checks of a request's `features` (`multimodal.md` §3.2, §3.7):
//! vLLM's pydantic validators of `MultiModalFeatures` and `GenerateRequest`, with their exact
//! messages and `param` paths (structural 400, `type: "Bad Request"`).
use crate::error::{Error, Result};
use serde_json::{Map, Value};

fn pydantic(loc: &str, kind: &str, msg: &str, input: &str, ctx: &str) -> Error {
    Error::validation(
        format!(
            "1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': '{msg}', \
             'input': '{input}', 'ctx': {ctx}}}"
        ),
        Some(loc),
    )
}

fn value_error(loc: &str, msg: &str, input: &Map<String, Value>) -> Error {
    pydantic(
        loc,
        "value_error",
        &format!("Value error, {msg}"),
        &format!("<dict of {} items>", input.len()),
        &format!("{{'error': ValueError('{msg}')}}"),
    )
}

/// A `{modality: [...]}` map; a missing or null one is `None`.
fn per_modality<'a>(features: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    features.get(key).and_then(Value::as_object)
}

fn len_of(v: &Value) -> usize {
    v.as_array().map_or(0, Vec::len)
}

/// Checks `features` of a generate body (`body` is the whole JSON object). Hash-only, full
/// `kwargs_data`, and metadata with a non-empty `ec_transfer_params` pass; a metadata-only
/// item without `ec_transfer_params` does not.
pub fn validate_generate_features(body: &Map<String, Value>) -> Result<()> {
    let Some(features) = body.get("features").and_then(Value::as_object) else {
        return Ok(());
    };
    let empty = Map::new();
    let hashes = per_modality(features, "mm_hashes").unwrap_or(&empty);
    let places = per_modality(features, "mm_placeholders").unwrap_or(&empty);
    // Field constraints of PlaceholderRangeInfo first (pydantic checks fields before models).
    for (m, list) in places {
        for (i, p) in list.as_array().into_iter().flatten().enumerate() {
            let offset = p.get("offset").and_then(Value::as_i64).unwrap_or(0);
            if offset < 0 {
                return Err(pydantic(
                    &format!("body.features.mm_placeholders.{m}.{i}.offset"),
                    "greater_than_equal",
                    "Input should be greater than or equal to 0",
                    &offset.to_string(),
                    "{'ge': 0}",
                ));
            }
            let length = p.get("length").and_then(Value::as_i64).unwrap_or(0);
            if length <= 0 {
                return Err(pydantic(
                    &format!("body.features.mm_placeholders.{m}.{i}.length"),
                    "greater_than",
                    "Input should be greater than 0",
                    &length.to_string(),
                    "{'gt': 0}",
                ));
            }
        }
    }
    let loc = "body.features";
    let same_keys = |a: &Map<String, Value>, b: &Map<String, Value>| {
        a.len() == b.len() && a.keys().all(|k| b.contains_key(k))
    };
    if !same_keys(hashes, places) {
        return Err(value_error(
            loc,
            "mm_hashes and mm_placeholders must use the same modalities",
            features,
        ));
    }
    for (m, h) in hashes {
        if len_of(h) != len_of(&places[m]) {
            return Err(value_error(
                loc,
                &format!("{m} mm_hashes and mm_placeholders must have the same length"),
                features,
            ));
        }
    }
    for key in ["kwargs_data", "mm_metadata"] {
        let Some(blobs) = per_modality(features, key) else {
            continue;
        };
        if !same_keys(blobs, hashes) {
            return Err(value_error(
                loc,
                &format!("{key} must use the same modalities as mm_hashes"),
                features,
            ));
        }
        for (m, list) in blobs {
            if len_of(list) != len_of(&hashes[m]) {
                return Err(value_error(
                    loc,
                    &format!("{m} {key} and mm_hashes must have the same length"),
                    features,
                ));
            }
        }
    }
    let mut runs: Vec<(i64, i64)> = places
        .values()
        .flat_map(|l| l.as_array().into_iter().flatten())
        .map(|p| {
            let o = p.get("offset").and_then(Value::as_i64).unwrap_or(0);
            (o, o + p.get("length").and_then(Value::as_i64).unwrap_or(0))
        })
        .collect();
    // Sorted within each modality, and no two runs (of any modality) overlap.
    let sorted_each = places.values().all(|l| {
        let offs: Vec<i64> = l
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p.get("offset").and_then(Value::as_i64).unwrap_or(0))
            .collect();
        offs.windows(2).all(|w| w[0] <= w[1])
    });
    runs.sort_unstable();
    if !sorted_each || runs.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(value_error(
            loc,
            "mm_placeholders must be globally non-overlapping and sorted",
            features,
        ));
    }
    let has_content_parts = body.get("content_parts").is_some_and(|v| !v.is_null());
    if has_content_parts {
        return Err(value_error(
            "body",
            "content_parts and features are mutually exclusive",
            body,
        ));
    }
    // An item with metadata but no kwargs needs the encoder cache handoff.
    let kwargs = per_modality(features, "kwargs_data");
    let metadata_only = per_modality(features, "mm_metadata").is_some_and(|meta| {
        meta.iter().any(|(m, list)| {
            list.as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .any(|(i, item)| {
                    !item.is_null()
                        && kwargs
                            .and_then(|k| k.get(m))
                            .and_then(|l| l.get(i))
                            .is_none_or(Value::is_null)
                })
        })
    });
    let has_ec = body
        .get("ec_transfer_params")
        .and_then(Value::as_object)
        .is_some_and(|o| !o.is_empty());
    if metadata_only && !has_ec {
        return Err(value_error(
            "body",
            "metadata-only multimodal items require ec_transfer_params",
            body,
        ));
    }
    Ok(())
}
