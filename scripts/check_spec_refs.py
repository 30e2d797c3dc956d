#!/usr/bin/env python3
"""Check that every wire-spec reference and every relative Markdown link resolves.

Spec references: the code and docs cite the specs in docs/spec by file and section, e.g.
"`api.md` §4.2", "`docs/spec/api.md` §6.1 step 3", "§4.2/§4.3". For every `§N[.M…]`:

* a reference preceded on its line by `NAME.md` (optionally in backticks / a parenthesis)
  names that file: it must be `docs/spec/NAME.md`, given as `NAME.md` or as a path from the
  repository root (or, inside docs/spec, from the spec's own folder);
* a reference without a file belongs to the spec file last mentioned before it in the same
  file (`api.md`, `[parsers.md](...)`); inside a spec it belongs to that spec. A reference
  with no spec mentioned before it is an error, since every spec numbers its sections;
* the section must be a heading of that spec (`## 4.`, `### 4.2 ...`).

References to other documents' sections (`RFC 9112 §3.2.2`) are skipped.

Links: every `[text](target)` in a Markdown file whose target is not a URL or an anchor must
name a file or folder that exists, relative to the Markdown file.

    python3 scripts/check_spec_refs.py      # exit 1, listing each failure, if any fails

Python standard library only.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT / "docs" / "spec"
SKIP_DIRS = {"target", ".git", ".assets", "node_modules", "__pycache__"}
EXTENSIONS = {".rs", ".md", ".py", ".pyi", ".sh", ".toml"}

# `§4.2`, `§ 6.2`; the number is the section.
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
# A Markdown file name or path: `api.md`, docs/spec/api.md, [parsers.md](parsers.md).
MENTION = re.compile(r"[\w./-]*?[\w-]+\.md\b")
# What may stand between a file name and the section sign of a reference naming it.
NAMES_NEXT = re.compile(r"`?\)?\s*§")
# Sections of documents other than the specs.
FOREIGN = re.compile(r"\bRFC\s*\d+\s*$")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?(?:\s|$)")
BAD = object()  # stands for a named file that is not a spec
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def source_files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".venv")
        )
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.suffix in EXTENSIONS and path.resolve() != Path(__file__).resolve():
                yield path


def spec_sections() -> dict[str, set[str]]:
    out = {}
    for spec in sorted(SPEC_DIR.glob("*.md")):
        if spec.name == "README.md":
            continue
        heads = set()
        for line in spec.read_text(encoding="utf-8").splitlines():
            m = HEADING.match(line)
            if m:
                heads.add(m.group(1))
        out[spec.name] = heads
    return out


def resolve_spec(name: str, referrer: Path, sections) -> str | None:
    """The spec file a written name stands for, or None when it is not a docs/spec file."""
    if "/" not in name:
        return name if name in sections else None
    for base in (ROOT, referrer.parent):
        p = (base / name).resolve()
        if p.parent == SPEC_DIR.resolve() and p.name in sections:
            return p.name
    return None


def check_refs(files, sections) -> tuple[int, list[str]]:
    ok, errors = 0, []
    for path in files:
        rel = path.relative_to(ROOT)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if "§" not in text:
            continue
        own = path.name if path.parent.resolve() == SPEC_DIR.resolve() else None
        own = own if own in sections else None
        context = own  # the spec a reference without a file belongs to
        for lineno, line in enumerate(text.splitlines(), 1):
            events = [(m.start(), "section", m) for m in SECTION.finditer(line)]
            events += [(m.start(), "mention", m) for m in MENTION.finditer(line)]
            named = None  # the spec named right before the next section sign
            for _, kind, m in sorted(events, key=lambda e: e[0]):
                if kind == "mention":
                    spec = resolve_spec(m.group(0), path, sections)
                    names_next = NAMES_NEXT.match(line, m.end())
                    if names_next and spec is None:
                        errors.append(
                            f"{rel}:{lineno}: {line.strip()}\n"
                            f"    `{m.group(0)}` is not a spec in docs/spec"
                        )
                    # A bad name's section is reported with the name, not counted.
                    named = (spec or BAD) if names_next else None
                    if spec is not None and own is None:
                        context = spec
                    continue
                where = f"{rel}:{lineno}: {line.strip()}"
                spec, named = named or context, None
                if FOREIGN.search(line[: m.start()]) or spec is BAD:
                    continue
                if spec is None:
                    errors.append(
                        f"{where}\n    §{m.group(1)} names no spec; name the file "
                        "(e.g. `docs/spec/api.md` §…) here or earlier in the file"
                    )
                    continue
                if m.group(1) not in sections[spec]:
                    errors.append(f"{where}\n    docs/spec/{spec} has no section {m.group(1)}")
                    continue
                ok += 1
    return ok, errors


def check_links(files) -> tuple[int, list[str]]:
    ok, errors = 0, []
    for path in files:
        if path.suffix != ".md":
            continue
        rel = path.relative_to(ROOT)
        in_code = False
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
            if in_code:
                continue
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue
                local = target.split("#", 1)[0]
                if (path.parent / local).exists():
                    ok += 1
                else:
                    errors.append(f"{rel}:{lineno}: link to {target} does not exist")
    return ok, errors


def main() -> int:
    files = list(source_files())
    n_refs, ref_errors = check_refs(files, spec_sections())
    n_links, link_errors = check_links(files)
    for e in ref_errors + link_errors:
        print(e)
    if ref_errors or link_errors:
        print(f"spec refs: {len(ref_errors)} broken, {n_refs} ok; links: {len(link_errors)} broken, {n_links} ok")
        return 1
    print(f"spec refs: {n_refs} ok")
    print(f"links: {n_links} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
