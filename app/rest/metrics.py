"""``GET /metrics``: Prometheus text exposition of this server's registry."""

from __future__ import annotations

from litestar import Response, get
from litestar.datastructures import State

from app.config.auth import ApiGroup
from app.rest.access import group_opt
from app.services.metrics import CONTENT_TYPE, render


@get("/metrics", opt=group_opt(ApiGroup.ADMIN), sync_to_thread=False, include_in_schema=True)
def metrics(state: State) -> Response[bytes]:
    return Response(render(state.metrics_registry), media_type=CONTENT_TYPE)


ROUTES = [metrics]
