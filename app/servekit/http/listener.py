"""The protocol class uvicorn is given for the HTTP listener: the edge bound to one server's
limits, ``Host`` names, token check, inference lane and load signal."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from servekit.config.hosts import HostPolicy
from servekit.config.schema import NetworkLimits
from servekit.http.connection import EdgeProtocol
from servekit.http.inference_lane import InferenceLane
from servekit.http.limits import ACCEPT_BACKLOG, EdgeState, Guard, connection_cap
from servekit.http.tls import TlsEdgeProtocol

__all__ = ["ACCEPT_BACKLOG", "protocol_class"]


def protocol_class(
    limits: NetworkLimits,
    hosts: HostPolicy | None = None,
    reserved: int = 0,
    tls: ssl.SSLContext | None = None,
    lane: InferenceLane | None = None,
    guard: Guard | None = None,
    note_read: Callable[[asyncio.AbstractEventLoop], None] | None = None,
) -> type[EdgeProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to these limits (answering
    only the ``Host`` names of ``hosts``, when given; ``reserved``: descriptors the connection
    cap leaves to something else). With ``tls`` it makes the TLS handshake itself
    (:class:`TlsEdgeProtocol`): give uvicorn no SSL context then, or every connection would be
    wrapped twice. ``lane``: the inference routes' answer at the connection
    (app/servekit/http/inference_lane.py), None: every request through uvicorn's ASGI cycle.
    ``guard``: the routes' token check at the end of the headers (app/servekit/rest/access.py),
    None when no group is guarded. ``note_read``: the load signal's count of plain inference
    requests read (app/servekit/services/execution/load.py ``Load.note_read``)."""
    state = EdgeState(limits, connection_cap(limits.max_connections, reserved), hosts, guard)
    if note_read is not None:
        state.note_read = note_read
    if tls is not None:
        context = tls

        class BoundTlsEdgeProtocol(TlsEdgeProtocol):
            edge = state
            tls_context = context

        BoundTlsEdgeProtocol.lane = lane
        return BoundTlsEdgeProtocol

    class BoundEdgeProtocol(EdgeProtocol):
        edge = state

    BoundEdgeProtocol.lane = lane
    return BoundEdgeProtocol
