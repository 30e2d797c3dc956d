"""Structured outputs against `aphro serve` through the official `openai` SDK: a Pydantic
model as `response_format` (the SDK's `parse` helper builds the strict JSON schema and parses
the answer back), vLLM's `structured_outputs` in `extra_body`, and the 400 a constraint that
cannot compile gets."""
from __future__ import annotations

import json

import openai
import pydantic
import pytest

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
