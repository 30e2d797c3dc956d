//! Generative scoring (vLLM `openai/generative_scoring/serving.py`,
//! `docs/spec/endpoints.md` §1.10): for each item, one generated position after the `query + item` prompt, read as
//! the probability of the first label token — over the label tokens only (`apply_softmax`)
//! or over the whole vocabulary.

use aphro_core::protocol::{
    random_request_id, GenerativeScoringItems, GenerativeScoringQuery, GenerativeScoringRequest,
    GenerativeScoringResponse, PoolingUsage, ScoreData,
};
use futures::StreamExt;

use super::{ServingEngine, ServingError};
use crate::engine::EngineError;
use crate::request::{EngineRequest, SamplingConfig};

impl ServingEngine {
    /// Score every item of `req` (see the module docs). `x_request_id` (the `X-Request-Id`
    /// header) replaces `request_id` as the base of the response id.
    pub async fn generative_score(
        &self,
        req: &GenerativeScoringRequest,
        x_request_id: Option<&str>,
    ) -> Result<GenerativeScoringResponse, ServingError> {
        let vocab = self.engine().model_info().vocab_size;
        if req.label_token_ids.is_empty() {
            return Err(ServingError::bad_request(
                "label_token_ids must contain at least one token ID.",
            ));
        }
        let mut labels = Vec::with_capacity(req.label_token_ids.len());
        for &t in &req.label_token_ids {
            match u32::try_from(t) {
                Ok(id) if (id as usize) < vocab => labels.push(id),
                _ => {
                    return Err(ServingError::bad_request(format!(
                        "label_token_id {t} is out of vocabulary range [0, {vocab}). Please \
                         provide valid token IDs."
                    )))
                }
            }
        }
        let encode = |text: &str, special: bool| -> Result<Vec<u32>, ServingError> {
            let tok = self.tokenizer.as_ref().ok_or_else(|| {
                ServingError::bad_request(
                    "text query and items need the model's tokenizer, which this server does \
                     not load; send token ids.",
                )
            })?;
            Ok(tok.encode(text, special)?)
        };
        let query = match &req.query {
            GenerativeScoringQuery::Text(t) => encode(t, req.add_special_tokens)?,
            GenerativeScoringQuery::Tokens(ids) => ids.clone(),
        };
        let items: Vec<Vec<u32>> = match &req.items {
            GenerativeScoringItems::Texts(v) => v
                .iter()
                .map(|t| encode(t, false))
                .collect::<Result<_, _>>()?,
            GenerativeScoringItems::Tokens(v) => v.clone(),
        };
        if items.is_empty() {
            return Err(ServingError::bad_request(
                "items must contain at least one item.",
            ));
        }
        let base = x_request_id
            .map(str::to_string)
            .or_else(|| req.request_id.clone())
            .unwrap_or_else(random_request_id);
        // The prompt keeps its head: one position is left for the scored token.
        let keep = self.engine().max_model_len().saturating_sub(1);
        let mut streams = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let mut prompt = if req.item_first {
                [item.as_slice(), &query].concat()
            } else {
                [query.as_slice(), item].concat()
            };
            prompt.truncate(keep);
            let sampling = SamplingConfig {
                logprobs: Some(0),
                logprob_token_ids: Some(labels.clone()),
                ..SamplingConfig::greedy(1)
            };
            let mut engine_req = EngineRequest::new(
                format!("generative-scoring-{base}-{i}-{}", random_request_id()),
                prompt,
                sampling,
            );
            engine_req.priority = req.priority;
            // With data parallelism each item goes where its prompt's prefix was sent.
            let replica = self.route(&engine_req.prompt_token_ids, None, None)?;
            streams.push(self.replicas[replica].engine.generate(engine_req));
        }
        let (mut data, mut prompt_tokens, mut completion_tokens) = (Vec::new(), 0, 0);
        for (index, mut stream) in streams.into_iter().enumerate() {
            let mut label_logprobs = None;
            while let Some(out) = stream.next().await {
                let out = out?;
                if label_logprobs.is_none() {
                    label_logprobs = out
                        .logprobs
                        .as_ref()
                        .and_then(|l| l.first())
                        .map(|p| p.top.iter().map(|l| l.logprob).collect::<Vec<f32>>());
                }
                if out.finished() {
                    prompt_tokens += out.usage.prompt_tokens as u64;
                    completion_tokens += out.usage.completion_tokens as u64;
                }
            }
            let lps = label_logprobs
                .filter(|l| l.len() == labels.len())
                .ok_or_else(|| {
                    ServingError::Engine(EngineError::Runner(format!(
                        "no label logprobs for item {index}"
                    )))
                })?;
            data.push(ScoreData {
                index,
                object: "score".into(),
                score: first_label_probability(&lps, req.apply_softmax),
            });
        }
        Ok(GenerativeScoringResponse {
            id: format!("generative-scoring-{base}"),
            object: "list".into(),
            created: super::unix_now() as u64,
            model: self.served_model_name().to_string(),
            data,
            usage: PoolingUsage {
                prompt_tokens,
                total_tokens: prompt_tokens + completion_tokens,
                completion_tokens,
                prompt_tokens_details: None,
            },
        })
    }
}

/// The first label's probability from the labels' log-probabilities over the vocabulary:
/// renormalized over the labels (`apply_softmax`), or as is.
fn first_label_probability(logprobs: &[f32], apply_softmax: bool) -> f32 {
    if !apply_softmax {
        return (logprobs[0] as f64).exp() as f32;
    }
    let max = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logprobs.iter().map(|&l| (l as f64 - max).exp()).sum();
    ((logprobs[0] as f64 - max).exp() / sum) as f32
}

#[cfg(test)]
mod tests {
    use super::first_label_probability;

    #[test]
    fn first_label_probability_renormalizes_over_the_labels() {
        let lp = [(0.2f64).ln() as f32, (0.6f64).ln() as f32];
        assert!((first_label_probability(&lp, true) - 0.25).abs() < 1e-6);
        assert!((first_label_probability(&lp, false) - 0.2).abs() < 1e-6);
    }
}
