"""`aphro serve` on all-MiniLM-L6-v2 driven by the official `cohere` SDK: `ClientV2.embed`
(`/v2/embed`, Cohere v2 shape) with `input_type` prompts, `ClientV2.rerank` (`/v2/rerank`) and
the v1 `Client.rerank` (`/v1/rerank`), checked against the sentence-transformers goldens of
`testdata/pooling/`. vLLM's `/v2/rerank` answers the Jina-style shape (documents echoed, no
`meta`), which the Cohere SDK reads: its models accept the extra fields."""
from __future__ import annotations

import base64
import json
import os
import struct

import cohere
import httpx
import pytest

from conftest import ASSETS, REPO, aphro_server

MODEL = "minilm"
MINILM = ASSETS / "models" / "all-MiniLM-L6-v2"
PROMPTS = {"search_query": "query: ", "search_document": "passage: "}


def _jsonl(name: str) -> list[dict]:
    with open(REPO / "testdata" / "pooling" / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _golden(case_id: str) -> dict:
    return next(c for c in _jsonl("embeddings.jsonl") if c["id"] == case_id)


def _max_abs(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def minilm_with_prompts(tmp_path_factory):
    """MiniLM with sentence-transformers `prompts` (what `input_type` selects): the model's
    files linked, `config_sentence_transformers.json` replaced."""
    if not (MINILM / "model.safetensors").is_file():
        pytest.fail(f"{MINILM} missing: run scripts/fetch_assets.py")
    out = tmp_path_factory.mktemp("minilm-prompts")
    for p in MINILM.iterdir():
        if p.name != "config_sentence_transformers.json":
            os.symlink(p, out / p.name)
    (out / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    return out


@pytest.fixture(scope="module")
def base(minilm_with_prompts):
    with aphro_server("serve", str(minilm_with_prompts), "--served-model-name", MODEL) as url:
        yield url


@pytest.fixture(scope="module")
def co(base):
    return cohere.ClientV2(api_key="unused", base_url=base, timeout=60)


def _embed_v1(base: str, text: str) -> tuple[list[float], int]:
    """`/v1/embeddings` of `text`: the vector and its prompt tokens."""
    r = httpx.post(f"{base}/v1/embeddings", json={"input": text}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["embedding"], r.json()["usage"]["prompt_tokens"]


def test_embed_v2_with_input_type_prompts(co, base):
    hello = _golden("hello-world")
    out = co.embed(
        model=MODEL,
        input_type="search_document",
        texts=[hello["input"]],
        embedding_types=["float", "base64", "ubinary"],
    )
    assert out.response_type == "embeddings_by_type"
    assert out.texts == [hello["input"]]
    # The prompt is prepended: the vector of "passage: Hello world", not the golden.
    vec = out.embeddings.float_[0]
    assert len(vec) == 384
    prefixed, tokens = _embed_v1(base, "passage: " + hello["input"])
    assert out.meta.billed_units.input_tokens == tokens > hello["n_tokens"]
    assert _max_abs(vec, prefixed) == 0.0
    assert _max_abs(vec, hello["embedding"]) > 1e-2
    # base64: little-endian float32 of the same vector.
    decoded = struct.unpack("<384f", base64.b64decode(out.embeddings.base64[0]))
    assert list(decoded) == list(struct.unpack("<384f", struct.pack("<384f", *vec)))
    # ubinary: sign bits, MSB first.
    bits = [1 if x >= 0 else 0 for x in vec]
    packed = [int("".join(map(str, bits[i : i + 8])), 2) for i in range(0, 384, 8)]
    assert out.embeddings.ubinary[0] == packed

    # No prompt for `input_type` none: the golden itself (the SDK sends null).
    plain = co.embed(model=MODEL, input_type=None, texts=[hello["input"]])
    assert _max_abs(plain.embeddings.float_[0], hello["embedding"]) <= 1e-5

    with pytest.raises(cohere.BadRequestError) as err:
        co.embed(model=MODEL, input_type="classification", texts=["a"])
    assert err.value.body["error"]["message"] == (
        "Unsupported input_type 'classification'. Supported values: search_document, search_query"
    )


def test_rerank_v2_and_v1_match_goldens(co, base):
    v1 = cohere.Client(api_key="unused", base_url=base, timeout=60)
    for case in _jsonl("rerank.jsonl"):
        if case["model"] != "bi-encoder":
            continue
        req = case["request"]
        # `top_n: 0` (all) is the server's default; the SDK would send `null` for None.
        extra = {"top_n": req["top_n"]} if req["top_n"] else {}
        want = case["results"]
        got_v2 = co.rerank(
            model=MODEL, query=req["query"], documents=req["documents"], **extra
        ).results
        got_v1 = v1.rerank(
            model=MODEL, query=req["query"], documents=req["documents"], **extra
        ).results
        for got in (got_v2, got_v1):
            assert [r.index for r in got] == [r["index"] for r in want], case["id"]
            for r, w in zip(got, want):
                assert abs(r.relevance_score - w["relevance_score"]) <= 1e-4, case["id"]
    # The raw /v2/rerank body: vLLM's Jina-style shape, documents echoed, usage.
    r = httpx.post(
        f"{base}/v2/rerank",
        json={"model": MODEL, "query": "a", "documents": ["b", "a"], "top_n": 1},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "model", "usage", "results"}
    assert body["results"][0]["document"] == {"text": "a", "multi_modal": None}
