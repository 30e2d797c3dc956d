import pytest

import aphro
from conftest import DEFAULT_GGUF, golden

SMOLLM2 = golden("smollm2")


@pytest.fixture(scope="module")
def corpus_renderer(model):
    # The corpus has prompts longer than SmolLM2's 8192-token context (the reference
    # renders them without a length check).
    return aphro.Renderer(model, max_model_len=1 << 20)


def test_default_model_is_the_embedded_gguf(model):
    assert model.path == str(DEFAULT_GGUF)
    assert aphro.default_model_path() == str(DEFAULT_GGUF)
    assert model.vocab_size > 40000
    assert model.eos_token_ids
    assert "SmolLM2" in repr(model) or "smollm2" in repr(model).lower()


def test_model_none_means_default(renderer):
    r = aphro.Renderer()
    req = {"messages": [{"role": "user", "content": "hi"}]}
    assert r.render_chat(req)["token_ids"] == renderer.render_chat(req)["token_ids"]


@pytest.mark.parametrize(
    "case", [c for c in SMOLLM2 if c["kind"] == "chat"], ids=lambda c: c["id"]
)
def test_render_chat_matches_golden_corpus(corpus_renderer, case):
    out = corpus_renderer.render_chat(case["request"])
    assert out["token_ids"] == case["prompt_token_ids"]


@pytest.mark.parametrize(
    "case", [c for c in SMOLLM2 if c["kind"] == "completion"], ids=lambda c: c["id"]
)
def test_render_completion_matches_golden_corpus(corpus_renderer, case):
    if not case["prompt_token_ids"]:
        # The tokenizer gives nothing: vLLM refuses empty prompts, so must we.
        with pytest.raises(aphro.BadRequestError):
            corpus_renderer.render_completion(case["request"])
        return
    out = corpus_renderer.render_completion(case["request"])
    assert isinstance(out, list) and len(out) == 1
    assert out[0]["token_ids"] == case["prompt_token_ids"]


def test_render_chat_shape(renderer):
    out = renderer.render_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 7,
            "temperature": 0.0,
        },
        request_id="abc",
    )
    assert set(out) >= {"request_id", "token_ids", "sampling_params", "model", "parse_context"}
    assert out["request_id"].endswith("abc")
    assert out["sampling_params"]["max_tokens"] == 7
    assert out["sampling_params"]["temperature"] == 0.0
    assert all(isinstance(t, int) for t in out["token_ids"])


def test_render_completion_batch(renderer):
    out = renderer.render_completion({"prompt": ["a b", "c d e"], "max_tokens": 3})
    assert len(out) == 2
    assert out[0]["token_ids"] != out[1]["token_ids"]


def test_tokenize_detokenize(renderer):
    t = renderer.tokenize({"prompt": "Hello world", "return_token_strs": True})
    assert t["count"] == len(t["tokens"]) == len(t["token_strs"])
    assert t["max_model_len"] == renderer.max_model_len
    assert renderer.detokenize({"tokens": t["tokens"]})["prompt"] == "Hello world"
    # Shorthands: a str for tokenize, a list of ids for detokenize.
    assert renderer.tokenize("Hello world")["tokens"] == t["tokens"]
    assert renderer.detokenize(t["tokens"])["prompt"] == "Hello world"
    chat = renderer.tokenize({"messages": [{"role": "user", "content": "hi"}]})
    assert chat["tokens"] == renderer.render_chat({"messages": [{"role": "user", "content": "hi"}]})["token_ids"]


def test_module_helpers(model):
    ids = aphro.tokenize("The quick brown fox")
    assert ids == model.encode("The quick brown fox")
    assert aphro.detokenize(ids) == "The quick brown fox"
    assert model.decode(ids) == "The quick brown fox"
    chat = aphro.tokenize([{"role": "user", "content": "hi"}])
    assert chat == aphro.Renderer().render_chat({"messages": [{"role": "user", "content": "hi"}]})["token_ids"]


def test_tuple_and_nested_inputs(renderer):
    out = renderer.render_chat({"messages": ({"role": "user", "content": "hi"},)})
    assert out["token_ids"]


def test_chat_template_override(model):
    r = aphro.Renderer(model, chat_template="{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    out = r.render_chat({"messages": [{"role": "user", "content": "x"}]})
    assert aphro.detokenize(out["token_ids"]) == "[x]"


def test_other_model_dir(qwen3_dir):
    r = aphro.Renderer(qwen3_dir)
    out = r.render_chat({"messages": [{"role": "user", "content": "hi"}]})
    text = r.detokenize(out["token_ids"])["prompt"]
    assert "<|im_start|>user\nhi<|im_end|>" in text


def test_max_model_len_option(model):
    r = aphro.Renderer(model, max_model_len=16)
    assert r.max_model_len == 16
    with pytest.raises(aphro.BadRequestError) as e:
        r.render_chat({"messages": [{"role": "user", "content": "word " * 50}]})
    assert e.value.status == 400


def test_gil_released_threads(renderer):
    from concurrent.futures import ThreadPoolExecutor

    req = {"messages": [{"role": "user", "content": "hello " * 200}]}
    want = renderer.render_chat(req)["token_ids"]
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda _: renderer.render_chat(req)["token_ids"], range(16)))
    assert all(o == want for o in outs)
