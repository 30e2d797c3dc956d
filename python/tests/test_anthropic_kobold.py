"""`aphro serve` on the real SmolLM2 GGUF driven by the official `anthropic` SDK
(`/v1/messages`, `/v1/messages/count_tokens`) and by plain HTTP on the Kobold API
(`--launch-kobold-api`): both run the same render -> engine -> derender path as the OpenAI
routes, so their greedy output equals the OpenAI routes' for the same prompt."""
from __future__ import annotations

import json
import threading
import time

import anthropic
import httpx
import pytest

from conftest import DEFAULT_GGUF, SERVE_FLAGS, SMOL, aphro_server

KEY = "sekret"
# The SDK (2.x) has no sampling arguments; clients send them as extra body fields.
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def server():
    """The integrated server with a tool parser, the Kobold API and an API key."""
    with aphro_server(
        "serve", str(DEFAULT_GGUF), "--served-model-name", SMOL, *SERVE_FLAGS,
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--launch-kobold-api", "--api-key", KEY,
    ) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    # The SDK sends `x-api-key`, which the server accepts as well as a Bearer token.
    return anthropic.Anthropic(base_url=server, api_key=KEY, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c


def chat(http, **body):
    r = http.post("/v1/chat/completions", json={"model": SMOL, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_create_text_system_and_multi_turn(client, http):
    messages = [{"role": "user", "content": "Name a colour."}]
    m = client.messages.create(model=SMOL, max_tokens=12, **GREEDY, messages=messages,
                               system="You are terse.", metadata={"user_id": "u-1"})
    assert m.type == "message" and m.role == "assistant" and m.model == SMOL
    assert m.stop_reason in ("end_turn", "max_tokens")
    # The same request as a chat completion gives the same text and usage.
    c = chat(http, max_tokens=12,
             messages=[{"role": "system", "content": "You are terse."}, *messages])
    assert text_of(m) == c["choices"][0]["message"]["content"]
    assert m.usage.input_tokens == c["usage"]["prompt_tokens"]
    assert m.usage.output_tokens == c["usage"]["completion_tokens"]
    # System as blocks (the billing line Claude Code sends is dropped) and a second turn.
    turns = [*messages, {"role": "assistant", "content": [{"type": "text", "text": text_of(m)}]},
             {"role": "user", "content": [{"type": "text", "text": "Another one."}]}]
    m2 = client.messages.create(
        model=SMOL, max_tokens=12, **GREEDY, messages=turns,
        system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
                {"type": "text", "text": "You are terse."}])
    c2 = chat(http, max_tokens=12, messages=[
        {"role": "system", "content": "You are terse."}, *messages,
        {"role": "assistant", "content": text_of(m)}, {"role": "user", "content": "Another one."}])
    assert text_of(m2) == c2["choices"][0]["message"]["content"]


def test_stop_sequences_and_max_tokens(client):
    messages = [{"role": "user", "content": "Count from one to twenty in words."}]
    free = client.messages.create(model=SMOL, max_tokens=16, **GREEDY, messages=messages)
    assert free.stop_reason == "max_tokens" and free.usage.output_tokens == 16
    full = text_of(free)
    stop = full[len(full) // 2: len(full) // 2 + 2]
    cut = client.messages.create(model=SMOL, max_tokens=16, **GREEDY, messages=messages,
                                 stop_sequences=[stop])
    assert text_of(cut) == full[: full.index(stop)]
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop


def test_stream_accumulates_to_the_non_streaming_message(client):
    kw = dict(model=SMOL, max_tokens=20, **GREEDY,
              messages=[{"role": "user", "content": "Tell me about the sea."}])
    full = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        names = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop",
            "message_delta"} <= set(names)
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in full.content]
    assert (streamed.stop_reason, streamed.stop_sequence) == (full.stop_reason, full.stop_sequence)
    assert streamed.usage.output_tokens == full.usage.output_tokens
    assert streamed.usage.input_tokens == full.usage.input_tokens


def test_raw_stream_has_anthropic_event_framing(server):
    body = {"model": SMOL, "max_tokens": 4, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]}
    r = httpx.post(f"{server}/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in r.text.split("\n\n") if b.strip()]
    first = blocks[0].split("\n")
    assert first[0] == "event: message_start"
    start = json.loads(first[1].removeprefix("data: "))
    assert start["message"]["type"] == "message" and start["message"]["role"] == "assistant"
    assert blocks[1] == 'event: ping\ndata: {"type":"ping"}'
    assert blocks[-1] == 'event: message_stop\ndata: {"type":"message_stop"}'
    assert "[DONE]" not in r.text


WEATHER = {"name": "get_weather", "description": "Current weather for a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


def _call(city: str) -> str:
    return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>' % city


# Three worked turns make the 135M model answer the fourth with a Hermes tool call.
FEW_SHOT = [m for c in ["Rome", "Berlin", "Madrid"] for m in (
    {"role": "user", "content": f"Weather in {c}?"}, {"role": "assistant", "content": _call(c)})]
ASK = {"role": "user", "content": "Weather in Paris?"}


def test_tools_with_a_parser_give_tool_use_blocks(client):
    kw = dict(model=SMOL, max_tokens=40, **GREEDY, system="Answer with a tool call.",
              messages=[*FEW_SHOT, ASK], tools=[WEATHER])
    m = client.messages.create(**kw)
    assert m.stop_reason == "tool_use", m
    [call] = m.content
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"})
    # Streamed: a tool_use block filled by input_json_delta events, accumulated to the same.
    with client.messages.stream(**kw) as stream:
        names = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in streamed.content] == [("tool_use", "get_weather", {"city": "Paris"})]
    assert "content_block_delta" in names


def test_tool_result_round_trip_renders_as_the_chat_tool_turn(client, http):
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    turns = [ask,
             {"role": "assistant", "content": [
                 {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
             {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"}]}]
    r = client.messages.create(model=SMOL, max_tokens=16, **GREEDY, messages=turns, tools=[WEATHER])
    openai_turns = [ask,
                    {"role": "assistant", "content": None, "tool_calls": [{
                        "id": "toolu_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 21 C"}]
    tools = [{"type": "function", "function": {"name": "get_weather",
              "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}}]
    c = chat(http, max_tokens=16, messages=openai_turns, tools=tools)
    assert text_of(r) == (c["choices"][0]["message"]["content"] or "")
    assert r.usage.input_tokens == c["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == c["usage"]["completion_tokens"]


def test_count_tokens_equals_the_chat_render(client, http):
    cases = [
        dict(messages=[{"role": "user", "content": "Hello there"}]),
        dict(messages=[{"role": "user", "content": "Hello there"}], system="Be kind."),
        dict(messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER]),
    ]
    for kw in cases:
        n = client.messages.count_tokens(model=SMOL, **kw).input_tokens
        messages = ([{"role": "system", "content": kw["system"]}] if "system" in kw else []) + kw["messages"]
        body = {"model": SMOL, "messages": messages}
        if "tools" in kw:
            body["tools"] = [{"type": "function", "function": {
                "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}
                for t in kw["tools"]]
        t = http.post("/tokenize", json=body)
        assert t.status_code == 200, t.text
        assert n == t.json()["count"], kw


@pytest.mark.parametrize("body,needle", [
    ({"messages": [{"role": "user", "content": "q"}]}, "max_tokens"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video", "text": "x"}]}]}, "video"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "q"}], "tools": [WEATHER],
      "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "q"}],
      "thinking": {"type": "enabled", "budget_tokens": 2}}, "budget_tokens"),
    ({"max_tokens": "many", "messages": [{"role": "user", "content": "q"}]}, "max_tokens"),
])
def test_bad_input_is_an_anthropic_400(server, client, body, needle):
    r = httpx.post(f"{server}/v1/messages", json={"model": SMOL, **body},
                   headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]
    if "max_tokens" in body:  # the SDK itself insists on max_tokens
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=SMOL, **body)


def test_auth_and_unknown_model(server):
    r = httpx.post(f"{server}/v1/messages", json={}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    bad = anthropic.Anthropic(base_url=server, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model=SMOL, max_tokens=2, messages=[{"role": "user", "content": "q"}])
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0).messages.create(
            model="claude-nope", max_tokens=2, messages=[{"role": "user", "content": "q"}])


# --- Kobold ---------------------------------------------------------------------------------

STORY = "Once upon a time, in a quiet village by the sea,"


def kobold_body(**kw):
    return {"prompt": STORY, "max_context_length": 512, "max_length": 24, "temperature": 0, **kw}


def test_kobold_greedy_generate_equals_the_completion(http):
    r = http.post("/api/v1/generate", json=kobold_body(rep_pen=1.0, top_k=0, sampler_order=[6, 0, 1]))
    assert r.status_code == 200, r.text
    text = r.json()["results"][0]["text"]
    ids = http.post("/tokenize", json={"model": SMOL, "prompt": STORY, "add_special_tokens": False}).json()["tokens"]
    c = http.post("/v1/completions", json={"model": SMOL, "prompt": ids, "max_tokens": 24, "temperature": 0})
    assert c.status_code == 200, c.text
    assert text == c.json()["choices"][0]["text"] and text
    # The same through the `latest` alias, and a stop sequence cuts where the completion's does.
    assert http.post("/api/latest/generate", json=kobold_body()).json()["results"][0]["text"] == text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    cut = http.post("/api/v1/generate", json=kobold_body(stop_sequence=[stop])).json()["results"][0]["text"]
    assert cut == text[: text.index(stop)]


def test_kobold_stream_and_settings(http):
    whole = http.post("/api/v1/generate", json=kobold_body()).json()["results"][0]["text"]
    with http.stream("POST", "/api/extra/generate/stream", json=kobold_body()) as r:
        assert r.status_code == 200
        raw = "".join(r.iter_text())
    events = [e for e in raw.split("\n\n") if e.strip()]
    assert all(e.startswith("event: message\ndata: ") for e in events), raw
    tokens = [json.loads(e.split("data: ", 1)[1])["token"] for e in events]
    assert len(tokens) > 1 and "".join(tokens) == whole
    assert http.get("/api/v1/model").json() == {"result": f"aphro/{SMOL}"}
    assert http.get("/api/extra/version").json()["result"] == "KoboldCpp"
    assert http.get("/api/v1/info/version").json() == {"result": "1.2.4"}
    n = http.get("/api/latest/config/max_context_length").json()["value"]
    assert n == http.get("/api/v1/config/max_length").json()["value"] > 0


def test_kobold_tokencount_equals_tokenize(http):
    for prompt in [STORY, "", "naïve café ☕ <|im_start|>"]:
        n = http.post("/api/extra/tokencount", json={"prompt": prompt}).json()["value"]
        t = http.post("/tokenize", json={"model": SMOL, "prompt": prompt, "add_special_tokens": False}).json()
        assert n == t["count"], prompt


def test_kobold_check_and_abort_a_running_stream(http, server):
    key = "kai-test-abort"
    body = kobold_body(max_length=200, genkey=key, temperature=0.8, sampler_seed=1)
    got: list[str] = []
    done = threading.Event()

    def consume():
        with httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
            with c.stream("POST", f"{server}/api/extra/generate/stream", json=body) as r:
                for chunk in r.iter_text():
                    got.append(chunk)
        done.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    deadline = time.time() + 60
    so_far = ""
    while time.time() < deadline and not so_far:
        so_far = http.post("/api/extra/generate/check", json={"genkey": key}).json()["results"][0]["text"]
        time.sleep(0.05)
    assert so_far, "the generation never showed progress"
    assert http.get("/api/extra/generate/check", params={"genkey": key}).json()["results"][0]["text"].startswith(so_far)
    assert http.post("/api/extra/abort", json={"genkey": key}).json() == {"success": True}
    assert done.wait(30), "the stream did not end after the abort"
    tokens = [json.loads(e.split("data: ", 1)[1])["token"]
              for e in "".join(got).split("\n\n") if e.strip()]
    assert len(tokens) < 200
    assert "".join(tokens).startswith(so_far)
    # Finished: unknown to check and abort.
    assert http.post("/api/extra/generate/check", json={"genkey": key}).json() == {"results": [{"text": ""}]}
    assert http.post("/api/extra/abort", json={"genkey": key}).json() == {"success": False}


@pytest.mark.parametrize("extra,param", [
    ({"max_length": 600}, "max_length"),
    ({"top_a": 0.2}, "top_a"),
    ({"tfs": 0.9}, "tfs"),
    ({"typical": 0.5}, "typical"),
    ({"mirostat": 2}, "mirostat"),
    ({"rep_pen": 1.2, "rep_pen_range": 8}, "rep_pen_range"),
])
def test_kobold_refuses_what_it_cannot_honour(http, extra, param):
    r = http.post("/api/v1/generate", json=kobold_body(**extra))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    r = http.post("/api/v1/generate", json={"prompt": 5})
    assert r.status_code == 400


def test_reasoning_parser_output_is_a_thinking_block():
    """With `--reasoning-parser deepseek_r1` output without `</think>` is all reasoning: a
    `thinking` block (with a signature), streamed as thinking_delta + signature_delta."""
    with aphro_server("serve", str(DEFAULT_GGUF), "--served-model-name", SMOL, *SERVE_FLAGS,
                      "--reasoning-parser", "deepseek_r1") as base:
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120)
        kw = dict(model=SMOL, max_tokens=12, **GREEDY, messages=[{"role": "user", "content": "Hi"}])
        m = client.messages.create(**kw)
        [block] = m.content
        assert block.type == "thinking" and block.thinking and len(block.signature) == 32
        with client.messages.stream(**kw) as stream:
            deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
            streamed = stream.get_final_message()
        assert [b.thinking for b in streamed.content] == [block.thinking]
        assert deltas[-1] == "signature_delta" and set(deltas[:-1]) == {"thinking_delta"}
