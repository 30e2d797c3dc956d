import pickle

import pytest

import aphro


def test_hierarchy():
    for cls in (aphro.BadRequestError, aphro.NotFoundError, aphro.InternalServerError):
        assert issubclass(cls, aphro.AphroError)
        assert issubclass(cls, Exception)


def test_missing_messages_is_structural_400(renderer):
    with pytest.raises(aphro.BadRequestError) as ei:
        renderer.render_chat({"model": "m"})
    e = ei.value
    assert e.status == 400 == e.code
    assert e.type == "Bad Request"
    assert e.param == "body.messages"
    assert str(e) == e.message
    assert e.message.startswith("1 validation error:")
    body = e.to_dict()["error"]
    assert body == {"message": e.message, "type": "Bad Request", "param": "body.messages", "code": 400}


def test_semantic_400_has_vllm_suffix(renderer):
    with pytest.raises(aphro.BadRequestError) as ei:
        renderer.render_chat(
            {"messages": [{"role": "user", "content": "x"}], "temperature": -1}
        )
    e = ei.value
    assert e.type == "BadRequestError"
    assert e.param == "temperature"
    assert "(parameter=temperature, value=-1" in e.message


def test_prompt_too_long(model):
    r = aphro.Renderer(model, max_model_len=8)
    with pytest.raises(aphro.BadRequestError) as ei:
        r.render_completion({"prompt": "one two three four five six seven eight nine ten"})
    assert "exceeds model's maximum context length (8)" in ei.value.message


def test_unknown_served_model_is_404(model):
    r = aphro.Renderer(model, served_model_name="smol")
    r.render_chat({"model": "smol", "messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(aphro.NotFoundError) as ei:
        r.render_chat({"model": "other", "messages": [{"role": "user", "content": "x"}]})
    assert ei.value.status == 404
    assert ei.value.param == "model"


def test_tokenize_validation_names_the_field(renderer):
    with pytest.raises(aphro.BadRequestError) as ei:
        renderer.detokenize({"tokens": "abc"})
    assert ei.value.type == "Bad Request"
    assert ei.value.param == "body.tokens"


def test_derender_bad_body(derenderer):
    with pytest.raises(aphro.BadRequestError) as ei:
        derenderer.derender_chat({"generate_response": {"choices": []}})
    assert ei.value.status == 400


def test_python_type_errors_stay_type_errors(renderer):
    with pytest.raises(TypeError):
        renderer.render_chat({"messages": [{"role": "user", "content": object()}]})
    with pytest.raises(TypeError):
        renderer.render_chat({1: "x"})
    with pytest.raises(ValueError):
        renderer.render_chat({"messages": [], "temperature": float("nan")})


def test_model_load_error():
    with pytest.raises(aphro.AphroError):
        aphro.Renderer("/nonexistent/model/dir")


def test_pickle_keeps_fields():
    e = aphro.BadRequestError("boom", type="Bad Request", param="body.x")
    f = pickle.loads(pickle.dumps(e))
    assert (type(f), f.message, f.status, f.type, f.param) == (
        aphro.BadRequestError,
        "boom",
        400,
        "Bad Request",
        "body.x",
    )


def test_self_referencing_request_does_not_crash(renderer):
    a = []
    a.append(a)
    with pytest.raises(ValueError):
        renderer.render_chat({"messages": a})
