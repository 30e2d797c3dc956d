"""Disaggregated serving with plain httpx, exactly as a vLLM client does it.

Start the two roles first (any order):

    aphro launch render --port 8001          # GPU-less frontend (embedded default model)
    aphro serve --tokens-only --port 8002     # token-in/token-out engine

then run:  python examples/http/seed_round_trip.py

It renders a chat request on the frontend, generates on the engine, derenders on the
frontend, and prints the answer; then does the same with streaming, forwarding each
generate event to the stateless streaming derender and carrying `stream_state`.
"""
import json
import os

import httpx

RENDER = os.environ.get("APHRO_RENDER_URL", "http://127.0.0.1:8001")
ENGINE = os.environ.get("APHRO_ENGINE_URL", "http://127.0.0.1:8002")

chat = {
    "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    "max_tokens": 48,
    "temperature": 0,
}

with httpx.Client(timeout=120) as client:
    # 1. render: chat request -> GenerateRequest (token ids + sampling params)
    rendered = client.post(f"{RENDER}/v1/chat/completions/render", json=chat).raise_for_status().json()
    # 2. generate: tokens in, tokens out
    generated = client.post(f"{ENGINE}/inference/v1/generate", json=rendered).raise_for_status().json()
    # 3. derender: tokens -> OpenAI chat completion
    response = client.post(
        f"{RENDER}/v1/chat/completions/derender",
        json={
            "generate_response": generated,
            "prompt_tokens": len(rendered["token_ids"]),
            "prompt_token_ids": rendered["token_ids"],
            "chat_request": chat,
        },
    ).raise_for_status().json()
    print("answer:", response["choices"][0]["message"]["content"])

    # Streaming: one derender call per generate SSE event, state carried by the client.
    stream_request = dict(rendered, stream=True)
    state = None
    pieces = []
    with client.stream("POST", f"{ENGINE}/inference/v1/generate", json=stream_request) as events:
        for line in events.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            out = client.post(
                f"{RENDER}/v1/chat/completions/derender",
                json={
                    "stream": True,
                    "generate_chunk": chunk,
                    "stream_state": state,
                    "prompt_token_ids": rendered["token_ids"],
                    "chat_request": chat,
                },
            ).raise_for_status().json()
            state = out["stream_state"]
            for choice in out["chunk"]["choices"]:
                pieces.append(choice["delta"].get("content") or "")
    print("streamed:", "".join(pieces))
