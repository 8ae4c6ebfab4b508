"""``grpc.health.v1.Health`` computed from the DataPlane at the time of each call.

The overall service ("") and the names of the gRPC services served here are SERVING while the
server is ready (``DataPlane.ready``: with strict readiness, every model asked for is READY);
a model name as the service is SERVING while the model has a ready version. Computing the
status on each Check (and polling it for Watch) keeps health in step with model loads and
unloads without any hook into the repository. Unknown names answer NOT_FOUND on Check and
SERVICE_UNKNOWN on Watch, as the gRPC health protocol says.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from servekit.errors import ServeError
from servekit.services import DataPlane

SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
WATCH_POLL_SECONDS = 0.5

Status = health_pb2.HealthCheckResponse.ServingStatus
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Health of the server and of each model, read from the DataPlane."""

    def __init__(self, dataplane: DataPlane, services: Iterable[str] = ()) -> None:
        self._dataplane = dataplane
        self._services = {"", *services}
        self._stopping = asyncio.Event()
        self._watchers = 0
        self._no_watchers = asyncio.Event()
        self._no_watchers.set()

    async def shut_down(self, timeout: float = 2.0) -> None:
        """The server is stopping: everything is NOT_SERVING and Watch streams end now (waited
        for, bounded), so a graceful stop is not held up by watchers for its whole grace."""
        self._stopping.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._no_watchers.wait(), timeout)

    def status(self, service: str) -> Any:
        """SERVING / NOT_SERVING for a known service or model; None for an unknown name."""
        if self._stopping.is_set():
            return NOT_SERVING
        if service in self._services:
            return SERVING if self._dataplane.ready() else NOT_SERVING
        try:
            ready = self._dataplane.model_ready(service)
        except ServeError:
            return None
        return SERVING if ready else NOT_SERVING

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no service or model called {request.service!r}"
            )
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> None:
        self._watchers += 1
        self._no_watchers.clear()
        try:
            last = None
            while True:
                stopping = self._stopping.is_set()  # read first: the last status sent says so
                status = self.status(request.service)
                status = SERVICE_UNKNOWN if status is None else status
                if status != last:
                    await context.write(health_pb2.HealthCheckResponse(status=status))
                    last = status
                if stopping:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), WATCH_POLL_SECONDS)
        finally:
            self._watchers -= 1
            if not self._watchers:
                self._no_watchers.set()
