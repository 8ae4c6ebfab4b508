"""Triton's system shared-memory extension: regions of POSIX shared memory (``/dev/shm``) that a
client on the same host registers, then names in inference requests instead of sending bytes.

tritonclient's ``utils.shared_memory`` creates an object with ``shm_open(key)``, the client
registers it under a name (``register_system_shared_memory(name, key, byte_size, offset)``),
and an input or requested output carries the parameters ``shared_memory_region``,
``shared_memory_byte_size`` and ``shared_memory_offset``. The server reads inputs from the
region and writes outputs into it; the response then carries only the output's datatype and
shape. This module owns the registered regions and does those reads and writes, so every
transport (HTTP JSON, HTTP binary, gRPC) gets the same checks from one place; the codecs only
mark a request that uses shared memory (``InferRequest.shared_memory``).

Off unless ``server.sharedMemory: system`` (the config check allows that only on a loopback
host or behind the repository token, in one process). Then, because a registration makes the
server read and write a file a client names:

- only a client on this host registers (a loopback TCP peer or a UNIX socket): the regions are
  local by nature, and a remote client has no business naming files of the server's host;
- a key names one object directly in ``/dev/shm`` (``/name`` or ``name``): no further ``/``,
  no ``.``/``..``, no NUL. It is opened relative to an open ``/dev/shm`` directory with
  ``O_NOFOLLOW``, then checked on the opened descriptor (no check-then-open race): a regular
  file, owned by the server's own user, neither readable nor writable by group or others
  (what ``shm_open(..., 0600)`` makes, as tritonclient and Python's multiprocessing do), and
  large enough for the window. An object of another user is never touched, whatever the
  server's privileges (root reads everything), and a world-writable one could be changed by
  anyone under the model. Every one of these refusals gives the same answer, so registering
  tells a client nothing about which objects exist or whose they are;
- bytes move through the descriptor with ``preadv``/``pwritev``, never a mapping: a client that
  shrinks the object (``ftruncate``) gets a short read and an error for its request, where a
  mapping would have killed the server with SIGBUS. Copies larger than :data:`INLINE_COPY_BYTES`
  run in a thread, off the event loop; the input bytes one request reads are bounded by
  ``server.maxRequestBytes`` (what it could have sent in a body), and those all requests in
  progress hold together by the same number (beyond it: 429 / RESOURCE_EXHAUSTED, retry);
- each region holds one descriptor, so at most :func:`region_budget` are registered at once (an
  eighth of the open-file limit, the edge keeps that many descriptors out of its connection
  cap): registering beyond it is refused, and connections never run out of descriptors;
- input bytes are copied out of the region before the model runs: the client cannot change
  them under the model; a descriptor is closed only when no copy uses it (unregistering while a
  copy runs in a thread closes it after), so a copy never meets a reused descriptor number;
- regions are unregistered (descriptors closed) when the server stops (:meth:`close`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import resource
import stat
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from servekit.codecs.raw import tensor_from_bytes, tensor_to_buffer
from servekit.datatypes import lookup
from servekit.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    Overloaded,
    PermissionDenied,
    ResourceExhausted,
    shown_name,
)
from servekit.types import InferRequest, InferResponse, Parameters, Tensor

log = logging.getLogger("servekit.shared_memory")

SHM_DIR = "/dev/shm"
"""Where POSIX shared memory objects live on Linux; keys name objects directly in it."""
MAX_REGIONS = 1024
"""Regions registered at once, whatever the open-file limit allows (each holds a descriptor)."""
MAX_NAME = 256
"""Longest region name or key accepted (a key is one file name: 255 bytes on Linux)."""
INLINE_COPY_BYTES = 64 * 1024
"""Copies up to this size run on the event loop (a few microseconds: a thread hop would cost
more); larger ones run in a thread, so a 100 MB tensor never stalls other clients."""
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""Bytes one request may read from regions when the server does not say (maxRequestBytes')."""

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"

DISABLED = (
    "system shared memory is disabled on this server; the operator enables it with "
    "'server.sharedMemory: system' in serve.yaml (for clients on the server's host only)"
)
REMOTE = (
    "failed to register shared memory region {name}: only a client on the server's host "
    "(loopback or a UNIX socket) may register system shared memory"
)
UNUSABLE = (
    "failed to register shared memory region {name}: Unable to open shared memory region: "
    "{key}. It must be an existing shared memory object owned by the server's user, not "
    "readable or writable by group or others (mode 0600, as shm_open(..., 0600) makes it), "
    "holding at least offset + byte_size ({end}) bytes"
)
"""The one answer for every object that cannot be registered (missing, another user's, open
to others, not a regular object, too small): no answer tells them apart."""
CUDA_UNSUPPORTED = (
    "failed to register CUDA shared memory region: {name}, GPUs not supported "
    "(servekit offers system shared memory only: register the region under "
    "/v2/systemsharedmemory, SystemSharedMemoryRegister over gRPC)"
)


def region_budget() -> int:
    """Regions that may be registered at once: an eighth of the soft open-file limit (each
    holds a descriptor), at most :data:`MAX_REGIONS`. The edge leaves that many descriptors out
    of its connection cap, so full regions never make clients' connections fail."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_REGIONS
    return max(1, min(MAX_REGIONS, soft // 8))


def is_local_peer(peer: str | None) -> bool:
    """Whether a client address is on this host: a loopback IP (``127.0.0.1``, ``::1``, an
    IPv4-mapped loopback), a gRPC ``ipv4:``/``ipv6:``/``unix:`` peer string, or None (an ASGI
    connection without a client address: uvicorn's UNIX socket). Anything else is remote."""
    if peer is None or peer.startswith(("unix:", "unix-abstract:")):
        return True
    host = urllib.parse.unquote(peer)  # grpcio writes "ipv6:%5B::1%5D:port"
    if host.startswith(("ipv4:", "ipv6:")):  # gRPC: family, address, port
        host = host[5:].rsplit(":", 1)[0]
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """One registered region as status answers show it (Triton's fields)."""

    name: str
    key: str
    offset: int
    byte_size: int

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}  # fmt: skip


@dataclass(slots=True)
class _Region:
    status: RegionStatus
    fd: int
    copies: int = 0
    """Copies using ``fd`` now (in threads or on the loop); it is closed when this is 0."""
    gone: bool = False
    """Unregistered: the last copy closes ``fd``."""


@dataclass(frozen=True, slots=True)
class _Window:
    """Where one tensor lies: a window of a region (checked against it on every use)."""

    where: str
    """The tensor, as errors name it: ``input 'INPUT0'``."""
    region: str
    offset: int
    byte_size: int


class SharedMemoryRegions:
    """The system shared-memory regions clients registered, by name (thread-safe)."""

    def __init__(
        self,
        directory: str = SHM_DIR,
        *,
        enabled: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_regions: int | None = None,
    ) -> None:
        self._directory = directory
        self.enabled = enabled
        """``server.sharedMemory: system`` (restart-only: fixed for the server's life)."""
        self._max_bytes = max_bytes
        if not enabled:
            max_regions = 0
        elif max_regions is None:
            max_regions = region_budget()
        self.max_regions = max_regions
        """Regions registered at once at most (0 when disabled: no descriptor is set aside)."""
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        self._held = 0
        """Input bytes requests in progress hold (copied out of regions), at most max_bytes."""

    def _require_enabled(self) -> None:
        if not self.enabled:
            raise PermissionDenied(DISABLED)

    # -- registration -------------------------------------------------------------------------
    def register(
        self, name: str, key: str, offset: int, byte_size: int, *, peer: str | None
    ) -> None:
        """Hold ``byte_size`` bytes at ``offset`` of the shm object ``key`` under ``name``, for
        a client at ``peer`` (its address, as :func:`is_local_peer` reads it)."""
        self._require_enabled()
        name = _region_name(name)
        if not is_local_peer(peer):
            log.warning("refused to register shm region %r for remote client %s", name, peer)
            raise PermissionDenied(REMOTE.format(name=shown_name(name)))
        filename = _file_name(name, key)
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidArgument(
                    f"failed to register shared memory region {shown_name(name)}: {field} must "
                    f"be a non-negative integer, got {shown_name(value)}"
                )
        if byte_size == 0:
            raise InvalidArgument(
                f"failed to register shared memory region {shown_name(name)}: byte_size must "
                "be at least 1"
            )
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(
                    f"shared memory region {shown_name(name)} already in manager "
                    "(unregister it first)"
                )
            if len(self._regions) >= self.max_regions:
                raise ResourceExhausted(
                    f"failed to register shared memory region {shown_name(name)}: "
                    f"{self.max_regions} regions are registered already, the most this server "
                    "holds (one open file each, from its open-file limit); unregister some first"
                )
            fd = self._open(name, key, filename, offset + byte_size)
            self._regions[name] = _Region(RegionStatus(name, key, offset, byte_size), fd)
        log.info("registered shared memory region %r (key %r, %d bytes)", name, key, byte_size)

    def _open(self, name: str, key: str, filename: str, end: int) -> int:
        """The object's descriptor once it passed every check; one answer for any refusal."""
        refused = InvalidArgument(UNUSABLE.format(name=shown_name(name), key=shown_name(key),
                                                  end=end))  # fmt: skip
        try:
            directory = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("cannot open the shared memory folder: %s", exc.strerror)
            raise refused from None
        try:
            flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
            fd = os.open(filename, flags, dir_fd=directory)
        except OSError as exc:
            log.info("refused shm key %r: cannot open it (%s)", key, exc.strerror)
            raise refused from None
        finally:
            os.close(directory)
        try:
            info = os.fstat(fd)
            why = _unfit(info, end)
        except OSError as exc:
            why = exc.strerror or "fstat failed"
        if why:
            os.close(fd)
            log.info("refused shm key %r: %s", key, why)
            raise refused
        return fd

    def status(self, name: str | None = None) -> list[RegionStatus]:
        """Every region (no name), or the one named (NotFound if it is not registered)."""
        self._require_enabled()
        with self._lock:
            if not name:
                return [r.status for r in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: {shown_name(name)}")
        return [region.status]

    def unregister(self, name: str | None = None) -> None:
        """Forget the named region, or all of them (no name). An unknown name is no error (as
        in Triton: unregistering is idempotent, clients call it to start clean)."""
        self._require_enabled()
        self._forget(name)

    def _forget(self, name: str | None) -> None:
        with self._lock:
            if name:
                region = self._regions.pop(name, None)
                gone = [region] if region is not None else []
            else:
                gone = list(self._regions.values())
                self._regions.clear()
            for region in gone:
                region.gone = True
                if region.copies == 0:
                    os.close(region.fd)
        for region in gone:
            log.info("unregistered shared memory region %r", region.status.name)

    def close(self) -> None:
        """Unregister everything (the server stops)."""
        self._forget(None)

    def __len__(self) -> int:
        return len(self._regions)

    # -- inference ----------------------------------------------------------------------------
    async def infer(
        self,
        request: InferRequest,
        run: Callable[[InferRequest], Awaitable[InferResponse]],
    ) -> InferResponse:
        """Run ``request`` with its shared-memory inputs read and its outputs written.

        The inputs are copied out of their regions and every output window is checked before
        the model runs (a bad window costs no inference); outputs are written after it ran, each
        checked against the size the client registered for it.
        """
        self._require_enabled()
        reads = [w for w in map(_input_window, request.inputs) if w is not None]
        total = sum(w.byte_size for w in reads)
        with self._lock:
            for window in reads:
                self._checked(window)
            if total > self._max_bytes:
                raise ResourceExhausted(
                    f"the inputs in shared memory hold {total} bytes, more than the "
                    f"{self._max_bytes} one request may bring (server.maxRequestBytes)"
                )
            if self._held + total > self._max_bytes:
                raise Overloaded(
                    "shared memory inputs of the requests in progress fill the server's budget "
                    f"({self._max_bytes} bytes, server.maxRequestBytes); retry shortly"
                )
            self._held += total
        try:
            if total <= INLINE_COPY_BYTES:
                data = [self._read(w) for w in reads]
            else:
                data = await asyncio.to_thread(lambda: [self._read(w) for w in reads])
            inputs = _with_data(request.inputs, data)
            targets = self._targets(request)
            response = await run(dataclasses.replace(request, inputs=inputs, shared_memory=False))
        finally:
            with self._lock:
                self._held -= total
        writes = []
        for tensor in response.outputs:
            target = targets.get(tensor.name)
            if target is not None:
                writes.append((_output_bytes(tensor, target), target))
        if sum(len(buffer) for buffer, _ in writes) <= INLINE_COPY_BYTES:
            self._write_all(writes)
        else:
            await asyncio.to_thread(self._write_all, writes)
        return response

    def _write_all(self, writes: list[tuple[memoryview, _Window]]) -> None:
        for buffer, window in writes:
            self._write(buffer, window)

    def _targets(self, request: InferRequest) -> dict[str, _Window]:
        targets: dict[str, _Window] = {}
        for output in request.outputs or ():
            params = output.parameters
            if REGION not in params:
                continue
            where = f"output {output.name!r}"
            if params.get("classification"):
                raise InvalidArgument(
                    f"{where}: output can't set both 'shared_memory_region' and 'classification'"
                )
            if params.get("binary_data"):
                raise InvalidArgument(
                    f"{where}: output can't set both 'shared_memory_region' and 'binary_data'"
                )
            window = _window(where, params)
            with self._lock:
                self._checked(window)
            targets[output.name] = window
        return targets

    def _use(self, window: _Window) -> _Region:
        """The window's region, checked, with one more copy counted on its descriptor."""
        with self._lock:
            region = self._checked(window)
            region.copies += 1
            return region

    def _done(self, region: _Region) -> None:
        with self._lock:
            region.copies -= 1
            if region.gone and region.copies == 0:
                os.close(region.fd)

    def _read(self, window: _Window) -> bytearray:
        """The window's bytes, read through the descriptor (in any thread)."""
        region = self._use(window)
        try:
            buffer = bytearray(window.byte_size)
            view = memoryview(buffer)
            start, done = region.status.offset + window.offset, 0
            while done < window.byte_size:
                count = os.preadv(region.fd, [view[done:]], start + done)
                if count == 0:
                    raise _shrunk(window, region)
                done += count
            return buffer
        except OSError as exc:
            log.warning("reading shm region %r failed: %s", window.region, exc.strerror)
            raise InvalidArgument(
                f"cannot read shared memory region {shown_name(window.region)} ({window.where})"
            ) from None
        finally:
            self._done(region)

    def _write(self, buffer: memoryview, window: _Window) -> None:
        """``buffer`` written at the window through the descriptor (in any thread)."""
        region = self._use(window)  # unregistered meanwhile: NotFound, nothing written
        try:
            registered_end = region.status.offset + region.status.byte_size
            if os.fstat(region.fd).st_size < registered_end:
                raise _shrunk(window, region)  # never grow an object its client cut
            start, done = region.status.offset + window.offset, 0
            while done < len(buffer):
                done += os.pwritev(region.fd, [buffer[done:]], start + done)
        except OSError as exc:
            log.warning("writing shm region %r failed: %s", window.region, exc.strerror)
            raise InvalidArgument(
                f"cannot write shared memory region {shown_name(window.region)} ({window.where})"
            ) from None
        finally:
            self._done(region)

    def _checked(self, window: _Window) -> _Region:
        """The window's region after checking [offset, offset+size) lies in what was
        registered (call with the lock held)."""
        name, offset, size = window.region, window.offset, window.byte_size
        where = window.where
        region = self._regions.get(name)
        if region is None:
            raise NotFound(
                f"Unable to find shared memory region: {shown_name(name)} ({where}; register "
                "it first)"
            )
        registered = region.status.byte_size
        if offset >= registered:
            raise InvalidArgument(
                f"Invalid offset for shared memory region: {shown_name(name)} ({where}: offset "
                f"{offset}, the region holds {registered} bytes)"
            )
        if offset + size > registered:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: {shown_name(name)} "
                f"({where}: {offset} + {size} is past the {registered} bytes registered)"
            )
        return region


def _unfit(info: os.stat_result, end: int) -> str:
    """Why an opened object may not be registered ('' when it may), for the server's log."""
    if not stat.S_ISREG(info.st_mode):
        return "not a regular shared memory object"
    if info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}, not the server's uid {os.geteuid()}"
    if info.st_mode & 0o077:
        return f"mode {stat.S_IMODE(info.st_mode):04o} opens it to group or others"
    if info.st_size < end:
        return f"holds {info.st_size} bytes, the window ends at {end}"
    return ""


def _shrunk(window: _Window, region: _Region) -> InvalidArgument:
    return InvalidArgument(
        f"shared memory region {shown_name(window.region)} ({window.where}) shrank below the "
        f"{region.status.byte_size} bytes registered; register it again"
    )


def _input_window(tensor: Tensor) -> _Window | None:
    if REGION not in tensor.parameters:
        return None
    return _window(f"input {tensor.name!r}", tensor.parameters)


def _with_data(inputs: list[Tensor], data: list[bytearray]) -> list[Tensor]:
    """``inputs`` with each one in shared memory decoded from its bytes (in order)."""
    read = iter(data)
    done: list[Tensor] = []
    for tensor in inputs:
        if REGION not in tensor.parameters:
            done.append(tensor)
            continue
        array = tensor_from_bytes(tensor.name, lookup(tensor.datatype), tensor.shape, next(read))
        done.append(Tensor(tensor.name, tensor.datatype, tensor.shape, array, tensor.parameters))
    return done


def _output_bytes(tensor: Tensor, target: _Window) -> memoryview:
    buffer = memoryview(tensor_to_buffer(lookup(tensor.datatype), tensor.data)).cast("B")
    if buffer.nbytes > target.byte_size:
        raise InvalidArgument(
            f"shared memory size specified with the request for output {tensor.name!r} "
            f"({target.byte_size} bytes) should be at least {buffer.nbytes} bytes to hold "
            "the results"
        )
    return buffer


def _window(where: str, params: Parameters) -> _Window:
    """The (region, offset, byte_size) a tensor's parameters name, type-checked."""
    region = params.get(REGION)
    if not isinstance(region, str) or not region:
        raise InvalidArgument(f"{where}: 'shared_memory_region' must be a region name (a string)")
    if BYTE_SIZE not in params:
        raise InvalidArgument(
            f"{where}: 'shared_memory_byte_size' must be specified along with "
            "'shared_memory_region'"
        )
    size = params[BYTE_SIZE]
    offset = params.get(OFFSET, 0)
    for field, value in ((BYTE_SIZE, size), (OFFSET, offset)):
        if type(value) is not int or value < 0:
            raise InvalidArgument(
                f"{where}: '{field}' must be a non-negative integer, got {shown_name(value)}"
            )
    return _Window(where, region, offset, size)


def _region_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgument("'region name' is necessary to register system shared memory region")
    if len(name) > MAX_NAME or not name.isprintable():
        raise InvalidArgument(
            f"shared memory region name {shown_name(name)} must be printable and at most "
            f"{MAX_NAME} characters"
        )
    return name


def _file_name(name: str, key: object) -> str:
    """The object's file name in /dev/shm: the key without its leading '/', one name only."""
    if not isinstance(key, str):
        raise InvalidArgument(
            f"cannot register shared memory region {shown_name(name)}: 'key' must be a string"
        )
    filename = key[1:] if key.startswith("/") else key
    if (
        not filename
        or len(filename) > MAX_NAME - 1
        or "/" in filename
        or "\0" in filename
        or filename in (".", "..")
    ):
        raise InvalidArgument(
            f"cannot register shared memory region {shown_name(name)} - invalid shm key "
            f"{shown_name(key)}: a key names one shared memory object, '/name' (no other '/', "
            "no '.' or '..')"
        )
    return filename


class Infer(Protocol):
    """``DataPlane.infer``'s shape: what :func:`with_shared_memory` wraps and returns."""

    def __call__(
        self,
        request: InferRequest,
        deadline: float | None = None,
        arrived: float | None = None,
        step: bool = False,
    ) -> Coroutine[Any, Any, InferResponse]: ...


def with_shared_memory(regions: SharedMemoryRegions, infer: Infer) -> Infer:
    """``infer`` decorated for requests whose tensors are in registered regions: such a
    request is run by ``regions`` (inputs read, ``infer`` run, outputs written); any other
    goes to ``infer`` as it is. A plain function returning ``infer``'s awaitable, not a
    coroutine of its own: every request passes here."""

    def infer_with_regions(
        request: InferRequest,
        deadline: float | None = None,
        arrived: float | None = None,
        step: bool = False,
    ) -> Coroutine[Any, Any, InferResponse]:
        if request.shared_memory:
            return regions.infer(request, lambda inner: infer(inner, deadline, arrived, step))
        return infer(request, deadline, arrived, step)

    return infer_with_regions
