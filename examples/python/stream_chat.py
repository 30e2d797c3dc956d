"""Streaming chat on the default model: render, stream generate events, and turn each into a
`chat.completion.chunk` with a streaming derenderer; prints the text as it is generated.

    python examples/python/stream_chat.py "Tell me a short story about a robot."
"""
import sys

import aphro

question = " ".join(sys.argv[1:]) or "Write a haiku about the sea."
model = aphro.Model()
renderer = aphro.Renderer(model)
engine = aphro.Engine(model)
derenderer = aphro.Derenderer(model)

chat = {
    "messages": [{"role": "user", "content": question}],
    "max_tokens": 96,
    "temperature": 0.7,
    "stream": True,
}
request = renderer.render_chat(chat)
stream = derenderer.chat_stream(chat, prompt_token_ids=request["token_ids"])

for event in engine.generate_stream(request):  # one dict per engine step, GIL released between
    chunk = stream.push(event)
    for choice in chunk["choices"]:
        print(choice["delta"].get("content") or "", end="", flush=True)
        if choice.get("finish_reason"):
            print(f"\n[finish_reason={choice['finish_reason']}, {stream.tokens} tokens]")
