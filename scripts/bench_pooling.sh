#!/usr/bin/env bash
# Embedding throughput, aphro against sentence-transformers (PyTorch, CPU) on the same machine,
# in the same run, on the same texts: embeddings/s at batch 1 (one text per call) and at 32
# concurrent requests (aphro: 32 callers of one text each, batched by its dynamic batcher;
# sentence-transformers: `encode(texts, batch_size=32)`, its own best case), then the ratio;
# and the CPU time per embedding of each (process user + system time, all threads), which
# a busy machine disturbs much less than wall-clock throughput.
#
#     scripts/bench_pooling.sh [N_TEXTS]     # default 256
#
# Needs the asset cache (scripts/fetch_assets.py) and a Python with sentence-transformers and
# torch: $BENCH_PYTHON, else a venv made in .venv-bench (pip install sentence-transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-256}"
APHRO_ASSETS="${APHRO_ASSETS:-$PWD/.assets}"
MODEL="$APHRO_ASSETS/models/all-MiniLM-L6-v2"
[ -f "$MODEL/model.safetensors" ] || { echo "$MODEL missing: run scripts/fetch_assets.py" >&2; exit 1; }
PY="${BENCH_PYTHON:-}"
if [ -z "$PY" ]; then
    python3 -m venv .venv-bench
    .venv-bench/bin/python -m pip install --quiet --disable-pip-version-check sentence-transformers
    PY=.venv-bench/bin/python
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# The texts: the string inputs of the pooling goldens (short to 325 tokens), repeated to N.
python3 - "$N" > "$WORK/texts.json" <<'PY'
import json, sys
n = int(sys.argv[1])
cases = [json.loads(l) for l in open("testdata/pooling/embeddings.jsonl") if l.strip()]
texts = [c["input"] for c in cases if isinstance(c["input"], str) and c["input"].strip()]
print(json.dumps([texts[i % len(texts)] for i in range(n)]))
PY
cargo run --quiet -p aphro-engine --example bench_pooling -- "$MODEL" "$WORK/texts.json" --json > "$WORK/aphro.json"
"$PY" - "$MODEL" "$WORK/texts.json" > "$WORK/st.json" <<'PY'
import json, sys, time
import torch
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
texts = json.load(open(sys.argv[2]))
for t in texts[:4]:
    model.encode([t])
start, cpu = time.perf_counter(), time.process_time()
for t in texts:
    model.encode([t])
b1 = len(texts) / (time.perf_counter() - start)
b1_cpu = (time.process_time() - cpu) * 1000 / len(texts)
start, cpu = time.perf_counter(), time.process_time()
model.encode(texts, batch_size=32)
b32 = len(texts) / (time.perf_counter() - start)
b32_cpu = (time.process_time() - cpu) * 1000 / len(texts)
print(json.dumps({"batch1_emb_s": b1, "batch32_emb_s": b32, "batch1_cpu_ms": b1_cpu,
                  "batch32_cpu_ms": b32_cpu, "torch": torch.__version__,
                  "threads": torch.get_num_threads()}))
PY
python3 - "$WORK/aphro.json" "$WORK/st.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2]))
print(f"all-MiniLM-L6-v2, {a['texts']} texts, CPU (torch {s['torch']}, {s['threads']} threads)\n")
print("| | aphro emb/s | sentence-transformers emb/s | ratio | aphro CPU ms/emb | ST CPU ms/emb | CPU ratio |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
def row(name, ak, sk):
    ac, sc = ak.replace("emb_s", "cpu_ms"), sk.replace("emb_s", "cpu_ms")
    print(f"| {name} | {a[ak]:.1f} | {s[sk]:.1f} | {a[ak]/s[sk]:.2f}x "
          f"| {a[ac]:.1f} | {s[sc]:.1f} | {s[sc]/max(a[ac], 1e-9):.2f}x |")
row("batch 1", "batch1_emb_s", "batch1_emb_s")
row(f"32 concurrent (aphro: {a['calls']} calls in {a['forwards']} forwards; ST: batch_size=32)",
    "concurrent_emb_s", "batch32_emb_s")
PY
