//! Folding streamed deltas back into a message.
use crate::{DeltaMessage, ParsedMessage, ToolCall};

/// Folds [`DeltaMessage`]s into a [`ParsedMessage`]: content and reasoning are concatenated (a
/// field is `Some` as soon as one delta carried it, even empty); tool calls are grouped by index,
/// taking id and name from their first appearance and concatenating argument fragments.
#[derive(Debug, Default, Clone)]
pub struct Aggregator {
    content: Option<String>,
    reasoning: Option<String>,
    calls: Vec<(usize, ToolCall)>,
}

impl Aggregator {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, d: &DeltaMessage) {
        if let Some(c) = &d.content {
            self.content.get_or_insert_with(String::new).push_str(c);
        }
        if let Some(r) = &d.reasoning {
            self.reasoning.get_or_insert_with(String::new).push_str(r);
        }
        for tc in &d.tool_calls {
            let pos = self.calls.iter().position(|(i, _)| *i == tc.index);
            let slot = match pos {
                Some(p) => &mut self.calls[p].1,
                None => {
                    self.calls.push((
                        tc.index,
                        ToolCall {
                            id: String::new(),
                            name: String::new(),
                            arguments: String::new(),
                        },
                    ));
                    let last = self.calls.len() - 1;
                    &mut self.calls[last].1
                }
            };
            if let Some(id) = &tc.id {
                if slot.id.is_empty() {
                    slot.id = id.clone();
                }
            }
            if let Some(n) = &tc.name {
                slot.name.push_str(n);
            }
            slot.arguments.push_str(&tc.arguments);
        }
    }

    pub fn into_message(mut self) -> ParsedMessage {
        self.calls.sort_by_key(|(i, _)| *i);
        ParsedMessage {
            content: self.content,
            reasoning: self.reasoning,
            tool_calls: self.calls.into_iter().map(|(_, c)| c).collect(),
        }
    }
}
