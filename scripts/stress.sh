#!/usr/bin/env bash
# Hostile-traffic stress run of the real `aphro` binary on 127.0.0.1: maximal bodies (peak
# RSS), stalled connections, made-up methods (/metrics), SIGTERM during streams, reused
# request ids, log injection. Prints a table; exits non-zero when a goal is missed.
#
#   scripts/stress.sh [--quick] [MODEL.gguf]      # release build; --quick = CI size
#   APHRO_STRESS_PROFILE=debug scripts/stress.sh  # use the debug build `cargo test` made
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE="${APHRO_STRESS_PROFILE:-release}"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
if [ "$PROFILE" = release ]; then
    cargo build --release --locked --workspace --bin aphro --example stress
else
    cargo build --locked --workspace --bin aphro --example stress
fi
exec "$TARGET/$PROFILE/examples/stress" --bin "$TARGET/$PROFILE/aphro" "$@"
