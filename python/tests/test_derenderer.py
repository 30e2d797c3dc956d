import pytest

import aphro


def gen_response(ids, finish="stop", request_id="gen-1"):
    return {
        "request_id": request_id,
        "choices": [{"index": 0, "token_ids": ids, "finish_reason": finish}],
    }


def test_derender_chat_plain(model, derenderer):
    ids = model.encode("Hello there, friend.", add_special_tokens=False)
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    out = derenderer.derender_chat(gen_response(ids), req)
    assert out["object"] == "chat.completion"
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant"
    assert msg["content"] == "Hello there, friend."
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == len(ids)


def test_derender_chat_wire_body_equals_kwargs(model, derenderer):
    ids = model.encode("Same either way", add_special_tokens=False)
    req = {"messages": [{"role": "user", "content": "hi"}]}
    a = derenderer.derender_chat(gen_response(ids), req, prompt_tokens=5)
    b = derenderer.derender_chat(
        {"generate_response": gen_response(ids), "chat_request": req, "prompt_tokens": 5}
    )
    for x in (a, b):
        x.pop("created")
    assert a == b
    assert a["usage"]["prompt_tokens"] == 5


def test_derender_chat_tool_calls(qwen3_dir):
    d = aphro.Derenderer(qwen3_dir, tool_call_parser="hermes", enable_auto_tool_choice=True)
    r = aphro.Renderer(qwen3_dir)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = r.tokenize({"prompt": text, "add_special_tokens": False})["tokens"]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    req = {"messages": [{"role": "user", "content": "weather?"}], "tools": tools}
    out = d.derender_chat(gen_response(ids), req)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert call["function"]["arguments"] == '{"city": "Paris"}'


def test_chat_stream_equals_full(model, derenderer):
    text = "One, two, three. Four five six!"
    ids = model.encode(text, add_special_tokens=False)
    req = {"messages": [{"role": "user", "content": "count"}], "stream": True}
    s = derenderer.chat_stream(req, prompt_token_ids=[1, 2, 3])
    pieces = []
    for i in range(0, len(ids), 2):
        last = i + 2 >= len(ids)
        chunk = {
            "request_id": "gen-7",
            "choices": [
                {
                    "index": 0,
                    "token_ids": ids[i : i + 2],
                    "finish_reason": "stop" if last else None,
                }
            ],
        }
        out = s.push(chunk)
        assert out["object"] == "chat.completion.chunk"
        assert out["id"] == "gen-7"
        delta = out["choices"][0]["delta"]
        pieces.append(delta.get("content") or "")
    assert "".join(pieces) == text
    assert s.tokens == len(ids)
    assert out["choices"][0]["finish_reason"] == "stop"


def test_completion_derender_and_stream(model, derenderer):
    text = " and then there were none"
    ids = model.encode(text, add_special_tokens=False)
    out = derenderer.derender_completion(gen_response(ids, finish="length"), {"prompt": "x"})
    assert out["object"] == "text_completion"
    assert out["choices"][0]["text"] == text
    assert out["choices"][0]["finish_reason"] == "length"
    # a list of responses = one per prompt
    two = derenderer.derender_completion([gen_response(ids), gen_response(ids, request_id="g2")])
    assert [c["text"] for c in two["choices"]] == [text, text]
    s = derenderer.completion_stream({"prompt": "x"})
    got = ""
    for i, t in enumerate(ids):
        c = s.push({"request_id": "g", "choices": [{"index": 0, "token_ids": [t]}]})
        got += c["choices"][0]["text"]
    assert got == text


def test_stateless_stream_wire_form(model, derenderer):
    ids = model.encode("stateless streaming", add_special_tokens=False)
    state = None
    text = ""
    for t in ids:
        body = {
            "stream": True,
            "generate_chunk": {"request_id": "g", "choices": [{"index": 0, "token_ids": [t]}]},
            "chat_request": {"messages": [{"role": "user", "content": "x"}]},
        }
        if state is not None:
            body["stream_state"] = state
        out = derenderer.derender_chat(body)
        state = out["stream_state"]
        text += out["chunk"]["choices"][0]["delta"].get("content") or ""
    assert text == "stateless streaming"


def test_unknown_parser_is_value_error(model):
    with pytest.raises(ValueError, match="nope"):
        aphro.Derenderer(model, tool_call_parser="nope")
