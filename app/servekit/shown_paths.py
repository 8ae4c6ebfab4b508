"""What clients see of server paths: never an absolute one.

Reasons (why a model version is UNAVAILABLE), error messages and dashboard pages reach anyone
allowed to read the index or the dashboard. An absolute path tells them how the server's disk is
laid out and, for a pushed model, exactly where the client's bytes landed: that is what once
turned a file push into code execution (push a pickle, read its path, point a model at it). So
every text that may hold a path is rewritten here before it is stored where clients read it,
while the server log keeps the full text:

* a file inside a push folder becomes ``<model>/<version>/<file>`` (the storage folder and the
  push folder's name are the server's business);
* anything under serve.yaml's folder becomes relative to it (``models/mlp/1/model.onnx``);
* any other absolute path keeps only its last part (``…/model.onnx``).
"""

from __future__ import annotations

import re
from pathlib import Path

GENERATION = re.compile(r"\d+-\d+-[0-9a-f]{8}")
"""Name of a push folder (app/servekit/models/storage.py): ``<pid>-<time_ns>-<random>`` (the pid
lets
``clean`` spare the folders of a live server sharing the storage dir; the random part makes the
name unguessable). Defined here, below storage, because hiding such paths needs it too."""
PUSHED_LABEL = "(pushed files)"
"""How a pushed model's storage location is shown (the same text its config holds while the
files are being written)."""

_PART = r"[^\s'\"`/,;:()\[\]<>]+"
_BEFORE = r"(?<![\w.~\-:/…])"  # an absolute path starts after a space, a quote, '(' or the start
_PUSHED = re.compile(
    rf"{_BEFORE}(?:/{_PART})*?/(?P<model>[A-Za-z0-9][A-Za-z0-9_.\-]{{0,127}})/{GENERATION.pattern}"
    r"(?![\w\-])"
)
_ABSOLUTE = re.compile(rf"{_BEFORE}/(?:{_PART}/)*(?P<last>{_PART})")


def hide_paths(text: str, base_dir: Path | None = None) -> str:
    """``text`` with every absolute path rewritten as the module docstring says."""
    if "/" not in text:
        return text
    text = _PUSHED.sub(lambda m: m["model"], text)
    if base_dir is not None:
        for base in _forms(base_dir):
            text = text.replace(base + "/", "")
            text = re.sub(re.escape(base) + r"(?![\w.\-/])", ".", text)
    return _ABSOLUTE.sub(lambda m: f"…/{m['last']}", text)


def _forms(base_dir: Path) -> list[str]:
    """serve.yaml's folder as written and with links resolved, longest first."""
    forms = {str(base_dir.absolute()), str(base_dir.resolve())}
    return sorted((f for f in forms if len(f) > 1), key=len, reverse=True)


def shown_storage_uri(uri: str | None, base_dir: Path | None) -> str | None:
    """A model's storageUri as a client may see it: as written in serve.yaml when relative,
    :data:`PUSHED_LABEL` for a pushed model, else relative to serve.yaml's folder at most."""
    if uri is None or not Path(uri).is_absolute():
        return uri
    if is_pushed_location(uri):
        return PUSHED_LABEL
    return hide_paths(uri, base_dir)


def is_pushed_location(uri: str) -> bool:
    """Whether ``uri`` is a push folder (``<storage>/<model>/<generation>``)."""
    path = Path(uri)
    return path.is_absolute() and GENERATION.fullmatch(path.name) is not None
