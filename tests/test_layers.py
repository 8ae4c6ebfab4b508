"""The layer table (pyproject.toml's [tool.importlinter]) holds, for every layer, adapters too.

- ``lint-imports`` passes on this checkout (in process: the import-linter API).
- Each of the six imports issue 23's probe found (an adapter reaching past the services or into
  another adapter, the client importing the HTTP server) fails ``lint-imports`` when added to a
  copy of the tree (end-to-end: a ``lint-imports`` process per probe).
- docs/ARCHITECTURE.md shows the same table as pyproject.toml.
- No import circle spans more than one folder (grimp's graph, which import-linter builds).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

from servekit.config.schema import GRPS_MESSAGE_KEYS
from servekit.protos import grps_pb2

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"


def _config() -> dict[str, object]:
    config: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "importlinter"
    ]
    return config


def _layers() -> list[str]:
    contracts = _config()["contracts"]
    assert isinstance(contracts, list)
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    return list(layers["layers"])


def test_lint_imports_passes() -> None:
    # import-linter configures logging (dictConfig), which disables every logger that exists:
    # later tests reading servekit's logs would see nothing. Put them back as they were.
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]
    disabled = [logger.disabled for logger in loggers]
    try:
        assert lint_imports(str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0
    finally:
        for logger, was in zip(loggers, disabled, strict=True):
            logger.disabled = was


# (file, import added, what it does) -- the probe of issue 23, one import at a time.
PROBES = [
    (
        "dashboard/views.py",
        "from servekit.models.repository import ModelEntry, VersionEntry",
        "the dashboard takes live repository entries",
    ),
    (
        "rest/repository.py",
        "from servekit.models.storage import FILE_PREFIX",
        "an HTTP route reaches the storage behind ModelControl",
    ),
    (
        "notebook/handle.py",
        "from servekit.runtimes import python",
        "the notebook imports a runtime (was runtimes.onnx_files)",
    ),
    (
        "client/transport.py",
        "from servekit.rest.errors import HTTP_STATUS",
        "the client imports the Litestar adapter's status table",
    ),
    (
        "dashboard/bench.py",
        "from servekit.notebook.handle import Server",
        "the dashboard imports the notebook (the old server -> dashboard -> notebook circle)",
    ),
    (
        "dashboard/views.py",
        "from servekit.services.dataplane import DataPlane",
        "an adapter imports a services module instead of the services' public names",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("path", "line", "why"), PROBES, ids=[p[0] for p in PROBES])
def test_each_forbidden_import_fails_lint_imports(
    tmp_path: Path, path: str, line: str, why: str
) -> None:
    shutil.copytree(APP, tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "app" / "servekit" / path
    text = target.read_text()
    anchor = "from __future__ import annotations\n"
    assert anchor in text, path
    target.write_text(text.replace(anchor, f"{anchor}\n{line}  # noqa: F401\n", 1))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "app")}
    done = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
         "lint_imports_command()", "--no-cache"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0, f"{why}: lint-imports passed\n{done.stdout}"
    imported = line.split()[1]
    assert imported.rsplit(".", 1)[0] in done.stdout or imported in done.stdout, done.stdout
    # and the same copy without the probe passes: the failure is the probe's
    target.write_text(text)
    done = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
         "lint_imports_command()", "--no-cache"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout


# ---- the table in the docs -------------------------------------------------------------------
def test_architecture_md_shows_the_layer_table() -> None:
    """docs/ARCHITECTURE.md's ``layers`` block is pyproject.toml's table, line for line."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    found = re.search(r"<!-- layers: pyproject.toml -->\n```text\n(.*?)```", text, re.DOTALL)
    assert found, "docs/ARCHITECTURE.md lost its layer table block"
    rows = [re.split(r"\s{2,}#", row)[0].strip() for row in found.group(1).splitlines()]
    assert [r for r in rows if r] == _layers()


def test_the_layer_table_covers_every_module_and_folder() -> None:
    """Every top-level module and folder of the package sits in a layer (the rest of a folder
    is its own business), so no part escapes the import-direction check."""
    named = {name for row in _layers() for name in re.split(r"\s*[:|]\s*", row)}
    parts = {
        f"servekit.{path.stem}"
        for path in APP.glob("servekit/*")
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    assert len(parts) > 20, "the package's parts were not found"
    assert parts <= named, f"not in the layer table: {sorted(parts - named)}"


# ---- import circles ---------------------------------------------------------------------------
def _folder(module: str) -> str:
    """The folder a module's file is in (a package's own folder for its __init__)."""
    return module if (APP / Path(*module.split("."))).is_dir() else module.rpartition(".")[0]


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if child < len(edges[node]):
                work.append((node, child + 1))
                nxt = edges[node][child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_no_import_circle_spans_two_folders() -> None:
    graph = grimp.build_graph("servekit", cache_dir=None)
    spanning = [c for c in _circles(graph) if len({_folder(m) for m in c}) > 1]
    assert spanning == []


def test_the_circle_finder_finds_a_circle_across_folders() -> None:
    """The check above can fail: a circle made by hand is found and spans its two folders."""
    graph = grimp.ImportGraph()
    for module in ("servekit.a.x", "servekit.b.y", "servekit.a.z"):
        graph.add_module(module)
    graph.add_import(importer="servekit.a.x", imported="servekit.b.y")
    graph.add_import(importer="servekit.b.y", imported="servekit.a.x")
    graph.add_import(importer="servekit.a.z", imported="servekit.a.x")
    assert _circles(graph) == [["servekit.a.x", "servekit.b.y"]]


def test_config_spells_the_grps_message_keys_as_the_protocol_has_them() -> None:
    """config imports no protocol module, so it writes the keys out: they must stay true."""
    fields = grps_pb2.GrpsMessage.DESCRIPTOR.fields
    assert {"ndarray", *(f.name for f in fields), *(f.json_name for f in fields)} == set(
        GRPS_MESSAGE_KEYS
    )


LONG_MODULE_LINES = 400
"""A module longer than this is named, with why, in docs/ARCHITECTURE.md's "Modules over 400
lines" (issue 37: one job per module, long only where the job needs it)."""


def test_every_long_module_is_named_in_architecture_md() -> None:
    package = ROOT / "app" / "servekit"
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = text.split("## Modules over 400 lines", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `([\w/]+\.py)` \|", table, re.M))
    long = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "protos" not in path.parts and len(path.read_text().splitlines()) > LONG_MODULE_LINES
    }
    assert long, "no module found over the limit: the package was not found"
    assert long <= named, f"modules over {LONG_MODULE_LINES} lines not named: {long - named}"
    assert named <= long, f"named but no longer over {LONG_MODULE_LINES} lines: {named - long}"
