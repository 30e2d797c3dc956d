#!/usr/bin/env bash
# Render speed next to vllm-rs: builds the release `aphro` and the `render_peer_bench` load client,
# fetches the test tokenizers and the pinned vllm-rs (both sha256-checked, cached), then runs
# scripts/bench_render.py. Arguments go to bench_render.py (`--help`; `--duration 1
# --concurrency 8` for a short run).
set -euo pipefail
cd "$(dirname "$0")/.."
export APHRO_ASSETS="${APHRO_ASSETS:-$PWD/.assets}"
python3 scripts/fetch_assets.py --dest "$APHRO_ASSETS" >&2
# The fixture models (Qwen3, Llama 3 tokenizers and templates) come from the asset cache.
export APHRO_FIXTURES="${APHRO_FIXTURES:-$APHRO_ASSETS}"
cargo build --release --locked -p aphro-http --bin aphro --example render_peer_bench >&2
exec python3 scripts/bench_render.py "$@"
