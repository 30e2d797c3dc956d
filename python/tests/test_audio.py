"""`aphro serve` on Whisper tiny.en (a speech model) driven by the official `openai` SDK:
`client.audio.transcriptions.create` for json, text, verbose_json, srt and streaming, WAV,
FLAC and MP3 uploads, and `aphro.Transcriber` in process. Transcripts are compared with
faster-whisper's greedy reference (`testdata/audio/transcripts.jsonl`), whitespace-normalized."""
from __future__ import annotations

import json

import openai
import pytest

import aphro
from conftest import ASSETS, REPO, aphro_server

MODEL = "whisper-tiny.en"
WHISPER = ASSETS / "models" / "whisper-tiny.en"
AUDIO = REPO / "testdata" / "audio"


def _reference(case_id: str) -> str:
    with open(AUDIO / "transcripts.jsonl", encoding="utf-8") as f:
        for line in f:
            case = json.loads(line)
            if case["id"] == case_id:
                return _norm(case["reference"]["text"])
    raise KeyError(case_id)


def _norm(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def client():
    if not (WHISPER / "model.bin").is_file():
        pytest.fail(f"{WHISPER} missing: run scripts/fetch_assets.py")
    with aphro_server("serve", str(WHISPER), "--served-model-name", MODEL) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=120)


def test_json_text_verbose_and_srt(client):
    want = _reference("a01_hello_us")
    path = AUDIO / "a01_hello_us.wav"
    with open(path, "rb") as f:
        r = client.audio.transcriptions.create(model=MODEL, file=f)
    assert _norm(r.text) == want
    with open(path, "rb") as f:
        text = client.audio.transcriptions.create(model=MODEL, file=f, response_format="text")
    assert isinstance(text, str) and _norm(text) == want
    with open(path, "rb") as f:
        v = client.audio.transcriptions.create(
            model=MODEL, file=f, response_format="verbose_json",
            timestamp_granularities=["segment"],
        )
    assert v.language == "en"
    assert abs(v.duration - 4.140437) < 1e-3
    assert _norm(v.text) == want
    assert v.segments and v.segments[0].start == 0.0
    with open(path, "rb") as f:
        srt = client.audio.transcriptions.create(model=MODEL, file=f, response_format="srt")
    lines = srt.splitlines()
    assert lines[0] == "1" and lines[1].startswith("00:00:00,000 --> ")
    assert _norm(lines[2]) == want


def test_streaming(client):
    with open(AUDIO / "a01_hello_us.wav", "rb") as f:
        events = list(client.audio.transcriptions.create(model=MODEL, file=f, stream=True))
    assert events, "no events"
    text = "".join(
        e.choices[0]["delta"]["content"] if isinstance(e.choices[0], dict)
        else e.choices[0].delta.content
        for e in events if getattr(e, "choices", None)
    )
    assert _norm(text) == _reference("a01_hello_us")
    # OpenAI's own event fields, as its SDK's users read them.
    deltas = "".join(e.delta for e in events if getattr(e, "type", None) == "transcript.text.delta")
    assert deltas == text
    done = [e for e in events if getattr(e, "type", None) == "transcript.text.done"]
    assert len(done) == 1 and _norm(done[0].text) == _reference("a01_hello_us")


def test_flac_mp3_and_opus_uploads(client):
    with open(AUDIO / "a01_hello_us.flac", "rb") as f:
        r = client.audio.transcriptions.create(model=MODEL, file=f)
    assert _norm(r.text) == _reference("a01_hello_us@flac")
    with open(AUDIO / "a04_slow_female.mp3", "rb") as f:
        r = client.audio.transcriptions.create(model=MODEL, file=f)
    # Another MP3 decoder than PyAV's: equal sample count, close but not bit-equal samples; the
    # transcript is faster-whisper's on the MP3 or on the lossless original.
    assert _norm(r.text) in {_reference("a04_slow_female@mp3"), _reference("a04_slow_female")}
    # Ogg Opus (lossy, made from a10's WAV): the WAV's transcript.
    with open(AUDIO / "a10_yes.opus", "rb") as f:
        r = client.audio.transcriptions.create(model=MODEL, file=f)
    assert _norm(r.text) == _reference("a10_yes")


def test_bad_upload_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model=MODEL, file=("notes.wav", b"not audio"))
    assert "Invalid or unsupported audio file." in str(e.value)


def _option_goldens():
    with open(AUDIO / "option_goldens.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_decoding_options_over_http(client):
    """`hotwords` and the penalties sent as extra form fields reach the decoder: the text
    equals faster-whisper's with the same options; a bad value is vLLM's 400."""
    for case in _option_goldens():
        options = case["options"]
        if "initial_prompt" in options:
            options = {**options, "prompt": options["initial_prompt"]}
            del options["initial_prompt"]
        with open(AUDIO / case["clip"], "rb") as f:
            got = client.audio.transcriptions.create(model=MODEL, file=f, extra_body=options)
        assert _norm(got.text) == _norm(case["text"]), case["options"]
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(
            model=MODEL,
            file=("yes.wav", (AUDIO / "a10_yes.wav").read_bytes()),
            extra_body={"top_p": 0},
        )
    assert "top_p must be in (0, 1], got 0.0." in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(
            model=MODEL,
            file=("yes.wav", (AUDIO / "a10_yes.wav").read_bytes()),
            response_format="verbose_json",
            timestamp_granularities=["word"],
        )
    assert "timestamp_granularities[]=word is not supported" in str(e.value)
    # Fields Whisper cannot honour are refused by name rather than dropped.
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.translations.create(
            model=MODEL,
            file=("yes.wav", (AUDIO / "a10_yes.wav").read_bytes()),
            extra_body={"to_language": "fr"},
        )
    assert "to_language 'fr' is not supported" in str(e.value)


def test_transcriber_in_process():
    if not (WHISPER / "model.bin").is_file():
        pytest.fail(f"{WHISPER} missing: run scripts/fetch_assets.py")
    with pytest.raises(ValueError, match="unknown device"):
        aphro.Transcriber(str(WHISPER), device="tpu")
    t = aphro.Transcriber(str(WHISPER), num_threads=2, device="cpu")
    out = t.transcribe(str(AUDIO / "a10_yes.wav"))
    assert _norm(out["text"]) == _reference("a10_yes")
    assert out["usage"] == {"type": "duration", "seconds": 2}
    data = (AUDIO / "a10_yes.wav").read_bytes()
    assert _norm(t.transcribe(data, response_format="text")) == _reference("a10_yes")
    with pytest.raises(aphro.BadRequestError):
        t.transcribe(b"")
    # Decoding options, against faster-whisper's goldens.
    for case in _option_goldens():
        o = case["options"]
        out = t.transcribe(
            str(AUDIO / case["clip"]),
            hotwords=o.get("hotwords"),
            prompt=o.get("initial_prompt"),
            repetition_penalty=o.get("repetition_penalty", 1.0),
        )
        assert _norm(out["text"]) == _norm(case["text"]), o
    # Sampling with top_k=1 keeps only the best token: the greedy transcript.
    greedy = t.transcribe(str(AUDIO / "clips" / "a04_slow_female.wav"))["text"]
    assert t.transcribe(
        str(AUDIO / "clips" / "a04_slow_female.wav"), temperature=1.0, seed=5, top_k=1
    )["text"] == greedy
    with pytest.raises(aphro.BadRequestError, match="min_p must be in"):
        t.transcribe(data, temperature=1.0, min_p=2.0)


def test_multilingual_model_detects_and_translates():
    """whisper-base: the language detected as faster-whisper does, and the translate task's
    tokens, against testdata/audio/base_goldens.jsonl."""
    base = WHISPER.parent / "whisper-base"
    if not (base / "model.bin").is_file():
        pytest.fail(f"{base} missing: run scripts/fetch_assets.py")
    goldens = [json.loads(l) for l in (AUDIO / "base_goldens.jsonl").read_text().splitlines()]
    t = aphro.Transcriber(str(base), num_threads=2)
    for task in ("transcribe", "translate"):
        want = next(g for g in goldens if g["clip"] == "clips/a02_meeting_gb.wav" and g["task"] == task)
        out = t.transcribe(str(AUDIO / want["clip"]), response_format="verbose_json", task=task)
        assert out["language"] == want["language"]
        assert [s["tokens"] for s in out["segments"]] == [s["tokens"] for s in want["segments"]], task
    with pytest.raises(aphro.BadRequestError, match="task must be"):
        t.transcribe(str(AUDIO / "a10_yes.wav"), task="summarize")
