"""Triton's statistics extension: which versions a statistics request covers, and their entries.

app/servekit/services/stats.py records; this module takes the typed snapshots that ``GET
/v2/models[/{m}[/versions/{v}]]/stats`` (as JSON, app/servekit/rest/triton_json.py) and the gRPC
ModelStatistics RPC (as protobuf, field by field) answer, so both carry the same rows. As in Triton:
no model name means every model, no version means every ready version of the model, and a named
version must be ready. A version that has served nothing yet reports zeros."""

from __future__ import annotations

from dataclasses import dataclass

from servekit.models.repository import ModelRepository
from servekit.services.stats import Duration, Statistics, VersionStats


@dataclass(frozen=True, slots=True)
class DurationStat:
    """A count of events and their cumulative nanoseconds (Triton's StatisticDuration)."""

    count: int
    ns: int


_ZERO = DurationStat(0, 0)


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """Executions of one batch size (Triton's InferBatchStatistics)."""

    batch_size: int
    compute_input: DurationStat
    compute_infer: DurationStat
    compute_output: DurationStat


@dataclass(frozen=True, slots=True)
class VersionStatistics:
    """One model version's statistics (Triton's ModelStatistics), a snapshot."""

    name: str
    version: str
    last_inference: int
    """Milliseconds since the epoch of the last request (0: none yet)."""
    inference_count: int
    execution_count: int
    success: DurationStat
    fail: DurationStat
    queue: DurationStat
    compute_input: DurationStat
    compute_infer: DurationStat
    compute_output: DurationStat
    cache_hit: DurationStat
    cache_miss: DurationStat
    batch_stats: tuple[BatchStatistics, ...]
    shadow: tuple[tuple[str, int], ...] = ()
    """This version as a shadow (serve.yaml ``shadow``): its copies by outcome (agreed,
    disagreed, failed, dropped); empty for a version that is no shadow. servekit's own: the
    JSON answer carries it as ``shadow``, the gRPC message has no field for it."""


def model_statistics(
    repository: ModelRepository,
    statistics: Statistics,
    name: str | None = None,
    version: str | None = None,
) -> tuple[VersionStatistics, ...]:
    """The statistics of the versions the request names."""
    rows: list[tuple[str, int]] = []
    if not name:
        for entry in sorted(repository.entries(), key=lambda e: e.plan.name):
            rows.extend((entry.plan.name, v) for v in entry.ready_versions())
    elif not version:
        entry = repository.get(name)
        rows.extend((name, v) for v in entry.ready_versions())
    else:
        _, found = repository.resolve(name, version)
        rows.append((name, found.version))
    return tuple(
        snapshot(statistics.find(model, number) or VersionStats(), model, str(number))
        for model, number in rows
    )


def snapshot(stats: VersionStats, name: str, version: str) -> VersionStatistics:
    """The recorded statistics of one version as an immutable value."""
    return VersionStatistics(
        name=name,
        version=version,
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        success=_stat(stats.success),
        fail=_stat(stats.fail),
        queue=_stat(stats.queue),
        compute_input=_stat(stats.compute_input),
        compute_infer=_stat(stats.compute_infer),
        compute_output=_stat(stats.compute_output),
        cache_hit=_ZERO,  # servekit has no response cache
        cache_miss=_ZERO,
        batch_stats=tuple(
            # Batch executions are timed as a whole: their time counts as compute_infer.
            BatchStatistics(size, DurationStat(d.count, 0), _stat(d), DurationStat(d.count, 0))
            for size, d in sorted(stats.batch_sizes.items())
        ),
        shadow=tuple(sorted(stats.shadow.items())),
    )


def _stat(duration: Duration) -> DurationStat:
    return DurationStat(duration.count, duration.ns)
