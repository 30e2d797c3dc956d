"""`aphro serve` on all-MiniLM-L6-v2 (a pooling model) driven by the official `openai` SDK:
`client.embeddings.create` with float and base64 vectors, batched input, and an error. The
vectors are checked against the sentence-transformers goldens of `testdata/pooling/`."""
from __future__ import annotations

import base64
import json
import struct

import openai
import pytest

from conftest import ASSETS, REPO, aphro_server

MODEL = "minilm"
MINILM = ASSETS / "models" / "all-MiniLM-L6-v2"


def _goldens() -> dict[str, dict]:
    with open(REPO / "testdata" / "pooling" / "embeddings.jsonl", encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    return {c["id"]: c for c in cases}


@pytest.fixture(scope="module")
def client():
    if not (MINILM / "model.safetensors").is_file():
        pytest.fail(f"{MINILM} missing: run scripts/fetch_assets.py")
    with aphro_server("serve", str(MINILM), "--served-model-name", MODEL) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=60)


def _f32(xs) -> list[float]:
    """Each value rounded to float32 (the JSON floats are float32's shortest repr)."""
    return list(struct.unpack(f"<{len(xs)}f", struct.pack(f"<{len(xs)}f", *xs)))


def _max_abs(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_float_and_base64_batched(client):
    g = _goldens()
    cases = [g["hello-world"], g["pangram"]]
    texts = [c["input"] for c in cases]
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert floats.model == MODEL
    assert [d.index for d in floats.data] == [0, 1]
    assert floats.usage.prompt_tokens == sum(c["n_tokens"] for c in cases)
    for d, c in zip(floats.data, cases):
        assert len(d.embedding) == 384
        assert _max_abs(d.embedding, c["embedding"]) <= 1e-5, c["id"]

    # The SDK's default asks for base64 and decodes it itself: the same float32 vectors.
    default = client.embeddings.create(model=MODEL, input=texts)
    for a, b in zip(default.data, floats.data):
        assert _f32(a.embedding) == _f32(b.embedding)

    # base64 as sent: little-endian float32 bytes of the float vector, bit for bit.
    raw = client.embeddings.with_raw_response.create(
        model=MODEL, input=texts[0], encoding_format="base64"
    )
    b64 = json.loads(raw.text)["data"][0]["embedding"]
    decoded = list(struct.unpack("<384f", base64.b64decode(b64)))
    assert decoded == _f32(floats.data[0].embedding)


def test_token_ids_and_errors(client):
    g = _goldens()
    ids = g["ids-with-specials"]
    out = client.embeddings.create(model=MODEL, input=[ids["input"]], encoding_format="float")
    assert _max_abs(out.data[0].embedding, ids["embedding"]) <= 1e-5

    long = g["long-paragraph"]
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=MODEL, input=long["input"])
    assert err.value.status_code == 400
    assert err.value.body["message"] == long["vllm"]["error_message"]

    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="no-such-model", input="hi")
    assert err.value.body["message"] == "The model `no-such-model` does not exist."

    # truncate_prompt_tokens (a vLLM extension) through extra_body.
    cut = client.embeddings.create(
        model=MODEL, input=long["input"], extra_body={"truncate_prompt_tokens": -1}
    )
    assert cut.usage.prompt_tokens == 256
