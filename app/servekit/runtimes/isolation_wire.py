"""The wire between the server and an isolated model's child process
(app/servekit/runtimes/isolated.py).

One message is a little-endian ``uint32`` header length, a JSON header, then the raw bytes of
each tensor the header lists (``{"name", "datatype", "shape", "nbytes"}``), in that order.
Numeric tensors travel as their C-order bytes and are received straight into a fresh numpy
array (one copy into the kernel, one out); BYTES tensors as ``uint32`` length + bytes per
element. Sends gather the pieces with ``sendmsg`` so a large tensor is never concatenated.

Why not pickle: the server must not unpickle anything a model process sends (a model's code could
then run code in the server). Here the child can only name a V2 datatype from the one table
(app/servekit/datatypes.py), a shape and a byte count, which the reader checks against each other
before it allocates anything beyond the stated size."""

from __future__ import annotations

import math
import socket
import struct
import time
from typing import Any

import numpy as np
import orjson

from servekit.datatypes import DATATYPES, from_numpy
from servekit.errors import InvalidArgument

Arrays = dict[str, np.ndarray]

_LENGTH = struct.Struct("<I")
MAX_HEADER_BYTES = 16 * 1024 * 1024
"""A header longer than this is a broken peer, not a message."""
MAX_TENSOR_BYTES = 1 << 40
"""A tensor bigger than this (1 TiB) is a broken peer, not a message."""
_IOV_MAX = 512  # pieces per sendmsg (Linux allows 1024)
_FIRST_READ = 64 * 1024


class ChannelClosed(EOFError):
    """The other end went away (its process exited or closed the socket)."""


class ProtocolError(ValueError):
    """The other end sent something that is not a valid message."""


def send_message(
    sock: socket.socket, header: dict[str, Any], arrays: Arrays, deadline: float | None = None
) -> None:
    """Send ``header`` plus ``arrays`` (their descriptions are added to the header)."""
    specs = []
    parts: list[memoryview] = []
    for name, array in arrays.items():
        datatype, body = _encode(name, array)
        specs.append(
            {"name": name, "datatype": datatype, "shape": list(array.shape), "nbytes": body.nbytes}
        )
        parts.append(body)
    encoded = orjson.dumps({**header, "tensors": specs})
    _send_parts(sock, [memoryview(_LENGTH.pack(len(encoded)) + encoded), *parts], deadline)


def recv_message(
    sock: socket.socket, deadline: float | None = None
) -> tuple[dict[str, Any], Arrays]:
    """Receive one message: its header (without ``tensors``) and its arrays by name."""
    reader = _Reader(sock, deadline)
    prefix = bytearray(_LENGTH.size)
    reader.read_into(memoryview(prefix))
    (length,) = _LENGTH.unpack(prefix)
    if length > MAX_HEADER_BYTES:
        raise ProtocolError(f"a message header of {length} bytes")
    raw = bytearray(length)
    reader.read_into(memoryview(raw))
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"a message header that is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("a message header that is not a JSON object")
    specs = header.pop("tensors", [])
    if not isinstance(specs, list):
        raise ProtocolError("'tensors' is not a list")
    arrays: Arrays = {}
    for spec in specs:
        name, datatype, shape, nbytes = _checked_spec(spec)
        if name in arrays:
            raise ProtocolError(f"tensor {name!r} sent twice")
        arrays[name] = _receive_tensor(reader, datatype, shape, nbytes)
    reader.finish()
    return header, arrays


class _Reader:
    """Reads one message. Its first ``recv`` takes up to 64 KiB, which usually holds all of a
    small message (one system call per call's answer instead of one per piece); what a large
    tensor needs beyond that is received straight into its array. The protocol is strictly
    one message each way at a time, so bytes beyond the message are the peer's error."""

    def __init__(self, sock: socket.socket, deadline: float | None) -> None:
        self._sock = sock
        self._deadline = deadline
        self._buffer = bytearray(_FIRST_READ)
        self._start = 0
        self._end = -1  # nothing received yet

    def read_into(self, target: memoryview) -> None:
        if self._end < 0:
            _timeout(self._sock, self._deadline)
            self._end = self._sock.recv_into(self._buffer)
            if self._end == 0:
                raise ChannelClosed("the other end closed the channel")
        have = min(self._end - self._start, target.nbytes)
        if have:
            target[:have] = memoryview(self._buffer)[self._start : self._start + have]
            self._start += have
        if have < target.nbytes:
            _recv_into(self._sock, target[have:], self._deadline)

    def finish(self) -> None:
        if self._start < self._end:
            raise ProtocolError(f"{self._end - self._start} bytes beyond the message")


def _encode(name: str, array: np.ndarray) -> tuple[str, memoryview]:
    if array.dtype.kind in "OSU":
        return "BYTES", memoryview(_pack_bytes(array))
    try:
        kind = from_numpy(array.dtype)
    except InvalidArgument:
        raise ProtocolError(f"tensor {name!r} has dtype {array.dtype}, not a V2 datatype") from None
    flat = np.ascontiguousarray(array, dtype=kind.dtype).reshape(-1).view(np.uint8)
    return kind.name, flat.data


def _pack_bytes(array: np.ndarray) -> bytes:
    pieces = []
    for item in array.flat:
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        pieces.append(_LENGTH.pack(len(data)))
        pieces.append(data)
    return b"".join(pieces)


def _checked_spec(spec: object) -> tuple[str, str, tuple[int, ...], int]:
    if not isinstance(spec, dict):
        raise ProtocolError("a tensor description that is not an object")
    name, datatype, shape, nbytes = (spec.get(k) for k in ("name", "datatype", "shape", "nbytes"))
    if not isinstance(name, str) or datatype not in DATATYPES:
        raise ProtocolError(f"a tensor with name {name!r} and datatype {datatype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ProtocolError(f"tensor {name!r} has shape {shape!r}")
    if type(nbytes) is not int or not 0 <= nbytes <= MAX_TENSOR_BYTES:
        raise ProtocolError(f"tensor {name!r} has {nbytes!r} bytes")
    itemsize = DATATYPES[datatype].itemsize
    count = math.prod(shape)
    if itemsize and count * itemsize != nbytes:
        raise ProtocolError(f"tensor {name!r}: {nbytes} bytes for shape {shape} of {datatype}")
    if not itemsize and nbytes < 4 * count:
        raise ProtocolError(f"tensor {name!r}: {nbytes} bytes for {count} BYTES elements")
    return name, str(datatype), tuple(shape), nbytes


def _receive_tensor(
    reader: _Reader, datatype: str, shape: tuple[int, ...], nbytes: int
) -> np.ndarray:
    kind = DATATYPES[datatype]
    if kind.is_bytes:
        raw = bytearray(nbytes)
        reader.read_into(memoryview(raw))
        return _unpack_bytes(raw, shape)
    array = np.empty(shape, dtype=kind.dtype)
    reader.read_into(array.reshape(-1).view(np.uint8).data)
    return array


def _unpack_bytes(raw: bytearray, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    out = np.empty(count, dtype=object)
    view = memoryview(raw)
    offset = 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise ProtocolError("a BYTES tensor shorter than its elements")
        (size,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise ProtocolError("a BYTES element longer than its tensor")
        out[i] = bytes(view[offset : offset + size])
        offset += size
    if offset != len(raw):
        raise ProtocolError("a BYTES tensor longer than its elements")
    return out.reshape(shape)


def _timeout(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        sock.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    sock.settimeout(left)


def _recv_into(sock: socket.socket, view: memoryview, deadline: float | None) -> None:
    while view.nbytes:
        _timeout(sock, deadline)
        got = sock.recv_into(view)
        if got == 0:
            raise ChannelClosed("the other end closed the channel")
        view = view[got:]


def _send_parts(sock: socket.socket, parts: list[memoryview], deadline: float | None) -> None:
    pending = [p for p in parts if p.nbytes]
    while pending:
        _timeout(sock, deadline)
        try:
            sent = sock.sendmsg(pending[:_IOV_MAX])
        except (BrokenPipeError, ConnectionResetError):
            raise ChannelClosed("the other end closed the channel") from None
        while pending and sent >= pending[0].nbytes:
            sent -= pending[0].nbytes
            pending.pop(0)
        if sent:
            pending[0] = pending[0][sent:]
