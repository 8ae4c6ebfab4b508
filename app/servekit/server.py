"""Composition: the one place that wires the core to HTTP and gRPC and runs them.

HTTP (uvicorn serving the Litestar app) and gRPC (grpc.aio) run on the *same* event loop over the
same DataPlane, on the same addresses (app/servekit/listen.py) with the same TLS material
(app/servekit/config/tls.py). Listeners open first, then models load, so liveness answers at once
and readiness turns true when start-up loading is done (and, with ``server.strictReadiness``, the
models asked for are READY: app/servekit/services/readiness.py). ``ServeKit.stop`` closes the
listeners and lets in-flight requests finish before models are released."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import Iterator
from typing import Any, Protocol

import uvicorn
from litestar import Litestar

from servekit import dashboard
from servekit.config.compiler import ServePlan
from servekit.config.hosts import host_policy
from servekit.config.schema import TracingConfig
from servekit.http.listener import ACCEPT_BACKLOG, protocol_class
from servekit.listen import Addresses, bind_http, bound_address
from servekit.models.repository import ModelRepository
from servekit.observability import access, tracing
from servekit.rest import create_app
from servekit.rest import extensions as rest_extensions
from servekit.rest import generate as rest_generate
from servekit.rest import grps as rest_grps
from servekit.rest import infer_stream as rest_infer_stream
from servekit.rest import openai as rest_openai
from servekit.rest import ports as rest_ports
from servekit.rest import repository as rest_repository
from servekit.rest import shared_memory as rest_shared_memory
from servekit.rest import workers as rest_workers
from servekit.rest.access import edge_guard
from servekit.rest.front import inference_lane
from servekit.services.catalog import Catalog
from servekit.services.dataplane import DataPlane
from servekit.services.extensions import server_extensions
from servekit.services.model_control import ModelControl
from servekit.services.sequences.handler import Sequences
from servekit.services.shared_memory import SharedMemoryRegions
from servekit.services.state import Listening, ServerState
from servekit.services.stats import Statistics

log = logging.getLogger("servekit")


DRAIN_SETTLE = 0.1
"""Least time a graceful stop keeps the gRPC listener taking calls (within the grace): the
calls that reached grpc core before the signal get handed to servekit and answered."""


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the owner of the loop decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class WorkerRole(Protocol):
    """What a worker of ``server.workers`` (app/servekit/workers/worker.py) changes in its ServeKit;
    a single server has none and runs exactly as without it."""

    def make_control(self, state: ServerState, repository: ModelRepository) -> ModelControl:
        """The ModelControl adapters get (changes go to every worker)."""
        ...

    async def before_listening(self) -> None:
        """Runs once start-up models loaded, before the listeners open (the journal replay)."""
        ...

    def wrap_http(self, app: Litestar) -> Any:
        """The ASGI application uvicorn serves."""
        ...

    async def refresh(self) -> None:
        """Fetch the other workers' statistics (before a gRPC ModelStatistics answer)."""
        ...


class ServeKit:
    """A running (or startable) server for one compiled plan.

    The composition root: it builds the services once (ServerState holding the plan in force,
    the repository, the DataPlane and ModelControl) and hands the DataPlane and ModelControl to
    every adapter; the adapters see nothing else of it.
    """

    def __init__(
        self,
        plan: ServePlan,
        statistics: Statistics | None = None,
        *,
        worker: WorkerRole | None = None,
    ) -> None:
        self.state = ServerState(plan)
        self.statistics = statistics or Statistics()
        self.repository = ModelRepository(plan.base_dir)
        # Every HTTP and gRPC surface below offers the configuration, statistics and
        # repository extensions and Triton's generate extension (app/servekit/rest/generate.py), so
        # server metadata names them.
        shared_memory = SharedMemoryRegions(
            enabled=plan.server.shared_memory == "system",
            max_bytes=plan.server.max_request_bytes,
        )
        extensions = (
            *server_extensions(
                config_and_statistics=True, repository=True, shared_memory=shared_memory.enabled
            ),
            *rest_generate.GENERATE,
        )
        sequences = Sequences(self.statistics, self.state)
        self.dataplane = DataPlane(
            self.state, self.repository, self.statistics, extensions, shared_memory, sequences
        )
        self.catalog = Catalog(
            self.state, self.repository, self.statistics, sequences, self.dataplane.on_demand
        )
        self._worker = worker
        self.control = (
            ModelControl(self.state, self.repository)
            if worker is None
            else worker.make_control(self.state, self.repository)
        )
        self.dataplane.on_demand.fetch = self.control.fetched  # a remote model's files
        self.addresses: Addresses | None = None
        self._http: _EmbeddedUvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._grpc: Any = None
        self._loading: asyncio.Task[None] | None = None

    @property
    def plan(self) -> ServePlan:
        """The plan in force (ServerState's; a reload or a ``--watch`` edit replaces it)."""
        return self.state.plan

    def _publish(self, addresses: Addresses) -> None:
        """Tell the services where the server listens (the ports route and the dashboard)."""
        self.state.listening = Listening(
            addresses.http_port, addresses.grpc_port, addresses.http_url, addresses.grpc_target
        )

    async def start(self, *, wait_for_models: bool = False) -> Addresses:
        """Open both listeners, then load models (awaited only if ``wait_for_models``).

        A worker of ``server.workers`` loads first and opens its listeners once it holds the
        state every worker holds (the others serve meanwhile)."""
        self.state.end_drain()
        self.state.stopping = False
        server = self.plan.server
        tls = self.plan.tls
        worker = self._worker
        access.set_access(server.logging.access_log)  # before the listeners exist
        # server.tracing and the OTEL_* variables; before gRPC's handlers are wrapped
        tracing.configure(settings=tracing_settings(server.tracing))
        if worker is not None:
            await self.control.start()
            await worker.before_listening()
        sockets = bind_http(server.host, server.http_port, reuse_port=worker is not None)
        hosts = tuple(bound_address(s) for s in sockets)
        self.addresses = Addresses(hosts, sockets[0].getsockname()[1], tls=tls is not None)
        network = server.network
        app: Any = self.http_app()
        protocol = protocol_class(
            network,
            host_policy(server.host, hosts, server.allowed_hosts),
            reserved=self.dataplane.shared_memory.max_regions,
            tls=None if tls is None else tls.server_context(),
            # V2 inference requests answered at the connection
            # (app/servekit/http/inference_lane.py); a worker's wrapper (totals_first) acts on
            # statistics paths only, which are never inference routes.
            lane=inference_lane(app),
            # the routes' tokens, checked when a request's headers end (app/servekit/rest/access.py)
            guard=edge_guard(app, self.dataplane.access),
            # plain inference requests read a loop pass (app/servekit/services/execution/load.py)
            note_read=self.state.load.note_read,
        )
        config = uvicorn.Config(
            app if worker is None else worker.wrap_http(app),
            lifespan="off",
            log_level="warning",
            # No dictConfig of uvicorn's own: its records reach the one handler servekit serve
            # sets up (app/servekit/observability/logs.py), in its format, once.
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=30,
            server_header=False,
            loop="none",
            # uvicorn's httptools protocol plus the deadlines and limits it lacks
            # (app/servekit/http/)
            # (each shared memory region holds a descriptor the connections must leave free).
            # TLS: our own context (app/servekit/config/tls.py, from the files the config check
            # read: uvicorn's file options would prompt on the terminal for an encrypted key's
            # password), handshaken by the edge itself so the handshake counts against the
            # connection cap and the header timeout; uvicorn is given no SSL context.
            http=protocol,
            timeout_keep_alive=max(1, math.ceil(network.keep_alive_seconds)),
            backlog=ACCEPT_BACKLOG,
        )
        self._http = _EmbeddedUvicorn(config)
        # the HTTP requests in progress, as the load signal counts them (uvicorn's tasks and
        # the requests the inference lane answers itself)
        self.state.load.listen_http(self._http.server_state.tasks)
        self._http_task = asyncio.create_task(self._http.serve(sockets=sockets))
        await _until(lambda: self._http is not None and self._http.started, self._http_task)
        self._publish(self.addresses)
        if server.grpc_port is not None:
            from servekit.grpc import tuning

            tuning.prefer_poller_io()  # before grpcio is imported (below)
            from servekit.grpc import grps_servicer
            from servekit.grpc.server import start_grpc_server

            self._grpc, port = await start_grpc_server(
                self.dataplane,
                server,
                catalog=self.catalog,
                control=self.control,
                services=[grps_servicer.registrar(self.dataplane, self.catalog)],
                hosts=hosts,
                tls=tls,
                reuse_port=worker is not None,
                before_statistics=worker.refresh if worker is not None else None,
            )
            self.addresses.grpc_port = port
            self._publish(self.addresses)
        if worker is None:
            self._loading = asyncio.create_task(self.control.start())
        if wait_for_models and self._loading is not None:
            await self._loading
        return self.addresses

    def http_app(self) -> Litestar:
        """Every HTTP surface of this server as one Litestar application."""
        return create_app(
            self.dataplane,
            self.control,
            self.catalog,
            extra_routes=[
                *rest_extensions.ROUTES,
                *rest_generate.ROUTES,
                *rest_infer_stream.ROUTES,
                *rest_openai.ROUTES,
                *dashboard.routes(),
                *rest_repository.ROUTES,
                *rest_shared_memory.ROUTES,
                *rest_grps.ROUTES,
                *rest_ports.ROUTES,
                *rest_workers.ROUTES,
            ],
        )

    async def wait_until_loaded(self) -> None:
        if self._loading is not None:
            await self._loading

    async def withdraw(self, seconds: float, cut_short: asyncio.Event | None = None) -> None:
        """The first step of a stop on SIGTERM: readiness turns false on every surface (V2
        HTTP and gRPC, gRPC health, grps) while requests that still arrive are served, for
        ``seconds`` (``server.drainDelaySeconds``) or until ``cut_short`` is set. A load
        balancer sends requests until its next health check sees the server unready (and
        Kubernetes' endpoints until the change reaches every node); refusing them at once
        would fail each of them. ``stop`` follows."""
        self.state.withdrawn = True
        if seconds <= 0:
            return
        waiting = asyncio.Event() if cut_short is None else cut_short
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiting.wait(), seconds)

    async def stop(self, grace: float | None = None) -> None:
        """Drain, then stop: readiness turns false and new inference requests are refused
        (503 / UNAVAILABLE) while accepted ones, queued or running, finish for up to ``grace``
        seconds (default ``server.drainSeconds``); then the listeners close (keep-alive
        connections after their current response, gRPC calls still open get the rest of the
        grace) and models are released. Refusing first, closing after, means no request a
        client saw accepted is cut off: a load balancer retries the refused ones elsewhere.

        Open streams (SSE generate_stream, grps streaming, gRPC ModelStreamInfer) count as
        accepted requests: they go on for the grace like any other, and only one still open
        when it runs out ends, at its next response (UNAVAILABLE). The gRPC listener keeps
        taking calls while the server drains (answering new ones UNAVAILABLE) and closes
        only once the calls in its handlers are done, after at least ``DRAIN_SETTLE``
        seconds: grpc core cancels a call it holds but has not handed over yet when it shuts
        down, so every call that arrived before the signal is first let in and answered."""
        loop = asyncio.get_running_loop()
        grace = self.plan.server.drain_seconds if grace is None else grace
        began = loop.time()
        deadline = began + grace
        settled = began + min(grace, DRAIN_SETTLE)
        self.state.begin_drain()
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loading
        calls = self.state.grpc_calls
        while loop.time() < deadline and (
            self.dataplane.in_flight() or calls.n or loop.time() < settled
        ):
            await asyncio.sleep(0.01)
        self.state.stopping = True  # streams still open end at their next response
        if self.dataplane.in_flight():  # (a request and its model call each count there)
            log.warning("stopping with requests unfinished after %.1f s of drain", grace)
        rest = max(1.0, deadline - loop.time())  # responses being written, open streams
        if self._grpc is not None:
            await self._grpc.stop(rest)
            self._grpc = None
        if self._http is not None and self._http_task is not None:
            self._http.config.timeout_graceful_shutdown = math.ceil(rest)
            self._http.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._http_task
            self._http = None
        self.dataplane.shared_memory.close()  # close every region clients registered
        await self.control.close()  # no more looks at remote storage
        await self.dataplane.on_demand.close()  # on-demand loads under way stop
        await self.repository.close()
        tracing.flush()  # the last requests' spans
        if self.state.payloads is not None:  # the events still queued, then its thread ends
            await asyncio.to_thread(self.state.payloads.close)


class StopSignals:
    """SIGTERM and SIGINT as a server process's stop (``servekit serve`` and each worker of
    ``--workers``): SIGTERM, what orchestrators send, first withdraws the server
    (``ServeKit.withdraw``: unready, still serving, ``server.drainDelaySeconds``); Ctrl-C
    (SIGINT) drains at once; a second signal cuts the withdrawal short."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.first: int | None = None
        self.received = asyncio.Event()
        self.again = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on, sig)

    def _on(self, sig: int) -> None:
        if self.first is None:
            self.first = sig
            self.received.set()
        else:
            self.again.set()

    def withdraw_seconds(self, plan: ServePlan) -> float:
        """How long to stay unready but serving before the drain: ``drainDelaySeconds`` after
        SIGTERM, nothing after Ctrl-C (or when the stop came from elsewhere)."""
        return plan.server.drain_delay_seconds if self.first == signal.SIGTERM else 0.0

    async def stop(self, kit: ServeKit) -> None:
        """Withdraw (after SIGTERM), then drain and stop ``kit``."""
        await kit.withdraw(self.withdraw_seconds(kit.plan), self.again)
        await kit.stop()


async def _until(condition: Any, task: asyncio.Task[None], timeout: float = 30.0) -> None:
    """Wait (bounded) for ``condition()``; surface the task's error if it died first."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if task.done():
            task.result()
            raise RuntimeError("HTTP server stopped during start-up")
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("HTTP server did not start in time")
        await asyncio.sleep(0.01)


def tracing_settings(config: TracingConfig) -> tracing.Settings:
    """serve.yaml's ``server.tracing`` as the plain values app/servekit/observability/tracing.py
    takes (the headers' secrets unwrapped here, for the exporter only)."""
    return tracing.Settings(
        enabled=config.enabled,
        endpoint=config.endpoint,
        protocol=config.protocol,
        sample_ratio=config.sample_ratio,
        service_name=config.service_name,
        headers={name: value.get_secret_value() for name, value in config.headers.items()},
    )
