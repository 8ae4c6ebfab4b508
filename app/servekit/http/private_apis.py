"""Every name the HTTP transport takes from uvicorn's and Litestar's internals, in one place.

The edge (app/servekit/http/connection.py) subclasses uvicorn's httptools protocol and reads
and writes its per-connection state; the inference lane (app/servekit/http/inference_lane.py)
makes and finishes uvicorn's request cycles itself; the inference answer and the token check
ask Litestar's own ``Host`` rule. None of this is uvicorn's or Litestar's public API, so it can
change in any release: pyproject.toml pins both to the ranges tested, every module of the
package imports these names from here (never from ``uvicorn.protocols`` or ``litestar._asgi``),
and tests/test_private_apis.py checks that every attribute listed below still exists in the
installed versions, so an upgrade that moves one fails a fast test instead of a request.
"""

from __future__ import annotations

from litestar._asgi.utils import is_valid_host
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

PROTOCOL_METHODS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_url",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
    "send_400_response",
    "handle_websocket_upgrade",
    "_should_upgrade",
    "_unsupported_upgrade_warning",
    "_start_asgi_task",
)
"""``HttpToolsProtocol`` methods the edge overrides or calls (``_start_asgi_task``: where a
request's task starts, overridden to start the request's ID and the inference lane)."""

PROTOCOL_STATE = (
    "self.cycle",
    "self.pipeline",
    "self.flow",
    "self.tasks",
    "self.connections",
    "self.server_state",
    "self.parser",
    "self.url",
    "self.headers",
    "self.expect_100_continue",
    "self.scope",
    "self.app",
    "self.config",
    "self.timeout_keep_alive",
    "self.root_path",
    "self.client",
    "self.server",
    "self.scheme",
    "self.loop",
    "self.logger",
    "self.access_logger",
    "self.access_log",
    "self.asgi_version",
    "self.app_state",
    "self.transport",
)
"""``HttpToolsProtocol`` instance attributes the edge reads or sets (checked in its source:
they are assigned in ``__init__`` and ``connection_made``, not declared on the class)."""

CYCLE_STATE = (
    "self.scope",
    "self.transport",
    "self.flow",
    "self.body",
    "self.more_body",
    "self.disconnected",
    "self.message_event",
    "self.response_started",
    "self.response_complete",
    "self.waiting_for_100_continue",
    "self.keep_alive",
    "self.default_headers",
    "self.on_response",
)
"""``RequestResponseCycle`` attributes the edge and the lane read or set."""

CYCLE_METHODS = ("run_asgi", "send_500_response", "receive", "send")
"""``RequestResponseCycle`` methods the lane calls."""

CYCLE_PARAMETERS = (
    "scope",
    "transport",
    "flow",
    "logger",
    "access_logger",
    "access_log",
    "default_headers",
    "message_event",
    "expect_100_continue",
    "keep_alive",
    "on_response",
)
"""The keyword arguments the lane makes a ``RequestResponseCycle`` with."""

FLOW_MEMBERS = ("read_paused", "write_paused", "pause_reading", "resume_reading", "drain")
"""``FlowControl`` members the edge and the lane use (uvicorn's read and write back-pressure)."""

SERVER_STATE = ("tasks", "total_requests", "default_headers", "connections")
"""``uvicorn.server.ServerState`` attributes read: the set of requests in progress (the load
signal counts it), the request total uvicorn's shutdown reports, the default headers."""

__all__ = [
    "CYCLE_METHODS",
    "CYCLE_PARAMETERS",
    "CYCLE_STATE",
    "FLOW_MEMBERS",
    "PROTOCOL_METHODS",
    "PROTOCOL_STATE",
    "SERVER_STATE",
    "STATUS_LINE",
    "FlowControl",
    "HttpToolsProtocol",
    "RequestResponseCycle",
    "ServerState",
    "is_valid_host",
]
