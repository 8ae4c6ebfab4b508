"""The server's own state: the plan in force and the switches every surface reads.

``ServerState`` is the one place the compiled serve.yaml in force is held. ModelControl replaces it
(``apply_plan``: a ``--watch`` edit or a notebook ``reload()``); everything else (DataPlane,
ModelControl itself, the watcher, the adapters through the services) reads it from here on use, so
no component can go on serving a stale copy. Settings marked restart-only in
app/servekit/config/schema.py (``RESTART_ONLY``) keep their running values in every replacement,
together with what the plan derived from them (tokens, TLS material): the listeners and guards built
at start are never out of step with the plan they are read from."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from servekit.config.compiler import ServePlan
from servekit.config.schema import RESTART_ONLY, ServerConfig
from servekit.errors import Unavailable
from servekit.observability.payloads import PayloadLog
from servekit.services.execution.load import CallCount as CallCount  # (the DataPlane's)
from servekit.services.execution.load import Load


@dataclass(frozen=True, slots=True)
class Listening:
    """Where the server listens once bound (set by the composition root, read by adapters)."""

    http_port: int
    grpc_port: int | None
    """None while gRPC is disabled or still starting (see ``ServerState.ports``)."""
    http_url: str
    """Base URL for a client on this machine."""
    grpc_target: str | None
    """``host:port`` for a gRPC client on this machine; None when gRPC is not listening."""


class ServerState:
    """The plan in force, online/offline, start-up progress and the bound addresses."""

    __slots__ = (
        "_plan",
        "drain_begun",
        "drain_started",
        "draining",
        "grpc_calls",
        "inline_below_ns",
        "listening",
        "load",
        "online",
        "payloads",
        "plan_changed",
        "read_together",
        "request_timeout_s",
        "requests_in_progress",
        "started_at",
        "startup_done",
        "stopping",
        "withdrawn",
    )

    def __init__(self, plan: ServePlan) -> None:
        self._plan = plan
        self.inline_below_ns = plan.server.inline_below_microseconds * 1000
        """``server.inlineBelowMicroseconds`` in ns, derived with each plan: executors are
        built with it and re-tuned when an edit changes it (``plan_changed``)."""
        self.request_timeout_s = plan.server.request_timeout_seconds
        """``server.requestTimeoutSeconds`` (None: no cap), derived likewise."""
        self.draining = False
        """True once a graceful stop began (ServeKit.stop): readiness is false and new
        inference requests are refused, while those already accepted finish."""
        self.drain_started = math.inf
        """When the drain began (``time.monotonic()``; infinity when not draining). A request
        whose headers arrived before it was accepted, even if its body is still uploading."""
        self.withdrawn = False
        """True from SIGTERM until the stop ends (``ServeKit.withdraw``): readiness is false so
        load balancers stop sending, while requests that still arrive are served until the
        drain (``draining``) begins."""
        self.online = True
        """False after grps Offline: readiness answers false (on every surface) so a load
        balancer drains this server, while requests that still arrive are served."""
        self.startup_done = False
        """Start-up loading (``startupModels``) has finished."""
        self.started_at = time.time()
        self.listening: Listening | None = None
        self.load = Load()
        """The requests the listeners hold and read: the one load signal the executors read
        (app/servekit/services/execution/load.py), fed by both listeners."""
        self.grpc_calls = self.load.grpc_calls
        """Unary gRPC inference calls the servicer holds (counted by
        app/servekit/grpc/servicer.py), part of ``load``."""
        self.requests_in_progress: Callable[[], int] = self.load.in_progress
        """How many requests the listeners hold right now (the one asking included):
        ``Load.in_progress``."""
        self.read_together: Callable[[], int] = self.load.read_together
        """1 while the HTTP listener reads several plain inference requests a loop pass, else
        0: ``Load.read_together``."""
        self.stopping = False
        """The server is shutting down: streams of decoupled models end at their next response
        (with an UNAVAILABLE error) instead of holding the shutdown until its grace runs out."""
        self.payloads: PayloadLog | None = None
        """The payload log (``server.payloadLog``; None without one): made by the DataPlane,
        which feeds it, read by the Catalog for its counts, closed when the server stops."""
        self.plan_changed: list[Callable[[], None]] = []
        """Called after each ``replace_plan`` (the DataPlane re-tunes its executors there, so
        no request checks for an edit)."""
        self.drain_begun: list[Callable[[], None]] = []
        """Called by ``begin_drain`` (the DataPlane's shadow copies are cancelled there: a
        stop waits for the clients' requests, not for copies no client waits for)."""

    def begin_drain(self) -> None:
        """Refuse inference requests that arrive from now on (those already accepted finish)."""
        self.drain_started = time.monotonic()
        self.draining = True
        for hook in self.drain_begun:
            hook()

    def end_drain(self) -> None:
        """Accept requests again (a stopped server that starts anew)."""
        self.withdrawn = False
        self.draining = False
        self.drain_started = math.inf

    def refuses(self, arrived: float | None) -> bool:
        """Whether a request is refused because the server is draining: it is, unless its
        headers ``arrived`` (``time.monotonic()``) before the drain began. A client whose
        upload was under way when SIGTERM came had its request accepted, and it finishes."""
        return self.draining and (arrived is None or arrived >= self.drain_started)

    @property
    def plan(self) -> ServePlan:
        """The compiled serve.yaml in force (read it on use; never keep it)."""
        return self._plan

    def replace_plan(self, plan: ServePlan) -> ServePlan:
        """Put ``plan`` in force, keeping restart-only settings as they run; returns the plan
        now in force. Only ModelControl.apply_plan calls this (it also applies the models)."""
        self._plan = keep_restart_only(plan, self._plan)
        self.inline_below_ns = self._plan.server.inline_below_microseconds * 1000
        self.request_timeout_s = self._plan.server.request_timeout_seconds
        for listener in self.plan_changed:
            listener()
        return self._plan

    def ports(self) -> Listening:
        """The bound ports; Unavailable before the listeners are up, and in the moment between
        the HTTP listener opening and the gRPC listener binding (so a client never reads
        "gRPC disabled" for a port that is about to exist)."""
        listening = self.listening
        if listening is None:
            raise Unavailable("the server's addresses are not known yet")
        if listening.grpc_port is None and self._plan.server.grpc_port is not None:
            raise Unavailable("the gRPC listener is still starting")
        return listening


def keep_restart_only(new: ServePlan, running: ServePlan) -> ServePlan:
    """``new`` with the restart-only server settings (and the tokens and TLS material read from
    them) of ``running``."""
    fixed = {name: getattr(running.server, name) for name in RESTART_ONLY}
    server = new.server.model_copy(update=fixed)
    return dataclasses.replace(new, server=server, access=running.access, tls=running.tls)


def restart_only_edits(new: ServerConfig, old: ServerConfig) -> list[str]:
    """Attribute names of restart-only settings that differ between two server sections (in
    the order serve.yaml's schema declares them)."""
    return [
        name
        for name in ServerConfig.model_fields
        if name in RESTART_ONLY and getattr(new, name) != getattr(old, name)
    ]
