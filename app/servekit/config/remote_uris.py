"""Remote ``storageUri``s: which are remote and which extra reads each.

A storageUri with a scheme is fetched by the server (app/servekit/models/remote.py) into a local
cache; everything else is a path relative to serve.yaml. This module only classifies: it reads
nothing over the network, so ``servekit validate`` and the exports can use it anywhere. How
one is shown (no user info, no query) is :func:`servekit.shown_paths.shown_uri`, which every
layer uses.
"""

from __future__ import annotations

import importlib.util
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit


@dataclass(frozen=True)
class Scheme:
    """One kind of remote storage: the library that reads it and the extra that installs it."""

    name: str
    module: str | None  # None: the standard library reads it
    extra: str | None

    def missing(self) -> str | None:
        """Why this scheme cannot be read here (its library is not installed), or None."""
        if self.module is None or importlib.util.find_spec(self.module) is not None:
            return None
        return f"{self.name} storage needs {self.module}: pip install 'servekit[{self.extra}]'"


S3 = Scheme("s3", "s3fs", "s3")
GCS = Scheme("gs", "gcsfs", "gcs")
AZURE = Scheme("az", "adlfs", "azure")
HTTPS = Scheme("https", None, None)

_AZURE_HOST = re.compile(r"^[a-z0-9]{3,24}\.blob\.core\.windows\.net$")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


def remote_scheme(uri: str) -> Scheme | None:
    """The remote scheme of ``uri``, or None for a local path.

    Raises ValueError for a URI servekit does not read (``http://``: model files run code or
    feed native parsers, so they come over TLS only; ``ftp://`` and the like), and for an
    ``https://`` URI whose user info would be read as part of its address. The message never
    quotes the URI (it may hold a password)."""
    if "://" not in uri:
        return None
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        return S3
    if scheme in ("gs", "gcs"):
        return GCS
    if scheme in ("az", "abfs", "abfss"):
        return AZURE
    if scheme == "https":
        try:
            parts.port  # noqa: B018  # raises on what is no port: user info not encoded
        except ValueError:
            raise ValueError(
                "storageUri: what follows the host's ':' is no port number; in user info, "
                "percent-encode '/', '?', '#', '@' and ':' (https://user:p%2Fss@host/...)"
            ) from None
        host = (parts.hostname or "").lower()
        return AZURE if _AZURE_HOST.match(host) else HTTPS
    if scheme == "file":
        return None
    raise ValueError(
        f"storageUri scheme {scheme!r} is not supported: use a path, s3://, gs://, az://, "
        "https://<account>.blob.core.windows.net/... or https://"
    )


def local_path(uri: str) -> str:
    """A ``file://`` URI's path (any other storageUri unchanged)."""
    return urlsplit(uri).path if uri.startswith("file://") else uri


def is_archive(uri: str) -> bool:
    """Whether ``uri`` names an archive that is unpacked into the model's folder."""
    return urlsplit(uri).path.lower().endswith(ARCHIVE_SUFFIXES)


def is_relative(uri: str) -> bool:
    """Whether a storageUri is a relative path (no scheme, not absolute, no ``~``)."""
    return "://" not in uri and not uri.startswith(("/", "~"))


def beside(config_uri: str, path: str) -> str:
    """The relative ``path`` resolved against the folder of the remote serve.yaml
    ``config_uri`` (``s3://b/prod/serve.yaml`` and ``models/iris``: ``s3://b/prod/models/iris``).

    User info stays (an ``https://`` store's Basic auth), the query does not: a signed URL
    signs one object only."""
    parts = urlsplit(config_uri)
    folder = posixpath.dirname(parts.path) or "/"
    joined = posixpath.normpath(posixpath.join(folder, path))
    if path.endswith("/") and not joined.endswith("/"):
        joined += "/"
    return urlunsplit((parts.scheme, parts.netloc, joined, "", ""))
