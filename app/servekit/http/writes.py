"""One ``write()`` per response: the writer a connection's response cycles write through.

uvicorn's ``RequestResponseCycle.send`` writes the status line and headers on
``http.response.start`` and the body on ``http.response.body``, and uvloop sends each
``transport.write`` at once: two syscalls and, with TCP_NODELAY, two TCP segments (and two
wake-ups of the client) for every small answer; a profile of the tiny-model path found the
header write alone was 14-17% of the server's samples. Each connection's cycles therefore
write through a :class:`Coalescer`: it holds the first write of a response (the header
block), joins it to the next write (the first body write; one ``writev`` through
``writelines`` for a large body, so the body is not copied), and passes later writes straight
through. A held header block never waits for the application: one ``call_soon`` per response
flushes it on the loop's next turn, so a streamed answer's headers (Server-Sent Events,
chunked grps streams) leave even while its first chunk is being made, and a finished
response, a close, or the edge's own answers flush it first, so bytes always leave in the
order they were written. A request with ``Expect: 100-continue`` keeps the plain transport
(its interim ``100 Continue`` is written by the cycle before the headers).
"""

from __future__ import annotations

import asyncio

JOIN_LIMIT = 64 * 1024
"""A held header block and a body shorter than this are joined into one ``bytes`` (one copy,
one ``write()``); a longer body goes with ``writelines``, which uvloop sends as one ``writev()``
without copying it (and which costs more than a small copy)."""


class Coalescer:
    """The transport a connection's response cycles write to: a response's first write (its
    header block) is held until the next write joins it, or until the loop's next turn.

    One per connection, re-armed by ``EdgeProtocol.on_response_complete``
    (app/servekit/http/connection.py) for the next response (uvicorn runs a connection's responses
    one after another, pipelined ones too, so no two responses share it at once). uvicorn's cycle
    calls ``write``, ``close`` and ``is_closing`` on its transport, and nothing else (no
    ``__getattr__`` passing the rest on: a class with one loses CPython's fast attribute access,
    which costs every call here)."""

    __slots__ = ("_call_soon", "armed", "held", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.held: bytes | None = None
        self.armed = True
        """The next write is a response's first: hold it."""
        self._call_soon = loop.call_soon

    def write(self, data: bytes) -> None:
        held = self.held
        if held is not None:
            self.held = None
            if len(data) < JOIN_LIMIT:
                self.transport.write(held + data)
            else:
                self.transport.writelines((held, data))
        elif self.armed:
            # uvicorn's header block (always bytes): held for the body, or the next turn
            self.armed = False
            self.held = data
            self._call_soon(self.flush)  # (not bound once here: that would be a ref cycle)
        else:
            self.transport.write(data)

    def flush(self) -> None:
        """Write what is held now (unless the connection is closing: nobody would read it)."""
        held = self.held
        if held is not None:
            self.held = None
            if not self.transport.is_closing():
                self.transport.write(held)

    def close(self) -> None:
        if self.held is not None:
            self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class CountingCoalescer(Coalescer):
    """A :class:`Coalescer` that also counts, for the access log: a response's header block
    (its status) and the bytes written. Used only when the access log is on, so the plain one
    stays as it was for everyone else."""

    __slots__ = ("head", "sent")
    counting = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.head: bytes | None = None
        self.sent = 0

    def write(self, data: bytes) -> None:
        if self.armed and self.held is None:  # the response's header block
            self.head = data
        self.sent += len(data)
        Coalescer.write(self, data)

    def answered(self, status_line: bytes, body_bytes: int) -> None:
        """A response written to the connection past this writer (the inference lane,
        app/servekit/http/inference_lane.py): its status line and body size, counted as if
        written here."""
        self.head = status_line
        self.sent = len(status_line) + body_bytes

    def taken(self) -> tuple[int, int]:
        """The finished response's status and body bytes, the counts reset for the next."""
        head, sent = self.head, self.sent
        self.head, self.sent = None, 0
        if head is None:
            return 0, sent
        return int(head[9:12]), sent - len(head)
