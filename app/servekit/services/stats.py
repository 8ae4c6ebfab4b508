"""Per model-version inference statistics, in the shape of Triton's statistics extension.

Durations are cumulative nanoseconds. The dataplane records; the REST and gRPC statistics
endpoints, the dashboard and /metrics read. One source of truth for all of them.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import add, sub
from typing import Literal, get_args

from servekit.observability import custom_metrics

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


FOLD_EVERY = 256
"""Successful requests kept raw before they are folded into the figures (a reader folds
what is pending at once): bounds the memory a busy version holds between reads."""

_Pending = tuple[int, int, int, int, int, int, bool]
"""A successful request as recorded: (batch, queue ns, then four ``time.perf_counter_ns``
clocks: started, inputs checked, model done, ended; executed here). Compute input is the
second minus the first, and so on; the request's latency is its queue time plus the last
minus the first."""


class VersionStats:
    """Statistics of one model version (Triton's ModelStatistics).

    A successful request is recorded as one tuple appended to a list (``record_success``:
    runs for every request, so it does no more than that); the durations, histograms, the
    rolling window and the last inference time are worked out from those tuples when a reader
    asks for any of them (each figure is a property that folds what is pending first), or
    every ``FOLD_EVERY`` requests. Readers see the same figures as if every request had been
    added as it ended: the end is kept with each request (a monotonic clock read the caller
    already has) and turned into wall-clock time at the fold.
    """

    __slots__ = (
        "_batch_sizes",
        "_compute_infer",
        "_compute_input",
        "_compute_output",
        "_execution_count",
        "_inference_count",
        "_last_inference_ms",
        "_lock",
        "_pending",
        "_queue",
        "_queue_histogram",
        "_recent",
        "_success",
        "batch_reasons",
        "fail",
        "shadow",
    )

    def __init__(self) -> None:
        self._pending: list[_Pending] = []
        self._lock = threading.Lock()
        """Held by a fold (readers may be in other threads); recording never takes it."""
        self._success = Duration()
        self.fail = Duration()
        self._queue = Duration()
        self._compute_input = Duration()
        self._compute_infer = Duration()
        self._compute_output = Duration()
        self._inference_count = 0
        self._execution_count = 0
        self._last_inference_ms = 0
        self._batch_sizes: dict[int, Duration] = {}
        self._queue_histogram = [0] * (len(QUEUE_BUCKETS_S) + 1)
        self.batch_reasons: dict[str, int] = {}
        """Why dynamic batches stopped where they did (by reason: see
        app/servekit/services/execution/batching.py)."""
        self.shadow: dict[str, int] = {}
        """This version as a shadow (serve.yaml ``shadow``): its copies of other versions'
        requests by outcome, ``agreed``, ``disagreed``, ``failed``, ``dropped`` (queue full)
        (app/servekit/services/traffic.py)."""
        self._recent: deque[tuple[int, list[int]]] = deque(maxlen=WINDOW_SLOTS)

    # -- the figures (each folds what is pending first) ---------------------------------------
    @property
    def success(self) -> Duration:
        if self._pending:
            self._fold()
        return self._success

    @property
    def queue(self) -> Duration:
        if self._pending:
            self._fold()
        return self._queue

    @property
    def compute_input(self) -> Duration:
        if self._pending:
            self._fold()
        return self._compute_input

    @property
    def compute_infer(self) -> Duration:
        if self._pending:
            self._fold()
        return self._compute_infer

    @property
    def compute_output(self) -> Duration:
        if self._pending:
            self._fold()
        return self._compute_output

    @property
    def inference_count(self) -> int:
        if self._pending:
            self._fold()
        return self._inference_count

    @inference_count.setter
    def inference_count(self, value: int) -> None:
        self._fold()
        self._inference_count = value

    @property
    def execution_count(self) -> int:
        if self._pending:
            self._fold()
        return self._execution_count

    @execution_count.setter
    def execution_count(self, value: int) -> None:
        self._fold()
        self._execution_count = value

    @property
    def last_inference_ms(self) -> int:
        if self._pending:
            self._fold()
        return self._last_inference_ms

    @last_inference_ms.setter
    def last_inference_ms(self, value: int) -> None:
        self._fold()
        self._last_inference_ms = value

    @property
    def batch_sizes(self) -> dict[int, Duration]:
        """Executions by batch size (rows): Triton's batch_stats, and /metrics' batch
        histogram."""
        if self._pending:
            self._fold()
        return self._batch_sizes

    @property
    def queue_histogram(self) -> list[int]:
        """Successful requests by queue time, per bucket of QUEUE_BUCKETS_S (last: beyond)."""
        if self._pending:
            self._fold()
        return self._queue_histogram

    @property
    def recent(self) -> deque[tuple[int, list[int]]]:
        """The rolling window: (slot number, successful requests by latency bucket of
        LATENCY_BOUNDS_NS, the last one beyond) for each of the last WINDOW_SLOTS slots that
        saw a request. The model page reads throughput and p50/p90/p99 over the last minutes
        from it."""
        if self._pending:
            self._fold()
        return self._recent

    # -- recording ----------------------------------------------------------------------------
    def record_success(
        self,
        batch: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        executed: bool = True,
        ended: int | None = None,
    ) -> None:
        """One successful request of ``batch`` inferences (rows of a batching model, else 1);
        ``executed`` is False when the executor counted the model run (worker threads);
        ``ended``: the request's end (``time.perf_counter_ns()``; read here if not given).
        ``record_clocks`` records the same from the caller's clocks with no arithmetic."""
        end = time.perf_counter_ns() if ended is None else ended
        infer_from = end - output_ns
        input_from = infer_from - infer_ns
        started = input_from - input_ns
        self.record_clocks(batch, queue_ns, started, input_from, infer_from, end, executed)

    def record_clocks(
        self,
        batch: int,
        queue_ns: int,
        started: int,
        input_done: int,
        infer_done: int,
        ended: int,
        executed: bool = True,
    ) -> None:
        """One successful request, by its clocks (``time.perf_counter_ns``): started, inputs
        checked, model done, ended (a request that waited ``queue_ns`` in the model's queue:
        the clocks without that wait, as ``record_success`` makes them); see
        ``record_success``.

        Runs for every request: one tuple appended, folded later (see the class)."""
        pending = self._pending
        pending.append((batch, queue_ns, started, input_done, infer_done, ended, executed))
        if len(pending) >= FOLD_EVERY:
            self._fold()

    def record_execution(self, batch: int, ns: int) -> None:
        """One model execution of ``batch`` rows (several requests when batched)."""
        with self._lock:
            self._execution_count += 1
            self._batch_sizes.setdefault(batch, Duration()).add(ns)

    def record_dispatch(self, reason: str) -> None:
        """Why a dynamic batch stopped at its size (queue drained, max or preferred size)."""
        self.batch_reasons[reason] = self.batch_reasons.get(reason, 0) + 1

    def record_failure(self, ns: int) -> None:
        self._fold()  # the successes before it: the last inference is this one
        self.fail.add(ns)
        self._last_inference_ms = time.time_ns() // 1_000_000

    def _fold(self) -> None:
        """Add the pending successes to the figures: a few C calls over whole columns (sums,
        counts, one sort per histogram), not a loop per request, for the usual fold (requests
        of one batch size, all executed here or none, all in one slot of the window)."""
        with self._lock:
            pending = self._pending
            n = len(pending)
            if not n:
                return
            rows = pending[:n]
            del pending[:n]  # a request recorded meanwhile (another thread) stays pending
            offset = time.time_ns() - time.perf_counter_ns()
            columns = zip(*rows, strict=True)
            batches, queues, starts, inputs_done, infers_done, ends, executed = columns
            # Sums of differences are differences of sums: no subtraction per request.
            started, input_done = sum(starts), sum(inputs_done)
            infer_done, ended = sum(infers_done), sum(ends)
            queued = sum(queues)
            self._success.count += n
            self._success.ns += queued + ended - started
            for duration, ns in (
                (self._queue, queued),
                (self._compute_input, input_done - started),
                (self._compute_infer, infer_done - input_done),
                (self._compute_output, ended - infer_done),
            ):
                duration.count += n
                duration.ns += ns
            self._inference_count += sum(batches)
            if not queued:
                self._queue_histogram[0] += n
            else:
                _add_to_buckets(self._queue_histogram, _QUEUE_BOUNDS_NS, queues)
            ran = executed.count(True)
            if ran:
                self._execution_count += ran
                sizes = self._batch_sizes
                if ran == n and batches.count(batches[0]) == n:
                    sized = sizes.get(batches[0])
                    if sized is None:
                        sized = sizes[batches[0]] = Duration()
                    sized.count += n
                    sized.ns += ended - started  # compute: input, infer, output
                else:
                    for batch, ran_here, first, last in zip(
                        batches, executed, starts, ends, strict=True
                    ):
                        if ran_here:
                            sizes.setdefault(batch, Duration()).add(last - first)
            latest = max(ends) + offset
            self._last_inference_ms = latest // 1_000_000
            totals = list(map(sub, ends, starts))
            if queued:
                totals = list(map(add, totals, queues))
            slot = latest // _SLOT_NS
            if (min(ends) + offset) // _SLOT_NS == slot:  # all in one slot: the usual fold
                _add_to_buckets(self._slot(slot), LATENCY_BOUNDS_NS, totals)
            else:
                for end, total in zip(ends, totals, strict=True):
                    counts = self._slot((end + offset) // _SLOT_NS)
                    counts[bisect_left(LATENCY_BOUNDS_NS, total)] += 1

    def _slot(self, slot: int) -> list[int]:
        """The latency buckets of window slot ``slot``, started if new (an older slot than
        the newest kept is looked up: requests folded out of order)."""
        recent = self._recent
        if not recent or recent[-1][0] < slot:
            recent.append((slot, [0] * (len(LATENCY_BOUNDS_NS) + 1)))
            return recent[-1][1]
        for number, counts in reversed(recent):
            if number == slot:
                return counts
            if number < slot:
                break
        counts = [0] * (len(LATENCY_BOUNDS_NS) + 1)
        if len(recent) < WINDOW_SLOTS:  # else older than the whole window: not shown anyway
            position = sum(1 for number, _ in recent if number < slot)
            recent.insert(position, (slot, counts))
        return counts


def _add_to_buckets(counts: list[int], bounds: tuple[int, ...], values: Sequence[int]) -> None:
    """Count ``values`` into ``counts``, the buckets of ``bounds`` (a value goes to the first
    bound at or above it, ``bisect_left``; the last bucket: beyond). One sort, then one
    bisect per bucket the values span (usually a few), not one per value."""
    ordered = sorted(values)
    low = bisect_left(bounds, ordered[0])
    high = bisect_left(bounds, ordered[-1])
    start = 0
    for bucket in range(low, high):
        end = bisect_right(ordered, bounds[bucket], start)
        counts[bucket] += end - start
        start = end
    counts[high] += len(ordered) - start


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

    def others_load(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(pending, inflight) requests per (model, version) in the other worker processes of
        ``server.workers`` as last fetched; none for a single server."""
        return {}

    def custom_samples(self) -> Iterator[custom_metrics.Sample]:
        """The metrics Python models define (app/servekit/observability/custom_metrics.py): this
        process's (every worker's, in a worker: app/servekit/workers/stats.py)."""
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
