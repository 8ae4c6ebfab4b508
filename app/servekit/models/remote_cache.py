"""The local cache of remote models: complete, checked snapshots, downloaded once.

Layout under ``server.storage.cacheDir``::

    <key>/                one folder per storageUri (key: a hash of the URI)
      uri                 the URI as it may be shown (no query, no user info)
      <digest>/           one complete snapshot: the files the listing named, as they were
        .manifest.json    that listing (paths, sizes, tags), whose hash is <digest>
        .used             touched each time a model takes the snapshot (least recently used)
        .file             when the URI names one object: its name (the file served)
      .tmp-<random>/      a download in progress (never served; removed when it fails)
    <key>.lock            held (flock) while a snapshot of that URI is made

Why snapshots named by their listing: a snapshot is renamed into place only once every file
is written and checked (size, and MD5 where the store gives one), so nothing half-written is
ever served; a start whose remote listing is unchanged finds its snapshot and downloads
nothing; a changed remote makes a new snapshot while the old one keeps serving, and files
that did not change are linked from the old one instead of downloaded again. The lock makes
two models, or two worker processes, asking for one URI download it once: the second finds
the first's snapshot. The cache is bounded: beyond ``maxBytes`` the least recently used
snapshots that no model of this process uses are deleted. When the store cannot be reached,
:func:`cached_copy` finds the snapshot a model last took, which it may serve meanwhile
(``server.storage.whenUnreachable``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tarfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path, PurePosixPath

from servekit.config.remote_uris import is_archive
from servekit.config.schema import StorageConfig
from servekit.models.remote_progress import Download
from servekit.models.remote_stores import (
    RemoteObject,
    Store,
    StoreError,
    StoreRefused,
    copy_file,
)
from servekit.shown_paths import shown_uri

log = logging.getLogger("servekit.storage")

MANIFEST = ".manifest.json"
USED = ".used"
ONE_FILE = ".file"
"""In a snapshot of one object (not an archive): that object's name, the file served."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/servekit/models``, else ``~/.cache/servekit/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servekit" / "models"


def cache_dir(settings: StorageConfig, base_dir: Path) -> Path:
    """The cache folder in force (relative paths from serve.yaml's folder)."""
    if settings.cache_dir is None:
        return default_cache_dir()
    return (base_dir / Path(settings.cache_dir).expanduser()).resolve()


def uri_key(uri: str) -> str:
    return hashlib.sha256(uri.encode()).hexdigest()[:24]


def snapshot(
    uri: str,
    store: Store,
    root: Path,
    settings: StorageConfig,
    in_use: set[Path],
    download: Download | None = None,
) -> Path:
    """The local copy of ``uri``: the folder (or the one file) a plan's versions are read from.
    ``download`` follows the bytes as they come (app/servekit/models/remote_progress.py).

    Raises StoreError (or the store's own error) when the remote cannot be listed or read; no
    partial snapshot is left behind."""
    download = download or Download("", shown_uri(uri))
    deadline = time.monotonic() + settings.timeout_seconds
    folder = root / uri_key(uri)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "uri").write_text(shown_uri(uri) + "\n")
    listing = store.list()
    objects = listing.objects
    if not objects:
        raise StoreRefused("nothing found there (no such bucket, container, folder or object)")
    total = sum(max(o.size, 0) for o in objects)
    if total > settings.max_download_bytes:
        raise StoreRefused(
            f"{total} bytes, beyond server.storage.maxDownloadBytes ({settings.max_download_bytes})"
        )
    digest = _digest(objects)
    target = folder / digest
    with _locked(root / f"{folder.name}.lock"):
        if not (target / MANIFEST).is_file():
            _download(uri, store, objects, folder, target, settings, deadline, download)
            log.info("fetched %s: %d file(s), %s", shown_uri(uri), len(objects),
                     download.finished())  # fmt: skip
        else:
            log.info("%s is unchanged: served from the cache", shown_uri(uri))
        one_file = listing.is_file and not is_archive(uri)
        if one_file and not (target / ONE_FILE).is_file():  # also a snapshot made before it
            (target / ONE_FILE).write_text(str(objects[0].path))
        _touch(target)
        in_use.add(target)
        evict(root, settings.max_bytes, in_use)
    return target / objects[0].path if one_file else target


def _served(target: Path) -> Path:
    """What a snapshot's versions are read from: the snapshot folder, or its one file."""
    with contextlib.suppress(OSError):
        return target / (target / ONE_FILE).read_text().strip()
    return target


def cached_copy(uri: str, root: Path) -> tuple[Path, float] | None:
    """The complete snapshot of ``uri`` a model took last (as :func:`snapshot` returns it) and
    when, or None: what serves while the store cannot be reached. Marked used again, so the
    cache keeps it."""
    folder = root / uri_key(uri)
    if not folder.is_dir():
        return None
    complete = [p for p in folder.iterdir() if (p / MANIFEST).is_file()]
    if not complete:
        return None
    last = max(complete, key=lambda p: (_last_used(p), (p / MANIFEST).stat().st_mtime))
    when = _last_used(last) or (last / MANIFEST).stat().st_mtime
    _touch(last)
    return _served(last), when


def _digest(objects: list[RemoteObject]) -> str:
    listing = json.dumps([[str(o.path), o.size, o.tag] for o in objects], sort_keys=True)
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


def _download(
    uri: str,
    store: Store,
    objects: list[RemoteObject],
    folder: Path,
    target: Path,
    settings: StorageConfig,
    deadline: float,
    download: Download,
) -> None:
    """Write every object into a temporary folder, check it, then rename it into place."""
    temporary = folder / f".tmp-{uuid.uuid4().hex}"
    temporary.mkdir()
    try:
        reusable = _previous_files(folder)
        earlier_files = ((o.path, reusable.get((str(o.path), o.tag))) for o in objects)
        kept = {path: file for path, file in earlier_files if file is not None and file.is_file()}
        fetched = [o for o in objects if o.path not in kept]
        download.begin(sum(max(o.size, 0) for o in fetched), len(fetched))
        for item in objects:
            _check_path(item.path)
            destination = temporary / item.path
            destination.parent.mkdir(parents=True, exist_ok=True)
            earlier = kept.get(item.path)
            if earlier is not None:
                copy_file(str(earlier), str(destination))
                continue
            _fetch(store, item, destination, deadline, download)
        if is_archive(uri):
            (archive,) = objects
            _unpack(temporary / archive.path, temporary, settings.max_download_bytes)
        manifest = [dict(asdict(o), path=str(o.path)) for o in objects]
        (temporary / MANIFEST).write_text(json.dumps(manifest))
        os.rename(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _fetch(
    store: Store, item: RemoteObject, destination: Path, deadline: float, download: Download
) -> None:
    written = 0

    def progress(done: int) -> None:
        nonlocal written
        if time.monotonic() > deadline:
            raise StoreError("the download took longer than server.storage.timeoutSeconds")
        download.add(done - written)
        written = done

    store.download(item, str(destination), progress)
    size = destination.stat().st_size
    if item.size >= 0 and size != item.size:
        raise StoreError(f"{item.path}: {size} bytes arrived, {item.size} were listed")
    if item.md5 is not None and _md5(destination) != item.md5:
        raise StoreError(f"{item.path}: the content does not match the store's MD5")


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as file:
        while chunk := file.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _check_path(path: PurePosixPath) -> None:
    """An object name that would land outside the snapshot (``..``, absolute) is refused."""
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise StoreRefused(f"object name {str(path)[:200]!r} leaves the model's folder")


def _unpack(archive: Path, into: Path, limit: int) -> None:
    """Unpack a .tar[.gz]/.zip beside itself, then delete it. Members that would write outside
    the folder (``..``, absolute paths, links pointing out, devices) refuse the whole archive,
    as does unpacking beyond ``limit`` bytes."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zipped:
                infos = zipped.infolist()
                for info in infos:
                    _check_path(PurePosixPath(info.filename))
                    if (info.external_attr >> 16) & 0o170000 == 0o120000:
                        raise StoreRefused(f"archive member {info.filename!r} is a link")
                if sum(i.file_size for i in infos) > limit:
                    raise StoreRefused("the archive unpacks beyond server.storage.maxDownloadBytes")
                zipped.extractall(into)
        else:
            with tarfile.open(archive) as tarred:
                members = tarred.getmembers()
                if sum(m.size for m in members) > limit:
                    raise StoreRefused("the archive unpacks beyond server.storage.maxDownloadBytes")
                for member in members:
                    _check_path(PurePosixPath(member.name))
                tarred.extractall(into, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile) as exc:
        raise StoreRefused(f"the archive cannot be unpacked safely: {exc}") from None
    archive.unlink()


def _previous_files(folder: Path) -> dict[tuple[str, str], Path]:
    """Files of the newest complete snapshot of this URI, by (path, tag)."""
    snapshots = [p for p in folder.iterdir() if (p / MANIFEST).is_file()]
    if not snapshots:
        return {}
    newest = max(snapshots, key=lambda p: (p / MANIFEST).stat().st_mtime)
    try:
        listed = json.loads((newest / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return {(entry["path"], entry["tag"]): newest / entry["path"] for entry in listed}


def _touch(target: Path) -> None:
    (target / USED).touch()


def evict(root: Path, max_bytes: int, in_use: set[Path]) -> list[Path]:
    """Delete least recently used snapshots until the cache fits ``max_bytes``; a snapshot in
    ``in_use`` (served by this process) is never deleted. Returns what was deleted."""
    snapshots = [s for key in root.iterdir() if key.is_dir() for s in key.iterdir()]
    complete = [s for s in snapshots if (s / MANIFEST).is_file()]
    sizes = {s: _size(s) for s in complete}
    total = sum(sizes.values())
    deleted = []
    for candidate in sorted(complete, key=_last_used):
        if total <= max_bytes:
            break
        if candidate in in_use:
            continue
        shutil.rmtree(candidate, ignore_errors=True)
        total -= sizes[candidate]
        deleted.append(candidate)
        log.info("cache: deleted %s (least recently used)", candidate.name)
    return deleted


def _last_used(snapshot_dir: Path) -> float:
    with contextlib.suppress(OSError):
        return (snapshot_dir / USED).stat().st_mtime
    return 0.0


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One snapshot maker per URI across threads and processes (flock on its lock file)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
