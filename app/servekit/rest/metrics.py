"""``GET /metrics``: Prometheus text exposition of this server's registry."""

from __future__ import annotations

from litestar import Response, get
from litestar.datastructures import State

from servekit.config.auth import ApiGroup
from servekit.observability.metrics import CONTENT_TYPE, render
from servekit.rest.access import group_opt
from servekit.rest.openapi import failures


@get(
    "/metrics",
    opt=group_opt(ApiGroup.ADMIN),
    sync_to_thread=False,
    media_type=CONTENT_TYPE,
    responses=failures(ApiGroup.ADMIN),
)
def metrics(state: State) -> Response[bytes]:
    # Content-Type as a header: Litestar appends "; charset=utf-8" to a text/* media type even
    # when it names its charset already (the answer carried the charset twice).
    return Response(
        render(state.metrics_registry),
        media_type=CONTENT_TYPE,
        headers={"Content-Type": CONTENT_TYPE},
    )


ROUTES = [metrics]
