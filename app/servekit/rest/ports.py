"""``GET /servekit/v1/ports``: the ports this server listens on, for clients that found it by URL.

A client that knows only the HTTP URL (``servekit.connect("http://host:8000")``, a server started in
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

from litestar import get

from servekit.config.auth import ApiGroup
from servekit.rest.access import group_opt
from servekit.rest.inject import Catalog
from servekit.rest.openapi import Ports, failures


@get(
    "/servekit/v1/ports",
    opt=group_opt(ApiGroup.METADATA),
    sync_to_thread=False,
    responses=failures(ApiGroup.METADATA),
)
def ports(catalog: Catalog) -> Ports:
    """The bound HTTP and gRPC ports (gRPC null when disabled)."""
    bound = catalog.ports()  # Unavailable (503) while they are not known yet
    return {"httpPort": bound.http_port, "grpcPort": bound.grpc_port}


ROUTES = [ports]
