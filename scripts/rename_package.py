#!/usr/bin/env python
"""Rewrite the tree from the package name ``app`` to ``servekit`` (issue 16): the mechanical part.

Usage (from anywhere; works on the git-tracked files of the repository this script is in)::

    python scripts/rename_package.py           # rewrite in place, list the files changed
    python scripts/rename_package.py --check   # exit 1 if anything still says ``app`` (CI, review)

The ``app/`` *folder* keeps its name: pyproject.toml maps the package ``servekit`` onto it. So
file paths (``app/rest/infer.py``) stay as they are, and only the module name changes:

* ``from app... import``, ``import app...`` (code, code in strings, Markdown, notebooks);
* dotted module paths ``app.<module>`` where ``<module>`` is one of the ``app/`` folder's own
  modules or the package's public names (``app.serve``, ``app.__version__``): found in code,
  docstrings, comments, prose, the layer ``ruff.toml`` files and notebook outputs. Nothing else
  named ``app`` is touched (Litestar applications are variables called ``app`` too: ``app.routes``
  stays, since ``routes`` is not one of our modules);
* ``python -m app ...`` and argv lists ``[..., "-m", "app", ...]``;
* in a Python file that binds the module with a bare ``import app``, the bare name ``app``
  (``app.__file__``, ``monkeypatch.setattr(app, ...)``); such a file must not also use ``app`` as
  a variable (the script stops and names the file).

Running it again changes nothing (idempotent), so it can be re-run after merging a newer main.
The hand-written parts of the rename (the old-name shim, its tests, pyproject.toml, and any line
saying ``deprecated`` or ``old name``) are left alone; see SKIP_FILES and SKIP_LINE.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD, NEW = "app", "servekit"

# Hand-written, and about the old name on purpose.
SKIP_FILES = {
    "pyproject.toml",
    "app/__init__.py",
    "app/_old_name.py",
    "compat/app/__init__.py",
    "tests/test_package_name.py",
    "scripts/rename_package.py",
}
SKIP_SUFFIXES = {".onnx", ".png", ".jpg", ".ico", ".pb", ".npy", ".npz", ".whl", ".gz"}
# Prose that names the old package on purpose (the deprecation notes).
SKIP_LINE = re.compile(r"deprecat|old name", re.IGNORECASE)


def package_names() -> list[str]:
    """``app``'s own modules and subpackages (from the folder), and its public attributes."""
    folder = ROOT / OLD
    names = {p.stem for p in folder.glob("*.py")} | {
        p.parent.name for p in folder.glob("*/__init__.py")
    }
    names -= {"__init__"}
    names |= {"serve", "connect", "__version__", "__file__", "__path__", "__all__"}
    # Longest first, so that "cli_project" wins over "cli" in the alternation.
    return sorted(names, key=lambda n: (-len(n), n))


def text_rules() -> list[tuple[re.Pattern[str], str]]:
    names = "|".join(re.escape(n) for n in package_names())
    return [
        # from app import x / from app.x import y (also inside strings, Markdown, notebooks).
        (
            re.compile(rf"(?<![\w.])from(\s+){OLD}(?=\s+import\b|\.(?!py\b)[A-Za-z_])"),
            rf"from\1{NEW}",
        ),
        # import app / import app.x / import app as y / import app.cli, app.server
        (
            re.compile(rf"(?<![\w.])import(\s+){OLD}(?!\.py\b)(?=\s|$|\\n|[.,;\"'`)])", re.M),
            rf"import\1{NEW}",
        ),
        # python -m app / -m app.runtimes.isolated_child
        (re.compile(rf"(?<![\w-])-m(\s+){OLD}(?![\w/-])(?!\.py\b)"), rf"-m\1{NEW}"),
        # [sys.executable, "-m", "app", ...] (plain or JSON-escaped quotes, as in notebooks)
        (
            re.compile(rf"""(\\?["'])-m\1(,\s*)(\\?["']){OLD}\3"""),
            rf"\1-m\1\2\3{NEW}\3",
        ),
        # app.<one of our modules or public names>, also regex-escaped (app\.serve)
        (re.compile(rf"(?<![\w./\\-]){OLD}(?=\\?\.(?:{names})\b)"), NEW),
    ]


_BINDS_OLD = re.compile(rf"^\s*import\s+{OLD}(\.[\w.]+)?\s*(#.*)?$", re.M)
_OLD_AS_VARIABLE = re.compile(
    rf"(?<![\w.]){OLD}\s*(=(?!=)|:\s*[A-Za-z])|\bas\s+{OLD}\b|\bfor\s+{OLD}\b|def\s+\w+\([^)]*\b{OLD}\b"
)


def rewrite_bare_name(text: str, path: str) -> str:
    """In a Python file that did ``import app``, the module's bare name ``app`` -> ``servekit``."""
    if _OLD_AS_VARIABLE.search(text):
        raise SystemExit(
            f"{path}: binds `import {OLD}` and also uses `{OLD}` as a variable; rename it by hand"
        )
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int]] = []
    previous: tokenize.TokenInfo | None = None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        after_dot = previous is not None and previous.type == tokenize.OP and previous.string == "."
        if token.type == tokenize.NAME and token.string == OLD and not after_dot:
            edits.append(token.start)
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = token
    for row, col in reversed(edits):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + NEW + line[col + len(OLD) :]
    return "".join(lines)


def rewrite(text: str, path: str, rules: list[tuple[re.Pattern[str], str]]) -> str:
    binds_old = path.endswith(".py") and _BINDS_OLD.search(text) is not None
    out = []
    for line in text.splitlines(keepends=True):
        if not SKIP_LINE.search(line):
            for pattern, replacement in rules:
                line = pattern.sub(replacement, line)
        out.append(line)
    result = "".join(out)
    if binds_old:
        result = rewrite_bare_name(result, path)
    return result


def tracked_files() -> list[str]:
    """git's list of the repository's files; without git (an unpacked sdist), the folder's."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        skip = {"build", "dist", "node_modules", "__pycache__"}
        return sorted(
            str(path.relative_to(ROOT))
            for path in ROOT.rglob("*")
            if path.is_file()
            and not any(p.startswith(".") or p in skip for p in path.relative_to(ROOT).parts)
        )
    return [name for name in listed.split("\0") if name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing, exit 1 if needed")
    parser.add_argument(
        "--no-ruff", action="store_true", help="skip sorting imports and formatting afterwards"
    )
    args = parser.parse_args(argv)
    rules = text_rules()
    changed = []
    for name in tracked_files():
        path = ROOT / name
        if name in SKIP_FILES or path.suffix in SKIP_SUFFIXES or path.is_symlink():
            continue
        if not path.is_file():
            continue
        try:
            with path.open(encoding="utf-8", newline="") as file:
                text = file.read()
        except UnicodeDecodeError:
            continue
        new = rewrite(text, name, rules)
        if new != text:
            changed.append(name)
            if not args.check:
                with path.open("w", encoding="utf-8", newline="") as file:
                    file.write(new)
    verb = "would change" if args.check else "changed"
    print(f"{verb} {len(changed)} files" + "".join(f"\n  {n}" for n in changed))
    if args.check:
        return 1 if changed else 0
    python = [n for n in changed if n.endswith(".py")]
    if python and not args.no_ruff:
        tidy(python)
    return 0


def tidy(files: list[str]) -> None:
    """Sort the rewritten imports (servekit sorts after app did), wrap what grew past the line
    length, and list the lines ruff cannot wrap (prose, ``# fmt: skip``): those are for a human."""
    ruff = [sys.executable, "-m", "ruff"]
    quiet = ["--quiet", "--force-exclude"]  # --force-exclude: leave app/protos (generated) be
    subprocess.run([*ruff, "check", "--fix", "--select", "I", *quiet, *files], cwd=ROOT)
    subprocess.run([*ruff, "format", *quiet, *files], cwd=ROOT, check=True)
    long = subprocess.run(
        [*ruff, "check", "--select", "E501", "--output-format", "concise", *quiet, *files],
        cwd=ROOT,
    )
    if long.returncode:
        print("lines too long after the rename (above): wrap them by hand")


if __name__ == "__main__":
    sys.exit(main())
