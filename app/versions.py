"""Model versions on disk and Triton's version policies.

A storage location is either one model file (version 1), a folder holding one model file
(version 1), or a folder of numbered version folders each holding one model file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.config import VersionPolicy

MODEL_SUFFIXES = (".onnx",)


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
    files = sorted(p for p in folder.iterdir() if p.suffix in MODEL_SUFFIXES)
    if len(files) == 1:
        return files[0], None
    if not files:
        return None, f"no model file (model.onnx) in {folder}"
    names = ", ".join(p.name for p in files)
    return None, f"several model files in {folder} ({names}); name one model.onnx"


def discover_versions(location: Path) -> tuple[list[VersionSource], str | None]:
    """Versions found at ``location``, or a problem a user can act on."""
    if not location.exists():
        return [], f"storageUri {location} does not exist"
    if location.is_file():
        return [VersionSource(1, location)], None
    numbered = sorted(
        (int(p.name), p)
        for p in location.iterdir()
        if p.is_dir() and p.name.isascii() and p.name.isdigit()  # not '²': int() refuses it
    )
    if not numbered:
        path, problem = model_file_in(location)
        return ([VersionSource(1, path)] if path else []), problem
    versions = []
    for number, folder in numbered:
        path, problem = model_file_in(folder)
        versions.append(VersionSource(number, path, problem))
    return versions, None


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
