"""One model from a folder, no serve.yaml: ``servekit serve --model-dir DIR --model-name NAME``.

KServe's runtimes and ``mlserver start`` serve what an InferenceService points at: its files at
/mnt/models, its name from the InferenceService. This module turns such a folder into the
serve.yaml one model entry would be (``name``, ``modelFormat``, ``storageUri``), so the folder
is served by exactly the code that serves a serve.yaml, its versions found by
app/servekit/config/versions.py. The format is told by the files when not given:

* ``MLmodel`` - mlflow (its folder also holds the flavour's own files, e.g. ``model.pkl``);
* ``model-settings.json`` - MLServer's settings: its ``implementation`` names the format and
  ``parameters.uri`` the file;
* ``model.joblib`` / ``model.pkl`` / ``model.pickle`` - sklearn;
* ``model.json`` / ``model.ubj`` / ``model.bst`` - xgboost, except a ``model.bst`` in LightGBM's
  text format (KServe's lgbserver names its files so) - lightgbm;
* ``model.txt`` - lightgbm; ``model.onnx`` - onnx;
* numbered version folders (``1/model.onnx``) - the format of the files in them;
* a single file as the folder (a storageUri naming one object) - the format of its name.

A folder that cannot be served (no recognised file, files of two formats, a pickle that is not
one) is refused before anything starts, in one line naming the folder's files (never its path,
which is the pod's business), so the pod never turns ready and its log says why. A model file
that looks right but does not load (a truncated pickle) stops ``servekit serve --model-dir``
once its load failed, in one line too (app/servekit/cli/serve.py).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from servekit.config.mlserver_project import BUILTINS

FORMATS = ("sklearn", "xgboost", "lightgbm", "mlflow", "onnx")
"""What ``--model-format`` accepts (KServe's modelFormat names)."""

BY_NAME = {
    "model.joblib": "sklearn",
    "model.pkl": "sklearn",
    "model.pickle": "sklearn",
    "model.json": "xgboost",
    "model.ubj": "xgboost",
    "model.bst": "xgboost",  # or lightgbm: see _bst_format
    "model.txt": "lightgbm",
    "model.onnx": "onnx",
}
BY_SUFFIX = {".joblib": "sklearn", ".pkl": "sklearn", ".pickle": "sklearn", ".ubj": "xgboost",
             ".bst": "xgboost", ".onnx": "onnx"}  # fmt: skip
"""Other names of a one-file model (``iris.joblib``); .json and .txt say too little alone."""

PICKLE_STARTS = (b"\x80", b"(", b"c", b"}", b"]", b"x", b"\x1f\x8b", b"BZh", b"\xfd7zXZ",
                 b"\x04\x22\x4d\x18")  # fmt: skip
"""How a joblib or pickle file begins: a pickle opcode (protocol 2+ or an old protocol's
MARK/GLOBAL/dict/list), or one of joblib's compressions (zlib, gzip, bz2, xz/lzma, lz4)."""

MAX_SHOWN = 12


class ModelDirError(ValueError):
    """A model folder that cannot be served; the message is one line for the pod's log."""


def model_dir_config(
    folder: str | Path, name: str, model_format: str | None = None
) -> dict[str, Any]:
    """The serve.yaml content that serves ``folder`` as model ``name``."""
    path = Path(folder).absolute()
    if not path.exists():
        raise ModelDirError("the model folder (--model-dir) does not exist")
    fmt, uri = _format_and_file(path, model_format)
    entry = {"name": name, "modelFormat": {"name": fmt}, "storageUri": str(uri)}
    # KServe's servers answer typed contents to typed gRPC requests: its clients read `.data`.
    return {"server": {"grpcAnswers": "asSent"}, "models": [entry]}


def model_dir_config_file(folder: str | Path, name: str, model_format: str | None = None) -> Path:
    """:func:`model_dir_config` written as serve.yaml in a new temporary folder: worker
    processes and reloads read the config from a file, like any other."""
    config = model_dir_config(folder, name, model_format)
    target = Path(tempfile.mkdtemp(prefix="servekit-model-")) / "serve.yaml"
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return target


def folder_files(folder: str | Path) -> str:
    """The folder's files by name, for a message (the file's own name when it is one)."""
    path = Path(folder)
    try:
        return _shown([path.name] if path.is_file() else _listing(path))
    except OSError:
        return "unreadable"


def load_failure(model: str, reasons: list[str], folder: str | Path) -> str:
    """The one line ``servekit serve --model-dir`` stops with when its model did not load."""
    why = "; ".join(dict.fromkeys(r for r in reasons if r)) or "no version"
    return (
        f"model {model} did not load from the model folder (files: {folder_files(folder)}): {why}"
    )


def _format_and_file(path: Path, given: str | None) -> tuple[str, Path]:
    if given is not None and given not in FORMATS:
        raise ModelDirError(
            f"--model-format {given!r} is not one servekit serves from a folder: "
            f"{', '.join(FORMATS)}"
        )
    if path.is_file():
        fmt = _file_format(path)
        found = {fmt} if fmt is not None else set()
        files: list[str] = [path.name]
        model_file: Path | None = path
        uri = path
    elif (path / "model-settings.json").is_file():
        fmt, uri = _mlserver_settings(path)
        found, files, model_file = {fmt}, _listing(path), uri if uri.is_file() else None
    else:
        files = _listing(path)
        found, model_file = _folder_formats(path)
        uri = path
    if given is not None:
        lightgbm_bst = given == "lightgbm" and found == {"xgboost"} and _has_bst(path)
        if given not in found and not lightgbm_bst:
            raise ModelDirError(
                f"no {given} model file in the model folder (files: {_shown(files)})"
            )
        found = {given}
    if not found:
        raise ModelDirError(
            f"no model file servekit recognises in the model folder (files: {_shown(files)}); "
            "expected model.joblib or model.pkl (sklearn), model.bst, model.json or model.ubj "
            "(xgboost), model.txt (lightgbm), MLmodel (mlflow), model.onnx or 1/model.onnx "
            "(onnx), or model-settings.json (MLServer)"
        )
    if len(found) > 1:
        raise ModelDirError(
            f"the model folder holds files of several formats ({', '.join(sorted(found))}; "
            f"files: {_shown(files)}): keep one model, or say which with --model-format"
        )
    (fmt,) = found
    if fmt == "sklearn" and model_file is not None:
        _check_pickle(model_file, files)
    return fmt, uri


def _folder_formats(path: Path) -> tuple[set[str], Path | None]:
    """The formats the folder's files say, and the one model file (None: a folder model or
    version folders)."""
    if (path / "MLmodel").is_file():
        return {"mlflow"}, None
    found: dict[str, Path] = {}
    for entry in _entries(path):
        fmt = _file_format(entry, by_suffix=False) if entry.is_file() else None
        if fmt is not None:
            found.setdefault(fmt, entry)
    if not found:
        candidates = [e for e in _entries(path) if e.is_file() and _file_format(e) is not None]
        for entry in candidates:
            found.setdefault(_file_format(entry) or "", entry)
    if found:
        only = next(iter(found.values())) if len(found) == 1 else None
        return set(found), only
    versions = [e for e in _entries(path) if e.is_dir() and e.name.isascii() and e.name.isdigit()]
    formats: set[str] = set()
    for version in versions:
        inner, _ = _folder_formats(version)
        formats |= inner
    return formats, None


def _file_format(path: Path, *, by_suffix: bool = True) -> str | None:
    fmt = BY_NAME.get(path.name) or (BY_SUFFIX.get(path.suffix) if by_suffix else None)
    if fmt == "xgboost" and path.suffix == ".bst":
        return _bst_format(path)
    return fmt


def _bst_format(path: Path) -> str:
    """``model.bst`` is XGBoost's binary format, or a LightGBM text model (which begins with
    its ``tree`` header) under the name KServe's lgbserver expects."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError:
        return "xgboost"
    return "lightgbm" if head == b"tree" else "xgboost"


def _has_bst(path: Path) -> bool:
    return (path.is_file() and path.suffix == ".bst") or (path / "model.bst").is_file()


def _mlserver_settings(path: Path) -> tuple[str, Path]:
    """The format and file of MLServer's ``model-settings.json``."""
    try:
        settings = json.loads((path / "model-settings.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise ModelDirError(
            f"model-settings.json in the model folder cannot be read: {why}"
        ) from None
    if not isinstance(settings, dict):
        raise ModelDirError("model-settings.json in the model folder is not a JSON object")
    implementation = settings.get("implementation")
    builtin = BUILTINS.get(str(implementation))  # MLServer's runtimes of servekit's formats
    if builtin is None:
        known = ", ".join(BUILTINS)
        raise ModelDirError(
            f"model-settings.json names implementation {implementation!r}: servekit serves "
            f"{known} from a folder"
        )
    parameters = settings.get("parameters")
    uri = parameters.get("uri") if isinstance(parameters, dict) else None
    fmt = builtin.format
    if uri is None:
        return fmt, path
    target = (path / str(uri)).resolve()
    if not target.is_relative_to(path.resolve()) or not target.exists():
        raise ModelDirError(
            f"model-settings.json's parameters.uri {str(uri)!r} is not a file of the model "
            f"folder (files: {_shown(_listing(path))})"
        )
    return fmt, target


def _check_pickle(path: Path, files: list[str]) -> None:
    """Refuse a scikit-learn file that is not a pickle or joblib file at all, before start."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise ModelDirError(
            f"{path.name} in the model folder cannot be read: {exc.strerror}"
        ) from None
    if not any(head.startswith(start) for start in PICKLE_STARTS):
        raise ModelDirError(
            f"{path.name} in the model folder is not a joblib or pickle file "
            f"(files: {_shown(files)})"
        )


def _entries(path: Path) -> list[Path]:
    return sorted(e for e in path.iterdir() if not e.name.startswith("."))


def _listing(path: Path) -> list[str]:
    """The folder's files and folders by name (folders with a slash), for messages."""
    return [e.name + ("/" if e.is_dir() else "") for e in _entries(path)]


def _shown(files: list[str]) -> str:
    if not files:
        return "none"
    more = len(files) - MAX_SHOWN
    return ", ".join(files[:MAX_SHOWN]) + (f", and {more} more" if more > 0 else "")
