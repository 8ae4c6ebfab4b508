"""HTTPS at the edge: the TLS handshake made by the connection itself.

Over TLS (``server.tls``) the handshake is part of the connection, as the limits see it:
:class:`TlsEdgeProtocol` is handed the plain TCP connection at ``accept()`` and makes the
handshake itself (``loop.start_tls``), where an SSL context given to uvicorn would make the
event loop do it before any protocol hears of the connection (uncounted, for uvloop's default
60 s). So the connection cap counts a connection from accept (one still in its handshake is
displaceable, like one still sending headers), and ``headerTimeoutSeconds`` runs from accept
over the handshake and the header block together: a client that never sends a ClientHello is
closed when it passes.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, ClassVar

from servekit.http.connection import EdgeProtocol
from servekit.http.deadlines import HEADER, UNWATCHED
from servekit.http.private_apis import HttpToolsProtocol


class TlsEdgeProtocol(EdgeProtocol):
    """:class:`EdgeProtocol` over TLS whose handshake it makes itself, so the handshake counts
    against the connection cap from ``accept()`` and against ``headerTimeoutSeconds``.

    Until the handshake completes, ``transport`` is the TCP connection (what displacement and
    uvicorn's shutdown close) and the protocol is in ``connections`` and ``waiting`` like a
    connection still sending its headers; then it becomes the TLS transport and the connection
    goes on as any other. Nothing is ever written in the clear: a connection refused or timed
    out before its handshake is closed without an HTTP answer."""

    tls_context: ClassVar[ssl.SSLContext]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._early: list[bytes] | None = None
        """While the handshake is under way: what the TLS layer delivered before the handshake
        task resumed (a client sends its request right after its Finished message)."""
        self._hello: list[bytes] | None = None
        """From accept until the task puts the TLS layer in place: bytes the event loop read
        meanwhile (uvloop starts reading once ``connection_made`` returns), the ClientHello."""
        self._lost = False
        self._handshake: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        edge = self.edge
        self.transport = transport
        if len(self.connections) >= edge.max_connections and not self._displace_one():
            self._refused = self._ignored = True
            transport.abort()  # nothing is encrypted yet: no answer can be read
            return
        self.connections.add(self)
        edge.waiting[self] = None
        self._early = []
        self._hello = []
        self._watch(HEADER, edge.limits.header_timeout_seconds)
        self._handshake = self.loop.create_task(self._secure(transport))

    async def _secure(self, raw: asyncio.Transport) -> None:
        """Make the handshake (within ``headerTimeoutSeconds`` of accept), then serve HTTP."""
        limits = self.edge.limits
        hello, self._hello = self._hello or [], None
        if hello:  # read before the TLS layer was in place: it gets them first (see _feed)
            self.loop.call_soon(_feed, raw, b"".join(hello))
        try:
            secured = await self.loop.start_tls(
                raw,
                self,
                self.tls_context,
                server_side=True,
                ssl_handshake_timeout=limits.header_timeout_seconds,
            )
        except Exception:  # refused certificate, timeout, a client gone: nothing to answer
            raw.close()
            self._release()
            return
        if self._lost or secured is None or raw.is_closing():
            if secured is not None:
                secured.close()
            self._release()
            return
        early, self._early = self._early, None
        HttpToolsProtocol.connection_made(self, secured)
        self._out.transport = secured
        client = self.client
        self._address = client[0] if client else ""
        for data in early or ():
            self.data_received(data)

    def _release(self) -> None:
        """Forget a connection that ends before its handshake did (idempotent)."""
        self._early = self._hello = None
        self._phase = UNWATCHED
        self.connections.discard(self)
        self.edge.waiting.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        if self._early is not None:  # the handshake is not done
            if self._hello is not None:  # TLS bytes, read before the TLS layer was in place
                self._hello.append(data)
                self.transport.pause_reading()  # start_tls resumes it
            else:  # the first request, decrypted before the handshake task resumed
                self._early.append(data)
            return
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._early is not None:  # before the handshake finished: no request, no cycle
            self._release()
            return
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        if self.flow is not None:
            super().pause_writing()

    def resume_writing(self) -> None:
        if self.flow is not None:
            super().resume_writing()

    def _close_with(self, status: int, message: str) -> None:
        if self._early is not None:  # the handshake is not done: close, say nothing
            self._phase = UNWATCHED
            self.transport.close()
            return
        super()._close_with(status, message)


def _feed(transport: asyncio.Transport, data: bytes) -> None:
    """Hand ``data`` to the TLS layer ``start_tls`` just put on ``transport``: it runs before
    that layer's ``connection_made`` and before reading resumes (both are scheduled after it),
    so the bytes keep their order. Before ``connection_made`` the TLS layer only stores them in
    its incoming buffer (asyncio's and uvloop's alike), where the handshake reads them."""
    protocol: Any = transport.get_protocol()
    if transport.is_closing() or isinstance(protocol, EdgeProtocol):  # start_tls failed
        return
    if hasattr(protocol, "buffer_updated"):  # both TLS layers are buffered protocols
        view = memoryview(data)
        while view:
            buffer = protocol.get_buffer(len(view))
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            protocol.buffer_updated(size)
            view = view[size:]
    else:
        protocol.data_received(data)
