//! Anthropic's `/v1/messages` over the coupled chat path: the request becomes a chat
//! request ([`aphro_core::anthropic`]), runs through [`OpenAiServing`]'s render → generate →
//! derender, and the chat response or chunk stream becomes the Messages response or event
//! stream. Same split as the chat route: [`OpenAiServing::render_messages`] (sync, CPU),
//! then [`OpenAiServing::stream_messages`] or [`OpenAiServing::generate_chat`] +
//! [`OpenAiServing::derender_messages`].
use aphro_core::anthropic::{self, MessageStream, MessagesRequest, Route, StreamEvent};
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::Value;

use crate::openai::{parse_chat, GeneratedChat, OpenAiError, OpenAiServing, RenderedChat};

/// Anthropic events (`event:` name, `data:` object); an `Err` is the last item.
pub type MessageEventStream = BoxStream<'static, Result<StreamEvent, OpenAiError>>;

impl OpenAiServing {
    /// Renders a Messages request as its chat request (CPU-bound).
    pub fn render_messages(
        &self,
        req: &MessagesRequest,
        request_id: Option<&str>,
    ) -> Result<RenderedChat, OpenAiError> {
        let renderer = &self.renderer;
        let body =
            anthropic::to_chat_body(req, Route::Messages, &|v| renderer.chat_template_reads(v));
        let chat = parse_chat(&body)?;
        self.render_chat(chat, request_id)
    }

    /// Starts the engine and returns the Messages event stream: `message_start`, `ping`,
    /// the content blocks, `message_delta`, `message_stop`.
    pub fn stream_messages(
        &self,
        r: RenderedChat,
        model: String,
    ) -> Result<MessageEventStream, OpenAiError> {
        let converter = MessageStream::new(
            r.id.clone(),
            model.clone(),
            r.generate.token_ids.len() as u64,
        );
        let chunks = self.stream_chat(r, Some(model))?;
        let events = futures::stream::unfold(
            (chunks, converter, false),
            |(mut chunks, mut conv, done)| async move {
                if done {
                    return None;
                }
                match chunks.next().await {
                    Some(Ok(chunk)) => Some((Ok(conv.push(&chunk)), (chunks, conv, false))),
                    Some(Err(e)) => Some((Err(e), (chunks, conv, true))),
                    None => Some((Ok(conv.finish()), (chunks, conv, true))),
                }
            },
        )
        .flat_map(|batch| {
            futures::stream::iter(match batch {
                Ok(events) => events.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            })
        });
        Ok(events.boxed())
    }

    /// Derenders a finished chat into the Messages response (CPU-bound).
    pub fn derender_messages(&self, g: GeneratedChat, model: &str) -> Result<Value, OpenAiError> {
        let resp = self.derender_chat(g)?;
        Ok(anthropic::from_chat_response(&resp, model))
    }

    /// A whole non-streaming Messages request.
    pub async fn messages(
        &self,
        req: &MessagesRequest,
        model: &str,
        request_id: Option<&str>,
    ) -> Result<Value, OpenAiError> {
        let rendered = self.render_messages(req, request_id)?;
        let generated = self.generate_chat(rendered).await?;
        self.derender_messages(generated, model)
    }
}
