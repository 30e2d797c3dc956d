#!/usr/bin/env bash
# The project's test command: fetch the pinned test assets (verified by sha256), then run every suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export APHRO_ASSETS="${APHRO_ASSETS:-$PWD/.assets}"
python3 scripts/fetch_assets.py --dest "$APHRO_ASSETS"
cargo test --workspace --locked
