#!/usr/bin/env python3
"""Goldens for a multilingual Whisper (openai/whisper-base in CTranslate2 format, the
`whisper-base` asset), made with faster-whisper 1.2.1: language detection, transcription and
the translate task.

Run with a Python that has `faster-whisper==1.2.1` (scripts/bench_whisper.sh builds one):
    python scripts/make_whisper_base_goldens.py --model .assets/models/whisper-base
It writes testdata/audio/base_goldens.jsonl: per case the clip, the task, the detected
language and its probability, and faster-whisper's text and segments (greedy, with
timestamps, previous-text conditioning, float32 compute).
"""
import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIPS = ROOT / "testdata/audio/clips"
# The translate task on a short clip, a two-sentence one and the one spanning two windows.
TRANSLATE = ["a01_hello_us", "a02_meeting_gb", "a09_long_chunking"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=str(ROOT / "testdata/audio/base_goldens.jsonl"))
    a = ap.parse_args()
    import faster_whisper
    from faster_whisper import WhisperModel, decode_audio

    model = WhisperModel(a.model, device="cpu", compute_type="float32", cpu_threads=2)
    cases = [(p.stem, "transcribe") for p in sorted(CLIPS.glob("*.wav"))]
    cases += [(c, "translate") for c in TRANSLATE]
    with open(a.out, "w") as out:
        for clip, task in cases:
            audio = decode_audio(str(CLIPS / f"{clip}.wav"))
            segments, info = model.transcribe(
                audio,
                task=task,
                language=None,
                beam_size=1,
                temperature=0.0,
                vad_filter=False,
                condition_on_previous_text=True,
                without_timestamps=False,
            )
            segments = list(segments)
            row = {
                "clip": f"clips/{clip}.wav",
                "task": task,
                "faster_whisper": faster_whisper.__version__,
                "language": info.language,
                "language_probability": info.language_probability,
                "text": "".join(s.text for s in segments),
                "segments": [
                    {
                        "seek": s.seek,
                        "start": s.start,
                        "end": s.end,
                        "tokens": s.tokens,
                        "avg_logprob": s.avg_logprob,
                        "no_speech_prob": s.no_speech_prob,
                    }
                    for s in segments
                ],
            }
            out.write(json.dumps(row) + "\n")
            print(clip, task, info.language, round(info.language_probability, 3), row["text"][:80])


if __name__ == "__main__":
    main()
