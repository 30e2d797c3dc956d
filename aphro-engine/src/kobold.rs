//! The KoboldAI API over the coupled completion path (`endpoints.md` §5): a generate body
//! becomes a completion request on the windowed prompt tokens ([`aphro_core::kobold`]) and
//! runs through [`OpenAiServing`]; [`KoboldServing`] adds what Kobold has and OpenAI lacks:
//! the text so far of a running generation by its `genkey` (`/api/extra/generate/check`)
//! and abort by `genkey` (`/api/extra/abort`).
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aphro_core::kobold::{parse_generate, KoboldGenerateRequest};
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::openai::{parse_completion, OpenAiError, OpenAiServing};

/// One running generation: its engine request id (for abort) and choice 0's text so far.
#[derive(Debug, Default)]
struct Running {
    engine_request_id: String,
    text: String,
}

type Table = Arc<Mutex<HashMap<String, Running>>>;

/// Removes a generation from the table when its stream ends or is dropped.
struct Registration {
    table: Table,
    genkey: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut t) = self.table.lock() {
            t.remove(&self.genkey);
        }
    }
}

/// A text stream of one generation: choice `i`'s new text per engine step.
pub type KoboldTextStream = BoxStream<'static, Result<(usize, String), OpenAiError>>;

/// The Kobold routes' state over one coupled server.
#[derive(Clone)]
pub struct KoboldServing {
    serving: OpenAiServing,
    running: Table,
}

impl KoboldServing {
    pub fn new(serving: OpenAiServing) -> Self {
        KoboldServing {
            serving,
            running: Arc::default(),
        }
    }

    /// `/api/extra/tokencount`: `len(encode(prompt, add_special_tokens=False))`.
    pub fn token_count(&self, prompt: &str) -> Result<usize, OpenAiError> {
        Ok(self
            .serving
            .renderer
            .tokenizer()
            .encode(prompt, false)?
            .len())
    }

    /// Starts a generation and returns the text deltas of its choices. `model` is the name
    /// the internal completion chunks carry.
    pub fn start(
        &self,
        body: &Value,
        stream: bool,
        model: String,
    ) -> Result<(KoboldGenerateRequest, KoboldTextStream), OpenAiError> {
        let req = parse_generate(body)?;
        if stream && req.n > 1 && req.temperature >= 1e-5 {
            return Err(aphro_core::Error::for_param(
                "The Kobold stream carries one generation; use n=1 (or /api/v1/generate for n > 1).",
                "n",
            )
            .into());
        }
        let ids = self.token_ids(&req.prompt)?;
        let window = req.prompt_window(&ids);
        let completion = parse_completion(&req.to_completion_body(window, true)?)?;
        let genkey = req
            .genkey
            .clone()
            .filter(|g| !g.is_empty())
            .unwrap_or_else(|| format!("kai-{}", aphro_core::protocol::random_request_id()));
        let rendered = self.serving.render_completion(completion, Some(&genkey))?;
        let engine_request_id = rendered
            .generate
            .first()
            .map(|g| crate::serving::wire_request_id(&g.request_id))
            .unwrap_or_default();
        {
            let mut t = self
                .running
                .lock()
                .map_err(|_| OpenAiError::Internal("kobold table poisoned".into()))?;
            if t.contains_key(&genkey) {
                return Err(aphro_core::Error::for_param(
                    format!("genkey '{genkey}' is already generating; send a fresh one"),
                    "genkey",
                )
                .into());
            }
            t.insert(
                genkey.clone(),
                Running {
                    engine_request_id,
                    text: String::new(),
                },
            );
        }
        let registration = Registration {
            table: Arc::clone(&self.running),
            genkey: genkey.clone(),
        };
        let chunks = match self.serving.stream_completion(rendered, model) {
            Ok(c) => c,
            Err(e) => {
                drop(registration);
                return Err(e);
            }
        };
        let table = Arc::clone(&self.running);
        let texts = chunks.filter_map(move |chunk| {
            // The registration lives as long as the stream.
            let _alive = &registration;
            let out = match chunk {
                Err(e) => Some(Err(e)),
                Ok(c) => {
                    let choice = c.get("choices").and_then(|c| c.get(0));
                    let index = choice
                        .and_then(|c| c.get("index"))
                        .and_then(Value::as_u64)
                        .unwrap_or(0) as usize;
                    let text = choice
                        .and_then(|c| c.get("text"))
                        .and_then(Value::as_str)
                        .filter(|t| !t.is_empty());
                    text.map(|t| {
                        if index == 0 {
                            if let Ok(mut t2) = table.lock() {
                                if let Some(r) = t2.get_mut(&genkey) {
                                    r.text.push_str(t);
                                }
                            }
                        }
                        Ok((index, t.to_owned()))
                    })
                }
            };
            futures::future::ready(out)
        });
        Ok((req, texts.boxed()))
    }

    /// `/api/v1/generate`: runs to the end (or to an abort) and returns
    /// `{"results": [{"text"}, ...]}`, one per choice.
    pub async fn generate(&self, body: &Value, model: String) -> Result<Value, OpenAiError> {
        let (req, texts) = self.start(body, false, model)?;
        Self::collect(&req, texts).await
    }

    /// Collects a started generation's texts into `{"results": [{"text"}, ...]}`.
    pub async fn collect(
        req: &KoboldGenerateRequest,
        mut texts: KoboldTextStream,
    ) -> Result<Value, OpenAiError> {
        let n = if req.temperature < 1e-5 {
            1
        } else {
            req.n.max(1) as usize
        };
        let mut out = vec![String::new(); n];
        while let Some(item) = texts.next().await {
            let (i, t) = item?;
            if let Some(slot) = out.get_mut(i) {
                slot.push_str(&t);
            }
        }
        let results: Vec<Value> = out.into_iter().map(|t| json!({"text": t})).collect();
        Ok(json!({"results": results}))
    }

    /// `/api/extra/generate/check`: the text so far of a running generation (`""` when the
    /// key is unknown or finished).
    pub fn check(&self, genkey: &str) -> Value {
        let text = self
            .running
            .lock()
            .ok()
            .and_then(|t| t.get(genkey).map(|r| r.text.clone()))
            .unwrap_or_default();
        json!({"results": [{"text": text}]})
    }

    /// `/api/extra/abort`: stops a running generation; its stream ends with the text so far.
    /// Returns whether one was running.
    pub fn abort(&self, genkey: &str) -> bool {
        let id = self
            .running
            .lock()
            .ok()
            .and_then(|t| t.get(genkey).map(|r| r.engine_request_id.clone()));
        match id {
            Some(id) => {
                self.serving.engine.abort(&[id]);
                true
            }
            None => false,
        }
    }

    fn token_ids(&self, prompt: &str) -> Result<Vec<u32>, OpenAiError> {
        Ok(self.serving.renderer.tokenizer().encode(prompt, false)?)
    }
}
