"""The binding against the HTTP server (`aphro launch render`, the Rust binary): the same
request gives the same body, and the same bad request the same error body."""
from __future__ import annotations

import pytest

import aphro
from conftest import aphro_server

httpx = pytest.importorskip("httpx")

NAME = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server():
    with aphro_server("launch", "render") as base:
        yield httpx.Client(base_url=base, timeout=30)


@pytest.fixture(scope="module")
def local():
    return aphro.Renderer(served_model_name=NAME)


CHAT = {
    "model": NAME,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "max_tokens": 16,
    "temperature": 0.5,
    "stop": ["\n\n"],
}


def test_render_chat_same_body(server, local):
    http = server.post("/v1/chat/completions/render", json=CHAT, headers={"X-Request-Id": "r1"})
    assert http.status_code == 200
    assert local.render_chat(CHAT, request_id="r1") == http.json()


def test_render_completion_same_body(server, local):
    body = {"model": NAME, "prompt": ["Once upon", "a time"], "max_tokens": 4}
    http = server.post("/v1/completions/render", json=body, headers={"X-Request-Id": "c1"})
    assert http.status_code == 200
    assert local.render_completion(body, request_id="c1") == http.json()


def test_tokenize_detokenize_same_body(server, local):
    body = {"prompt": "Hello, world", "return_token_strs": True}
    assert local.tokenize(body) == server.post("/tokenize", json=body).json()
    body = {"tokens": [19556, 28, 905]}
    assert local.detokenize(body) == server.post("/detokenize", json=body).json()


@pytest.mark.parametrize(
    "route,method,body",
    [
        ("/v1/chat/completions/render", "render_chat", {"model": NAME}),
        ("/v1/chat/completions/render", "render_chat", {**CHAT, "temperature": -1}),
        ("/v1/chat/completions/render", "render_chat", {**CHAT, "n": 0}),
        ("/v1/chat/completions/render", "render_chat", {**CHAT, "model": "nope"}),
        ("/v1/completions/render", "render_completion", {"model": NAME, "prompt": "x", "max_tokens": -2}),
    ],
)
def test_same_error_body(server, local, route, method, body):
    http = server.post(route, json=body)
    assert http.status_code >= 400
    with pytest.raises(aphro.AphroError) as ei:
        getattr(local, method)(body)
    want = http.json()["error"]
    got = ei.value.to_dict()["error"]
    assert got["code"] == want["code"] == http.status_code
    assert got["type"] == want["type"]
    assert got["param"] == want["param"]
    if body.get("model") == "nope":
        # the HTTP layer adds the list of served aliases
        assert want["message"].startswith(got["message"].rstrip("."))
    else:
        assert got["message"] == want["message"]
