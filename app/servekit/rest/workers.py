"""``GET /servekit/v1/workers``: each worker process and its share of the work, read-only.

With ``server.workers`` above 1 an operator wants to see a sick or starved worker: which
positions serve, since when, how often each was restarted, how many inference requests each
answered (from the statistics the workers keep anyway: nothing is counted per request for this).
Whichever worker answers, it reports them all (fetched through the supervisor right before, as
for the statistics extension). A single server answers one entry, its own process.

Every position is listed whatever its state (``starting``, ``serving``, ``unresponsive`` -- it
stopped answering the supervisor's heartbeats --, ``restarting``, ``stopping``), with how long
ago it last answered one, so a stopped or hung worker shows up here before it is restarted
(docs/server.md, "Workers: heartbeats and restarts").

Answer: ``{"workers": [{"index": 0, "pid": 4242, "state": "serving", "upSince":
"2026-11-24T10:00:00Z", "restarts": 0, "inferenceSuccess": 10, "inferenceFailure": 1,
"heartbeatAgeSeconds": 0.4}]}``; the counts of a position include its processes that died (up
to their last statistics read), so they add up to the statistics extension's totals. Process
ids, restart counts and request counts are operational data: the route is in the ``admin``
group, like ``/metrics`` and the statistics; it carries no path, command line or setting.
"""

from __future__ import annotations

import datetime as dt

from litestar import get

from servekit.config.auth import ApiGroup
from servekit.rest.access import group_opt
from servekit.rest.inject import Catalog
from servekit.rest.openapi import Worker, Workers, failures
from servekit.services import WorkerStatus


@get(
    "/servekit/v1/workers",
    opt=group_opt(ApiGroup.ADMIN),
    sync_to_thread=False,
    responses=failures(ApiGroup.ADMIN),
)
def workers(catalog: Catalog) -> Workers:
    """Each worker process: index, pid, state, start time, restarts, requests answered, and
    seconds since it last answered the supervisor's heartbeat."""
    return {"workers": [_worker(status) for status in catalog.workers()]}


def _worker(status: WorkerStatus) -> Worker:
    return {
        "index": status.index,
        "pid": status.pid,
        "state": status.state,
        "upSince": _iso(status.up_since),
        "restarts": status.restarts,
        "inferenceSuccess": status.success,
        "inferenceFailure": status.failure,
        "heartbeatAgeSeconds": status.heartbeat_age,
    }


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    when = dt.datetime.fromtimestamp(seconds, dt.UTC).replace(microsecond=0)
    return when.isoformat().replace("+00:00", "Z")


ROUTES = [workers]
