#!/usr/bin/env bash
# GPU check, run on a machine with an NVIDIA GPU: release build with `--features cuda`, a
# check that the driver (libcuda.so.1) and NVRTC (libnvrtc) load, the engine's parity and
# serving tests on the device, `aphro bench --device cuda --json`, and Whisper on the device
# against faster-whisper's transcript. Sized for < 8 minutes
# (build included) on 16 cores. Env: APHRO_ASSETS (test assets), APHRO_GPU_DTYPE (weights
# of the parity run: float32 (default) or bfloat16), CUDARC_CUDA_VERSION (see below).
set -euo pipefail
cd "$(dirname "$0")/.."
export APHRO_ASSETS="${APHRO_ASSETS:-$PWD/.assets}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
GGUF="$APHRO_ASSETS/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$GGUF" ] || python3 scripts/fetch_assets.py --dest "$APHRO_ASSETS"

loads() { python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$1" 2>/dev/null; }
first_loadable() {
    for l in "$@"; do
        if loads "$l"; then echo "$l"; return 0; fi
    done
    return 1
}

# 1. The driver. Nothing replaces it: without it there is no GPU to test.
if ! loads libcuda.so.1; then
    echo "gpu-check: MISSING libcuda.so.1 (the NVIDIA driver library); is this a GPU machine?" >&2
    exit 1
fi
echo "gpu-check: libcuda.so.1 loads"

# 2. NVRTC (CubeCL compiles its kernels at run time). Fallback: PyPI's wheel.
NVRTC_NAMES=(libnvrtc.so libnvrtc.so.13 libnvrtc.so.12)
if ! NVRTC=$(first_loadable "${NVRTC_NAMES[@]}"); then
    echo "gpu-check: libnvrtc not found; installing nvidia-cuda-nvrtc-cu12 from PyPI into .venv-gpu"
    python3 -m venv .venv-gpu
    .venv-gpu/bin/pip install --quiet --disable-pip-version-check "nvidia-cuda-nvrtc-cu12>=12.4"
    NVRTC_DIR=$(.venv-gpu/bin/python -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))')
    export LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if ! NVRTC=$(first_loadable "${NVRTC_NAMES[@]}"); then
        echo "gpu-check: MISSING libnvrtc (tried ${NVRTC_NAMES[*]}, also in $NVRTC_DIR)" >&2
        exit 1
    fi
    # The wheel is CUDA 12: bind cudarc to 12.x unless told otherwise.
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-12080}"
fi
echo "gpu-check: $NVRTC loads"

# 3. cudarc binds one CUDA version at build time and, without nvcc, takes its newest. Use
# the newest it supports that the driver also supports (nvidia-smi's "CUDA Version").
if [ -z "${CUDARC_CUDA_VERSION:-}" ] && command -v nvidia-smi >/dev/null; then
    drv=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -1)
    if [ -n "$drv" ]; then
        read -r maj min <<<"$drv"
        for v in 13040 13030 13020 13010 13000 12090 12080 12060 12050 12040 12030 12020 12010 12000; do
            if [ "$v" -le $((maj * 1000 + min * 10)) ]; then export CUDARC_CUDA_VERSION=$v; break; fi
        done
    fi
fi
echo "gpu-check: CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-<cudarc default>}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

# 4. Build (release: the tests run the real model) and test on the device.
t0=$(date +%s)
cargo build --release --locked -p aphro-http --features cuda
cargo test --release --locked -p aphro-engine --features cuda --test parity --test serving --no-run
echo "gpu-check: build took $(( $(date +%s) - t0 ))s"
APHRO_TEST_DEVICE=cuda APHRO_TEST_DTYPE="${APHRO_GPU_DTYPE:-float32}" \
    cargo test --release --locked -p aphro-engine --features cuda --test parity --test serving
"$CARGO_TARGET_DIR/release/aphro" bench --device cuda --model "$GGUF" --json
"$CARGO_TARGET_DIR/release/aphro" bench --device cuda --dtype bfloat16 --model "$GGUF" --json
# Whisper on the device (the burn network on burn-cuda): the two-window clip's transcript must
# equal faster-whisper's (whitespace-normalized), then its real-time factor on the GPU.
WHISPER="$APHRO_ASSETS/models/whisper-tiny.en"
CLIP=testdata/audio/clips/a09_long_chunking.wav
got=$("$CARGO_TARGET_DIR/release/aphro" transcribe --device cuda --model "$WHISPER" "$CLIP")
want=$(python3 -c 'import json
for l in open("testdata/audio/transcripts.jsonl"):
    c = json.loads(l)
    if c["id"] == "a09_long_chunking" and c["container"] == "wav":
        print(c["reference"]["text"])')
if [ "$(echo $got)" != "$(echo $want)" ]; then
    echo "gpu-check: Whisper on cuda differs from faster-whisper:" >&2
    echo "  got:  $got" >&2
    echo "  want: $want" >&2
    exit 1
fi
echo "gpu-check: Whisper on cuda equals faster-whisper on $CLIP"
"$CARGO_TARGET_DIR/release/aphro" transcribe --device cuda --bench-runs 3 --model "$WHISPER" "$CLIP" >/dev/null
echo "gpu-check: all done in $(( $(date +%s) - t0 ))s"
