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

Confinement, because a registration makes the server map memory a client names:
- a key names one object directly in ``/dev/shm`` (``/name`` or ``name``): no further ``/``,
  no ``.``/``..``, no NUL. It is opened relative to an open ``/dev/shm`` directory with
  ``O_NOFOLLOW`` (a symlink planted there is refused, never followed) and must be a regular
  file (a shm object), checked on the opened descriptor (no check-then-open race);
- the registered window (offset, byte_size) must lie inside the object; every tensor a request
  reads or writes must lie inside the window (offset and size checked, Triton's messages with
  our detail after them, 400s);
- input bytes are copied out of the region before the model runs: the client cannot change
  them under the model, and no view outlives the request, so unregistering never meets a buffer
  still in use;
- regions are unregistered (unmapped) when the server stops (:meth:`close`).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import mmap
import os
import stat
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from servekit.codecs.raw import tensor_from_bytes, tensor_to_buffer
from servekit.datatypes import lookup
from servekit.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    shown_name,
)
from servekit.types import InferRequest, InferResponse, Parameters, Tensor

log = logging.getLogger("servekit.shared_memory")

SHM_DIR = "/dev/shm"
"""Where POSIX shared memory objects live on Linux; keys name objects directly in it."""
MAX_REGIONS = 1024
"""Regions registered at once: each holds a mapping (and its descriptor)."""
MAX_NAME = 256
"""Longest region name or key accepted (a key is one file name: 255 bytes on Linux)."""

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"

CUDA_UNSUPPORTED = (
    "failed to register CUDA shared memory region: {name}, GPUs not supported "
    "(servekit offers system shared memory only: register the region under "
    "/v2/systemsharedmemory, SystemSharedMemoryRegister over gRPC)"
)


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
    mapping: mmap.mmap
    start: int
    """Where the registered window begins in ``mapping`` (mmap offsets are page-aligned)."""


@dataclass(frozen=True, slots=True)
class _Target:
    """Where one requested output goes: a checked window of a region."""

    output: str
    region: str
    offset: int
    byte_size: int


class SharedMemoryRegions:
    """The system shared-memory regions clients registered, by name (thread-safe)."""

    def __init__(self, directory: str = SHM_DIR) -> None:
        self._directory = directory
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()

    # -- registration -------------------------------------------------------------------------
    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the shm object ``key`` under ``name``."""
        name = _region_name(name)
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
            if len(self._regions) >= MAX_REGIONS:
                raise ResourceExhausted(
                    f"failed to register shared memory region {shown_name(name)}: "
                    f"{MAX_REGIONS} regions are registered already; unregister some first"
                )
            self._regions[name] = self._map(name, key, filename, offset, byte_size)
        log.info("registered shared memory region %r (key %r, %d bytes)", name, key, byte_size)

    def _map(self, name: str, key: str, filename: str, offset: int, byte_size: int) -> _Region:
        failed = f"failed to register shared memory region {shown_name(name)}"
        try:
            directory = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("cannot open %s: %s", self._directory, exc)
            raise InvalidArgument(f"{failed}: this host offers no system shared memory") from None
        try:
            flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            fd = os.open(filename, flags, dir_fd=directory)
        except OSError as exc:
            log.info("opening shm key %r failed: %s", key, exc)
            raise InvalidArgument(
                f"{failed}: Unable to open shared memory region: {shown_name(key)} ({_reason(exc)})"
            ) from None
        finally:
            os.close(directory)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidArgument(
                    f"{failed}: key {shown_name(key)} is not a shared memory object"
                )
            if offset + byte_size > info.st_size:
                raise InvalidArgument(
                    f"{failed}: invalid args (offset {offset} + byte_size {byte_size} is past "
                    f"the end of the object, which holds {info.st_size} bytes)"
                )
            start = offset % mmap.ALLOCATIONGRANULARITY
            try:
                mapping = mmap.mmap(fd, start + byte_size, offset=offset - start)
            except (OSError, ValueError) as exc:
                log.warning("mapping shm key %r failed: %s", key, exc)
                raise InvalidArgument(f"{failed}: the object cannot be mapped") from None
        finally:
            os.close(fd)
        return _Region(RegionStatus(name, key, offset, byte_size), mapping, start)

    def status(self, name: str | None = None) -> list[RegionStatus]:
        """Every region (no name), or the one named (NotFound if it is not registered)."""
        with self._lock:
            if not name:
                return [r.status for r in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: {shown_name(name)}")
        return [region.status]

    def unregister(self, name: str | None = None) -> None:
        """Unmap the named region, or all of them (no name). An unknown name is no error (as
        in Triton: unregistering is idempotent, clients call it to start clean)."""
        with self._lock:
            if name:
                region = self._regions.pop(name, None)
                gone = [region] if region is not None else []
            else:
                gone = list(self._regions.values())
                self._regions.clear()
        for region in gone:
            region.mapping.close()
            log.info("unregistered shared memory region %r", region.status.name)

    def close(self) -> None:
        """Unregister everything (the server stops)."""
        self.unregister(None)

    def __len__(self) -> int:
        return len(self._regions)

    # -- inference ----------------------------------------------------------------------------
    async def infer(
        self,
        request: InferRequest,
        run: Callable[[InferRequest], Awaitable[InferResponse]],
    ) -> InferResponse:
        """Run ``request`` with its shared-memory inputs read and its outputs written.

        Inputs are copied out of their regions and every output window is checked before the
        model runs (a bad window costs no inference); outputs are written after it ran, each
        checked against the size the client registered for it.
        """
        inputs = [self._read_input(tensor) for tensor in request.inputs]
        targets = self._targets(request)
        response = await run(dataclasses.replace(request, inputs=inputs, shared_memory=False))
        for tensor in response.outputs:
            target = targets.get(tensor.name)
            if target is not None:
                self._write_output(tensor, target)
        return response

    def _read_input(self, tensor: Tensor) -> Tensor:
        params = tensor.parameters
        if REGION not in params:
            return tensor
        where = f"input {tensor.name!r}"
        region, offset, size = _window(where, params)
        data = self._read(where, region, offset, size)
        datatype = lookup(tensor.datatype)
        array = tensor_from_bytes(tensor.name, datatype, tensor.shape, data)
        return Tensor(tensor.name, tensor.datatype, tensor.shape, array, params)

    def _targets(self, request: InferRequest) -> dict[str, _Target]:
        targets: dict[str, _Target] = {}
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
            region, offset, size = _window(where, params)
            with self._lock:
                self._checked(where, region, offset, size)
            targets[output.name] = _Target(output.name, region, offset, size)
        return targets

    def _read(self, where: str, name: str, offset: int, size: int) -> bytes:
        with self._lock:
            region = self._checked(where, name, offset, size)
            begin = region.start + offset
            return region.mapping[begin : begin + size]

    def _write_output(self, tensor: Tensor, target: _Target) -> None:
        buffer = memoryview(tensor_to_buffer(lookup(tensor.datatype), tensor.data)).cast("B")
        if buffer.nbytes > target.byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output {tensor.name!r} "
                f"({target.byte_size} bytes) should be at least {buffer.nbytes} bytes to hold "
                "the results"
            )
        where = f"output {tensor.name!r}"
        with self._lock:  # unregistered meanwhile: NotFound, never a write to unmapped memory
            region = self._checked(where, target.region, target.offset, target.byte_size)
            begin = region.start + target.offset
            region.mapping[begin : begin + buffer.nbytes] = buffer

    def _checked(self, where: str, name: str, offset: int, size: int) -> _Region:
        """The region ``name`` after checking [offset, offset+size) lies in what was registered
        (call with the lock held)."""
        region = self._regions.get(name)
        if region is None:
            raise NotFound(
                f"Unable to find shared memory region: {shown_name(name)} ({where}; register "
                "it first)"
            )
        registered = region.status.byte_size
        if region.mapping.size() < region.status.offset + registered:
            # The client shrank the object (ftruncate) since it registered it: touching the
            # pages past its new end would kill the server (SIGBUS), so nothing is touched.
            raise InvalidArgument(
                f"shared memory region {shown_name(name)} ({where}) shrank below the "
                f"{registered} bytes registered; register it again"
            )
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


def _window(where: str, params: Parameters) -> tuple[str, int, int]:
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
    return region, offset, size


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


def _reason(exc: OSError) -> str:
    """Why an object could not be opened, without a path."""
    return {
        errno.ENOENT: "no such object; create it first (shm_open)",
        errno.EACCES: "permission denied",
        errno.ELOOP: "a symbolic link, refused",
        errno.EISDIR: "a directory, not a shared memory object",
        errno.ENXIO: "not a shared memory object",
    }.get(exc.errno or 0, "cannot be opened")
