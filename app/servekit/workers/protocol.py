"""The supervisor <-> worker channel: length-prefixed JSON frames over a Unix socket.

Both ends send requests and answer the other's requests on one connection, so a frame is either
a request (``{"id": n, "op": ..., ...}``) or an answer (``{"re": n, "ok": ...}`` or
``{"re": n, "error": {"code": ..., "message": ...}}``). JSON only, never pickle: a frame carries a
client's load parameters (pushed files base64-encoded), and nothing a client sends may become code.
A ``ServeError`` crosses the channel as its code and message and is raised again, the same class,
on the other side, so the client sees the error the worker that failed raised.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from servekit import errors
from servekit.errors import ErrorCode, Internal, ServeError

log = logging.getLogger("servekit.workers")

Message = dict[str, Any]
Handler = Callable[[Message], Awaitable[Any]]

_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 31
"""Largest frame (a push of ``server.maxRequestBytes`` in base64 fits)."""

_BY_CODE: dict[str, type[ServeError]] = {
    cls.code.value: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, ServeError) and cls is not ServeError
}


def encode_error(exc: BaseException) -> Message:
    """An exception as the channel carries it (anything not a ServeError is INTERNAL, its text
    logged here and not sent: it may name server paths)."""
    if isinstance(exc, ServeError):
        return {"code": exc.code.value, "message": exc.message}
    log.error("worker channel: %s", exc, exc_info=exc)
    return {"code": ErrorCode.INTERNAL.value, "message": "internal error (see the server log)"}


def decode_error(error: Message) -> ServeError:
    cls = _BY_CODE.get(str(error.get("code")), Internal)
    return cls(str(error.get("message", "")))


def encode_params(params: dict[str, object] | None) -> dict[str, Any]:
    """Load parameters as JSON: bytes (pushed files) become ``{"b64": ...}``."""
    out: dict[str, Any] = {}
    for key, value in (params or {}).items():
        if isinstance(value, bytes | bytearray | memoryview):
            out[key] = {"b64": base64.b64encode(bytes(value)).decode("ascii")}
        else:
            out[key] = value
    return out


def decode_params(params: dict[str, Any]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in params.items():
        if isinstance(value, dict) and set(value) == {"b64"}:
            out[key] = base64.b64decode(value["b64"])
        else:
            out[key] = value
    return out


class Channel:
    """One connection: ``request`` awaits the peer's answer; the peer's requests go to
    ``handler``, each in its own task (an answer may need other requests to be answered
    first: a worker forwarding a load is itself asked to apply it)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()
        self.closed = asyncio.Event()
        self._reading = asyncio.create_task(self._read())

    async def request(self, message: Message, timeout: float | None = None) -> Any:
        """Send a request and return the ``ok`` of its answer (raise its error)."""
        if self.closed.is_set():
            raise ConnectionError("worker channel closed")
        ident = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        try:
            await self._send({**message, "id": ident})
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(ident, None)

    async def _send(self, message: Message) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        async with self._write_lock:
            self._writer.write(_HEADER.pack(len(data)) + data)
            await self._writer.drain()

    async def _read(self) -> None:
        try:
            while True:
                header = await self._reader.readexactly(_HEADER.size)
                (size,) = _HEADER.unpack(header)
                if size > MAX_FRAME:
                    raise ConnectionError(f"frame of {size} bytes")
                message = json.loads(await self._reader.readexactly(size))
                if "re" in message:
                    future = self._waiting.get(message["re"])
                    if future is None or future.done():
                        continue
                    if "error" in message:
                        future.set_exception(decode_error(message["error"]))
                    else:
                        future.set_result(message.get("ok"))
                else:
                    task = asyncio.create_task(self._answer(message))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
            pass
        finally:
            self.closed.set()
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(ConnectionError("worker channel closed"))

    async def _answer(self, message: Message) -> None:
        try:
            result = await self._handler(message)
            answer: Message = {"re": message["id"], "ok": result}
        except Exception as exc:
            answer = {"re": message["id"], "error": encode_error(exc)}
        with contextlib.suppress(ConnectionError, OSError):
            await self._send(answer)

    async def close(self) -> None:
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
        self.closed.set()
