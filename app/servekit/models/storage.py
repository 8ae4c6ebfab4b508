"""Safe writing of model files pushed by clients (repository load with ``file:`` parameters).

A load request names files as ``file:<version>/<path>``; those names come from the network, so
they are validated as a whole *before* anything touches the disk: relative POSIX paths whose
first part is a version number and whose parts are plain names (no ``..``, no leading dot, no
backslash, no NUL, no drive letters). Each accepted push is written into a fresh folder,
``<storage>/<model>/<generation>/``, created by us and marked as ours, with ``O_NOFOLLOW |
O_EXCL`` so no link planted inside storage can redirect a write. A failed load deletes its
folder; a replaced push deletes the previous one, an unload the current one; leftovers from an
earlier run are removed at start (only folders carrying our marker, so a storage dir pointed at
user data loses nothing). The folder's absolute path is never shown to clients
(app/servekit/shown_paths.py): where a client's bytes landed is the server's business.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
from pathlib import Path, PurePosixPath

from servekit.config.schema import MODEL_NAME
from servekit.errors import InvalidArgument, ResourceExhausted

FILE_PREFIX = "file:"
MARKER = ".servekit-upload"
MAX_FILES = 64
MAX_DEPTH = 8
MAX_KEY_CHARS = 1024
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}$")


def default_storage_dir(base_dir: Path, configured: str | None) -> Path:
    """``server.storageDir`` resolved against serve.yaml's folder (default .servekit/storage)."""
    return (base_dir / (configured or ".servekit/storage")).absolute()


def parse_file_key(key: str) -> PurePosixPath:
    """``file:1/model.onnx`` -> ``1/model.onnx``; anything that could escape is refused."""
    rel = key[len(FILE_PREFIX) :] if key.startswith(FILE_PREFIX) else key
    shown = repr(key[:200])
    if not rel or len(key) > MAX_KEY_CHARS:
        raise InvalidArgument(f"file parameter {shown}: give file:<version>/<name>")
    if "\x00" in rel or "\\" in rel or ":" in rel:
        raise InvalidArgument(f"file parameter {shown}: NUL, backslash and ':' are not allowed")
    if rel.startswith("/"):
        raise InvalidArgument(f"file parameter {shown}: absolute paths are not allowed")
    parts = rel.split("/")
    if len(parts) < 2 or len(parts) > MAX_DEPTH:
        raise InvalidArgument(
            f"file parameter {shown}: give file:<version>/<name> (at most {MAX_DEPTH} parts)"
        )
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidArgument(f"file parameter {shown}: empty, '.' and '..' parts are not allowed")
    if not parts[0].isdigit() or len(parts[0]) > 18 or not parts[0].isascii():
        raise InvalidArgument(f"file parameter {shown}: the first part must be a version number")
    for part in parts[1:]:
        if not _PART.match(part):
            raise InvalidArgument(
                f"file parameter {shown}: {part!r} is not a plain file name (letters, digits, "
                "'_', '.', '-', not starting with a dot)"
            )
    return PurePosixPath(*parts)


def validate_files(
    files: dict[str, object], max_total_bytes: int
) -> list[tuple[PurePosixPath, bytes]]:
    """Check every pushed file's name, type and size; nothing is written here."""
    if len(files) > MAX_FILES:
        raise ResourceExhausted(f"at most {MAX_FILES} files can be pushed in one load")
    out: list[tuple[PurePosixPath, bytes]] = []
    total = 0
    for key, content in files.items():
        path = parse_file_key(key)
        if not isinstance(content, bytes | bytearray | memoryview):
            raise InvalidArgument(f"file parameter {key!r} must carry bytes")
        data = bytes(content)
        total += len(data)
        if total > max_total_bytes:
            raise ResourceExhausted(
                f"pushed files exceed the limit of {max_total_bytes} bytes (server.maxRequestBytes)"
            )
        out.append((path, data))
    paths = {p for p, _ in out}
    for path in paths:
        if any(parent in paths for parent in path.parents):
            raise InvalidArgument(f"file {path} is inside another pushed file")
    return out


def stage(root: Path, model: str, files: list[tuple[PurePosixPath, bytes]]) -> Path:
    """Write validated ``files`` into a new generation folder of ``model``; return the folder."""
    if not MODEL_NAME.match(model):
        raise InvalidArgument(f"invalid model name {model!r}")
    root.mkdir(parents=True, exist_ok=True)
    real_root = root.resolve()
    model_dir = real_root / model
    try:
        model_dir.mkdir(exist_ok=True)
    except FileExistsError:
        raise InvalidArgument(f"storage for {model!r} is not a folder") from None
    if model_dir.is_symlink() or model_dir.resolve().parent != real_root:
        raise InvalidArgument(f"storage for {model!r} is a link; refusing to write through it")
    generation = model_dir / f"{os.getpid()}-{time.time_ns()}-{uuid.uuid4().hex[:8]}"
    generation.mkdir()
    try:
        _write(generation, MARKER, b"")
        for path, data in files:
            folder = generation
            for part in path.parts[:-1]:
                folder = folder / part
                if not folder.exists():
                    folder.mkdir()
                if folder.is_symlink() or not folder.is_dir():
                    raise InvalidArgument(f"cannot write {path}: {part!r} is not a folder")
            _write(folder, path.name, data)
            if not (generation / path).resolve().is_relative_to(generation):
                raise InvalidArgument(f"file {path} would land outside the model's storage")
    except BaseException:
        shutil.rmtree(generation, ignore_errors=True)
        raise
    return generation


def _write(folder: Path, name: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(folder / name, flags, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def is_generation(root: Path, folder: Path) -> bool:
    """Whether ``folder`` is a push folder we wrote inside ``root``."""
    try:
        real = folder.resolve()
        return (
            real.parent.parent == root.resolve()
            and not folder.is_symlink()
            and (real / MARKER).is_file()
        )
    except OSError:
        return False


def disk_bytes(folder: Path) -> int:
    """Bytes the files of a push folder take (links are not followed; we never write any)."""
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += (Path(parent) / name).lstat().st_size
    return total


def discard(root: Path, folder: Path | None) -> None:
    """Delete a push folder (only one of ours) and its model folder once empty."""
    if folder is None or not is_generation(root, folder):
        return
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # other generations still there
        folder.parent.rmdir()


def clean(root: Path) -> int:
    """Remove push folders left by servers that are gone (another live server sharing the
    folder keeps its own); returns how many were removed."""
    if not root.is_dir():
        return 0
    removed = 0
    for model_dir in root.iterdir():
        if model_dir.is_symlink() or not model_dir.is_dir():
            continue
        for folder in model_dir.iterdir():
            owner = folder.name.split("-", 1)[0]
            alive = owner.isdigit() and _alive(int(owner))
            if not alive and is_generation(root, folder):
                discard(root, folder)
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another server in this process (a notebook) may still use them
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True
