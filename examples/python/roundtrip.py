"""Render -> generate -> derender, in one process, on the default model (SmolLM2-135M GGUF).

The three stages of `/v1/chat/completions`, called one by one: what the integrated server does
internally, and what the disaggregated deployment does across three processes (the same
seed round trip over HTTP: examples/http/seed_round_trip.py).

    python examples/python/roundtrip.py
"""
import json

import aphro

model = aphro.Model()  # the embedded default; load once, share the tokenizer
renderer = aphro.Renderer(model)
engine = aphro.Engine(model, seed=0)
derenderer = aphro.Derenderer(model)

chat = {
    "messages": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "max_tokens": 32,
    "temperature": 0.0,
}

# 1. render: OpenAI chat request -> token-in GenerateRequest (/v1/chat/completions/render)
generate_request = renderer.render_chat(chat)
print(f"prompt: {len(generate_request['token_ids'])} tokens")

# 2. generate: token ids in, token ids out (/inference/v1/generate)
generate_response = engine.generate(generate_request)
print("generated ids:", generate_response["choices"][0]["token_ids"])

# 3. derender: token ids -> chat.completion (/v1/chat/completions/derender)
completion = derenderer.derender_chat(
    generate_response, chat, prompt_token_ids=generate_request["token_ids"]
)
print(json.dumps(completion, indent=2, ensure_ascii=False))
