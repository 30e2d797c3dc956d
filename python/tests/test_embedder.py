"""`aphro.Embedder` (the engine's pooling API in process) on all-MiniLM-L6-v2 and on the
cross-encoder of `testdata/pooling/cross_encoder/`, against the sentence-transformers /
transformers goldens of `testdata/pooling/`."""
from __future__ import annotations

import json
import shutil
import struct

import pytest

import aphro
from conftest import ASSETS, REPO

MINILM = ASSETS / "models" / "all-MiniLM-L6-v2"
POOLING = REPO / "testdata" / "pooling"


def _jsonl(name: str) -> list[dict]:
    with open(POOLING / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _golden(case_id: str) -> dict:
    return next(c for c in _jsonl("embeddings.jsonl") if c["id"] == case_id)


def _max_abs(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def minilm():
    if not (MINILM / "model.safetensors").is_file():
        pytest.fail(f"{MINILM} missing: run scripts/fetch_assets.py")
    return aphro.Embedder(MINILM)


def _read_safetensors(path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    return header, raw[8 + n :]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    """The folder `compose_model_dir.py` writes: MiniLM's tensors under `bert.` (without the
    `position_ids` buffer) plus the seeded head, the head's config and MiniLM's tokenizer."""
    out = tmp_path_factory.mktemp("cross-encoder")
    tensors: list[tuple[str, dict, bytes]] = []
    base, base_data = _read_safetensors(MINILM / "model.safetensors")
    for name, t in base.items():
        if name != "embeddings.position_ids":
            s, e = t["data_offsets"]
            tensors.append(("bert." + name, t, base_data[s:e]))
    head, head_data = _read_safetensors(POOLING / "cross_encoder" / "head.safetensors")
    for name, t in head.items():
        s, e = t["data_offsets"]
        tensors.append((name, t, head_data[s:e]))
    header, offset, blobs = {}, 0, []
    for name, t, data in sorted(tensors):
        header[name] = {"dtype": t["dtype"], "shape": t["shape"],
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    hjson = json.dumps(header).encode()
    hjson += b" " * (-len(hjson) % 8)
    (out / "model.safetensors").write_bytes(struct.pack("<Q", len(hjson)) + hjson + b"".join(blobs))
    shutil.copyfile(POOLING / "cross_encoder" / "config.json", out / "config.json")
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copyfile(MINILM / f, out / f)
    return aphro.Embedder(out)


def test_embed_matches_goldens(minilm):
    assert minilm.task == "embed"
    assert minilm.max_model_len == 256
    ids = ["hello-world", "pangram", "cjk-chinese", "emoji", "accents", "empty-string"]
    cases = [_golden(i) for i in ids]
    vectors = minilm.embed([c["input"] for c in cases])
    assert len(vectors) == len(cases)
    for v, c in zip(vectors, cases):
        assert _max_abs(v, c["embedding"]) <= 1e-5, c["id"]
    # One string: one vector; token ids are used as given.
    one = minilm.embed(cases[0]["input"])
    assert len(one) == 384 and _max_abs(one, cases[0]["embedding"]) <= 1e-5
    pre = _golden("ids-no-specials")
    assert _max_abs(minilm.embed([pre["input"]])[0], pre["embedding"]) <= 1e-5
    # normalize=False: the mean-pooled vector (vLLM's `use_activation: false`).
    raw = minilm.embed(cases[0]["input"], normalize=False)
    assert _max_abs(raw, cases[0]["mean_pooled"]) <= 1e-5


def test_embed_truncation_and_errors(minilm):
    long = _golden("long-paragraph")
    with pytest.raises(aphro.BadRequestError) as err:
        minilm.embed(long["input"])
    assert err.value.message == long["vllm"]["error_message"]
    assert err.value.status == 400
    cut = minilm.embed(long["input"], truncate_prompt_tokens=-1)
    assert _max_abs(cut, long["embedding"]) <= 1e-5
    left = _golden("truncate-16-left")
    got = minilm.embed(left["input"], truncate_prompt_tokens=16, truncation_side="left")
    assert _max_abs(got, left["embedding"]) <= 1e-5
    with pytest.raises(aphro.BadRequestError) as err:
        minilm.embed("hi", dimensions=32)
    assert "does not support matryoshka representation" in err.value.message
    assert err.value.param == "dimensions"


def test_score_and_rerank_match_goldens(minilm):
    for case in _jsonl("score.jsonl"):
        if case["vllm"]["status"] != 200:
            continue
        got = minilm.score(case["request"]["queries"], case["request"]["documents"])
        assert len(got) == len(case["scores"]), case["id"]
        for g, w in zip(got, case["scores"]):
            assert abs(g - w) <= 1e-4, case["id"]
    for case in _jsonl("rerank.jsonl"):
        if case["model"] != "bi-encoder":
            continue
        req = case["request"]
        got = minilm.rerank(req["query"], req["documents"], top_n=req["top_n"])
        assert [r["index"] for r in got] == [r["index"] for r in case["results"]], case["id"]
        for g, w in zip(got, case["results"]):
            assert abs(g["relevance_score"] - w["relevance_score"]) <= 1e-4
            assert g["document"] == w["document"]["text"]
    with pytest.raises(aphro.BadRequestError) as err:
        minilm.score(["a", "b"], ["a", "b", "c"])
    assert err.value.message == "Input lengths must be either 1:1, 1:N or N:N"


def test_cross_encoder_classify_and_score(cross_encoder):
    assert cross_encoder.task == "classify"
    cases = _jsonl("classify.jsonl")
    got = cross_encoder.classify([c["input"] for c in cases])
    for g, c in zip(got, cases):
        want = c["vllm"]["data"]
        assert g["label"] == want["label"] and g["num_classes"] == want["num_classes"]
        assert _max_abs(g["probs"], want["probs"]) <= 1e-4, c["id"]
    logits = cross_encoder.classify(cases[0]["input"], use_activation=False)
    assert _max_abs(logits[0]["probs"], cases[0]["vllm"]["probs_with_use_activation_false"]) <= 1e-4
    pairs = _jsonl("cross_encoder_score.jsonl")
    scores = cross_encoder.score([p["query"] for p in pairs], [p["document"] for p in pairs])
    for s, p in zip(scores, pairs):
        assert abs(s - p["vllm"]["score"]) <= 1e-4, p["id"]
    with pytest.raises(aphro.AphroError) as err:
        cross_encoder.embed("hi")
    assert err.value.status == 501
