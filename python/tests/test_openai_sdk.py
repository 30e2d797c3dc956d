"""The integrated server (`aphro serve`, the Rust binary) driven by the official `openai`
SDK: stop strings end completions and chats where vLLM ends them, streamed or not."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

import aphro.cli

MODEL = "smol"
GGUF = Path(os.environ["APHRO_ASSETS"]) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def client():
    binary = aphro.cli.find_binary()
    if binary is None or not os.path.isfile(binary):
        pytest.skip("the `aphro` binary is not built (set APHRO_BIN)")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "serve", str(GGUF), "--port", str(port), "--served-model-name", MODEL,
         "--kv-cache-memory", "33554432", "--max-num-seqs", "8"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited: {proc.stderr.read().decode(errors='replace')}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                pytest.fail("server did not start")
            time.sleep(0.2)
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _middle_stop(text: str) -> str:
    """A two-character stop string from the middle of `text`."""
    mid = len(text) // 2
    return text[mid : mid + 2]


PROMPT = "1, 2, 3, 4,"
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def test_completion_stop_strings(client):
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, **GREEDY)
    full = free.choices[0].text
    assert free.choices[0].finish_reason == "length"
    stop = _middle_stop(full)
    cut = full.index(stop)
    for spec in ([stop], stop):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, stop=spec, **GREEDY)
        assert r.choices[0].text == full[:cut]
        assert r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens < 20
    kept = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20, stop=[stop], temperature=0,
        extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == full[: cut + len(stop)]
    # Streamed: the concatenated deltas end at the stop string, and the stream ends there.
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20, stop=[stop], stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full[:cut]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_stop_strings(client):
    messages = [{"role": "user", "content": "Count from one to twenty in words."}]
    free = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, **GREEDY)
    content = free.choices[0].message.content
    stop = _middle_stop(content)
    cut = content.index(stop)
    r = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, stop=[stop], **GREEDY)
    assert r.choices[0].message.content == content[:cut]
    assert r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, stop=[stop], stream=True,
        stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in with_choices) == content[:cut]
    assert with_choices[-1].choices[0].finish_reason == "stop"
    assert [c.choices[0].finish_reason for c in with_choices[:-1]] == [None] * (len(with_choices) - 1)
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
