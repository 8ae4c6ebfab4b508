"""The rolling window behind the model page's latency chart (issue 27): requests counted per
10 s slot, p50/p90/p99 read from buckets 25% wide, the last five minutes and nothing older."""

from __future__ import annotations

import time

import numpy as np

from servekit.services.stats import WINDOW_SLOT_S, WINDOW_SLOTS, VersionStats, window


def _record(stats: VersionStats, latencies_ms: list[float]) -> None:
    for ms in latencies_ms:
        stats.record_success(1, 0, 0, round(ms * 1e6), 0)


def test_percentiles_are_within_a_bucket_of_the_truth() -> None:
    stats = VersionStats()
    latencies = list(np.random.default_rng(1).lognormal(0.0, 1.0, 2000))
    _record(stats, latencies)
    points = window(stats, time.time_ns())
    assert len(points) == WINDOW_SLOTS
    busy = [p for p in points if p.requests]
    assert sum(p.requests for p in busy) == 2000 and 1 <= len(busy) <= 2  # a slot edge
    if len(busy) == 1:
        (point,) = busy
        for q, got in ((50, point.p50_ms), (90, point.p90_ms), (99, point.p99_ms)):
            truth = float(np.percentile(latencies, q))
            assert got is not None and truth * 0.99 <= got <= truth * 1.26, (q, truth, got)
    quiet = [p for p in points if not p.requests]
    assert all(p.p50_ms is None and p.per_second == 0 for p in quiet)
    assert [p.start_ms for p in points] == sorted(p.start_ms for p in points)


def test_old_slots_leave_the_window() -> None:
    stats = VersionStats()
    _record(stats, [1.0] * 10)
    later = time.time_ns() + (WINDOW_SLOTS + 1) * WINDOW_SLOT_S * 1_000_000_000
    assert all(p.requests == 0 for p in window(stats, later))
    assert sum(p.requests for p in window(stats)) == 10
    assert stats.recent.maxlen == WINDOW_SLOTS  # never more kept than the window shows
