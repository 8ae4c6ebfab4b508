"""The read side: what the server holds and how it has done, for the dashboard, the
repository index, the ports and workers routes, Triton's statistics and /metrics.

The DataPlane answers health, metadata and inference; everything an adapter only reads about
the models (their versions and states as frozen views, the index, statistics, sequence counts,
queue load), the workers, the ports and the recent errors is asked here. Nothing here changes
the server.
"""

from __future__ import annotations

import os
from typing import Any

from servekit.models.repository import ModelEntry, ModelRepository, State
from servekit.observability.payloads import PayloadCounts
from servekit.results import IndexRow, LoggedError
from servekit.services.composition.pipelines import steps_waiting, with_steps_waiting
from servekit.services.execution.executor import ModelExecutor
from servekit.services.memory import MemoryStatus, OnDemand
from servekit.services.model_stats import VersionStatistics, model_statistics
from servekit.services.sequences.batcher import SequenceCounts
from servekit.services.sequences.handler import Sequences
from servekit.services.state import Listening, ServerState
from servekit.services.stats import (
    Statistics,
    VersionStats,
    WindowPoint,
    WorkerState,
    WorkerStatus,
    window,
)
from servekit.services.views import ModelView, view_of


class Catalog:
    """The read-side service every adapter is given beside the DataPlane (see the module
    docstring)."""

    def __init__(
        self,
        state: ServerState,
        repository: ModelRepository,
        statistics: Statistics,
        sequences: Sequences,
        on_demand: OnDemand | None = None,
    ) -> None:
        """``on_demand``: the DataPlane's loader of ``load: onDemand`` models, whose figures
        ``memory`` reads."""
        self._state = state
        self._on_demand = on_demand
        self._repository = repository
        self.statistics = statistics
        """Every version's figures (what each request's account writes)."""
        self._sequences = sequences

    @property
    def started_at(self) -> float:
        """When this server started (``time.time()``)."""
        return self._state.started_at

    def ports(self) -> Listening:
        """The bound HTTP and gRPC ports (Unavailable until they are known)."""
        return self._state.ports()

    @property
    def listening(self) -> Listening | None:
        """Where the server listens, or None before the listeners are up."""
        return self._state.listening

    def models(self) -> list[ModelView]:
        """Every model with its versions, states and reasons, sorted by name (frozen views)."""
        repository = self._repository
        entries = sorted(repository.entries(), key=lambda e: e.plan.name)
        return [self._view(entry) for entry in entries]

    def model(self, name: str) -> ModelView:
        """One model with its versions (NotFound for an unknown name; a frozen view)."""
        return self._view(self._repository.get(name))

    def _view(self, entry: ModelEntry) -> ModelView:
        plan = entry.plan
        waiting = steps_waiting(self._repository, plan) if plan.pipeline else None
        return view_of(entry, self._repository.downloading(plan.name), waiting)

    def index(self, ready_only: bool = False) -> list[IndexRow]:
        """Triton's repository index: one row per model version (name, version, state,
        reason), ready ones only if asked; a pipeline whose steps cannot run is not READY."""
        rows = with_steps_waiting(self._repository, self._repository.index())
        return [r for r in rows if r.state == State.READY.value] if ready_only else rows

    def memory(self) -> MemoryStatus:
        """``server.modelMemory``, what the loaded models hold, and each model's measured
        resident size, on-demand loads, unloads and load times (memory.py)."""
        if self._on_demand is None:
            return MemoryStatus(None, 0, ())
        return self._on_demand.status()

    def recent_errors(self) -> list[LoggedError]:
        """Failed loads and rejected serve.yaml edits, newest last (a copy)."""
        return list(self._repository.recent_errors)

    def workers(self) -> list[WorkerStatus]:
        """Each worker process with its figures (``server.workers``); a single server answers
        one entry, this process."""
        found = self.statistics.workers()
        if found is not None:
            return found
        success, failure = self.statistics.requests()
        state: WorkerState = "serving" if self._state.startup_done else "starting"
        if self._state.stopping:
            state = "stopping"
        started = self._state.started_at
        return [WorkerStatus(0, os.getpid(), state, started, 0, success, failure)]

    def payload_log(self) -> PayloadCounts | None:
        """What the payload log did (logged, dropped and why) in this process; None when
        serve.yaml has no ``server.payloadLog``."""
        payloads = self._state.payloads
        return payloads.counts() if payloads is not None else None

    def payload_sink(self) -> str | None:
        """The payload log's sink as pages may show it (``http`` and the URL without user
        info or query, or ``file`` and the file's name), None without a payload log."""
        payloads = self._state.payloads
        return payloads.sink.shown() if payloads is not None else None

    def payload_log_status(self) -> dict[str, Any] | None:
        """The payload log as the dashboard and a notebook show it: its sink
        (:meth:`payload_sink`) and the events it logged and dropped (``queue_full``,
        ``sink_failed``); None without one."""
        counts = self.payload_log()
        if counts is None:
            return None
        return {
            "sink": self.payload_sink(),
            "logged": counts.logged,
            "dropped": counts.dropped,
            "queue_full": counts.queue_full,
            "sink_failed": counts.sink_failed,
        }

    def version_stats(self, name: str, version: int) -> VersionStats:
        """The statistics of one version (zeros if it has served nothing)."""
        return self.statistics.find(name, version) or VersionStats()

    def window(self, name: str, version: int) -> list[WindowPoint]:
        """The last minutes of one version, per slot of the rolling window (stats.py
        ``window``): the dashboard's latency chart."""
        return window(self.version_stats(name, version))

    def sequence_counts(self, name: str, version: str | None = None) -> SequenceCounts:
        """The sequence statistics of a sequence model's version (started, ended, expired by
        idleness, active, in the backlog); zeros before its first sequence."""
        _, found = self._repository.resolve(name, version)
        return self._sequences.counts(found.executor) or SequenceCounts()

    def model_statistics(
        self, name: str | None = None, version: str | None = None
    ) -> tuple[VersionStatistics, ...]:
        """Triton's statistics of the versions a request names (see model_stats.py)."""
        return model_statistics(self._repository, self.statistics, name, version)

    def load_here(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Requests per (model, version) in this process now: (pending: queued, not started;
        inflight: started, not answered), for every version with an executor."""
        found: dict[tuple[str, int], tuple[int, int]] = {}
        for entry in self._repository.entries():
            for version in entry.versions.values():
                executor = version.executor
                if isinstance(executor, ModelExecutor):
                    found[(entry.plan.name, version.version)] = executor.load()
        return found

    def load(self) -> dict[tuple[str, int], tuple[int, int]]:
        """``load_here`` summed with the other workers' (``server.workers``): the gauges an
        autoscaler reads, whichever worker answers the scrape."""
        total = self.load_here()
        for key, (pending, inflight) in self.statistics.others_load().items():
            mine = total.get(key, (0, 0))
            total[key] = (mine[0] + pending, mine[1] + inflight)
        return total
