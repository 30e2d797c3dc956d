import os
import subprocess
import sys
from pathlib import Path

import aphro
import aphro.cli


def test_public_api():
    for name in aphro.__all__:
        assert hasattr(aphro, name), name
    assert aphro.__version__


def test_typed_package_files():
    pkg = Path(aphro.__file__).parent
    assert (pkg / "py.typed").is_file()
    assert (pkg / "_aphro.pyi").is_file()


def test_stub_names_match_extension():
    import ast

    stub = ast.parse((Path(aphro.__file__).parent / "_aphro.pyi").read_text())
    names = {n.name for n in stub.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    from aphro import _aphro

    exported = {n for n in dir(_aphro) if not n.startswith("__")}
    assert names == exported


def test_console_script_without_binary(tmp_path):
    env = dict(os.environ, APHRO_BIN=str(tmp_path / "missing"))
    r = subprocess.run(
        [sys.executable, "-m", "aphro", "version"], env=env, capture_output=True, text=True
    )
    assert r.returncode == 127
    assert "not found" in r.stderr


def test_console_script_runs_binary(tmp_path):
    fake = tmp_path / "aphro-bin"
    fake.write_text("#!/bin/sh\necho fake-aphro \"$@\"\n")
    fake.chmod(0o755)
    env = dict(os.environ, APHRO_BIN=str(fake))
    r = subprocess.run(
        [sys.executable, "-m", "aphro", "serve", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0
    assert r.stdout.strip() == "fake-aphro serve --port 1"


def test_serve_builds_the_command_line(tmp_path, monkeypatch):
    fake = tmp_path / "aphro-bin"
    out = tmp_path / "argv"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {out}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("APHRO_BIN", str(fake))
    rc = aphro.serve("m.gguf", port=9001, max_model_len=64, enable_prefix_caching=True, api_key=None)
    assert rc == 0
    assert out.read_text().split() == [
        "serve", "m.gguf", "--host", "127.0.0.1", "--port", "9001",
        "--max-model-len", "64", "--enable-prefix-caching",
    ]
