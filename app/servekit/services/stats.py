"""Per model-version inference statistics, in the shape of Triton's statistics extension.

Durations are cumulative nanoseconds. The dataplane records; the REST and gRPC statistics
endpoints, the dashboard and /metrics read. One source of truth for all of them.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, get_args

from servekit import custom_metrics

QUEUE_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds (seconds) of the queue-time histogram in /metrics (+Inf implied)."""
_QUEUE_BOUNDS_NS = tuple(round(b * 1e9) for b in QUEUE_BUCKETS_S)


LATENCY_BOUNDS_NS: tuple[int, ...] = tuple(round(20_000 * 1.25**k) for k in range(64))
"""Upper bounds of the request-latency buckets of the rolling window: 20 us to about 30 min,
each 25% wider than the last, so a percentile read from them is within 25% of the truth."""
WINDOW_SLOT_S = 10
"""The rolling window's slot: requests are counted per 10 s of wall clock."""
WINDOW_SLOTS = 30
"""Slots kept: the last five minutes (the model page's latency chart)."""
_SLOT_NS = WINDOW_SLOT_S * 1_000_000_000


@dataclass(slots=True)
class Duration:
    """A count of events and their cumulative time."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class VersionStats:
    """Statistics of one model version (Triton's ModelStatistics)."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batch_sizes: dict[int, Duration] = field(default_factory=dict)
    """Executions by batch size (rows): Triton's batch_stats, and /metrics' batch histogram."""
    queue_histogram: list[int] = field(default_factory=lambda: [0] * (len(QUEUE_BUCKETS_S) + 1))
    """Successful requests by queue time, per bucket of QUEUE_BUCKETS_S (last: beyond)."""
    batch_reasons: dict[str, int] = field(default_factory=dict)
    """Why dynamic batches stopped where they did (by reason: see
    app/servekit/services/execution/batching.py)."""
    recent: deque[tuple[int, list[int]]] = field(default_factory=lambda: deque(maxlen=WINDOW_SLOTS))
    """The rolling window: (slot number, successful requests by latency bucket of
    LATENCY_BOUNDS_NS, the last one beyond) for each of the last WINDOW_SLOTS slots that saw a
    request. The model page reads throughput and p50/p90/p99 over the last minutes from it."""

    def record_success(
        self,
        batch: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        executed: bool = True,
    ) -> None:
        """One successful request of ``batch`` inferences (rows of a batching model, else 1);
        ``executed`` is False when the executor counted the model run (worker threads).

        Runs for every request: plain integer adds on the durations' slots (no call per
        duration), one wall clock read."""
        compute = input_ns + infer_ns + output_ns
        total = queue_ns + compute
        duration = self.success
        duration.count += 1
        duration.ns += total
        duration = self.queue
        duration.count += 1
        if queue_ns:
            duration.ns += queue_ns
            self.queue_histogram[bisect_left(_QUEUE_BOUNDS_NS, queue_ns)] += 1
        else:
            self.queue_histogram[0] += 1
        duration = self.compute_input
        duration.count += 1
        duration.ns += input_ns
        duration = self.compute_infer
        duration.count += 1
        duration.ns += infer_ns
        duration = self.compute_output
        duration.count += 1
        duration.ns += output_ns
        self.inference_count += batch
        now = time.time_ns()
        self.last_inference_ms = now // 1_000_000
        slot = now // _SLOT_NS
        recent = self.recent
        if not recent or recent[-1][0] != slot:
            recent.append((slot, [0] * (len(LATENCY_BOUNDS_NS) + 1)))
        recent[-1][1][bisect_left(LATENCY_BOUNDS_NS, total)] += 1
        if executed:
            self.execution_count += 1
            sized = self.batch_sizes.get(batch)
            if sized is None:
                sized = self.batch_sizes[batch] = Duration()
            sized.count += 1
            sized.ns += compute

    def record_execution(self, batch: int, ns: int) -> None:
        """One model execution of ``batch`` rows (several requests when batched)."""
        self.execution_count += 1
        self.batch_sizes.setdefault(batch, Duration()).add(ns)

    def record_dispatch(self, reason: str) -> None:
        """Why a dynamic batch stopped at its size (queue drained, max or preferred size)."""
        self.batch_reasons[reason] = self.batch_reasons.get(reason, 0) + 1

    def record_failure(self, ns: int) -> None:
        self.fail.add(ns)
        self.last_inference_ms = time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class WindowPoint:
    """One slot of the rolling window: when it started, its throughput and latency
    percentiles (ms, None without a request), read from its latency buckets."""

    start_ms: int
    requests: int
    per_second: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None


def window(stats: VersionStats, now_ns: int | None = None) -> list[WindowPoint]:
    """The last WINDOW_SLOTS slots up to now, oldest first, empty ones included (zero
    requests): a chart of the last minutes. The current slot's rate counts only the seconds
    of it that have passed. A percentile is the upper bound of the bucket holding it."""
    now = time.time_ns() if now_ns is None else now_ns
    current = now // _SLOT_NS
    counts = {slot: list(c) for slot, c in list(stats.recent)}  # copies: read beside writers
    points = []
    for slot in range(current - WINDOW_SLOTS + 1, current + 1):
        buckets = counts.get(slot)
        total = sum(buckets) if buckets else 0
        seconds = (now - slot * _SLOT_NS) / 1e9 if slot == current else WINDOW_SLOT_S
        points.append(
            WindowPoint(
                start_ms=slot * _SLOT_NS // 1_000_000,
                requests=total,
                per_second=round(total / max(seconds, 1.0), 3),
                p50_ms=_percentile_ms(buckets, total, 0.50),
                p90_ms=_percentile_ms(buckets, total, 0.90),
                p99_ms=_percentile_ms(buckets, total, 0.99),
            )
        )
    return points


def _percentile_ms(buckets: list[int] | None, total: int, q: float) -> float | None:
    if not buckets or not total:
        return None
    wanted = q * total
    running = 0
    for index, count in enumerate(buckets):
        running += count
        if running >= wanted:
            bound = LATENCY_BOUNDS_NS[min(index, len(LATENCY_BOUNDS_NS) - 1)]
            return round(bound / 1e6, 3)
    return round(LATENCY_BOUNDS_NS[-1] / 1e6, 3)


class Statistics:
    """All version statistics of a server, keyed by (model, version)."""

    def __init__(self) -> None:
        self._by_version: dict[tuple[str, int], VersionStats] = {}

    def of(self, model: str, version: int) -> VersionStats:
        key = (model, version)
        stats = self._by_version.get(key)
        if stats is None:
            stats = self._by_version[key] = VersionStats()
        return stats

    def find(self, model: str, version: int) -> VersionStats | None:
        return self._by_version.get((model, version))

    def requests(self) -> tuple[int, int]:
        """Inference requests this process answered: (successes, failures), every version."""
        stats = list(self._by_version.values())
        return sum(s.success.count for s in stats), sum(s.fail.count for s in stats)

    def workers(self) -> list[WorkerStatus] | None:
        """Each worker process of ``server.workers`` with its own figures, or None for a
        single server (which has no breakdown: it is its one process)."""
        return None

    def custom_samples(self) -> Iterator[custom_metrics.Sample]:
        """The metrics Python models define (app/servekit/custom_metrics.py): this process's
        (every worker's, in a worker: app/servekit/workers/stats.py)."""
        return custom_metrics.samples()


WorkerState = Literal["starting", "serving", "unresponsive", "restarting", "stopping"]
"""What a worker process is doing: loading before its listeners open, serving, not answering
the supervisor's heartbeats (stopped or hung: killed and restarted if it stays so), dead and
waiting to be started again, draining at shutdown."""
WORKER_STATES: tuple[WorkerState, ...] = get_args(WorkerState)


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One worker process, as ``GET /servekit/v1/workers``, ``/metrics`` and the dashboard show
    it. The request counts are of the worker *position* (``index``) since the server started,
    the processes restarted there included, so the workers' counts add up to the totals the
    statistics answer (a worker's last counts before it died stay in both)."""

    index: int
    pid: int | None
    """The current process (None while restarting)."""
    state: WorkerState
    up_since: float | None
    """When the current process started (Unix seconds; None while restarting)."""
    restarts: int
    """How often the supervisor started this position again after its process died."""
    success: int
    failure: int
    heartbeat_age: float | None = None
    """Seconds since it last answered the supervisor's heartbeat (None: a single server, or a
    worker not watched yet -- starting or restarting)."""
