//! Synthetic chats for benchmarks: Qwen3-style tool-using conversations of a target size.
use crate::protocol::ChatCompletionRequest;
use serde_json::json;

/// A chat with two tools and `turns` rounds of user question → assistant tool call → tool
/// result → assistant answer. About 110 Qwen3 tokens per round plus ~330 for the tools.
pub fn tool_chat(turns: usize) -> ChatCompletionRequest {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant that can call tools."}),
    ];
    for i in 0..turns {
        messages.push(json!({"role": "user", "content": format!("What's the weather in city number {i}, and should I bring an umbrella for my {i}-km walk?")}));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{i:04}"), "type": "function",
            "function": {"name": "get_weather", "arguments": format!("{{\"city\": \"City {i}\", \"unit\": \"celsius\"}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i:04}"), "content": format!("{{\"temp\": {}, \"sky\": \"cloudy\", \"rain_probability\": 0.{}}}", 10 + i % 20, i % 10)}));
        messages.push(json!({"role": "assistant", "content": format!("In City {i} it is {} °C and cloudy with some chance of rain, so an umbrella is a good idea for {i} km.", 10 + i % 20)}));
    }
    messages.push(json!({"role": "user", "content": "Thanks! Summarize everything."}));
    let body = json!({
        "model": "Qwen/Qwen3-8B",
        "messages": messages,
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "search_web", "description": "Search the web and return the top results.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}}, "required": ["query"]}}}
        ],
        "max_tokens": 64
    });
    serde_json::from_value(body).unwrap_or_default()
}
