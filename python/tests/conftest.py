"""Shared fixtures. Tests read only the repository and the asset cache
(`APHRO_ASSETS`, filled by `scripts/fetch_assets.py`; default: `<repo>/.assets`)."""
from __future__ import annotations

import json
import os
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
