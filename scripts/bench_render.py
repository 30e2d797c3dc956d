#!/usr/bin/env python3
"""Chat-render throughput and latency, aphro next to vllm-rs, in one run.

For each model: starts `vllm-rs render` and `aphro launch render` on the same model directory
(free loopback ports, the same flags as scripts/compare_render.py), then runs the
`render_peer_bench` example against both: a fresh request body per request (a nonce in the last
turn, or in every message), at each concurrency and prompt size, with and without eight
tools, after checking both return the same token_ids. Prints one Markdown table with the
ratio aphro / vllm-rs. Standard library only; scripts/bench_render.sh builds the binaries.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_render as cr  # noqa: E402  (vllm-rs fetching, fixtures, server start-up)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ["fixture:qwen3,tool=hermes", "fixture:llama3,tool=llama3_json"]
TEMPLATE_NAMES = {"qwen3": "Qwen3", "llama3": "Llama 3"}


def run_model(spec, args, log_root):
    label, path, opts = cr.parse_model_spec(spec)
    cfg = json.loads((path / "config.json").read_text())
    mml = cr.max_model_len_from_config(cfg)
    model = str(path)
    pa, pv = cr.free_port(), cr.free_port()
    argv_a, argv_v = cr.server_argvs(args.aphro, args.vllm_rs, model, opts, mml, pa, pv)
    print(f"## {spec}\n  aphro:   {' '.join(argv_a)}\n  vllm-rs: {' '.join(argv_v)}",
          file=sys.stderr, flush=True)
    log_dir = Path(log_root) / label.replace(":", "_")
    log_dir.mkdir(parents=True, exist_ok=True)
    servers = []
    try:
        servers.append(cr.Server("vllm-rs", argv_v, pv, log_dir))
        servers.append(cr.Server("aphro", argv_a, pa, log_dir))
        deadline = time.time() + 120
        for s in servers:
            s.wait_ready(deadline)
        common = [str(args.harness), "--model", model, "--family", label.split(":")[-1],
                  "--sizes", args.sizes, "--concurrency", args.concurrency,
                  "--duration", str(args.duration), "--tools", args.tools, "--modes", args.modes]
        vllm, aphro = f"vllm-rs=http://127.0.0.1:{pv}", f"aphro=http://127.0.0.1:{pa}"
        endpoints = args.endpoints.split(",")
        runs = []
        if "render" in endpoints:
            runs.append(common + ["--target", vllm, "--target", aphro, "--endpoints", "render"])
        if "tokenize" in endpoints:
            # vllm-rs has no /tokenize: aphro alone, its ids checked against vllm-rs's render.
            runs.append(common + ["--reference", vllm, "--target", aphro, "--endpoints", "tokenize"])
        out = "".join(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
                      for cmd in runs)
        for s in servers:
            if s.proc.poll() is not None:
                raise RuntimeError(f"{s.label} died:\n{s.log_tail()}")
        return [json.loads(line) for line in out.splitlines() if line.strip()]
    finally:
        for s in servers:
            s.stop()


def table(rows):
    by_key = {}
    for r in rows:
        key = (r["family"], r["endpoint"], r["tools"], r["mode"], r["size"], r["concurrency"])
        by_key.setdefault(key, {})[r["target"]] = r
    lines = [
        "| template | route | tools | request | prompt tokens | c | vllm-rs req/s | aphro req/s "
        "| aphro / vllm-rs | vllm-rs p50 / p99 ms | aphro p50 / p99 ms | ids equal |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for key in sorted(by_key, key=lambda k: (k[0], k[1], k[2], k[3] != "fresh-turn", k[4], k[5])):
        t = by_key[key]
        v, a = t.get("vllm-rs"), t.get("aphro")
        if not a:
            continue
        fam, endpoint, tools, mode, _, c = key
        if v:
            ratio = f"{a['req_per_s'] / v['req_per_s']:.2f}" if v["req_per_s"] else "n/a"
            peer = (f"{v['req_per_s']:.0f}", f"{v['p50_ms']:.2f} / {v['p99_ms']:.2f}")
        else:
            ratio, peer = "(no such route)", ("—", "—")
        lines.append(
            f"| {TEMPLATE_NAMES.get(fam, fam)} | {endpoint} | {'8' if tools else '0'} | {mode} "
            f"| {a['tokens']} | {c} "
            f"| {peer[0]} | {a['req_per_s']:.0f} | {ratio} "
            f"| {peer[1]} | {a['p50_ms']:.2f} / {a['p99_ms']:.2f} "
            f"| {'yes' if a['ids_equal'] else 'NO'} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS,
                    help="model specs as in compare_render.py (default: Qwen3 and Llama 3 fixtures)")
    ap.add_argument("--aphro", type=Path, default=os.environ.get("APHRO_BIN"),
                    help="aphro binary (default: target/release/aphro)")
    ap.add_argument("--vllm-rs", type=Path, default=os.environ.get("APHRO_VLLM_RS"),
                    help="vllm-rs binary (default: fetched from the pinned vllm wheel, cached)")
    ap.add_argument("--harness", type=Path,
                    help="render_peer_bench example binary (default: target/release/examples/render_peer_bench)")
    ap.add_argument("--sizes", default="2000,9000")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    ap.add_argument("--tools", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--modes", default="fresh-turn,distinct")
    ap.add_argument("--endpoints", default="render",
                    help="render (POST /v1/chat/completions/render) and/or tokenize (POST /tokenize, chat form)")
    ap.add_argument("--json-out", type=Path, help="also write every measurement as JSON")
    args = ap.parse_args()
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    args.aphro = args.aphro or target / "release" / "aphro"
    args.harness = args.harness or target / "release" / "examples" / "render_peer_bench"
    for p in (args.aphro, args.harness):
        if not Path(p).is_file():
            sys.exit(f"{p} missing: run scripts/bench_render.sh (it builds both)")
    args.vllm_rs = args.vllm_rs or cr.fetch_vllm_rs()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-render-") as logs:
        for spec in args.models:
            rows += run_model(spec, args, logs)
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{os.cpu_count()} CPUs, {args.duration:g} s per cell, closed-loop clients on the same machine\n")
    print(table(rows))


if __name__ == "__main__":
    main()
