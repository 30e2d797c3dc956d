import pytest

import aphro

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def test_parse_tool_call():
    out = aphro.parse(
        'Sure. <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
        tool_call_parser="hermes",
        tools=TOOLS,
    )
    assert out["content"] == "Sure. "
    assert out["tool_calls"][0]["name"] == "f"
    assert out["tool_calls"][0]["arguments"] == '{"a": 1}'
    assert out["tool_calls"][0]["id"]
    assert out["finish_reason"] == "tool_calls"


def test_parse_reasoning():
    out = aphro.parse("<think>hmm</think>The answer.", reasoning_parser="qwen3")
    assert out["reasoning"] == "hmm"
    assert out["content"] == "The answer."
    assert out["tool_calls"] == []
    assert out["finish_reason"] == "stop"


def test_parse_plain_text():
    out = aphro.parse("just text")
    assert out == {"content": "just text", "reasoning": None, "tool_calls": [], "finish_reason": "stop"}


def test_named_tool_choice_finish_reason():
    out = aphro.parse(
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        tool_call_parser="hermes",
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "f"}},
    )
    assert out["finish_reason"] == "stop"


def test_streaming_parser_equals_one_shot():
    text = '<think>a b c</think>Hi <tool_call>{"name": "f", "arguments": {"x": [1, 2]}}</tool_call>'
    whole = aphro.parse(text, tool_call_parser="hermes", reasoning_parser="qwen3", tools=TOOLS)
    p = aphro.Parser(tool_call_parser="hermes", reasoning_parser="qwen3", tools=TOOLS)
    content, reasoning, args, names = "", "", {}, {}
    deltas = [p.push(text[i : i + 3]) for i in range(0, len(text), 3)] + [p.finish()]
    for d in deltas:
        content += d.get("content") or ""
        reasoning += d.get("reasoning") or ""
        for tc in d.get("tool_calls", []):
            args[tc["index"]] = args.get(tc["index"], "") + tc["arguments"]
            if "name" in tc:
                names[tc["index"]] = tc["name"]
    assert content == whole["content"]
    assert reasoning == whole["reasoning"]
    assert [args[0]] == [c["arguments"] for c in whole["tool_calls"]]
    assert names[0] == "f"


def test_unknown_parser():
    with pytest.raises(ValueError):
        aphro.parse("x", tool_call_parser="no-such-parser")
    with pytest.raises(ValueError):
        aphro.parse("x", tool_choice="sometimes")
