"""Statistics recorded raw and folded when read (issue 28): every figure a reader sees (Triton's
durations and batch statistics, /metrics' queue histogram, the dashboard's latency window, the
last inference time) is the one adding each request as it ended gives, whatever the mix of
batch sizes, queue times, window slots and reads in between."""

from __future__ import annotations

import random
import threading
import time
from bisect import bisect_left

from servekit.services.stats import (
    _QUEUE_BOUNDS_NS,
    FOLD_EVERY,
    LATENCY_BOUNDS_NS,
    WINDOW_SLOT_S,
    WINDOW_SLOTS,
    Duration,
    VersionStats,
    window,
)

SLOT_NS = WINDOW_SLOT_S * 1_000_000_000


class Eager:
    """The figures added request by request, as the statistics did before they were folded."""

    def __init__(self) -> None:
        self.durations = {k: Duration() for k in ("success", "queue", "input", "infer", "output")}
        self.inference_count = self.execution_count = self.last_ms = 0
        self.batch_sizes: dict[int, Duration] = {}
        self.queue_histogram = [0] * (len(_QUEUE_BOUNDS_NS) + 1)
        self.slots: dict[int, list[int]] = {}

    def add(self, batch: int, q: int, i: int, f: int, o: int, executed: bool, wall: int) -> None:
        total = q + i + f + o
        for name, ns in (("success", total), ("queue", q), ("input", i), ("infer", f)):
            self.durations[name].add(ns)
        self.durations["output"].add(o)
        self.queue_histogram[bisect_left(_QUEUE_BOUNDS_NS, q) if q else 0] += 1
        self.inference_count += batch
        self.last_ms = wall // 1_000_000
        counts = self.slots.setdefault(wall // SLOT_NS, [0] * (len(LATENCY_BOUNDS_NS) + 1))
        counts[bisect_left(LATENCY_BOUNDS_NS, total)] += 1
        if executed:
            self.execution_count += 1
            self.batch_sizes.setdefault(batch, Duration()).add(i + f + o)


def test_folded_figures_equal_the_eager_ones() -> None:
    rng = random.Random(7)
    offset = time.time_ns() - time.perf_counter_ns()
    first_slot = time.time_ns() // SLOT_NS
    stats, eager = VersionStats(), Eager()
    wall = first_slot * SLOT_NS + SLOT_NS // 2
    for step in range(3 * FOLD_EVERY + 37):
        wall += rng.randrange(10**6, 2 * 10**7)  # requests end in order, 1-20 ms apart
        if rng.random() < 0.02:
            wall += rng.randrange(5 * 10**9, 25 * 10**9)  # later window slots, some skipped
        if not 10**6 < wall % SLOT_NS < SLOT_NS - 10**6:  # the clocks differ by microseconds:
            wall += 3 * 10**6  # no request within a millisecond of a slot's edge
        batch = rng.choice((1, 1, 1, 4, 8))
        queue_ns = rng.choice((0, 0, rng.randrange(1, 3 * 10**9)))
        sizes = rng.randrange(1, 10**4), rng.randrange(1, 10**8), rng.randrange(0, 10**5)
        executed = rng.random() < 0.7
        stats.record_success(batch, queue_ns, *sizes, executed, wall - offset)
        eager.add(batch, queue_ns, *sizes, executed, wall)
        if step % 97 == 0:  # a reader in between: folds what is pending so far
            assert stats.success.count == step + 1
    got = {
        "success": stats.success,
        "queue": stats.queue,
        "input": stats.compute_input,
        "infer": stats.compute_infer,
        "output": stats.compute_output,
    }
    slot = wall // SLOT_NS
    assert got == eager.durations
    assert stats.inference_count == eager.inference_count
    assert stats.execution_count == eager.execution_count
    assert stats.batch_sizes == eager.batch_sizes
    assert stats.queue_histogram == eager.queue_histogram
    assert abs(stats.last_inference_ms - eager.last_ms) <= 2  # two clocks, read microseconds apart
    kept = dict(stats.recent)
    assert kept == dict(sorted(eager.slots.items())[-WINDOW_SLOTS:])  # the last slots used
    points = window(stats, slot * SLOT_NS + SLOT_NS - 1)
    assert sum(p.requests for p in points) == sum(sum(eager.slots.get(s, [])) for s in kept)


def test_a_failure_after_pending_successes_is_the_last_inference() -> None:
    stats = VersionStats()
    long_ago = time.perf_counter_ns() - 60 * 10**9
    stats.record_success(1, 0, 1, 1, 1, True, long_ago)
    before = time.time_ns() // 1_000_000
    stats.record_failure(5)
    assert stats.last_inference_ms >= before
    assert (stats.success.count, stats.fail.count) == (1, 1)


def test_records_from_threads_while_read_all_count() -> None:
    stats = VersionStats()
    per_thread = 5 * FOLD_EVERY + 3

    def record() -> None:
        for _ in range(per_thread):
            stats.record_success(1, 0, 1, 2, 3)

    threads = [threading.Thread(target=record) for _ in range(3)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        assert stats.success.count <= 3 * per_thread  # reads fold beside the writers
    for thread in threads:
        thread.join()
    assert stats.success.count == stats.compute_infer.count == 3 * per_thread
    assert stats.success.ns == 6 * 3 * per_thread
    assert stats.batch_sizes[1].count == stats.execution_count == 3 * per_thread
