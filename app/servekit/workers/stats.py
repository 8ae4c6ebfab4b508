"""Statistics totalled across workers: a worker's own counts plus the others' snapshots.

Inference records into the plain ``Statistics.of`` (nothing changes on the hot path); every
reader (the statistics extension, ``/metrics``, the dashboard) reads through ``find``, which here
adds the snapshots of the other workers, fetched right before the read (``set_cluster``: the
worker's ASGI wrapper and its gRPC ModelStatistics fetch them for statistics requests only).

The same fetch carries each worker position's process, state and restarts, and the counts of
its processes that died (merged into one snapshot by the supervisor), so ``workers`` answers the
per-worker breakdown from the very numbers the totals are made of: the workers' request counts
add up to the totals, whichever worker answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from servekit.observability import custom_metrics
from servekit.services.stats import (
    WORKER_STATES,
    Duration,
    Statistics,
    VersionStats,
    WorkerState,
    WorkerStatus,
)

Snapshot = list[dict[str, Any]]
"""One worker's statistics as JSON: ``[{"model", "version", "stats": {...}}, ...]``."""
SlotReport = dict[str, Any]
"""One worker position as the supervisor reports it: ``index``, ``pid``, ``state``, ``since``
(Unix seconds), ``restarts``, ``heartbeat_age`` (seconds since it last answered a heartbeat;
null while not watched), ``retired`` (the merged snapshot of its dead processes) and
``current`` (its live process's snapshot; null for the worker asking, which adds its own)."""

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")

REFRESH_SECONDS = 5.0
"""How long a statistics read waits for the other workers before answering with what it has."""


def stats_to_json(stats: VersionStats) -> dict[str, Any]:
    out: dict[str, Any] = {
        name: [getattr(stats, name).count, getattr(stats, name).ns] for name in _DURATIONS
    }
    out["inference_count"] = stats.inference_count
    out["execution_count"] = stats.execution_count
    out["last_inference_ms"] = stats.last_inference_ms
    out["batch_sizes"] = [[size, d.count, d.ns] for size, d in stats.batch_sizes.items()]
    out["queue_histogram"] = list(stats.queue_histogram)
    out["batch_reasons"] = dict(stats.batch_reasons)
    out["shadow"] = dict(stats.shadow)
    return out


def add_json(into: VersionStats, data: dict[str, Any]) -> None:
    """Add a snapshot's counts to ``into``."""
    for name in _DURATIONS:
        count, ns = data[name]
        getattr(into, name).add(int(ns), int(count))
    into.inference_count += int(data["inference_count"])
    into.execution_count += int(data["execution_count"])
    into.last_inference_ms = max(into.last_inference_ms, int(data["last_inference_ms"]))
    for size, count, ns in data["batch_sizes"]:
        into.batch_sizes.setdefault(int(size), Duration()).add(int(ns), int(count))
    for bucket, count in enumerate(data["queue_histogram"]):
        into.queue_histogram[bucket] += int(count)
    for reason, count in data["batch_reasons"].items():
        into.batch_reasons[str(reason)] = into.batch_reasons.get(str(reason), 0) + int(count)
    for outcome, count in data["shadow"].items():
        into.shadow[str(outcome)] = into.shadow.get(str(outcome), 0) + int(count)


def merge(snapshots: Iterable[Snapshot]) -> Snapshot:
    """Several snapshots as one (the counts of a worker position's processes that died)."""
    total: dict[tuple[str, int], VersionStats] = {}
    for snapshot in snapshots:
        for row in snapshot:
            key = (str(row["model"]), int(row["version"]))
            add_json(total.setdefault(key, VersionStats()), row["stats"])
    return [
        {"model": model, "version": version, "stats": stats_to_json(stats)}
        for (model, version), stats in total.items()
    ]


def requests_of(snapshot: Snapshot | None) -> tuple[int, int]:
    """A snapshot's inference requests: (successes, failures), every model version."""
    rows = [row["stats"] for row in snapshot or []]
    return sum(int(r["success"][0]) for r in rows), sum(int(r["fail"][0]) for r in rows)


class ClusterStatistics(Statistics):
    """This worker's statistics; ``find`` answers the totals of every worker, ``workers``
    each worker's share."""

    def __init__(self, index: int = 0) -> None:
        super().__init__()
        self.index = index
        """This worker's position (its own counts are read locally, never from a report)."""
        self._others: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self._slots: list[SlotReport] = []
        self._metrics: list[tuple[str | None, custom_metrics.Snapshot]] = []
        self._retired_metrics: list[custom_metrics.Snapshot] = []
        self._others_load: dict[tuple[str, int], tuple[int, int]] = {}

    def local_snapshot(self) -> Snapshot:
        """This worker's own counts, as the channel carries them."""
        return [
            {"model": model, "version": version, "stats": stats_to_json(stats)}
            for (model, version), stats in self._by_version.items()
        ]

    def set_cluster(self, slots: list[SlotReport]) -> None:
        """Every worker position as fetched right before a statistics read: the counts of the
        other workers and of every dead process join this worker's own in the totals."""
        others: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for slot in slots:
            current = slot.get("current") if int(slot["index"]) != self.index else None
            for snapshot in (slot.get("retired"), current):
                for row in snapshot or []:
                    key = (str(row["model"]), int(row["version"]))
                    others.setdefault(key, []).append(row["stats"])
        self._others = others
        self._slots = slots
        load: dict[tuple[str, int], tuple[int, int]] = {}
        for slot in slots:
            if int(slot["index"]) == self.index:
                continue  # this worker's own load is read live
            for model, version, pending, inflight in slot.get("load") or []:
                key = (str(model), int(version))
                had = load.get(key, (0, 0))
                load[key] = (had[0] + int(pending), had[1] + int(inflight))
        self._others_load = load
        self._metrics = [
            (str(slot["index"]), slot["metrics"])
            for slot in slots
            if int(slot["index"]) != self.index and slot.get("metrics")
        ]
        self._retired_metrics = [
            slot["retired_metrics"] for slot in slots if slot.get("retired_metrics")
        ]

    def custom_samples(self) -> Iterator[custom_metrics.Sample]:
        """Every worker's custom metrics: this one's now, the others' as fetched for this
        read, the dead processes' counts (see app/servekit/observability/custom_metrics.py)."""
        live = [(str(self.index), custom_metrics.snapshot()), *self._metrics]
        return custom_metrics.merged(live, self._retired_metrics)

    def others_load(self) -> dict[tuple[str, int], tuple[int, int]]:
        """The other workers' pending and in-flight requests, as fetched for this read."""
        return self._others_load

    def workers(self) -> list[WorkerStatus] | None:
        """Each worker position with its process and counts (None before the first fetch)."""
        if not self._slots:
            return None
        found = []
        for slot in self._slots:
            index = int(slot["index"])
            success, failure = requests_of(slot.get("retired"))
            alive = self.requests() if index == self.index else requests_of(slot.get("current"))
            pid, since, age = slot.get("pid"), slot.get("since"), slot.get("heartbeat_age")
            found.append(
                WorkerStatus(
                    index=index,
                    pid=None if pid is None else int(pid),
                    state=_state(slot["state"]),
                    up_since=None if since is None else float(since),
                    restarts=int(slot["restarts"]),
                    success=success + alive[0],
                    failure=failure + alive[1],
                    heartbeat_age=None if age is None else float(age),
                )
            )
        return found

    def find(self, model: str, version: int) -> VersionStats | None:
        key = (model, version)
        local = self._by_version.get(key)
        remote = self._others.get(key)
        if not remote:
            return local
        total = VersionStats()
        if local is not None:
            add_json(total, stats_to_json(local))
        for data in remote:
            add_json(total, data)
        return total


def _state(value: object) -> WorkerState:
    for state in WORKER_STATES:
        if value == state:
            return state
    raise ValueError(f"unknown worker state {str(value)[:40]!r}")
