#!/usr/bin/env bash
# Same-run CPU throughput comparison: llama.cpp's `llama-bench` / `llama-batched-bench` and
# `aphro bench` on one GGUF, back to back, at 1 and 2 threads (on a shared machine only ratios
# measured together mean anything). Points: prefill at 512 / 2048 / 4096 / 8192 prompt tokens,
# batch-1 decode of 128 tokens from context 0 / 2048 / 8064, aggregate decode at 8/16/32
# concurrent sequences; aphro also reports a decode's inter-token latency while an 8k prompt
# prefills, and the delay of an abort during that prefill.
#
#   scripts/bench_llamacpp.sh [model.gguf]        (default: the SmolLM2 Q4_1 test asset)
#   scripts/bench_llamacpp.sh --build-only        (just build llama.cpp)
#
# llama.cpp is taken from the `llama-cpp-python` sdist on PyPI (it vendors llama.cpp under
# vendor/llama.cpp) and built once into a cache outside the repository:
# ${XDG_CACHE_HOME:-~/.cache}/aphro/llama.cpp. aphro is the dev-profile binary the tests build
# (its profile compiles the engine and every dependency at opt-level 3). Env: THREADS (default
# "1 2"), REPS (llama-bench repetitions, default 2), LLAMA_FA (llama-bench flash attention,
# default 1: its faster CPU setting at long contexts), KV_DTYPE (aphro's --kv-cache-dtype,
# default float16: llama.cpp's default KV cache type, so both read the same bytes per key),
# LLAMA_CPP_PY_VERSION, JOBS (build parallelism, default 2). The points, for a shorter run
# (a second model, say): PREFILL_LENS (default 512,2048,4096,8192), DECODE_DEPTHS (default
# 0,2048,8064), CONCURRENCY (default 8,16,32), STALL_PROMPT_LEN (aphro's stall and abort
# measurement, default 8192; 0 skips it).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_ONLY=0
if [ "${1:-}" = "--build-only" ]; then BUILD_ONLY=1; shift; fi
MODEL=${1:-$ROOT/.assets/models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-1 2}
REPS=${REPS:-2}
LLAMA_FA=${LLAMA_FA:-1}
JOBS=${JOBS:-2}
KV_DTYPE=${KV_DTYPE:-float16}
PREFILL_LENS=${PREFILL_LENS:-512,2048,4096,8192}
DECODE_DEPTHS=${DECODE_DEPTHS:-0,2048,8064}
CONCURRENCY=${CONCURRENCY:-8,16,32}
STALL_PROMPT_LEN=${STALL_PROMPT_LEN:-8192}
VERSION=${LLAMA_CPP_PY_VERSION:-0.3.16}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/aphro/llama.cpp
SRC=$CACHE/llama_cpp_python-$VERSION
BUILD=$CACHE/build-$VERSION
BENCH=$BUILD/bin/llama-bench
BATCHED=$BUILD/bin/llama-batched-bench

mkdir -p "$CACHE"

if [ ! -x "$BENCH" ] || [ ! -x "$BATCHED" ]; then
    if ! command -v cmake >/dev/null; then
        echo "cmake is required (apt-get install cmake)" >&2
        exit 1
    fi
    if [ ! -d "$SRC/vendor/llama.cpp" ]; then
        # The sdist straight from PyPI's simple index (`pip download` of an sdist would
        # first build its build backend's dependencies from source).
        python3 - "$VERSION" "$CACHE/sdist.tar.gz" <<'PY'
import hashlib, re, sys, urllib.request
version, dest = sys.argv[1], sys.argv[2]
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                             headers={"Accept": "text/html"})
html = urllib.request.urlopen(req, timeout=120).read().decode()
m = re.search(r'href="([^"#]+/llama_cpp_python-' + re.escape(version)
              + r'\.tar\.gz)#sha256=([0-9a-f]+)"', html)
if not m:
    sys.exit(f"no sdist of llama-cpp-python {version} on PyPI")
data = urllib.request.urlopen(m.group(1), timeout=600).read()
if hashlib.sha256(data).hexdigest() != m.group(2):
    sys.exit("sdist checksum mismatch")
open(dest, "wb").write(data)
PY
        tar -xzf "$CACHE/sdist.tar.gz" -C "$CACHE"
        rm -f "$CACHE/sdist.tar.gz"
    fi
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_OPENMP=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
    cmake --build "$BUILD" --target llama-bench llama-batched-bench -j"$JOBS" >/dev/null
fi

[ "$BUILD_ONLY" = 1 ] && exit 0
[ -f "$MODEL" ] || { echo "model $MODEL not found" >&2; exit 1; }

(cd "$ROOT" && cargo build --quiet -p aphro-http --bin aphro)
APHRO=${CARGO_TARGET_DIR:-$ROOT/target}/debug/aphro

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for T in $THREADS; do
    echo "[$T threads] llama-bench prefill -p $PREFILL_LENS ..." >&2
    "$BENCH" -m "$MODEL" -t "$T" -r "$REPS" -fa "$LLAMA_FA" -p "$PREFILL_LENS" -n 0 \
        -o json >"$OUT/llama-pp-$T.json" 2>/dev/null
    # One llama-bench run per depth: in one `-d 0,2048,8064` run the deepest point came back
    # without a result.
    for D in ${DECODE_DEPTHS//,/ }; do
        echo "[$T threads] llama-bench decode -n 128 -d $D ..." >&2
        "$BENCH" -m "$MODEL" -t "$T" -r "$REPS" -fa "$LLAMA_FA" -p 0 -n 128 -d "$D" \
            -o json >"$OUT/llama-tg-$T-$D.json" 2>"$OUT/llama-tg-$T-$D.err" || {
            echo "llama-bench -d $D failed:" >&2
            cat "$OUT/llama-tg-$T-$D.err" >&2
        }
    done
    # Concurrency: the same shape as `aphro bench`'s aggregate (32-token prompts, 128 new
    # tokens each, 8/16/32 sequences decoded together; prefill counted in the wall time).
    echo "[$T threads] llama-batched-bench -npp 32 -ntg 128 -npl $CONCURRENCY ..." >&2
    # llama-batched-bench takes flash attention as a bare flag (llama-bench as 0/1).
    FA_FLAG=()
    [ "$LLAMA_FA" = 1 ] && FA_FLAG=(-fa)
    "$BATCHED" -m "$MODEL" -t "$T" -c 8192 -b 2048 -ub 512 "${FA_FLAG[@]}" -npp 32 -ntg 128 \
        -npl "$CONCURRENCY" --output-format jsonl 2>/dev/null | grep '^{' >"$OUT/batched-$T.jsonl"
    echo "[$T threads] aphro bench --json ..." >&2
    RAYON_NUM_THREADS=$T "$APHRO" bench --model "$MODEL" --dtype auto --json \
        --kv-cache-dtype "$KV_DTYPE" \
        --prefill-lens "$PREFILL_LENS" --decode-contexts "$DECODE_DEPTHS" \
        --concurrency "$CONCURRENCY" --stall-prompt-len "$STALL_PROMPT_LEN" \
        >"$OUT/aphro-$T.json"
done

python3 - "$OUT" "$KV_DTYPE" $THREADS <<'PY'
import json, os, sys
out, kv, threads = sys.argv[1], sys.argv[2], sys.argv[3:]
for t in threads:
    llama = json.load(open(os.path.join(out, f"llama-pp-{t}.json")))
    for name in sorted(os.listdir(out)):
        if name.startswith(f"llama-tg-{t}-") and name.endswith(".json"):
            try:
                llama += json.load(open(os.path.join(out, name)))
            except ValueError:
                print(f"{name}: llama-bench wrote no result", file=sys.stderr)
    aphro = json.loads(open(os.path.join(out, f"aphro-{t}.json")).read().strip().splitlines()[-1])
    batched = [json.loads(l) for l in open(os.path.join(out, f"batched-{t}.jsonl")) if l.strip()]
    # Generated tokens over the whole run (prefill included), as `aphro bench` counts them.
    agg = {str(r["pl"]): r["pl"] * r["tg"] / r["t"] for r in batched}
    pp = {r["n_prompt"]: r["avg_ts"] for r in llama if r["n_gen"] == 0}
    tg = {r.get("n_depth", 0): r["avg_ts"] for r in llama if r["n_prompt"] == 0}
    rows = []
    for p in aphro["prefill"]:
        n = p["prompt_tokens"]
        # aphro's longest prompt is one short of the context (room for the sampled token).
        key = min(pp, key=lambda k: abs(k - n)) if pp else None
        rows.append((f"prefill {key or n} tokens", pp.get(key), p["tok_s"]))
    for d in aphro["decode"]:
        c = d["context"]
        # aphro's deepest context is one short of llama.cpp's (the same room rule).
        key = min(tg, key=lambda k: abs(k - c)) if tg else None
        rows.append((f"decode 128, context {key if key is not None else c}", tg.get(key), d["tok_s"]))
    for c, v in aphro.get("aggregate_tok_s", {}).items():
        rows.append((f"aggregate, {c} concurrent", agg.get(c), v))
    print(f"\n{t} thread(s); aphro KV cache {kv}, llama.cpp KV cache f16")
    print(f"{'measurement':<30} {'llama.cpp':>10} {'aphro':>10} {'aphro/llama':>12}")
    for name, l, a in rows:
        ratio = f"{a / l:.2f}" if l else "-"
        print(f"{name:<30} {l or 0:>10.1f} {a:>10.1f} {ratio:>12}")
    # Time to first token grows with the prompt: exact attention alone makes 8k ~2.7x 4k.
    ttft = {p["prompt_tokens"]: p["prompt_tokens"] / p["tok_s"] for p in aphro["prefill"]}
    four = min(ttft, key=lambda n: abs(n - 4096), default=None)
    eight = min(ttft, key=lambda n: abs(n - 8192), default=None)
    if four and eight and eight != four:
        lt = {n: n / v for n, v in pp.items()}
        l4, l8 = lt.get(4096), lt.get(8192)
        lratio = f", llama.cpp {l8 / l4:.2f}x" if l4 and l8 else ""
        print(f"time to first token: {four} tokens {ttft[four]:.1f} s, {eight} tokens "
              f"{ttft[eight]:.1f} s ({ttft[eight] / ttft[four]:.2f}x{lratio})")
    s = aphro.get("stall")
    if s:
        print(f"decode ITL while a {s['prompt_tokens']}-token prompt prefills: "
              f"median {s['itl_median_ms']:.1f} ms, max {s['itl_max_ms']:.1f} ms, "
              f"idle {s['idle_itl_ms']:.1f} ms ({s['itl_median_ms'] / max(s['idle_itl_ms'], 1e-9):.2f}x), "
              f"prefill {s['prefill_s']:.1f} s")
        if s.get("context_matched_ratio"):
            print(f"  the decode's context grew meanwhile; against its idle latency at the same "
                  f"context: median {s['context_matched_ratio']:.2f}x, "
                  f"mean {s['context_matched_mean_ratio']:.2f}x")
    a = aphro.get("abort")
    if a:
        print(f"abort during a {a['prompt_tokens']}-token prefill frees the engine after {a['delay_ms']:.0f} ms")
PY
