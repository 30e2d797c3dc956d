"""`aphro.LLM` against the integrated server (`aphro serve`, the Rust binary): the same greedy
request gives the same response and the same stream chunks in process as over HTTP."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

import aphro
from conftest import DEFAULT_GGUF as GGUF
from conftest import SMOL as MODEL

# The engine arguments of conftest's `aphro serve` (SERVE_FLAGS), so both sides run alike.
ENGINE = {"kv_cache_memory": 33554432, "max_model_len": "auto", "max_num_seqs": 8}


@pytest.fixture(scope="module")
def http(integrated_server):
    with httpx.Client(base_url=integrated_server, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def llm():
    with aphro.LLM(str(GGUF), served_model_name=MODEL, **ENGINE) as llm:
        yield llm


CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Name three colours."}],
    "max_tokens": 24,
    "temperature": 0,
    "logprobs": True,
    "top_logprobs": 2,
}
USAGE = {"include_usage": True, "continuous_usage_stats": True}


def _sse(http: httpx.Client, path: str, body: dict, request_id: str) -> list:
    events = []
    with http.stream("POST", path, json=body, headers={"X-Request-Id": request_id}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    return events


def _timeless(chunks: list) -> list:
    """The chunks without `created` (seconds since the epoch at each side's start)."""
    out = []
    for c in chunks:
        c = dict(c)
        assert isinstance(c.pop("created"), int)
        out.append(c)
    return out


def test_chat_stream_equals_http_stream(http, llm):
    body = dict(CHAT, stream=True, stream_options=USAGE)
    over_http = _sse(http, "/v1/chat/completions", body, "same-1")
    in_process = list(llm.chat_stream(body, request_id="same-1"))
    assert len(in_process) > 3
    assert in_process[0]["choices"][0]["delta"]["role"] == "assistant"
    assert in_process[-1]["choices"] == [] and in_process[-1]["usage"]["completion_tokens"] > 0
    assert _timeless(in_process) == _timeless(over_http)


def test_chat_and_completion_responses_equal_http(http, llm):
    over_http = http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "same-2"})
    assert over_http.status_code == 200
    assert _timeless([llm.chat(CHAT, request_id="same-2")]) == _timeless([over_http.json()])

    comp = {"model": MODEL, "prompt": ["1, 2, 3,", "a, b, c,"], "max_tokens": 8,
            "temperature": 0, "n": 1}
    over_http = http.post("/v1/completions", json=comp, headers={"X-Request-Id": "same-3"})
    assert over_http.status_code == 200
    assert _timeless([llm.completion(comp, request_id="same-3")]) == _timeless([over_http.json()])

    stream = dict(comp, stream=True, stream_options={"include_usage": True})
    over_http = _sse(http, "/v1/completions", stream, "same-4")
    in_process = list(llm.completion_stream(stream, request_id="same-4"))
    # Two prompts interleave as their tokens come; each prompt's own order is fixed.
    key = lambda c: (c["choices"][0]["index"] if c["choices"] else 99)  # noqa: E731
    assert sorted(_timeless(in_process), key=key) == sorted(_timeless(over_http), key=key)


def test_errors_and_early_close(llm):
    with pytest.raises(aphro.NotFoundError):
        llm.chat(dict(CHAT, model="other"))
    with pytest.raises(aphro.BadRequestError) as e:
        llm.chat(dict(CHAT, structured_outputs={"regex": "(unclosed"}))
    assert e.value.param == "structured_outputs"
    stream = llm.chat_stream(dict(CHAT, stream=True, max_tokens=200))
    next(stream)
    stream.close()
    assert list(stream) == []
    # The engine is free again: a new request completes.
    assert llm.chat(dict(CHAT, max_tokens=2))["choices"][0]["finish_reason"] == "length"


def test_async_llm_streams_concurrently():
    async def run():
        async with aphro.AsyncLLM(str(GGUF), served_model_name=MODEL, **ENGINE) as llm:
            async def one(i):
                body = dict(CHAT, stream=True, max_tokens=6, ignore_eos=True,
                            stream_options=USAGE,
                            messages=[{"role": "user", "content": f"Count to {i}."}])
                return [c async for c in llm.chat_stream(body)]
            return await asyncio.gather(*(one(i) for i in range(3)))

    results = asyncio.run(run())
    assert all(r[-1]["usage"]["completion_tokens"] == 6 for r in results)
