import asyncio

import pytest

import aphro

CHAT = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 12,
    "temperature": 0.0,
}


@pytest.fixture(scope="module")
def engine(model):
    e = aphro.Engine(model, seed=0)
    yield e
    e.shutdown()


def test_generate_shape_and_determinism(engine, renderer):
    req = renderer.render_chat(CHAT)
    a = engine.generate(req)
    b = engine.generate(req)
    assert a["request_id"].startswith("generate-tokens-")
    ca, cb = a["choices"][0], b["choices"][0]
    assert ca["token_ids"] == cb["token_ids"]
    assert 1 <= len(ca["token_ids"]) <= 12
    assert ca["finish_reason"] in ("length", "stop")
    assert a["usage"]["prompt_tokens"] == len(req["token_ids"])
    assert a["usage"]["completion_tokens"] == len(ca["token_ids"])


def test_request_id_kwarg(engine):
    out = engine.generate(
        {"token_ids": aphro.tokenize("Hello"), "sampling_params": {"max_tokens": 2}},
        request_id="mine",
    )
    assert out["request_id"] == "generate-tokens-mine"


def test_stream_equals_full(engine, renderer):
    req = renderer.render_chat(CHAT)
    full = engine.generate(req)["choices"][0]["token_ids"]
    events = list(engine.generate_stream(req))
    ids = [t for ev in events for c in ev["choices"] for t in c.get("token_ids") or []]
    assert ids == full
    assert events[-1]["choices"][0]["finish_reason"] in ("length", "stop")


def test_seed_round_trip_in_process(engine, renderer, derenderer, model):
    """The seed's three calls chained in one process: render -> generate -> derender."""
    req = renderer.render_chat(CHAT)
    gen = engine.generate(req)
    resp = derenderer.derender_chat(gen, CHAT, prompt_token_ids=req["token_ids"])
    assert resp["object"] == "chat.completion"
    msg = resp["choices"][0]["message"]
    ids = gen["choices"][0]["token_ids"]
    want = model.decode([t for t in ids if t not in model.eos_token_ids], skip_special_tokens=True)
    assert msg["content"] == want
    assert msg["content"].strip()
    assert resp["usage"]["completion_tokens"] == len(ids)
    assert resp["usage"]["prompt_tokens"] == len(req["token_ids"])
    assert resp["choices"][0]["finish_reason"] == gen["choices"][0]["finish_reason"]


def test_streaming_round_trip(engine, renderer, derenderer):
    chat = {**CHAT, "stream": True}
    req = renderer.render_chat(chat)
    full = derenderer.derender_chat(engine.generate(req), CHAT, prompt_token_ids=req["token_ids"])
    s = derenderer.chat_stream(chat, prompt_token_ids=req["token_ids"])
    text = ""
    finish = None
    for ev in engine.generate_stream(req):
        chunk = s.push(ev)
        for c in chunk["choices"]:
            text += c["delta"].get("content") or ""
            finish = c.get("finish_reason") or finish
    assert text == full["choices"][0]["message"]["content"]
    assert finish == full["choices"][0]["finish_reason"]


def test_text_mode(engine, model):
    ids = aphro.tokenize("The sky is")
    out = engine.generate(
        {"token_ids": ids, "output_mode": "text", "sampling_params": {"max_tokens": 6, "temperature": 0}}
    )
    c = out["choices"][0]
    assert c["text"] == model.decode(c["token_ids"], skip_special_tokens=True)


def test_logprobs_for_rl(engine):
    ids = aphro.tokenize("1, 2, 3,")
    out = engine.generate(
        {"token_ids": ids, "sampling_params": {"max_tokens": 5, "logprobs": 2, "n": 2, "seed": 7}}
    )
    assert len(out["choices"]) == 2
    for c in out["choices"]:
        lp = c["logprobs"]["content"]
        assert len(lp) == len(c["token_ids"])
        assert all(isinstance(e["logprob"], float) and e["logprob"] <= 0 for e in lp)


def test_abort_stream(engine):
    ids = aphro.tokenize("Count slowly from one to one thousand:")
    stream = engine.generate_stream(
        {"token_ids": ids, "sampling_params": {"max_tokens": 500, "ignore_eos": True}}
    )
    first = next(stream)
    assert first["choices"]
    engine.abort(stream.request_id)
    rest = list(stream)
    finish = [c.get("finish_reason") for ev in rest for c in ev["choices"]]
    assert finish and finish[-1] == "abort"
    n = sum(len(c.get("token_ids") or []) for ev in [first, *rest] for c in ev["choices"])
    assert n < 500


def test_generate_errors(engine):
    with pytest.raises(aphro.BadRequestError) as ei:
        engine.generate({"token_ids": [], "sampling_params": {}})
    assert ei.value.param == "body.token_ids"
    assert ei.value.status == 400
    with pytest.raises(aphro.BadRequestError):
        engine.generate({"token_ids": [1, 2], "sampling_params": {"temperature": -3}})
    with pytest.raises(aphro.BadRequestError):
        engine.generate({"token_ids": [1] * (engine.max_model_len + 1), "sampling_params": {"max_tokens": 1}})


def test_engine_args_validation(model):
    with pytest.raises(TypeError, match="unexpected engine argument"):
        aphro.Engine(model, no_such_flag=1)
    with pytest.raises(ValueError):
        aphro.Engine(model, dtype="int3")


def test_data_parallel_engines_route_sessions_and_agree(model):
    one = aphro.Engine(model, seed=0, max_model_len=256, kv_cache_memory=16 << 20)
    two = aphro.Engine(model, seed=0, max_model_len=256, kv_cache_memory=16 << 20,
                       data_parallel_size=2)
    req = {"token_ids": aphro.tokenize("The capital of France is"),
           "sampling_params": {"max_tokens": 6, "temperature": 0}}
    want = one.generate(req)["choices"][0]["token_ids"]
    for turn in range(3):
        got = two.generate(req, session_id="conversation-1")["choices"][0]["token_ids"]
        assert got == want
    with pytest.raises(aphro.AphroError, match="data-parallel-size"):
        aphro.Engine(model, data_parallel_size=0)


def test_async_engine_concurrent(model):
    async def run():
        async with aphro.AsyncEngine(model, seed=0) as engine:
            req = {"token_ids": aphro.tokenize("Once upon a time"), "sampling_params": {"max_tokens": 8, "temperature": 0}}

            async def collect():
                ids = []
                async for ev in engine.generate(req):
                    for c in ev["choices"]:
                        ids += c.get("token_ids") or []
                return ids

            a, b, full = await asyncio.gather(collect(), collect(), engine.generate_full(req))
            return a, b, full

    a, b, full = asyncio.run(run())
    assert a == b == full["choices"][0]["token_ids"]
    assert len(a) == 8


def test_async_break_aborts(model):
    async def run():
        engine = aphro.AsyncEngine(model)
        req = {"token_ids": aphro.tokenize("Go on and on"), "sampling_params": {"max_tokens": 400, "ignore_eos": True}}
        got = 0
        async for ev in engine.generate(req):
            got += 1
            if got == 2:
                break
        # the engine is free again: a new request completes promptly
        out = await engine.generate_full({"token_ids": aphro.tokenize("Hi"), "sampling_params": {"max_tokens": 2}})
        engine.shutdown()
        return got, out

    got, out = asyncio.run(asyncio.wait_for(run(), timeout=120))
    assert got == 2
    assert len(out["choices"][0]["token_ids"]) <= 2
