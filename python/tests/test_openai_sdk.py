"""The integrated server (`aphro serve`, the Rust binary) driven by the official `openai`
SDK: stop strings end completions and chats where vLLM ends them, streamed or not."""
from __future__ import annotations

import re
import time

import httpx
import openai
import pytest

from conftest import SMOL as MODEL


@pytest.fixture(scope="module")
def client(integrated_server):
    return openai.OpenAI(base_url=f"{integrated_server}/v1", api_key="unused", timeout=60)


def _middle_stop(text: str) -> str:
    """A two-character stop string from the middle of `text`."""
    mid = len(text) // 2
    return text[mid : mid + 2]


PROMPT = "1, 2, 3, 4,"
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def test_completion_stop_strings(client):
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, **GREEDY)
    full = free.choices[0].text
    assert free.choices[0].finish_reason == "length"
    stop = _middle_stop(full)
    cut = full.index(stop)
    for spec in ([stop], stop):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, stop=spec, **GREEDY)
        assert r.choices[0].text == full[:cut]
        assert r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens < 20
    kept = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20, stop=[stop], temperature=0,
        extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == full[: cut + len(stop)]
    # Streamed: the concatenated deltas end at the stop string, and the stream ends there.
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20, stop=[stop], stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full[:cut]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_stop_strings(client):
    messages = [{"role": "user", "content": "Count from one to twenty in words."}]
    free = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, **GREEDY)
    content = free.choices[0].message.content
    stop = _middle_stop(content)
    cut = content.index(stop)
    r = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, stop=[stop], **GREEDY)
    assert r.choices[0].message.content == content[:cut]
    assert r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, stop=[stop], stream=True,
        stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in with_choices) == content[:cut]
    assert with_choices[-1].choices[0].finish_reason == "stop"
    assert [c.choices[0].finish_reason for c in with_choices[:-1]] == [None] * (len(with_choices) - 1)
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


# --- echo and prompt_logprobs, as vLLM's serving_completion / serving_chat return them ---


def _prompt_ids(client, prompt: str) -> list[int]:
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
                                  extra_body={"return_token_ids": True})
    return r.choices[0].prompt_token_ids


def test_completion_echo_text(client):
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, **GREEDY)
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, echo=True, **GREEDY)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    assert echoed.usage == plain.usage
    # A token prompt is echoed as its decoded text.
    ids = _prompt_ids(client, PROMPT)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, echo=True, **GREEDY)
    assert by_ids.choices[0].text == PROMPT + plain.choices[0].text
    # max_tokens=0: the prompt alone; vLLM still generates (and counts) one token.
    only = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True)
    assert only.choices[0].text == PROMPT
    assert only.usage.completion_tokens == 1
    # Without echo, max_tokens=0 stays a 400.
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    # Streamed: the first chunk carries the prompt, the concatenation is the same text.
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, echo=True, stream=True, **GREEDY))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert texts[0].startswith(PROMPT)
    assert "".join(texts) == echoed.choices[0].text


def test_completion_echo_logprobs(client):
    n_prompt = len(_prompt_ids(client, PROMPT))
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, logprobs=1, **GREEDY)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, logprobs=1, echo=True, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == n_prompt + 4
    assert "".join(lp.tokens) == r.choices[0].text
    # The first prompt position has no logprob; every other one has its candidates.
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(v, float) for v in lp.token_logprobs[1:])
    assert all(1 <= len(t) <= 2 for t in lp.top_logprobs[1:])
    # Offsets run through the prompt and on into the generated text.
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    # The generated positions are those of the plain request, moved past the prompt.
    assert lp.tokens[n_prompt:] == plain.choices[0].logprobs.tokens
    assert lp.token_logprobs[n_prompt:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-4)
    # The prompt positions are the prompt logprobs of the same prompt.
    pl = r.choices[0].prompt_logprobs
    ids = _prompt_ids(client, PROMPT)
    assert len(pl) == n_prompt and pl[0] is None
    for i in range(1, n_prompt):
        assert lp.token_logprobs[i] == pytest.approx(pl[i][str(ids[i])]["logprob"])
    # Streamed, the same positions come back across the chunks.
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, logprobs=1, echo=True, stream=True, **GREEDY))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert sum((s.tokens for s in streamed), []) == lp.tokens
    assert sum((s.text_offset for s in streamed), []) == lp.text_offset
    # max_tokens=0 with logprobs: only the prompt positions.
    only = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, logprobs=1, echo=True)
    assert only.choices[0].logprobs.tokens == lp.tokens[:n_prompt]


def test_prompt_logprobs_match_decoding(client):
    """Each prompt position's logprob is the one the model gives that token when it is
    generated after the prefix: prefill and decode agree."""
    ids = _prompt_ids(client, PROMPT)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 3})
    pl = r.choices[0].prompt_logprobs
    assert len(pl) == len(ids) and pl[0] is None
    for i in range(1, len(ids)):
        entry = pl[i]
        assert str(ids[i]) in entry
        assert 1 <= len(entry) <= 4  # the prompt token and the top 3
        # The top 3 candidates, one of which may be the prompt token itself.
        assert {v["rank"] for v in entry.values()} >= {1, 2, 3}
    for i in (2, len(ids) - 1):
        step = client.completions.create(model=MODEL, prompt=ids[:i], max_tokens=1, temperature=0,
                                         logprobs=20)
        want = pl[i][str(ids[i])]
        candidates = step.choices[0].logprobs.top_logprobs[0]
        assert want["decoded_token"] in candidates, (i, want, candidates)
        assert candidates[want["decoded_token"]] == pytest.approx(want["logprob"], abs=2e-3)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
        extra_body={"prompt_logprobs": 0})
    assert len(chat.prompt_logprobs) == chat.usage.prompt_tokens
    assert chat.prompt_logprobs[0] is None
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, stream=True,
                                  extra_body={"prompt_logprobs": 1})


def test_chat_echo(client):
    messages = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hello"}]
    body = {"add_generation_prompt": False, "continue_final_message": True, "echo": True,
            "ignore_eos": True}
    plain = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3, temperature=0,
        extra_body={k: v for k, v in body.items() if k != "echo"})
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3,
                                       temperature=0, extra_body=body)
    assert r.choices[0].message.content == "Hello" + plain.choices[0].message.content
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3, temperature=0, stream=True, extra_body=body))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    assert deltas[:2] == ["", "Hello"]
    assert "".join(d or "" for d in deltas) == r.choices[0].message.content
    # The last message is the user's: nothing to echo with a generation prompt.
    q = client.chat.completions.create(
        model=MODEL, messages=messages[:1], max_tokens=3, temperature=0,
        extra_body={"echo": True, "ignore_eos": True})
    q_plain = client.chat.completions.create(
        model=MODEL, messages=messages[:1], max_tokens=3, temperature=0,
        extra_body={"ignore_eos": True})
    assert q.choices[0].message.content == q_plain.choices[0].message.content


# --- the 400s vLLM gives where a server must not guess ---


def _bad(call, match: str, param: str | None = "unset"):
    with pytest.raises(openai.BadRequestError, match=match) as ei:
        call()
    body = ei.value.body
    if param != "unset":
        assert body["param"] == param, body
    return body


def test_requests_vllm_refuses(client):
    user = {"role": "user", "content": "hi"}
    chat = client.chat.completions.create
    _bad(lambda: chat(model=MODEL, messages=[{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "hologram", "data": "x"}]}], max_tokens=2),
        "Unsupported chat content part type: 'hologram'", "type")
    _bad(lambda: chat(model=MODEL, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}], max_tokens=2),
        "is not a multimodal model")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    _bad(lambda: chat(model=MODEL, messages=[user], tools=[tool], max_tokens=2),
         '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser')
    _bad(lambda: chat(model=MODEL, messages=[user], tools=[tool], tool_choice="required",
                      max_tokens=2),
         'tool_choice="required" requires --tool-call-parser')
    # tool_choice "none" renders without a parser, as in vLLM.
    assert chat(model=MODEL, messages=[user], tools=[tool], tool_choice="none",
                max_tokens=2).choices[0].message.content is not None
    # An empty list renders when the template copes with one (SmolLM2's loops over nothing),
    # as in vLLM; a template that fails on it gets a 400 naming `messages` (core tests).
    assert chat(model=MODEL, messages=[], max_tokens=2).usage.prompt_tokens > 0
    # Structural errors name the field and the type expected, as pydantic does.
    body = _bad(lambda: chat(model=MODEL, messages=[user], max_tokens=2,
                             extra_body={"temperature": "hot"}),
                "Input should be a valid number", "body.temperature")
    assert body["type"] == "Bad Request"
    _bad(lambda: chat(model=MODEL, messages=[user], max_tokens=2, extra_body={"session_id": 123}),
         "Input should be a valid string", "body.session_id")
    _bad(lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=2,
                                           extra_body={"stop_token_ids": [1, "x"]}),
         "valid integer", "body.stop_token_ids.1")


def test_validator_errors_are_vllms(client):
    """Checks vLLM runs in its request validators: a BadRequestError whose message carries
    the ` (parameter=...)` suffix, with that parameter."""
    def _bad(call, match, param):
        # The message itself, anchored: the exception's text wraps the whole body.
        with pytest.raises(openai.BadRequestError) as ei:
            call()
        body = ei.value.body
        assert re.search(match, body["message"]), body
        assert body["param"] == param, body
        return body

    user = {"role": "user", "content": "hi"}
    chat = client.chat.completions.create
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = _bad(lambda: chat(model=MODEL, messages=[user], tools=[tool], max_tokens=2,
                             tool_choice={"type": "function", "function": {"name": "g"}}),
                r"does not match any of the specified `tools` \(parameter=tool_choice\)$",
                "tool_choice")
    assert body["type"] == "BadRequestError"
    _bad(lambda: chat(model=MODEL, messages=[user], max_tokens=2, tool_choice="required"),
         r"When using `tool_choice`, `tools` must be set\. \(parameter=tool_choice\)$", "tool_choice")
    _bad(lambda: chat(model=MODEL, messages=[user], max_tokens=2, top_logprobs=2),
         r"`logprobs` must be set to true\. \(parameter=top_logprobs\)$", "top_logprobs")
    _bad(lambda: chat(model=MODEL, messages=[user], max_tokens=2,
                      stream_options={"include_usage": True}),
         r"stream=True`\. \(parameter=stream_options\)$", "stream_options")
    # continue_final_message: an explicit add_generation_prompt is the validator's refusal,
    # the default one transformers'; with it off the last message is continued.
    assistant = [user, {"role": "assistant", "content": "Hello"}]
    _bad(lambda: chat(model=MODEL, messages=assistant, max_tokens=2,
                      extra_body={"continue_final_message": True, "add_generation_prompt": True}),
         "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", None)
    _bad(lambda: chat(model=MODEL, messages=assistant, max_tokens=2,
                      extra_body={"continue_final_message": True}),
         "continue_final_message and add_generation_prompt are not compatible", None)
    assert chat(model=MODEL, messages=assistant, max_tokens=2, extra_body={
        "continue_final_message": True, "add_generation_prompt": False}).choices
    complete = client.completions.create
    _bad(lambda: complete(model=MODEL, prompt="", max_tokens=2),
         r"Either prompt or prompt_embeds must be provided and non-empty\. \(parameter=prompt\)$",
         "prompt")
    _bad(lambda: complete(model=MODEL, prompt=[], max_tokens=2),
         r"You must pass at least one prompt \(parameter=prompt\)$", "prompt")


def test_suffix_and_truncation(client):
    complete = client.completions.create
    _bad(lambda: complete(model=MODEL, prompt="def f(", suffix="):", max_tokens=2),
         "suffix is only supported for models with FIM completion rendering", "suffix")
    _bad(lambda: complete(model=MODEL, prompt="def f(", suffix="):", echo=True, max_tokens=2),
         "Echo is unsupported with suffix.", "suffix")
    max_len = client.models.retrieve(MODEL).model_extra["max_model_len"]
    _bad(lambda: complete(model=MODEL, prompt="hi", max_tokens=2,
                          extra_body={"truncate_prompt_tokens": max_len + 1}),
         f"truncate_prompt_tokens={max_len + 1} cannot be greater than max_model_len = {max_len}",
         "truncate_prompt_tokens")
    # -1 keeps as much as fits while leaving one token to generate.
    long = "one two three " * max_len
    r = complete(model=MODEL, prompt=long, max_tokens=1, extra_body={"truncate_prompt_tokens": -1})
    assert r.usage.prompt_tokens == max_len - 1
    assert r.usage.completion_tokens == 1


def _metric(client, name: str) -> float:
    text = httpx.get(str(client.base_url).removesuffix("/v1/") + "/metrics").text
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{"))


def test_cache_salt(client):
    _bad(lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=1,
                                           extra_body={"cache_salt": "a/b"}),
         "Parameter 'cache_salt' must be at most 128 characters", "cache_salt")
    _bad(lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=1,
                                           extra_body={"cache_salt": ""}),
         "must be a non-empty string", "cache_salt")
    prompt = "The quick brown fox jumps over the lazy dog. " * 8  # several full KV blocks

    def hits(salt):
        done = _metric(client, "vllm:request_success_total")
        before = _metric(client, "vllm:prefix_cache_hits_total")
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                  extra_body={"cache_salt": salt})
        deadline = time.time() + 30
        # A request's metrics land just after its response.
        while _metric(client, "vllm:request_success_total") == done:
            assert time.time() < deadline, "request metrics never arrived"
            time.sleep(0.02)
        return _metric(client, "vllm:prefix_cache_hits_total") - before

    hits("tenant-a")
    assert hits("tenant-a") > 0          # same salt: the prompt's blocks are reused
    assert hits("tenant-b") == 0         # another tenant's salt: nothing shared


def test_truncation_side(client):
    ids = _prompt_ids(client, PROMPT)
    assert len(ids) > 3

    def kept(side):
        # A token prompt is echoed as its (truncated) ids decoded, as vLLM detokenizes it
        # after truncation.
        body = {"truncate_prompt_tokens": 3}
        if side:
            body["truncation_side"] = side
        r = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True,
                                      extra_body=body)
        assert r.usage.prompt_tokens == 3
        return r.choices[0].text

    assert kept(None) == kept("left") != kept("right")
    assert PROMPT.startswith(kept("right")) and PROMPT.endswith(kept("left"))
    _bad(lambda: client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1,
                                           extra_body={"truncation_side": "middle"}),
         "`truncation_side` must be either 'left' or 'right'.", "truncation_side")
