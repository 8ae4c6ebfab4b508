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

URIs are shown the same way everywhere (:func:`shown_uri`, the one redaction of a URI: a
storageUri, an endpoint, a URL inside a message): without user info (a password), query (a
signed URL's signature and credential live there; shown as ``?...``) or fragment. The server
keeps the URI as written to fetch from it; nothing it shows or logs carries those parts.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

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


_URI = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*)://(?P<authority>[^\s/?#'\"<>`]*)"
    r"(?P<path>[^\s?#'\"<>`]*)(?P<query>\?[^\s#'\"<>`]*)?(?P<fragment>#[^\s'\"<>`]*)?"
)
_TAIL = re.compile(r"[.:,;)\]]*$")
"""What may follow a URI in a sentence (its period, a colon): kept after the shown URI."""


def shown_uri(uri: str) -> str:
    """``uri`` as logs, answers and pages may show it: no user info, query or fragment (a
    signed URL's signature lives in its query; shown as ``?...``); a path is returned as it
    is."""
    if "://" not in uri:
        return uri
    tail = _TAIL.search(uri)
    end = tail.start() if tail is not None and tail.start() > 0 else len(uri)
    if uri[end - 1] == "?" and uri.startswith("...", end):  # shown already: "?..." stays
        end += 3
    found = _URI.fullmatch(uri, 0, end)
    if found is None:  # spaces or quotes in it: no telling its parts apart, show the scheme
        return uri.split("://", 1)[0] + "://..."
    host = found["authority"].rpartition("@")[2]
    query = "?..." if found["query"] else ""
    return f"{found['scheme']}://{host}{found['path']}{query}{uri[end:]}"


def hide_uri_secrets(text: str) -> str:
    """``text`` with every URI in it as :func:`shown_uri` shows it."""
    return _URI.sub(lambda found: shown_uri(found[0]), text) if "://" in text else text


def uri_secrets(uri: str) -> list[str]:
    """The parts of ``uri`` that may be secrets (its user info, user and password, and each
    query value), as written and decoded, longest first: what a message quoting any of them
    must blank out (a library's error may quote a part without the whole URI)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return []
    user_info = parts.netloc.rpartition("@")[0]
    found = [user_info, *user_info.split(":", 1)]
    for item in parts.query.split("&"):
        name, _, value = item.partition("=")
        found.append(value or name)
    found += [unquote(part) for part in found]
    return sorted({part for part in found if len(part) >= 4}, key=len, reverse=True)


def hide_paths(text: str, base_dir: Path | None = None) -> str:
    """``text`` with every absolute path rewritten as the module docstring says, and every URI
    as :func:`shown_uri` shows it."""
    if "/" not in text:
        return text
    text = hide_uri_secrets(text)
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
    """A model's storageUri as a client may see it: a URI as :func:`shown_uri` shows it, a path
    as written in serve.yaml when relative, :data:`PUSHED_LABEL` for a pushed model, else
    relative to serve.yaml's folder at most."""
    if uri is not None and uri.startswith("file://"):  # a path: shown as paths are
        uri = urlsplit(uri).path
    if uri is not None and "://" in uri:  # remote: no user info, no signed query
        return shown_uri(uri)
    if uri is None or not Path(uri).is_absolute():
        return uri
    if is_pushed_location(uri):
        return PUSHED_LABEL
    return hide_paths(uri, base_dir)


def is_pushed_location(uri: str) -> bool:
    """Whether ``uri`` is a push folder (``<storage>/<model>/<generation>``)."""
    path = Path(uri)
    return path.is_absolute() and GENERATION.fullmatch(path.name) is not None
