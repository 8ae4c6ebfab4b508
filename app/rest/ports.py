"""``GET /servekit/v1/ports``: the ports this server listens on, for clients that found it by URL.

A client that knows only the HTTP URL (``app.connect("http://host:8000")``, a server started in
a terminal or a container) needs the gRPC port to build a gRPC target; the host it must use is
the one in its own URL (the server may listen on 0.0.0.0, or sit behind a port-forward), so only
ports are answered here. It is servekit's own resource, outside ``/v2``, so the V2 server
metadata stays exactly what the protocol defines, and it is not the dashboard's internal JSON.

Answer: ``{"httpPort": 8000, "grpcPort": 8001}``, the bound values of ``server.httpPort`` and
``server.grpcPort`` (a 0 in serve.yaml is answered as the port actually picked); ``grpcPort``
is null when gRPC is disabled. 503 in the moment between the HTTP listener opening and the gRPC
listener binding, so a client never reads "disabled" for a port that is about to exist.
"""

from __future__ import annotations

from typing import Any

from litestar import get
from litestar.datastructures import State

from app.config.auth import ApiGroup
from app.errors import Unavailable
from app.rest.access import group_opt


@get("/servekit/v1/ports", opt=group_opt(ApiGroup.METADATA), sync_to_thread=False)
def ports(state: State) -> dict[str, int | None]:
    """The bound HTTP and gRPC ports (gRPC null when disabled)."""
    kit: Any = state.get("servekit")
    addresses = getattr(kit, "addresses", None)
    if addresses is None:
        raise Unavailable("the server's addresses are not known yet")
    grpc_port: int | None = addresses.grpc_port
    if grpc_port is None and kit.plan.server.grpc_port is not None:
        raise Unavailable("the gRPC listener is still starting")
    return {"httpPort": addresses.http_port, "grpcPort": grpc_port}


ROUTES = [ports]
