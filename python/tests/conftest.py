"""Shared fixtures. Tests read only the repository and the asset cache
(`APHRO_ASSETS`, filled by `scripts/fetch_assets.py`; default: `<repo>/.assets`)."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("APHRO_ASSETS", str(REPO / ".assets"))
ASSETS = Path(os.environ["APHRO_ASSETS"])
DEFAULT_GGUF = ASSETS / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

import aphro  # noqa: E402  (after APHRO_ASSETS is set)


def pytest_configure(config):
    if not DEFAULT_GGUF.is_file():
        raise pytest.UsageError(
            f"test assets missing: {DEFAULT_GGUF} (run scripts/fetch_assets.py --dest {ASSETS})"
        )


def golden(family: str):
    with open(REPO / "testdata" / "render" / f"{family}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="session")
def model():
    return aphro.Model()


@pytest.fixture(scope="session")
def renderer(model):
    return aphro.Renderer(model)


@pytest.fixture(scope="session")
def derenderer(model):
    return aphro.Derenderer(model)


@pytest.fixture(scope="session")
def qwen3_dir():
    return str(ASSETS / "tokenizers" / "qwen3")


SMOL = "smol"
SERVE_FLAGS = ["--kv-cache-memory", "33554432", "--max-model-len", "auto", "--max-num-seqs", "8"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def aphro_server(*args: str):
    """Runs the Rust binary (`APHRO_BIN`) as `aphro ARGS --port P` until the block ends and
    yields its base URL once `/health` answers; skips when the binary is not built."""
    with aphro_process(*args) as (base, _proc):
        yield base


@contextlib.contextmanager
def aphro_process(*args: str, env: dict | None = None, port: int | None = None):
    """`aphro_server`, yielding `(base URL, Popen)` so a test can kill the server, with
    extra environment variables."""
    import httpx

    import aphro.cli

    binary = aphro.cli.find_binary()
    if binary is None or not os.path.isfile(binary):
        pytest.skip("the `aphro` binary is not built (set APHRO_BIN)")
    port = port or free_port()
    # A file, not a pipe: a server that logs more than a pipe buffer would block on it.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [binary, *args, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, **(env or {})},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"server exited: {log.read().decode(errors='replace')[-4000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                pytest.fail("server did not start")
            time.sleep(0.2)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="session")
def integrated_server():
    """`aphro serve` on the test GGUF as `smol` with a small cache: the base URL."""
    with aphro_server("serve", str(DEFAULT_GGUF), "--served-model-name", SMOL, *SERVE_FLAGS) as base:
        yield base
