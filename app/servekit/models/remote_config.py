"""A serve.yaml kept in object storage (``servekit serve s3://bucket/prod/serve.yaml``).

Every replica reads its configuration from one object, through the same transports and
credentials as remote models (app/servekit/models/remote_stores.py): ``s3://``, ``gs://``,
``az://`` and ``https://``. The object is read into a local copy (a folder of this process
under the cache, removed at exit) that the config layer loads like any serve.yaml
(:class:`~servekit.config.overrides.Overrides` ``config_uri`` says where it came from); under
``--watch`` the watcher reads the object again every ``server.storage.pollSeconds`` and
rewrites the copy when it changed (app/servekit/services/watch.py).

The object is read with the environment's storage settings (``AWS_ENDPOINT_URL`` and the
stores' usual credential chains), not with serve.yaml's ``server.storage``: those are not
known before the file is read. Messages never hold a secret: the URI is shown by
:func:`~servekit.shown_paths.shown_uri`, a library's error by
:func:`~servekit.models.remote.shown_error`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path

from servekit.config.remote_uris import remote_scheme
from servekit.config.schema import StorageConfig
from servekit.models.remote import in_daemon_thread, shown_error
from servekit.models.remote_cache import default_cache_dir
from servekit.models.remote_stores import open_store
from servekit.shown_paths import shown_uri

MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A serve.yaml larger than this is refused (it is YAML for a few dozen models, not data)."""
CONFIG_NAME = "serve.yaml"


class RemoteConfigError(Exception):
    """A remote serve.yaml that cannot be read: its message names the URI as shown (no
    secret) and says why."""


class RemoteConfigMissing(RemoteConfigError):
    """The store answered: there is no such object."""


def is_remote_config(location: str) -> bool:
    """Whether the command line's CONFIG names an object in a store rather than a file.

    Raises RemoteConfigError for a scheme servekit does not read (``http://``, ``ftp://``)."""
    try:
        return remote_scheme(location) is not None
    except ValueError as exc:
        message = str(exc).replace("storageUri", "the config's URI", 1)
        raise RemoteConfigError(f"cannot read {shown_uri(location)}: {message}") from None


def read_remote_config(uri: str) -> bytes:
    """The content of the serve.yaml object at ``uri`` (blocking: the store's library is
    synchronous). Raises RemoteConfigMissing when the store says there is nothing there,
    RemoteConfigError for anything else (no extra installed, unreachable, refused, a folder,
    too large)."""
    shown = shown_uri(uri)
    try:
        store = open_store(uri, StorageConfig())
        listing = store.list()
        if not listing.objects:
            raise RemoteConfigMissing(f"no such object: {shown}")
        if not listing.is_file or len(listing.objects) != 1:
            raise RemoteConfigError(f"{shown} is a folder: name the serve.yaml object in it")
        item = listing.objects[0]
        if item.size > MAX_CONFIG_BYTES:
            raise RemoteConfigError(
                f"{shown} is {item.size} bytes: over {MAX_CONFIG_BYTES} for a serve.yaml"
            )
        with tempfile.TemporaryDirectory(prefix="servekit-config-") as folder:
            target = os.path.join(folder, CONFIG_NAME)
            store.download(item, target, lambda _: None)
            return Path(target).read_bytes()
    except RemoteConfigError:
        raise
    except Exception as exc:  # any library's failure: said without secrets
        raise RemoteConfigError(f"cannot read {shown}: {shown_error(exc, uri)}") from None


_copies: list[Path] = []
_copies_lock = threading.Lock()


def local_copy(text: bytes, folder: Path | None = None) -> Path:
    """Write ``text`` as serve.yaml into ``folder`` (by default a new folder of this process
    under the cache, removed at exit) and return its path. The write is atomic (a temporary
    file renamed), so a reader never sees half a file."""
    if folder is None:
        root = default_cache_dir().parent / "configs"
        root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
        with _copies_lock:
            if not _copies:
                atexit.register(_remove_copies)
            _copies.append(folder)
    path = folder / CONFIG_NAME
    fd, temporary = tempfile.mkstemp(prefix=".serve-", suffix=".yaml", dir=folder)
    with os.fdopen(fd, "wb") as out:
        out.write(text)
    os.replace(temporary, path)
    return path


def _remove_copies() -> None:
    for folder in _copies:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = [
    "RemoteConfigError",
    "RemoteConfigMissing",
    "in_daemon_thread",
    "is_remote_config",
    "local_copy",
    "read_remote_config",
]
