#!/usr/bin/env python3
"""Goldens for the decoding options beyond greedy defaults (`hotwords`, `repetition_penalty`,
an initial prompt with hotwords), made with faster-whisper 1.2.1 on Whisper tiny.en.

Run with a Python that has `faster-whisper==1.2.1` (scripts/bench_whisper.sh builds one):
    python scripts/make_whisper_option_goldens.py --model .assets/models/whisper-tiny.en
It writes testdata/audio/option_goldens.jsonl: per case the clip, the options, and
faster-whisper's text and per-segment tokens (greedy, with timestamps, float32 compute).
"""
import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Clips of testdata/audio/clips and the options each is decoded with. The long clip spans
# several 30 s windows, so the hotwords meet previous-text conditioning.
CASES = [
    ("a04_slow_female", {"hotwords": "Aphro, Whisper, clearly"}),
    ("a02_meeting_gb", {"hotwords": "quarterly roadmap"}),
    ("a09_long_chunking", {"hotwords": "Kubernetes"}),
    ("a09_long_chunking", {"initial_prompt": "A talk.", "hotwords": "inference"}),
    ("a04_slow_female", {"repetition_penalty": 1.5}),
    ("a03_pangram_fast", {"repetition_penalty": 2.0}),
    ("a09_long_chunking", {"repetition_penalty": 1.3}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=str(ROOT / "testdata/audio/option_goldens.jsonl"))
    a = ap.parse_args()
    import faster_whisper
    from faster_whisper import WhisperModel, decode_audio

    model = WhisperModel(a.model, device="cpu", compute_type="float32", cpu_threads=2)
    with open(a.out, "w") as out:
        for clip, options in CASES:
            audio = decode_audio(str(ROOT / "testdata/audio/clips" / f"{clip}.wav"))
            segments, info = model.transcribe(
                audio,
                beam_size=1,
                temperature=0.0,
                vad_filter=False,
                condition_on_previous_text=True,
                without_timestamps=False,
                **options,
            )
            segments = list(segments)
            row = {
                "clip": f"clips/{clip}.wav",
                "options": options,
                "faster_whisper": faster_whisper.__version__,
                "text": "".join(s.text for s in segments),
                "segments": [
                    {"seek": s.seek, "start": s.start, "end": s.end, "tokens": s.tokens}
                    for s in segments
                ],
            }
            out.write(json.dumps(row) + "\n")
            print(clip, options, row["text"][:100])


if __name__ == "__main__":
    main()
