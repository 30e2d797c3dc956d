#!/usr/bin/env bash
# The project's test command: fetch the pinned test assets (verified by sha256), then run every suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every wire-spec reference (`api.md` §4.2) names a spec in docs/spec and a section it has, and
# every relative Markdown link resolves (standard library only, no build).
python3 scripts/check_spec_refs.py
# One formatting, checked before anything builds.
cargo fmt --all --check
# System packages, from Debian: nasm (libjpeg-turbo's SIMD in the image decode, which the
# multimodal bench measures; without it the build uses libjpeg's C code) and lavapipe for
# the wgpu pass below.
APT_PACKAGES=()
command -v nasm >/dev/null || APT_PACKAGES+=(nasm)
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || APT_PACKAGES+=(mesa-vulkan-drivers libvulkan1)
if [ ${#APT_PACKAGES[@]} -gt 0 ] && command -v apt-get >/dev/null; then
    SUDO=""
    [ "$(id -u)" != 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${APT_PACKAGES[@]}"
fi
export APHRO_ASSETS="${APHRO_ASSETS:-$PWD/.assets}"
python3 scripts/fetch_assets.py --dest "$APHRO_ASSETS"
cargo test --workspace --locked

# The README's quick start as a new user meets it: an empty model cache, no test assets, the
# default model downloaded by aphro itself, then the README's curl (the binary `cargo test`
# just built stands in for `cargo run --release`, which would be a second full build).
APHRO_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/aphro" ./scripts/first_run.sh

# Hostile traffic against the binary `cargo test` just built (CI size; see scripts/stress.sh).
APHRO_STRESS_PROFILE=debug ./scripts/stress.sh --quick "$APHRO_ASSETS/models/SmolLM2-135M-Instruct.Q4_1.gguf"

# Lints on every target (tests, examples, benches) as errors, in the same pass that
# type-checks the GPU backend: the `cuda` feature must build on a machine without the CUDA
# toolkit or a GPU (burn-cuda loads libcuda/libnvrtc at run time), and one check pass over
# the workspace with it on costs one metadata build of the dependencies instead of two.
cargo clippy --workspace --all-targets --features aphro-http/cuda --locked -- -D warnings
# The CubeCL kernels themselves run for real through burn-wgpu on lavapipe, Mesa's CPU Vulkan
# driver (installed at the top); the test fails (rather than skips) under CI=true when no Vulkan
# adapter is found.
cargo test -p aphro-engine --features wgpu --test paged_attention_wgpu --test pooling_wgpu --test whisper_wgpu --locked
# The architecture suites' wgpu tests only (their CPU tests ran in `cargo test` above); the
# same build as the line before.
cargo test -p aphro-engine --features wgpu --test arch_moe --test arch_parity --locked -- wgpu

# Python bindings (python/): a fresh venv, the extension installed the way users install it
# (`pip install ./python`, maturin's PEP 517 backend, shared cargo target dir), then pytest.
# CI builds it with the dev profile (`MATURIN_PEP517_ARGS`), which reuses the dependencies
# `cargo test` just compiled (the dev profile optimizes them, Cargo.toml) instead of a second,
# release build of the whole tree. The HTTP parity tests use the `aphro` binary `cargo test`
# built.
PYVENV="$PWD/.venv-test"
rm -rf "$PYVENV"
python3 -m venv "$PYVENV"
export PATH="$PYVENV/bin:$PATH" # maturin's PEP 517 backend runs `maturin` from PATH
"$PYVENV/bin/python" -m pip install --quiet --disable-pip-version-check "maturin>=1.7,<2" pytest httpx "openai>=1.50,<3" "anthropic>=0.40,<3" \
    "vllm-router==0.1.17" "msgspec==0.23.0" "pyzmq>=26,<28" "cbor2>=5.6,<6" \
    "cohere==7.3.1"
MATURIN_PEP517_ARGS="${MATURIN_PEP517_ARGS:---profile dev}" \
    "$PYVENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation ./python
APHRO_BIN="${APHRO_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/debug/aphro}" \
    "$PYVENV/bin/python" -m pytest python/tests -q -p no:cacheprovider
