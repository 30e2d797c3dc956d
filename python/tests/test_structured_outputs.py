"""Structured outputs against `aphro serve` through the official `openai` SDK: a Pydantic
model as `response_format` (the SDK's `parse` helper builds the strict JSON schema and parses
the answer back), vLLM's `structured_outputs` in `extra_body`, `tool_choice` "required" and a
named tool through a hermes tool parser, and the 400 a constraint that cannot compile gets."""
from __future__ import annotations

import json

import openai
import pydantic
import pytest

from conftest import DEFAULT_GGUF, SERVE_FLAGS, aphro_server
from conftest import SMOL as MODEL


@pytest.fixture(scope="module")
def client(integrated_server):
    return openai.OpenAI(base_url=f"{integrated_server}/v1", api_key="unused", timeout=120)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    population_millions: int = pydantic.Field(ge=0, le=40)


def _parse(client):
    # openai >= 1.92 has `chat.completions.parse`; older releases only the beta path.
    completions = client.chat.completions
    return getattr(completions, "parse", None) or client.beta.chat.completions.parse


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_pydantic_response_format_parses(client, temperature):
    completion = _parse(client)(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        response_format=City,
        temperature=temperature,
        seed=1,
        max_tokens=120,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, City), choice.message
    # The text is the same object the SDK parsed.
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


def test_structured_outputs_in_extra_body(client):
    chat = client.chat.completions.create
    user = [{"role": "user", "content": "Is the sky blue?"}]
    answer = chat(model=MODEL, messages=user, max_tokens=10, temperature=0,
                  extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert answer.choices[0].message.content in ("yes", "no")
    phone = client.completions.create(model=MODEL, prompt="Call me at", max_tokens=20, temperature=0,
                                      extra_body={"structured_outputs": {"regex": " [0-9]{3}-[0-9]{4}"}})
    text = phone.choices[0].text
    assert len(text) == 9 and text[4] == "-" and (text[1:4] + text[5:]).isdigit(), text
    obj = chat(model=MODEL, messages=[{"role": "user", "content": 'Reply with exactly this JSON: {"ok": true}'}],
               max_tokens=60, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    # Streaming carries the same constrained text.
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(
        model=MODEL, messages=user, max_tokens=10, temperature=0, stream=True,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}}) if c.choices)
    assert streamed == answer.choices[0].message.content


def test_constraints_that_cannot_compile_are_400s(client):
    chat = client.chat.completions.create
    user = [{"role": "user", "content": "hi"}]
    for so, needle in [({"regex": "(unclosed"}, "Grammar error"),
                       ({"json": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}, "Grammar error"),
                       ({"grammar": "root ::= undefined"}, "never defined"),
                       ({"regex": "a" * (1 << 20)}, "accepts at most")]:
        with pytest.raises(openai.BadRequestError) as ei:
            chat(model=MODEL, messages=user, max_tokens=5, extra_body={"structured_outputs": so})
        body = ei.value.body
        assert needle in body["message"] and body["param"] == "structured_outputs", body
    # Still serving.
    ok = chat(model=MODEL, messages=user, max_tokens=5, extra_body={"structured_outputs": {"choice": ["fine"]}})
    assert ok.choices[0].message.content == "fine"


@pytest.fixture(scope="module")
def tool_client():
    with aphro_server("serve", str(DEFAULT_GGUF), "--served-model-name", MODEL, *SERVE_FLAGS,
                      "--enable-auto-tool-choice", "--tool-call-parser", "hermes") as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=120)


class Forecast(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    days: int = pydantic.Field(ge=1, le=7)


TOOLS = [
    openai.pydantic_function_tool(Forecast, name="get_forecast", description="Weather forecast for a city"),
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a zone", "strict": True,
     "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 30}},
                    "required": ["tz"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tool_choice_forces_a_call_of_an_offered_tool(tool_client, tool_choice):
    for prompt in ["Tell me a joke.", "Weather in Rome for three days?"]:
        kwargs = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], tools=TOOLS,
                      tool_choice=tool_choice, max_tokens=100, temperature=0, parallel_tool_calls=False)
        reply = tool_client.chat.completions.create(**kwargs)
        calls = reply.choices[0].message.tool_calls
        assert calls and len(calls) == 1, reply
        call = calls[0].function
        if isinstance(tool_choice, dict):
            assert call.name == "get_time", call
        args = json.loads(call.arguments)
        if call.name == "get_forecast":
            Forecast.model_validate(args)
        else:
            assert call.name == "get_time" and isinstance(args["tz"], str) and set(args) == {"tz"}, call
        # Streaming gives the same call.
        name, arguments = None, ""
        for chunk in tool_client.chat.completions.create(stream=True, **kwargs):
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                name = tc.function.name or name
                arguments += tc.function.arguments or ""
        assert (name, json.loads(arguments)) == (call.name, args)
