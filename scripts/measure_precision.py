#!/usr/bin/env python3
"""Quality and speed of the default model per `--dtype`: how the README's default was chosen.

Quality: greedy continuations of the engine goldens (testdata/engine, HF transformers in
float32 on the weights dequantized from the same GGUF) compared token by token; speed:
`aphro bench` decode tok/s at batch 1 and aggregate at 8 concurrent requests. Prints a table.

    python3 scripts/measure_precision.py [--aphro target/release/aphro] [--model M.gguf]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "testdata/engine/smollm2-135m-instruct.jsonl"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def quality(aphro: str, model: str, dtype: str) -> dict:
    port = free_port()
    proc = subprocess.Popen(
        [aphro, "serve", model, "--port", str(port), "--dtype", dtype, "--enable-scale-out",
         "--served-model-name", "m"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        exact = prefix = total = 0
        answers = {}
        for line in CASES.read_text().splitlines():
            case = json.loads(line)
            want = case["hf_f32"]["greedy_token_ids"]
            r = post(base + "/inference/v1/generate", {
                "token_ids": case["prompt_token_ids"],
                "sampling_params": {"temperature": 0.0, "max_tokens": len(want),
                                    "stop_token_ids": case["stop_token_ids"]},
            })
            got = r["choices"][0]["token_ids"]
            n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            exact += got == want
            prefix += n
            total += len(want)
            if case["id"] == "chat-capital-france":
                answers[dtype] = post(base + "/v1/chat/completions", {
                    "messages": case["messages"], "max_tokens": 24, "temperature": 0})["choices"][0]["message"]["content"]
        return {"cases": sum(1 for _ in CASES.read_text().splitlines()), "exact": exact,
                "prefix_share": prefix / total, "france": answers.get(dtype, "")}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def speed(aphro: str, model: str, dtype: str) -> dict:
    out = subprocess.run([aphro, "bench", "--model", model, "--dtype", dtype, "--json",
                          "--concurrency", "8"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--aphro", default=str(ROOT / "target/release/aphro"))
    ap.add_argument("--model", default=str(Path(os.environ.get("APHRO_ASSETS", ROOT / ".assets"))
                                            / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--dtypes", default="auto,float32", help="comma-separated --dtype values")
    args = ap.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        q = quality(args.aphro, args.model, dtype)
        s = speed(args.aphro, args.model, dtype)
        rows.append((dtype, q, s))
    print("| --dtype | golden cases identical to HF f32 | generated tokens before the first difference | decode tok/s (batch 1) | decode tok/s (8 concurrent) | \"What is the capital of France?\" |")
    print("| --- | --- | --- | --- | --- | --- |")
    for dtype, q, s in rows:
        print(f"| {dtype} | {q['exact']}/{q['cases']} | {q['prefix_share']:.0%} | "
              f"{s['decode_tok_s']:.1f} | {s['aggregate_tok_s']['8']:.1f} | {q['france']!r} |")


if __name__ == "__main__":
    main()
