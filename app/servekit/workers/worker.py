"""One worker process of ``server.workers``: a ServeKit on its own event loop, tied to the
supervisor (``python -m servekit.workers.worker SPEC``, started by
app/servekit/workers/supervisor.py).

It loads serve.yaml with the command line's overrides and the ports the supervisor reserved,
loads the start-up models, asks the supervisor to replay the operations the other workers
applied since they started (so it holds the same repository state), and only then opens its
HTTP and gRPC listeners on the shared ports (SO_REUSEPORT). Afterwards it answers the
supervisor's requests (a heartbeat ping, apply an operation, a statistics snapshot) and
forwards its clients' model-control requests to it (app/servekit/workers/control.py). SIGTERM
drains it like a single server; losing the supervisor stops it too (no orphan keeps the ports).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from litestar import Litestar
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from servekit import gc_tuning
from servekit.config.compiler import ServePlan
from servekit.config.overrides import Overrides, load_plan
from servekit.models.repository import ModelRepository
from servekit.observability import custom_metrics, logs
from servekit.server import ServeKit, StopSignals
from servekit.services.model_control import ModelControl
from servekit.services.state import ServerState
from servekit.workers.control import ClusterControl
from servekit.workers.protocol import Channel, Message
from servekit.workers.spec import WorkerSpec
from servekit.workers.stats import REFRESH_SECONDS, ClusterStatistics

log = logging.getLogger("servekit.workers")

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

NOT_FAILURES = (None, "", "unloaded", "not loaded")
"""Reasons of a model that is not loaded on purpose (app/servekit/models/repository.py)."""
WORKERS_PATH = "/servekit/v1/workers"
"""The per-worker figures (app/servekit/rest/workers.py)."""


def needs_totals(path: str) -> bool:
    """HTTP paths that show statistics (read totals across workers before answering)."""
    return (
        path.endswith("/stats")
        or path in ("/metrics", WORKERS_PATH)
        or path == "/"
        or path.startswith(("/dashboard/", "/models"))
    )


class Worker:
    """The worker's side of the supervisor channel and what it changes in its ServeKit."""

    def __init__(self, spec: WorkerSpec, overrides: Overrides) -> None:
        self.spec = spec
        self.overrides = overrides
        self.statistics = ClusterStatistics(spec.index)
        self.control: ClusterControl | None = None
        self.channel: Channel | None = None
        self.workers = 1
        self.restarts = 0
        self.load: Callable[[], dict[tuple[str, int], tuple[int, int]]] = dict
        """This process's requests per model version now (``DataPlane.load_here``, set once
        the ServeKit exists), sent with each statistics snapshot."""

    # -- WorkerRole (app/servekit/server.py)
    # -----------------------------------------------------------
    def make_control(self, state: ServerState, repository: ModelRepository) -> ModelControl:
        self.control = ClusterControl(state, repository, self.overrides)
        self.control.connect(self.forward)
        return self.control

    async def before_listening(self) -> None:
        """Join the supervisor: it replays what the other workers applied, then counts us."""
        await self.request({"op": "hello", "worker": self.spec.index, "summary": self.summary()})

    def summary(self) -> dict[str, str]:
        """Each model's failure as this worker sees it ("" when it serves or is not loaded):
        how the supervisor tells that a model loaded here but not on another worker."""
        assert self.control is not None
        out: dict[str, str] = {}
        for row in self.control.index():
            if row.state == "READY":
                out.setdefault(row.name, "")
            elif row.state == "UNAVAILABLE" and row.reason not in NOT_FAILURES:
                out[row.name] = row.reason
        return out

    def wrap_http(self, app: Litestar) -> ASGIApp:
        app.state.metrics_registry.register(_WorkerCollector(self))

        async def totals_first(scope: Scope, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and needs_totals(scope["path"]):
                await self.refresh()
            await app(scope, receive, send)  # type: ignore[arg-type]

        return totals_first

    # -- the channel --------------------------------------------------------------------------
    async def connect(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self.spec.socket)
        self.channel = Channel(reader, writer, self.handle)
        # Heartbeats start now: a worker that hangs while it loads its models is found too.
        await self.request({"op": "attach", "worker": self.spec.index})

    async def request(self, message: Message) -> Any:
        assert self.channel is not None
        return await self.channel.request(message)

    async def forward(self, message: Message) -> Any:
        """A client's model-control request: the supervisor applies it on every worker."""
        return await self.request(message)

    async def handle(self, message: Message) -> Any:
        """The supervisor's requests."""
        op = message.get("op")
        if op == "ping":  # a heartbeat: answered on this loop, so it proves the loop turns
            return None
        if op == "apply":
            assert self.control is not None
            return await self.control.apply(message)
        if op == "snapshot":
            return {
                "stats": self.statistics.local_snapshot(),
                "metrics": custom_metrics.snapshot(),
                "load": [[m, v, p, i] for (m, v), (p, i) in self.load().items()],
            }
        if op == "summary":
            return self.summary()
        raise ValueError(f"unknown request {str(op)[:40]!r}")

    async def refresh(self) -> None:
        """The other workers' statistics, fetched now (a slow or gone worker: last known)."""
        try:
            answer = await asyncio.wait_for(self.request({"op": "stats"}), REFRESH_SECONDS)
        except (TimeoutError, ConnectionError) as exc:
            log.warning(
                "worker %d: statistics of the other workers unavailable: %s", self.spec.index, exc
            )
            return
        self.workers = int(answer["workers"])
        self.restarts = int(answer["restarts"])
        self.statistics.set_cluster(list(answer["slots"]))


class _WorkerCollector(Collector):
    """The worker metrics of /metrics: ``servekit_workers`` and ``servekit_worker_restarts_total``
    (totals), and per worker position (label ``worker``, its index: stable across restarts,
    unlike a pid) whether it serves, when its process started, its restarts and its share of
    the inference requests. Whichever worker answers the scrape, it reports every worker (read
    through the supervisor just before), so one scrape of the one port is the whole picture.

    The per-worker series have names of their own, so ``sum`` over them gives the totals and
    never adds a total in: ``sum(servekit_worker_inference_success_total)`` equals
    ``sum(servekit_inference_success_total)`` (per model version) as long as no model was
    removed (the shares keep counting its requests, a counter never goes down), and
    ``sum(servekit_worker_restarts_by_worker_total)`` equals ``servekit_worker_restarts_total``.
    """

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def collect(self) -> list[Metric]:
        workers = GaugeMetricFamily("servekit_workers", "Worker processes serving")
        workers.add_metric([], self._worker.workers)
        restarts = CounterMetricFamily(
            "servekit_worker_restarts", "Workers restarted by the supervisor after they died"
        )
        restarts.add_metric([], self._worker.restarts)
        label = ["worker"]
        up = GaugeMetricFamily(
            "servekit_worker_up",
            "1 while the worker serves, 0 while it starts or restarts",
            labels=label,
        )
        started = GaugeMetricFamily(
            "servekit_worker_start_time_seconds",
            "When the worker's current process started (Unix time)",
            labels=label,
        )
        heartbeat = GaugeMetricFamily(
            "servekit_worker_heartbeat_age_seconds",
            "Seconds since the worker last answered the supervisor's heartbeat (absent while "
            "it starts or restarts; it is killed and restarted past 10 s)",
            labels=label,
        )
        by_worker = CounterMetricFamily(
            "servekit_worker_restarts_by_worker",
            "Restarts of each worker (they add up to servekit_worker_restarts_total)",
            labels=label,
        )
        success = CounterMetricFamily(
            "servekit_worker_inference_success",
            "Successful inference requests answered by each worker, every model and restart",
            labels=label,
        )
        failure = CounterMetricFamily(
            "servekit_worker_inference_failure",
            "Failed inference requests answered by each worker, every model and restart",
            labels=label,
        )
        for status in self._worker.statistics.workers() or []:
            key = [str(status.index)]
            up.add_metric(key, float(status.state == "serving"))
            if status.up_since is not None:
                started.add_metric(key, status.up_since)
            if status.heartbeat_age is not None:
                heartbeat.add_metric(key, status.heartbeat_age)
            by_worker.add_metric(key, status.restarts)
            success.add_metric(key, status.success)
            failure.add_metric(key, status.failure)
        return [workers, restarts, up, started, heartbeat, by_worker, success, failure]


async def _run(spec: WorkerSpec, plan: ServePlan) -> None:
    overrides = spec.overrides()
    worker = Worker(spec, overrides)
    signals = StopSignals(asyncio.get_running_loop())
    stop = signals.received
    await worker.connect()
    assert worker.channel is not None
    kit = ServeKit(plan, worker.statistics, worker=worker)
    worker.load = kit.catalog.load_here
    await kit.start()
    await worker.request({"op": "listening", "worker": spec.index})
    watcher = None
    if plan.server.watch and spec.index == 0:
        from servekit.services.watch import watch_config

        watcher = asyncio.create_task(watch_config(kit, overrides))
    supervisor_gone = asyncio.create_task(worker.channel.closed.wait())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({supervisor_gone, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if supervisor_gone.done() and not stop.is_set():
        log.warning("worker %d: supervisor gone, stopping", spec.index)
    if watcher is not None:
        watcher.cancel()
    await signals.stop(kit)
    supervisor_gone.cancel()
    stopping.cancel()
    await worker.channel.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = WorkerSpec.from_json(args[0])
    # serve.yaml's format; the level the command line resolved (passed in the spec)
    plan = load_plan(spec.config, spec.overrides())
    logs.setup(plan.server.logging.format, spec.log_level, worker=spec.index)
    gc_tuning.tune()  # a process of its own: see app/servekit/gc_tuning.py
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_run(spec, plan))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
