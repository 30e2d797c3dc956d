"""Rendering through the Python binding vs the plain Rust call.

Same request (the Qwen3 tool chats of `aphro_core::bench_support::tool_chat`, as in
`cargo run --release -p aphro-examples --example render_bench`), same process, same build:

* rust      -- `Renderer::render_chat` on a pre-parsed request (one call from Python into a
               Rust timing helper, so it pays one Python->Rust call like the binding);
* rust+json -- the same plus parsing the JSON body each time (what the HTTP route does);
* python    -- `aphro.Renderer.render_chat(dict) -> dict` from Python (dict -> JSON value ->
               request, render, response -> dict).

    python python/bench/bench_render.py [MODEL_DIR]     # default: $APHRO_ASSETS/tokenizers/qwen3
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import aphro
from aphro import _aphro


def tool_chat(turns: int) -> dict:
    messages = [{"role": "system", "content": "You are a helpful assistant that can call tools."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"What's the weather in city number {i}, and should I bring an umbrella for my {i}-km walk?"})
        messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{i:04}", "type": "function",
            "function": {"name": "get_weather", "arguments": f'{{"city": "City {i}", "unit": "celsius"}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i:04}", "content": f'{{"temp": {10 + i % 20}, "sky": "cloudy", "rain_probability": 0.{i % 10}}}'})
        messages.append({"role": "assistant", "content": f"In City {i} it is {10 + i % 20} °C and cloudy with some chance of rain, so an umbrella is a good idea for {i} km."})
    messages.append({"role": "user", "content": "Thanks! Summarize everything."})
    return {
        "model": "Qwen/Qwen3-8B",
        "messages": messages,
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "search_web", "description": "Search the web and return the top results.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}}, "required": ["query"]}}},
        ],
        "max_tokens": 64,
    }


def measure(r: aphro.Renderer, req: dict, seconds: float):
    """Single calls, interleaved (rust, rust+json, python), so load from other processes hits
    all three alike. Returns per-call (min, p10, median) seconds of each."""
    rust, rust_json, py = [], [], []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(py) < 20:
        t = time.perf_counter()
        _aphro._bench_render_chat(r, req, 1)
        rust.append(time.perf_counter() - t)
        t = time.perf_counter()
        _aphro._bench_render_chat(r, req, 1, parse_each=True)
        rust_json.append(time.perf_counter() - t)
        t = time.perf_counter()
        r.render_chat(req)
        py.append(time.perf_counter() - t)
    out = []
    for x in (rust, rust_json, py):
        x.sort()
        out.append((x[0], x[len(x) // 10], statistics.median(x)))
    return out


def main() -> None:
    assets = os.environ.get("APHRO_ASSETS", str(Path(__file__).resolve().parents[2] / ".assets"))
    model_dir = sys.argv[1] if len(sys.argv) > 1 else f"{assets}/tokenizers/qwen3"
    seconds = float(os.environ.get("BENCH_SECONDS", "3"))
    r = aphro.Renderer(
        model_dir, max_model_len=40960, tool_call_parser="hermes", enable_auto_tool_choice=True
    )
    print(f"{'chat':<5} {'tokens':>7} {'stat':>6} {'rust ms':>9} {'rust+json ms':>13} {'python ms':>10} {'overhead':>9} {'vs rust+json':>13}")
    for label, turns in (("1k", 6), ("8k", 58)):
        req = tool_chat(turns)
        n = len(r.render_chat(req)["token_ids"])
        rows = measure(r, req, seconds)
        for k, stat in enumerate(("min", "p10", "median")):
            rust, rust_json, py = (x[k] for x in rows)
            print(
                f"{label:<5} {n:>7} {stat:>6} {rust * 1e3:>9.3f} {rust_json * 1e3:>13.3f} {py * 1e3:>10.3f} "
                f"{(py / rust - 1) * 100:>8.1f}% {(py / rust_json - 1) * 100:>12.1f}%"
            )


if __name__ == "__main__":
    main()
