"""The ``aphro`` console script: runs the Rust ``aphro`` binary (``serve``, ``render``, ...).

The wheel carries the library, not the HTTP server; the server is the Rust binary built from
the same repository (``cargo install --path aphro-http``). This script finds it, in order:
``$APHRO_BIN``; an ``aphro`` executable on ``PATH`` that is not this script; ``target/release``
or ``target/debug`` of the source checkout the package was built from; and replaces the
current process with it, passing the arguments through.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

_HINT = (
    "aphro: the `aphro` server binary was not found. Build it with "
    "`cargo install --path aphro-http` (or `cargo build --release -p aphro-http`), put it "
    "on PATH, or set APHRO_BIN to its path."
)


def _is_this_script(path: str) -> bool:
    """True for a Python launcher script (e.g. this console entry point)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return True
    return head.startswith(b"#!") and b"python" in head.split(b"\n", 1)[0]


def find_binary() -> Optional[str]:
    """Path of the Rust ``aphro`` binary, or ``None``."""
    env = os.environ.get("APHRO_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        cand = shutil.which("aphro", path=entry) if entry else None
        if cand and os.path.realpath(cand) != me and not _is_this_script(cand):
            return cand
    # A source checkout: python/aphro/cli.py -> repository root.
    root = Path(__file__).resolve().parents[2]
    target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    for profile in ("release", "debug"):
        cand = target / profile / "aphro"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def serve(
    model: Optional[str] = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    command: Sequence[str] = ("serve",),
    wait: bool = True,
    **flags: Any,
) -> Union[int, "subprocess.Popen[bytes]"]:
    """Runs the HTTP server (the Rust binary) as a child process.

    ``aphro.serve("model.gguf", port=8000, max_model_len=4096)`` runs
    ``aphro serve model.gguf --host 127.0.0.1 --port 8000 --max-model-len 4096``; use
    ``command=("launch", "render")`` for the GPU-less render/derender frontend. Keyword flags
    become ``--kebab-case`` options (``True`` -> a bare flag, ``False``/``None`` -> omitted, a
    list -> repeated values). With ``wait=False`` the ``subprocess.Popen`` is returned;
    otherwise the call blocks and returns the exit status.
    """
    import subprocess

    binary = find_binary()
    if binary is None:
        raise FileNotFoundError(_HINT)
    argv = [binary, *command]
    if model is not None:
        argv.append(os.fspath(model))
    argv += ["--host", host, "--port", str(port)]
    for key, value in flags.items():
        opt = "--" + key.replace("_", "-")
        if value is True:
            argv.append(opt)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [opt, *map(str, value)]
        else:
            argv += [opt, str(value)]
    proc = subprocess.Popen(argv)
    if not wait:
        return proc
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    binary = find_binary()
    if binary is None:
        print(_HINT, file=sys.stderr)
        return 127
    if os.name == "nt":  # no exec on Windows: run and forward the status
        import subprocess

        return subprocess.call([binary, *args])
    os.execv(binary, [binary, *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
