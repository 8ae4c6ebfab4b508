"""Statistics totalled across workers: a worker's own counts plus the others' snapshots.

Inference records into the plain ``Statistics.of`` (nothing changes on the hot path); every
reader (the statistics extension, ``/metrics``, the dashboard) reads through ``find``, which here
adds the snapshots of the other workers, fetched right before the read
(``set_others``: the worker's ASGI wrapper and gRPC interceptor fetch them for statistics
requests only).
"""

from __future__ import annotations

from typing import Any

from app.services.stats import Duration, Statistics, VersionStats

Snapshot = list[dict[str, Any]]
"""One worker's statistics as JSON: ``[{"model", "version", "stats": {...}}, ...]``."""

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


class ClusterStatistics(Statistics):
    """This worker's statistics; ``find`` answers the totals of every worker."""

    def __init__(self) -> None:
        super().__init__()
        self._others: dict[tuple[str, int], list[dict[str, Any]]] = {}

    def local_snapshot(self) -> Snapshot:
        """This worker's own counts, as the channel carries them."""
        return [
            {"model": model, "version": version, "stats": stats_to_json(stats)}
            for (model, version), stats in self._by_version.items()
        ]

    def set_others(self, snapshots: list[Snapshot]) -> None:
        """The other workers' counts, as fetched right before a statistics read."""
        others: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for snapshot in snapshots:
            for row in snapshot:
                key = (str(row["model"]), int(row["version"]))
                others.setdefault(key, []).append(row["stats"])
        self._others = others

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
