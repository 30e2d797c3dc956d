#!/usr/bin/env bash
# Real-time factor (seconds of audio per second of compute) of Whisper tiny.en on the CPU:
# aphro (`aphro transcribe --bench-runs`, compute only, warm) next to faster-whisper
# (CTranslate2, CPU, float32 and int8) on the same clips, on 1 and 2 threads, in one run.
#
#   scripts/bench_whisper.sh [CLIP...]    (default: four fixture clips, 46 s of audio)
#
# faster-whisper is installed from PyPI into a cached venv ($APHRO_BENCH_VENV, default
# ~/.cache/aphro/bench-whisper-venv). The model is $APHRO_ASSETS/models/whisper-tiny.en; the
# clips are testdata/audio/clips.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ASSETS="${APHRO_ASSETS:-$ROOT/.assets}"
MODEL="$ASSETS/models/whisper-tiny.en"
VENV="${APHRO_BENCH_VENV:-$HOME/.cache/aphro/bench-whisper-venv}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
[ -f "$MODEL/model.bin" ] || { echo "missing $MODEL: run python3 scripts/fetch_assets.py" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import faster_whisper" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "faster-whisper==1.2.1"
fi
# $APHRO_BIN: an aphro binary already built (the debug profile compiles the engine at
# opt-level 3 too); otherwise a release build.
APHRO="${APHRO_BIN:-}"
if [ -z "$APHRO" ]; then
  (cd "$ROOT" && cargo build -q --release -p aphro-http --bin aphro)
  APHRO="$TARGET/release/aphro"
fi
CLIPS_DIR="$ROOT/testdata/audio/clips"
if [ "$#" -gt 0 ]; then CLIPS=("$@"); else
  CLIPS=()
  for c in a01_hello_us a02_meeting_gb a09_long_chunking a14_medium_f2; do
    [ -f "$CLIPS_DIR/$c.wav" ] && CLIPS+=("$CLIPS_DIR/$c.wav")
  done
fi
exec "$VENV/bin/python" "$ROOT/scripts/bench_whisper.py" --aphro "$APHRO" \
  --model "$MODEL" "${CLIPS[@]}"
