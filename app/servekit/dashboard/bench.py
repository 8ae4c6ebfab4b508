"""``POST /dashboard/api/models/{name}/benchmark``: the model page's Benchmark button.

The server benchmarks itself the way ``server.benchmark`` does from a notebook
(app/servekit/client/bench.py): client threads in this process drive the model over its own
HTTP and gRPC listeners with generated inputs, so every request takes the real path (codec,
access check, batching). It costs the server real work, so:

* it belongs to the admin group (its token, and nothing else: not also the metadata token,
  which a single ``Authorization`` header could not carry beside it when the two differ), is
  closed with that group on a public bind without one, and is a control route (same-site
  browser requests or non-browser clients only);
* one runs at a time per process; another request meanwhile is answered 409;
* what a request may ask is bounded (``MAX_SECONDS`` per step, ``MAX_LEVELS`` concurrency
  levels of at most ``MAX_CONCURRENCY``), and each step's length is a hard deadline: requests
  still in flight when it ends are abandoned, so a slow model cannot stretch the run;
* it stops when its client leaves: the edge cancels the waiting handler when the connection
  is lost (app/servekit/http/client_left.py), which sets the run's stop event; the lock is freed
  only once the client threads have ended, so a next run never overlaps a leaving one.

The client threads send the server's own tokens.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from litestar import Request, Response, post
from litestar.params import FromPath

from servekit.config.auth import ApiGroup
from servekit.dashboard.routes import NO_STORE, SECURITY
from servekit.errors import AlreadyExists, InvalidArgument
from servekit.http.client_left import unless_client_leaves
from servekit.rest.access import cross_site_guard
from servekit.rest.inject import Catalog, Dataplane
from servekit.services import Catalog as CatalogService
from servekit.services import DataPlane

if TYPE_CHECKING:
    from servekit.client.bench import BenchmarkTable
    from servekit.client.remote import RemoteServer

MAX_SECONDS = 10.0
MAX_CONCURRENCY = 64
MAX_LEVELS = 4
_running = threading.Lock()  # per process: servers in one process share the cores


def _self_client(dataplane: DataPlane, catalog: CatalogService) -> RemoteServer:
    """A client of this very server, sending the server's own token of each group."""
    from servekit.client.remote import RemoteServer

    tokens = {g: t.decode("ascii") for g, t in dataplane.access.tokens.items()}

    class SelfClient(RemoteServer):
        def _token_for(self, group: ApiGroup) -> str | None:
            return tokens.get(group)

    listening = catalog.ports()
    tls = dataplane.plan.tls
    return SelfClient(
        listening.http_url,
        # gRPC over TLS would need the pinned context in a channel: HTTP alone then.
        grpc_target=listening.grpc_target if tls is None else None,
        timeout=60.0,
        ssl_context=tls.pinned_client_context() if tls is not None else None,
    )


def _bounded(data: Any) -> tuple[float, tuple[int, ...]]:
    if not isinstance(data, dict):
        raise InvalidArgument('expected {"seconds": number, "concurrency": [numbers]}')
    seconds = data.get("seconds", 2.0)
    levels = data.get("concurrency", [1, 8])
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        raise InvalidArgument("seconds: a number")
    if not 0 < seconds <= MAX_SECONDS:
        raise InvalidArgument(f"seconds: more than 0, at most {MAX_SECONDS:g}")
    if (
        not isinstance(levels, list)
        or not 0 < len(levels) <= MAX_LEVELS
        or not all(isinstance(c, int) and not isinstance(c, bool) for c in levels)
        or not all(1 <= c <= MAX_CONCURRENCY for c in levels)
    ):
        raise InvalidArgument(
            f"concurrency: a list of 1 to {MAX_LEVELS} numbers from 1 to {MAX_CONCURRENCY}"
        )
    return float(seconds), tuple(levels)


def _run(
    dataplane: DataPlane,
    catalog: CatalogService,
    name: str,
    seconds: float,
    levels: tuple[int, ...],
    stop: threading.Event,
) -> BenchmarkTable:
    # Imported on use: only the Benchmark button needs the client.
    from servekit.client.bench import run_benchmark

    client = _self_client(dataplane, catalog)
    try:
        return run_benchmark(client, name, levels, seconds, progress=False, stop=stop)
    finally:
        client.close()


@post(
    "/dashboard/api/models/{name:str}/benchmark",
    include_in_schema=False,
    middleware=SECURITY,
    guards=[cross_site_guard],
    opt={"api_group": ApiGroup.ADMIN},
    status_code=200,
)
async def benchmark(
    dataplane: Dataplane, catalog: Catalog, request: Request[Any, Any, Any], name: FromPath[str]
) -> Response[dict[str, Any]]:
    # The admin group's check (the application guard) is the whole access rule; checking it
    # again here keeps the route closed even if it lost its ``opt``.
    client = request.client.host if request.client else "unknown"
    dataplane.access.check(ApiGroup.ADMIN, request.headers.get("authorization"), client)
    seconds, levels = _bounded(await request.json())
    if not _running.acquire(blocking=False):
        raise AlreadyExists(
            "a benchmark is already running on this server: wait for it to finish (at most "
            f"{MAX_LEVELS * 2 * MAX_SECONDS:g} s) and try again"
        )
    stop = threading.Event()
    try:
        job = asyncio.get_running_loop().run_in_executor(
            None, _run, dataplane, catalog, name, seconds, levels, stop
        )
    except BaseException:
        _running.release()
        raise
    job.add_done_callback(lambda _: _running.release())  # once its threads have ended
    try:
        # The edge cancels this wait when the client's connection is lost (ClientLeft).
        table = await unless_client_leaves(request.scope, asyncio.shield(job))
    finally:
        stop.set()  # nothing left to do when it ended; else its client left: stop it now
    return Response({"model": name, "rows": table.to_list()}, headers=NO_STORE)


HANDLERS = [benchmark]
