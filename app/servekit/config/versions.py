"""Model versions on disk and Triton's version policies.

A storage location is either one model file (version 1), a folder holding one model file
(version 1), or a folder of numbered version folders each holding one model file.

A version folder's name is read as a decimal integer, so ``01/`` is version 1 like ``1/`` (Triton
skips zero-prefixed folders instead; servekit has always served them, and a repository that
relies on that keeps working). Two folders meaning the same number (``1/`` and ``01/``) are an
ambiguity only the user can settle: that version is UNAVAILABLE with a reason naming both, and
the model's other versions are unaffected. Folders that are not numbers (``notes/``, ``-1/``,
``v2/``) and hidden entries (``.ipynb_checkpoints/`` that Jupyter creates, macOS ``._model.onnx``
copies) are not versions and not model files. A number beyond Triton's int64 version range is a
problem of the whole model: nothing could address that version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servekit.config.schema import VersionPolicy

MAX_VERSION = 2**63 - 1
"""The largest version number: Triton's model config and statistics carry versions as int64."""


@dataclass(frozen=True)
class ModelFiles:
    """What a model of one runtime implementation looks like on disk.

    A one-file model is a file with one of ``suffixes``; in a folder, the first of ``preferred``
    that exists wins, else the only file with such a suffix. A folder model (MLflow's) is a
    folder holding ``marker``: the version's path is then that folder.
    """

    suffixes: tuple[str, ...]
    preferred: tuple[str, ...]
    marker: str | None = None


ONNX_FILES = ModelFiles((".onnx",), ("model.onnx",))
FILES: dict[str, ModelFiles] = {
    "onnxruntime": ONNX_FILES,
    # KServe's sklearnserver looks for model.joblib, model.pkl, model.pickle in that order.
    "sklearn": ModelFiles(
        (".joblib", ".pkl", ".pickle"), ("model.joblib", "model.pkl", "model.pickle")
    ),
    "xgboost": ModelFiles((".json", ".ubj", ".bst"), ("model.json", "model.ubj", "model.bst")),
    "lightgbm": ModelFiles((".txt", ".bst"), ("model.txt", "model.bst")),
    "mlflow": ModelFiles((), (), marker="MLmodel"),
}
"""Model files by runtime implementation (a Python model's storageUri follows ONNX's rules)."""
IGNORED_FILES = frozenset({"labels.txt"})
"""Files beside a model that are never the model (labels.txt is a LightGBM-like .txt)."""


def files_of(implementation: str) -> ModelFiles:
    """The on-disk rules of a runtime implementation."""
    return FILES.get(implementation, ONNX_FILES)


@dataclass(frozen=True, order=True)
class VersionSource:
    """One version number and its model file (None: nothing on disk for it)."""

    version: int
    path: Path | None
    problem: str | None = None


def model_file_in(folder: Path, files: ModelFiles = ONNX_FILES) -> tuple[Path | None, str | None]:
    """The model in a version folder: the first preferred name (model.onnx), else the only
    file with the format's suffix; for a folder model, the folder itself when it holds the
    marker (MLmodel)."""
    if files.marker is not None:
        if (folder / files.marker).is_file():
            return folder, None
        return None, f"no {files.marker} file in {folder}"
    for name in files.preferred:
        preferred = folder / name
        if preferred.exists():
            return preferred, None
    found = _model_files(folder, files)
    if len(found) == 1:
        return found[0], None
    if not found:
        return None, f"no model file ({files.preferred[0]}) in {folder}"
    names = ", ".join(p.name for p in found)
    return None, f"several model files in {folder} ({names}); name one {files.preferred[0]}"


def discover_versions(
    location: Path, labels: Mapping[str, int] | None = None, files: ModelFiles = ONNX_FILES
) -> tuple[list[VersionSource], str | None]:
    """Versions found at ``location``, or a problem a user can act on.

    A folder named by one of the model's ``labels`` (serve.yaml ``versionLabels``, e.g. grps'
    ``1.0.0/``) is the version that label names. ``files`` says what a model file is (the
    runtime implementation's rules); a folder model (MLflow) at ``location`` itself is
    version 1."""
    labels = labels or {}
    if not location.exists():
        return [], f"storageUri {location} does not exist"
    if location.is_file():
        return [VersionSource(1, location)], None
    if files.marker is not None and (location / files.marker).is_file():
        return [VersionSource(1, location)], None
    folders: dict[int, list[str]] = {}
    others: list[str] = []
    for entry in location.iterdir():
        if not entry.is_dir() or not _visible(entry):
            continue
        if entry.name in labels:
            folders.setdefault(labels[entry.name], []).append(entry.name)
            continue
        if not _is_number(entry.name):
            others.append(entry.name)
            continue
        number = int(entry.name)
        if number > MAX_VERSION:
            return [], (
                f"version folder '{entry.name}' in {location} is beyond the largest version "
                f"number ({MAX_VERSION}); rename it"
            )
        folders.setdefault(number, []).append(entry.name)
    if not folders:
        path, problem = model_file_in(location, files)
        if problem and others and not _model_files(location, files):  # say why 'v1/' did not count
            named = ", ".join(f"'{n}'" for n in sorted(others))
            problem += f" (not version folders: {named}; name them 1/, 2/, ...)"
        return ([VersionSource(1, path)] if path else []), problem
    versions = []
    for number, names in sorted(folders.items()):
        if len(names) > 1:
            versions.append(VersionSource(number, None, _same_number(number, names)))
            continue
        path, problem = model_file_in(location / names[0], files)
        versions.append(VersionSource(number, path, problem))
    return versions, None


def _model_files(folder: Path, files: ModelFiles) -> list[Path]:
    """Candidate model files of a folder, by name."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.suffix in files.suffixes
        and p.name not in IGNORED_FILES
        and _visible(p)
        and p.is_file()
    )


def _is_number(name: str) -> bool:
    """A version folder name: ASCII digits only ('²' is a digit to str.isdigit, not to int)."""
    return name.isascii() and name.isdigit()


def _visible(path: Path) -> bool:
    """Hidden entries (.ipynb_checkpoints, ._model.onnx) belong to tools, never to a model."""
    return not path.name.startswith(".")


def _same_number(number: int, names: list[str]) -> str:
    """The reason of a version claimed by several folders, shortest (canonical) name first."""
    ordered = [f"'{n}'" for n in sorted(names, key=lambda n: (len(n), n))]
    listed = ", ".join(ordered[:-1]) + f" and {ordered[-1]}"
    both = "both" if len(names) == 2 else "all"
    return f"version folders {listed} {both} mean version {number}; keep one"


def select_versions(found: list[VersionSource], policy: VersionPolicy) -> tuple[VersionSource, ...]:
    """Apply a version policy; a specific version that is missing is kept with its problem."""
    ordered = sorted(found)
    if policy.all is not None:
        return tuple(ordered)
    if policy.latest is not None:
        return tuple(ordered[-policy.latest.num_versions :]) if ordered else ()
    assert policy.specific is not None
    by_number = {v.version: v for v in ordered}
    return tuple(
        by_number.get(n, VersionSource(n, None, f"version {n} has no folder"))
        for n in sorted(set(policy.specific.versions))
    )
