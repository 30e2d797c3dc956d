#!/usr/bin/env bash
# The project's test command: fetch the pinned test assets (verified by sha256), then run every suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export APHRO_ASSETS="${APHRO_ASSETS:-$PWD/.assets}"
python3 scripts/fetch_assets.py --dest "$APHRO_ASSETS"
cargo test --workspace --locked

# Python bindings (python/): a fresh venv, one release build of the extension installed the
# way users install it (`pip install ./python`, maturin backend, shared cargo target dir),
# then pytest. The HTTP parity tests use the `aphro` binary that `cargo test` just built.
PYVENV="$PWD/.venv-test"
rm -rf "$PYVENV"
python3 -m venv "$PYVENV"
export PATH="$PYVENV/bin:$PATH" # maturin's PEP 517 backend runs `maturin` from PATH
"$PYVENV/bin/python" -m pip install --quiet --disable-pip-version-check "maturin>=1.7,<2" pytest httpx
"$PYVENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation ./python
APHRO_BIN="${APHRO_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/debug/aphro}" \
    "$PYVENV/bin/python" -m pytest python/tests -q -p no:cacheprovider
