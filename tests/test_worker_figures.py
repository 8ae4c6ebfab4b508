"""The per-worker figures, in process: how a worker's counts, the counts of its positions' dead
processes and its own local counts make both the totals and each worker's share, so that the
shares always add up to the totals (tests/test_workers.py checks the same through real
processes); and the one entry a single server answers for itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from fakes import Sum, python_model, request, rows
from inprocess import Serve

from servekit.errors import InvalidArgument
from servekit.services.stats import Statistics, VersionStats
from servekit.workers.stats import (
    ClusterStatistics,
    SlotReport,
    Snapshot,
    add_json,
    merge,
    requests_of,
    stats_to_json,
)
from servekit.workers.supervisor import _Slot

pytestmark = pytest.mark.anyio


def snapshot(**counts: tuple[int, int]) -> Snapshot:
    """A worker's snapshot: ``model=(successes, failures)`` of version 1 each."""
    out = []
    for model, (ok, failed) in counts.items():
        stats = VersionStats()
        for _ in range(ok):
            stats.record_success(1, 10, 20, 30, 40)
        for _ in range(failed):
            stats.record_failure(50)
        out.append({"model": model, "version": 1, "stats": stats_to_json(stats)})
    return out


def slot(index: int, current: Snapshot | None, retired: Snapshot | None = None) -> SlotReport:
    return {
        "index": index,
        "pid": 100 + index,
        "state": "serving",
        "since": 1_700_000_000.0,
        "restarts": 1 if retired else 0,
        "retired": retired or [],
        "current": current,
    }


def test_merge_adds_counts_and_durations_per_version() -> None:
    merged = merge([snapshot(a=(2, 1)), snapshot(a=(3, 0), b=(1, 4)), []])
    by_model = {row["model"]: row["stats"] for row in merged}
    assert by_model["a"]["success"] == [5, 5 * 100]
    assert by_model["a"]["fail"] == [1, 50]
    assert by_model["a"]["inference_count"] == 5
    assert by_model["b"]["fail"] == [4, 200]
    assert requests_of(merged) == (6, 5)
    assert requests_of(None) == (0, 0)
    assert merge([]) == []


def test_shares_add_up_to_the_totals_and_a_worker_reads_its_own_counts_locally() -> None:
    mine = ClusterStatistics(index=1)
    for _ in range(7):
        mine.of("a", 1).record_success(1, 0, 1, 1, 1)
    mine.of("b", 1).record_failure(5)
    reports = [
        slot(0, snapshot(a=(4, 1)), retired=snapshot(a=(10, 0), b=(2, 2))),
        # The supervisor's copy of this worker's counts is older than its own: never used.
        slot(1, snapshot(a=(1, 0)), retired=snapshot(b=(3, 0))),
        slot(2, None),  # restarting, never read: its share is what its dead processes left
    ]
    reports[2].update(pid=None, since=None, state="restarting", retired=snapshot(a=(5, 5)))
    mine.set_cluster(reports)
    shares = {w.index: w for w in mine.workers() or []}
    assert (shares[0].success, shares[0].failure) == (4 + 10 + 2, 1 + 2)
    assert (shares[1].success, shares[1].failure) == (7 + 3, 1)
    assert (shares[2].success, shares[2].failure) == (5, 5)
    assert shares[2].pid is None and shares[2].up_since is None
    assert shares[2].state == "restarting" and shares[0].restarts == 1
    totals = [mine.find(model, 1) for model in ("a", "b")]
    assert sum(t.success.count for t in totals if t) == sum(w.success for w in shares.values())
    assert sum(t.fail.count for t in totals if t) == sum(w.failure for w in shares.values())


def test_no_breakdown_before_the_first_fetch_nor_in_a_single_server() -> None:
    assert ClusterStatistics(index=0).workers() is None
    single = Statistics()
    single.of("a", 1).record_failure(1)
    single.of("a", 2).record_success(1, 0, 0, 0, 0)
    assert single.workers() is None
    assert single.requests() == (1, 1)


def test_an_unknown_worker_state_is_refused() -> None:
    stats = ClusterStatistics(index=0)
    stats.set_cluster([{**slot(0, []), "state": "zombie"}])
    with pytest.raises(ValueError, match="zombie"):
        stats.workers()


def test_a_slot_reports_no_process_while_restarting() -> None:
    position = _Slot(3, state="restarting", since=1.0, restarts=2)
    report = position.report(now=100.0)
    assert report["pid"] is None and report["since"] is None
    assert report["heartbeat_age"] is None
    assert (report["index"], report["state"], report["restarts"]) == (3, "restarting", 2)


def test_a_silent_slot_is_listed_with_its_heartbeat_age() -> None:
    """An unresponsive worker stays in the list, with how long it has been silent."""
    position = _Slot(1, state="unresponsive", since=1.0, beat=96.5)
    report = position.report(now=100.0)
    assert (report["state"], report["heartbeat_age"]) == ("unresponsive", 3.5)
    stats = ClusterStatistics(index=0)
    stats.set_cluster([slot(0, []), report])
    found = stats.workers()
    assert found is not None
    assert [(w.index, w.state, w.heartbeat_age) for w in found] == [
        (0, "serving", None),
        (1, "unresponsive", 3.5),
    ]


async def test_a_single_server_answers_itself(serve: Serve, tmp_path: Path) -> None:
    services = await serve()
    await services.control.add(python_model("sum"), Sum())
    ones = rows(2)
    for _ in range(3):
        await services.dataplane.infer(request("sum", a=ones, b=ones))
    with pytest.raises(InvalidArgument):
        await services.dataplane.infer(request("sum", a=ones))
    (me,) = services.catalog.workers()
    assert (me.index, me.pid, me.state, me.restarts) == (0, os.getpid(), "serving", 0)
    assert (me.success, me.failure) == (3, 1)
    # The HTTP route, through the ASGI application (no socket): the same entry, as JSON.
    app = services.kit.http_app()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answer = await client.get("/servekit/v1/workers")
    assert answer.status_code == 200, answer.text
    (row,) = answer.json()["workers"]
    assert row["pid"] == os.getpid() and row["state"] == "serving"
    assert (row["inferenceSuccess"], row["inferenceFailure"]) == (3, 1)
    assert row["upSince"].endswith("Z") and row["restarts"] == 0 and row["index"] == 0


def test_queue_and_batch_figures_cross_workers_whole() -> None:
    """The executor's queue-time histogram and batch-dispatch reasons travel in a snapshot and
    add up across workers like the counts (the /metrics series of a several-worker server)."""
    one, two = VersionStats(), VersionStats()
    one.record_success(1, 10, 20, 30, 40)
    two.record_success(1, 10**9, 20, 30, 40)  # a second in the queue: a later bucket
    one.record_dispatch("max_batch_size")
    two.record_dispatch("max_batch_size")
    two.record_dispatch("queue_drained")
    (row,) = merge([[{"model": "m", "version": 1, "stats": stats_to_json(s)}] for s in (one, two)])
    total = VersionStats()
    add_json(total, row["stats"])
    assert sum(total.queue_histogram) == 2
    assert total.queue_histogram != one.queue_histogram
    assert total.batch_reasons == {"max_batch_size": 2, "queue_drained": 1}
