"""``grpc.health.v1.Health`` computed from the DataPlane at the time of each call.

The overall service ("") and the names of the gRPC services served here are SERVING while the
server is ready (``DataPlane.ready``: with strict readiness, every model asked for is READY);
a model name as the service is SERVING while the model has a ready version. Computing the
status on each Check (and polling it for Watch) keeps health in step with model loads and
unloads without any hook into the repository. Unknown names answer NOT_FOUND on Check and
SERVICE_UNKNOWN on Watch, as the gRPC health protocol says.

Health needs no token, so Watch streams are bounded (``WATCHES_PER_CONNECTION`` per client
connection, ``WATCHES_TOTAL`` in all; beyond them RESOURCE_EXHAUSTED saying so) and cheap: all
of them wait on one shared timer between polls.
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
WATCHES_PER_CONNECTION = 64
"""Watch streams one client connection may hold open; more get RESOURCE_EXHAUSTED (a client
needs one per service it follows: 64 is many)."""
WATCHES_TOTAL = 1024
"""Watch streams open at once over all connections; more get RESOURCE_EXHAUSTED. Health is
open to everyone (no token): without a bound, idle streams were memory for the asking."""

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
        self._per_peer: dict[str, int] = {}
        """Open Watch streams by client connection (its peer address)."""
        self._tick: asyncio.Event | None = None
        """Set at the next poll (or at shut-down): one timer for every Watch stream, rather
        than a timer and a task per stream and period."""

    async def shut_down(self, timeout: float = 2.0) -> None:
        """The server is stopping: everything is NOT_SERVING and Watch streams end now (waited
        for, bounded), so a graceful stop is not held up by watchers for its whole grace."""
        self._stopping.set()
        self._ring()
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
        peer = context.peer()
        held = self._per_peer.get(peer, 0)
        if held >= WATCHES_PER_CONNECTION:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {WATCHES_PER_CONNECTION} health Watch streams per connection; "
                "close one, or use Check",
            )
        if self._watchers >= WATCHES_TOTAL:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the server holds {WATCHES_TOTAL} health Watch streams, its limit; "
                "retry later, or use Check",
            )
        self._per_peer[peer] = held + 1
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
                await self._next_tick().wait()
        finally:
            self._watchers -= 1
            left = self._per_peer.pop(peer) - 1
            if left:
                self._per_peer[peer] = left
            if not self._watchers:
                self._no_watchers.set()

    def _next_tick(self) -> asyncio.Event:
        """The event every Watch stream waits on until its next look at the status."""
        tick = self._tick
        if tick is None:
            tick = self._tick = asyncio.Event()
            asyncio.get_running_loop().call_later(WATCH_POLL_SECONDS, self._ring)
        return tick

    def _ring(self) -> None:
        tick, self._tick = self._tick, None
        if tick is not None:
            tick.set()
