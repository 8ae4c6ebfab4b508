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

MODEL_SUFFIXES = (".onnx",)
MAX_VERSION = 2**63 - 1
"""The largest version number: Triton's model config and statistics carry versions as int64."""


@dataclass(frozen=True, order=True)
class VersionSource:
    """One version number and its model file (None: nothing on disk for it)."""

    version: int
    path: Path | None
    problem: str | None = None


def model_file_in(folder: Path) -> tuple[Path | None, str | None]:
    """The model file in a version folder: model.onnx, else the only *.onnx file."""
    preferred = folder / "model.onnx"
    if preferred.exists():
        return preferred, None
    files = _model_files(folder)
    if len(files) == 1:
        return files[0], None
    if not files:
        return None, f"no model file (model.onnx) in {folder}"
    names = ", ".join(p.name for p in files)
    return None, f"several model files in {folder} ({names}); name one model.onnx"


def discover_versions(
    location: Path, labels: Mapping[str, int] | None = None
) -> tuple[list[VersionSource], str | None]:
    """Versions found at ``location``, or a problem a user can act on.

    A folder named by one of the model's ``labels`` (serve.yaml ``versionLabels``, e.g. grps'
    ``1.0.0/``) is the version that label names."""
    labels = labels or {}
    if not location.exists():
        return [], f"storageUri {location} does not exist"
    if location.is_file():
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
        path, problem = model_file_in(location)
        if problem and others and not _model_files(location):  # say why 'v1/' did not count
            named = ", ".join(f"'{n}'" for n in sorted(others))
            problem += f" (not version folders: {named}; name them 1/, 2/, ...)"
        return ([VersionSource(1, path)] if path else []), problem
    versions = []
    for number, names in sorted(folders.items()):
        if len(names) > 1:
            versions.append(VersionSource(number, None, _same_number(number, names)))
            continue
        path, problem = model_file_in(location / names[0])
        versions.append(VersionSource(number, path, problem))
    return versions, None


def _model_files(folder: Path) -> list[Path]:
    """Candidate model files of a folder, by name."""
    return sorted(
        p for p in folder.iterdir() if p.suffix in MODEL_SUFFIXES and _visible(p) and p.is_file()
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
