"""`aphro.Renderer` on a Qwen-VL model: a chat with images renders to vLLM 0.33.0's own
render response (`testdata/multimodal/render_cases.jsonl`): token ids, and the `features`
object with its `mm_hashes`, `mm_placeholders`, `kwargs_data` and `mm_metadata`."""
from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil

import pytest

import aphro
from conftest import ASSETS, REPO

MM = REPO / "testdata" / "multimodal"
MODEL = "Qwen/Qwen2-VL-2B-Instruct"


def cases():
    with open(MM / "render_cases.jsonl", encoding="utf-8") as f:
        return {c["id"]: c for c in map(json.loads, f) if c}


CASES = cases()


def materialize(value):
    """`{{b64:images/NAME}}` -> the file's standard base64, as vLLM's generator sent it."""
    text = json.dumps(value)
    text = re.sub(
        r"\{\{b64:([^}]+)\}\}",
        lambda m: base64.b64encode((MM / m.group(1)).read_bytes()).decode(),
        text,
    )
    return json.loads(text)


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    """`<root>/Qwen/Qwen2-VL-2B-Instruct`, the served dir as vLLM got it: the model id in
    every mm_hash is the `--model` string, here that relative path."""
    root = tmp_path_factory.mktemp("mm")
    dest = root / MODEL
    shutil.copytree(MM / "models" / MODEL.split("/")[1], dest)
    shutil.copy(ASSETS / "tokenizers" / "qwen3" / "tokenizer.json", dest / "tokenizer.json")
    return root


def qwen_renderer(model_root, monkeypatch, **kw):
    monkeypatch.chdir(model_root)
    return aphro.Renderer(MODEL, **kw)


@pytest.mark.parametrize(
    "case_id,flags",
    [
        ("q2/single_png_224", {}),
        ("q2/two_images", {}),
        ("q2/rgba_png_io_config_hash", {}),
        ("q2/nonorm_tiny_32x32", {"mm_device_do_normalize": False}),
    ],
)
def test_render_chat_returns_vllms_features(model_root, monkeypatch, case_id, flags):
    case = CASES[case_id]
    want = case["response"]
    r = qwen_renderer(model_root, monkeypatch, **flags)
    request_id = case_id.replace("/", "-")
    got = r.render_chat(materialize(case["request"]), request_id=request_id)
    assert_vllms_response(got, want)


def assert_vllms_response(got, want):
    """`got` is vLLM's render response `want`: ids, hashes, placeholders, and every blob by
    its length and sha256 (what the goldens keep of them)."""
    assert got["request_id"] == want["request_id"]
    assert got["token_ids"] == want["token_ids"]
    f, wf = got["features"], want["features"]
    assert list(f) == ["mm_hashes", "mm_placeholders", "kwargs_data", "mm_metadata"]
    assert f["mm_hashes"] == wf["mm_hashes"]
    assert f["mm_placeholders"] == wf["mm_placeholders"]
    for key in ("kwargs_data", "mm_metadata"):
        # The goldens keep each blob's length and sha256 (the blobs are large).
        assert len(f[key]["image"]) == len(wf[key]["image"])
        for ours, theirs in zip(f[key]["image"], wf[key]["image"]):
            assert len(ours) == theirs["b64_len"]
            assert hashlib.sha256(ours.encode()).hexdigest() == theirs["b64_sha256"], key
    assert got["token_offsets"] is None


def test_launch_render_over_http_returns_vllms_features(model_root, monkeypatch):
    """The same goldens through `aphro launch render` and a plain HTTP client: the image
    parts travel as JSON, the features come back in the response body."""
    httpx = pytest.importorskip("httpx")
    from conftest import aphro_server

    monkeypatch.chdir(model_root)
    with aphro_server("launch", "render", "--model", MODEL) as base:
        client = httpx.Client(base_url=base, timeout=60)
        for case_id in ("q2/single_png_224", "q2/two_images"):
            case = CASES[case_id]
            http = client.post(
                "/v1/chat/completions/render",
                json=materialize(case["request"]),
                headers={"X-Request-Id": case_id.replace("/", "-")},
            )
            assert http.status_code == 200, http.text
            assert_vllms_response(http.json(), case["response"])
        case = CASES["q2/err_invalid_base64"]
        http = client.post("/v1/chat/completions/render", json=materialize(case["request"]))
        assert http.status_code == case["response"]["error"]["code"] == 400
        assert http.json()["error"]["message"] == case["response"]["error"]["message"]


def test_mm_payload_none_keeps_hashes_and_placeholders(model_root, monkeypatch):
    case = CASES["q2/mm_payload_none"]
    got = qwen_renderer(model_root, monkeypatch).render_chat(materialize(case["request"]))
    assert got["features"] == case["response"]["features"]
    assert got["features"]["kwargs_data"] is None


def test_image_errors_are_vllms(model_root, monkeypatch):
    r = qwen_renderer(model_root, monkeypatch)
    case = CASES["q2/err_invalid_base64"]
    with pytest.raises(aphro.BadRequestError) as e:
        r.render_chat(materialize(case["request"]))
    assert e.value.message == case["response"]["error"]["message"]
    # Fetching is off unless allowed_media_domains names the host.
    with pytest.raises(aphro.InternalServerError, match="allowed-media-domains"):
        r.render_chat(CASES["q2/err_https_url_no_network"]["request"])
    strict = qwen_renderer(model_root, monkeypatch, allowed_media_domains=["images.example"])
    with pytest.raises(aphro.BadRequestError) as e:
        strict.render_chat(CASES["q2/err_https_url_no_network"]["request"])
    assert e.value.message == (
        "The URL must be from one of the allowed domains: ['images.example']. "
        "Input URL domain: example.com"
    )


def test_text_only_models_have_no_features(renderer):
    out = renderer.render_chat({"messages": [{"role": "user", "content": "hi"}]})
    assert out["features"] is None
