"""The transports of remote storage: list what a storageUri names, download one object.

S3, GCS and Azure Blob go through fsspec's filesystems (s3fs, gcsfs, adlfs): one kept library
family with one interface (``find``/``info``/``get_file``) over the three stores, each an extra
(``servekit[s3]``, ``[gcs]``, ``[azure]``), with the stores' usual credential chains (AWS
environment and files, Google application default credentials or ``STORAGE_EMULATOR_HOST``,
Azure connection strings and account keys). Why not KServe's ``kserve-storage``: it downloads
a whole URI into a folder in one call, with no listing to compare against a cache and no size
bound, and it brings KServe's dependency pins. ``https://`` (one file or an archive) needs no
library: the standard library's ``urllib`` with the system's trust store (``SSL_CERT_FILE``);
user info in such a URI (``https://user:password@host/...``) is sent as HTTP Basic auth, never
as part of the address (and only to that origin: a redirect elsewhere goes without it).
"""

from __future__ import annotations

import os
import shutil
import ssl
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from servekit.config.remote_uris import AZURE, GCS, HTTPS, S3, Scheme, remote_scheme
from servekit.config.schema import StorageConfig

Progress = Callable[[int], None]
"""Called with the bytes written so far by one download."""


@dataclass(frozen=True)
class RemoteObject:
    """One object under a storageUri: its path relative to the URI, size and version tag."""

    path: PurePosixPath
    size: int
    tag: str
    """ETag, MD5 or generation: what changes when the object's content does."""
    md5: str | None = None
    """The content's MD5 (hex) when the store gives it, checked after the download."""


@dataclass(frozen=True)
class Listing:
    """What a storageUri names: its objects, and whether the URI is one file (or archive)."""

    objects: list[RemoteObject]
    is_file: bool


class Store(Protocol):
    """What the cache needs of a transport."""

    def list(self) -> Listing:
        """Every object the URI names (one for a file or an archive); empty: nothing there."""
        ...

    def download(self, item: RemoteObject, target: str, progress: Progress) -> None:
        """Write ``item`` to the local file ``target``."""
        ...


def open_store(uri: str, settings: StorageConfig) -> Store:
    """The transport for ``uri`` (its library imported only now: each is an extra)."""
    scheme = remote_scheme(uri)
    if scheme is None:
        raise ValueError(f"{uri} is not a remote storageUri")
    missing = scheme.missing()
    if missing:
        raise StoreError(missing)
    if scheme is HTTPS:
        return HttpsStore(uri, settings.timeout_seconds)
    return FsspecStore(scheme, uri, settings)


class StoreError(Exception):
    """A failure whose message can be shown as it is (no secret, no signed URL)."""


class StoreRefused(StoreError):
    """The store answered, and what it holds cannot be served (nothing there, too large, an
    unsafe archive): a cached copy never stands in for it, unlike a store that cannot be
    reached (``server.storage.whenUnreachable``)."""


class FsspecStore:
    """S3, GCS or Azure Blob through fsspec."""

    def __init__(self, scheme: Scheme, uri: str, settings: StorageConfig) -> None:
        self.fs, self.root = _filesystem(scheme, uri, settings)

    def list(self) -> Listing:
        root = self.root.rstrip("/")
        try:
            info = self.fs.info(root)
        except FileNotFoundError:
            return Listing([], is_file=False)
        if info.get("type") == "file":
            return Listing([_described(PurePosixPath(root).name, info)], is_file=True)
        found: dict[str, dict[str, Any]] = self.fs.find(root, detail=True)
        objects = [
            _described(name[len(root) :].lstrip("/"), info)
            for name, info in sorted(found.items())
            if info.get("type") != "directory" and not name.endswith("/")
        ]
        return Listing(objects, is_file=False)

    def download(self, item: RemoteObject, target: str, progress: Progress) -> None:
        root = self.root.rstrip("/")
        source = root if self.fs.isfile(root) else f"{root}/{item.path}"
        with (
            self.fs.open(source, "rb", block_size=1024 * 1024) as remote,
            open(target, "wb") as out,
        ):
            _copy(remote, out, item.size, progress)


class HttpsStore:
    """One file or archive over HTTPS (the system's trust store; no redirects to plain HTTP).

    The URI's user info, if any, becomes HTTP Basic auth sent with the first request (no
    round trip for a challenge) by urllib's own handler, to this origin only."""

    def __init__(self, uri: str, timeout: float) -> None:
        self.uri, self.user_info = without_user_info(uri)
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))

    def _request(self, method: str) -> Any:
        request = urllib.request.Request(self.uri, method=method)
        handlers: list[urllib.request.BaseHandler] = [
            urllib.request.HTTPSHandler(context=self.context),
            _NoPlainRedirect(),
        ]
        if self.user_info is not None:
            # A manager per request: urllib's marks every URL that answered 2xx as
            # authenticated, and would then send a bogus header to a redirect's target.
            passwords = urllib.request.HTTPPasswordMgrWithPriorAuth()
            parts = urlsplit(self.uri)
            origin = urlunsplit((parts.scheme, parts.netloc, "/", "", ""))
            passwords.add_password(None, origin, *self.user_info, is_authenticated=True)
            handlers.append(urllib.request.HTTPBasicAuthHandler(passwords))
        opener = urllib.request.build_opener(*handlers)
        return opener.open(request, timeout=min(self.timeout, 60.0))

    def list(self) -> Listing:
        with self._request("HEAD") as answer:
            size = int(answer.headers.get("Content-Length") or -1)
            tag = answer.headers.get("ETag") or answer.headers.get("Last-Modified") or ""
        name = PurePosixPath(urlsplit(self.uri).path).name or "model"
        return Listing([RemoteObject(PurePosixPath(name), size, f"{tag}:{size}")], is_file=True)

    def download(self, item: RemoteObject, target: str, progress: Progress) -> None:
        with self._request("GET") as answer, open(target, "wb") as out:
            _copy(answer, out, item.size, progress)


def without_user_info(uri: str) -> tuple[str, tuple[str, str] | None]:
    """``uri`` without its user info, and that user info decoded as (user, password), or
    None when it has none. urllib would read ``user:password@host`` as the host."""
    parts = urlsplit(uri)
    user_info, at, host = parts.netloc.rpartition("@")
    if not at:
        return uri, None
    user, _, password = user_info.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


class _NoPlainRedirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects to HTTPS only (a signed-URL redirect is fine, a downgrade is not)."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        if not newurl.lower().startswith("https://"):
            raise StoreError("the server redirected to a non-HTTPS URL")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _copy(source: Any, out: Any, expected: int, progress: Progress) -> None:
    """Copy in 1 MiB chunks, reporting progress; never more than the listed size allows."""
    written = 0
    while chunk := source.read(1024 * 1024):
        written += len(chunk)
        if 0 <= expected < written:
            raise StoreError(f"the object grew while it was downloaded (over {expected} bytes)")
        out.write(chunk)
        progress(written)
    if 0 <= expected != written:
        raise StoreError(f"download ended after {written} of {expected} bytes")


def _filesystem(scheme: Scheme, uri: str, settings: StorageConfig) -> tuple[Any, str]:
    parts = urlsplit(uri)
    timeout = min(settings.timeout_seconds, 60.0)
    if scheme is S3:
        import s3fs

        endpoint = settings.s3.endpoint or os.environ.get("AWS_ENDPOINT_URL")
        fs = s3fs.S3FileSystem(
            anon=settings.s3.anonymous,
            endpoint_url=endpoint,
            config_kwargs={
                "connect_timeout": timeout,
                "read_timeout": timeout,
                "retries": {"max_attempts": 3, "mode": "standard"},
            },
            skip_instance_cache=True,
            use_listings_cache=False,
        )
        return fs, f"{parts.netloc}{parts.path}"
    if scheme is GCS:
        with warnings.catch_warnings():  # google-auth's notice about grpcio's version
            warnings.simplefilter("ignore", FutureWarning)
            # The JSON API filesystem, not gcsfs' default ExtendedGcsFileSystem: that one
            # first asks the gRPC storage-control API for the bucket's layout, which
            # S3-style emulators and private endpoints do not answer (a 60 s stall per call).
            from gcsfs.core import GCSFileSystem

        token = "anon" if os.environ.get("STORAGE_EMULATOR_HOST") else None
        fs = GCSFileSystem(
            token=token, skip_instance_cache=True, use_listings_cache=False, timeout=timeout
        )
        return fs, f"{parts.netloc}{parts.path}"
    if scheme is AZURE:
        import adlfs

        if parts.scheme.lower() == "https":  # https://<account>.blob.core.windows.net/c/p
            account = (parts.hostname or "").split(".", 1)[0]
            fs = adlfs.AzureBlobFileSystem(
                account_name=account,
                connection_string=os.environ.get("AZURE_STORAGE_CONNECTION_STRING"),
                skip_instance_cache=True,
            )
            return _bounded_azure_retries(fs, timeout), parts.path.lstrip("/")
        fs = adlfs.AzureBlobFileSystem(
            connection_string=os.environ.get("AZURE_STORAGE_CONNECTION_STRING"),
            account_name=os.environ.get("AZURE_STORAGE_ACCOUNT_NAME"),
            account_key=os.environ.get("AZURE_STORAGE_KEY"),
            skip_instance_cache=True,
        )
        return _bounded_azure_retries(fs, timeout), f"{parts.netloc}{parts.path}"
    raise ValueError(f"no filesystem for {scheme.name}")


def _bounded_azure_retries(fs: Any, timeout: float) -> Any:
    """``fs`` with a blob client that gives up on a store that went away in seconds.

    Why: Azure's storage client retries with backoffs of 15, 18 and 24 s by default, for each
    call, so a store that stops mid-download was noticed after about 85 s, and adlfs passes no
    retry setting through. Where the credential is a connection string or an account key (the
    two servekit reads from the environment), the client is made again through the SDK's public
    constructor with backoffs of about 1, 3 and 5 s and the storage timeout as its socket
    timeouts; any other credential keeps adlfs' own client."""
    from azure.storage.blob.aio import BlobServiceClient, ExponentialRetry

    options: dict[str, Any] = {
        "retry_policy": ExponentialRetry(
            initial_backoff=1, increment_base=2, retry_total=3, random_jitter_range=1
        ),
        "connection_timeout": timeout,
        "read_timeout": timeout,
    }
    if fs.connection_string:
        fs.service_client = BlobServiceClient.from_connection_string(
            fs.connection_string, **options
        )
    elif fs.account_name and fs.account_key and not fs.credential:
        fs.service_client = BlobServiceClient(
            f"https://{fs.account_name}.blob.core.windows.net", credential=fs.account_key, **options
        )
    return fs


def _described(name: str, info: dict[str, Any]) -> RemoteObject:
    """A listing entry of any of the three stores as a RemoteObject."""
    size = int(info.get("size") or 0)
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    md5 = None
    if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):
        md5 = etag  # S3's ETag of a single-part upload is the content's MD5
    raw_md5 = info.get("md5Hash")  # GCS: base64 of the MD5
    if isinstance(raw_md5, str):
        import base64
        import binascii

        try:
            md5 = base64.b64decode(raw_md5).hex()
        except (binascii.Error, ValueError):
            md5 = None
    settings = info.get("content_settings")  # Azure: bytes of the MD5, when set
    content_md5 = getattr(settings, "content_md5", None) if settings is not None else None
    if isinstance(content_md5, bytes | bytearray) and len(content_md5) == 16:
        md5 = bytes(content_md5).hex()
    tag = etag or str(info.get("generation") or info.get("last_modified") or info.get("mtime"))
    return RemoteObject(PurePosixPath(name), size, f"{tag}:{size}", md5)


def copy_file(source: str, target: str) -> None:
    """Reuse an unchanged file of an earlier download (a hard link where the disk allows)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
