#!/usr/bin/env bash
# Same-run CPU throughput comparison: llama.cpp's `llama-bench` and `aphro bench` on one GGUF,
# back to back (on a shared machine only ratios measured together mean anything).
#
#   scripts/bench_llamacpp.sh [model.gguf]        (default: the SmolLM2 Q4_1 test asset)
#
# llama.cpp is taken from the `llama-cpp-python` sdist on PyPI (it vendors llama.cpp under
# vendor/llama.cpp) and built once, `llama-bench` only, into a cache outside the repository:
# ${XDG_CACHE_HOME:-~/.cache}/aphro/llama.cpp. Env: THREADS (default 2), LLAMA_CPP_PY_VERSION,
# JOBS (build parallelism, default 2).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${1:-$ROOT/.assets/models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
JOBS=${JOBS:-2}
VERSION=${LLAMA_CPP_PY_VERSION:-0.3.16}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/aphro/llama.cpp
SRC=$CACHE/llama_cpp_python-$VERSION
BUILD=$CACHE/build-$VERSION
BENCH=$BUILD/bin/llama-bench
BATCHED=$BUILD/bin/llama-batched-bench

[ -f "$MODEL" ] || { echo "model $MODEL not found" >&2; exit 1; }
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

(cd "$ROOT" && cargo build --quiet --release -p aphro-http --bin aphro)
APHRO=${CARGO_TARGET_DIR:-$ROOT/target}/release/aphro

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "llama-bench -t $THREADS -p 128,512 -n 128 ..." >&2
"$BENCH" -m "$MODEL" -t "$THREADS" -p 128,512 -n 128 -o json >"$OUT/llama.json" 2>/dev/null
# Concurrency: the same shape as `aphro bench`'s aggregate (32-token prompts, 128 new
# tokens each, 8/16/32 sequences decoded together; prefill counted in the wall time).
echo "llama-batched-bench -t $THREADS -npp 32 -ntg 128 -npl 8,16,32 ..." >&2
"$BATCHED" -m "$MODEL" -t "$THREADS" -c 8192 -b 2048 -ub 512 -npp 32 -ntg 128 -npl 8,16,32 \
    --output-format jsonl 2>/dev/null | grep '^{' >"$OUT/batched.jsonl"
echo "aphro bench --json ..." >&2
RAYON_NUM_THREADS=$THREADS "$APHRO" bench --model "$MODEL" --json >"$OUT/aphro.json"

python3 - "$OUT/llama.json" "$OUT/aphro.json" "$OUT/batched.jsonl" <<'PY'
import json, sys
llama = json.load(open(sys.argv[1]))
aphro = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
batched = [json.loads(l) for l in open(sys.argv[3]) if l.strip()]
# Generated tokens over the whole run (prefill included), as `aphro bench` counts them.
agg = {str(r["pl"]): r["pl"] * r["tg"] / r["t"] for r in batched}
ts = {}
for r in llama:
    key = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    ts[key] = r["avg_ts"]
rows = [
    ("prefill 512 tokens", ts.get("pp512"), aphro["prefill_tok_s"]),
    ("decode batch 1 (128 tokens)", ts.get("tg128"), aphro["decode_tok_s"]),
]
for c, v in aphro.get("aggregate_tok_s", {}).items():
    rows.append((f"aggregate, {c} concurrent", agg.get(c), v))
print(f"{'measurement':<30} {'llama.cpp':>10} {'aphro':>10} {'aphro/llama':>12}")
for name, l, a in rows:
    ratio = f"{a / l:.2f}" if l else "-"
    print(f"{name:<30} {l or 0:>10.1f} {a:>10.1f} {ratio:>12}")
print(f"{'llama.cpp prefill 128 tokens':<30} {ts.get('pp128', 0):>10.1f}")
PY
