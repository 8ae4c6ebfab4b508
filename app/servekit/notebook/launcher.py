"""Run a ServeKit in a background thread with its own event loop.

A Jupyter kernel already runs an asyncio loop on its main thread, so ``asyncio.run`` (what
KServe's ``start()`` does) fails inside a cell. The server gets a thread and a fresh loop of its
own instead; the notebook talks to it through ``run`` (a coroutine handed to that loop) and
``stop``, which closes the listeners, releases the models, shuts the loop's worker threads down
and joins the thread, so nothing is left behind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from servekit.config.compiler import ServePlan
from servekit.listen import Addresses
from servekit.notebook.progress import DownloadDisplay
from servekit.results import DownloadStatus
from servekit.server import ServeKit

log = logging.getLogger("servekit.notebook")

T = TypeVar("T")

_numbers = itertools.count(1)
PROGRESS_POLL_S = 1.0
"""How often a waiting ``start`` looks at the server's downloads."""


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when available (as ``servekit serve`` uses), else the default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class ServerThread:
    """One ServeKit on one daemon thread; ``start`` blocks until it serves or has failed."""

    def __init__(self, plan: ServePlan) -> None:
        self.plan = plan
        self.servekit: ServeKit | None = None
        self.addresses: Addresses | None = None
        self._loop = _new_loop()
        self._ready: concurrent.futures.Future[Addresses] = concurrent.futures.Future()
        self._stop: asyncio.Event | None = None
        self._main: asyncio.Task[None] | None = None
        self._grace = 5.0
        self._thread = threading.Thread(
            target=self._run, name=f"servekit-notebook-{next(_numbers)}", daemon=True
        )

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self, timeout: float, display: DownloadDisplay | None = None) -> Addresses:
        """Start serving; return the bound addresses once every start-up model has loaded.
        Meanwhile remote models' downloads are shown (``display``: Jupyter's output or
        stderr, see app/servekit/notebook/progress.py)."""
        self._thread.start()
        display = display or DownloadDisplay()
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    self.addresses = self._ready.result(max(min(left, PROGRESS_POLL_S), 0.0))
                    break
                except concurrent.futures.TimeoutError:
                    if left <= PROGRESS_POLL_S:
                        raise
                    display.show(self._downloads())
        except concurrent.futures.TimeoutError:
            self.stop(grace=0.0)
            raise TimeoutError(f"servekit did not start within {timeout} s") from None
        except BaseException:
            self._join(30.0)
            raise
        finally:
            display.close()
        return self.addresses

    def _downloads(self) -> list[DownloadStatus]:
        """Remote models being fetched by the starting server (none before it exists)."""
        servekit = self.servekit
        return servekit.control.downloads() if servekit is not None else []

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 60.0) -> T:
        """Run ``coro`` on the server's loop and wait (bounded) for its result."""
        if not self._thread.is_alive() or self._loop.is_closed():
            coro.close()
            raise RuntimeError("the server is not running")
        if threading.current_thread() is self._thread:
            coro.close()  # waiting here would block the very loop that must run it
            raise RuntimeError("a model cannot call its own server's handle from inside a request")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer from the server within {timeout} s") from None

    def stop(self, grace: float = 5.0, timeout: float = 30.0) -> None:
        """Stop the server (in-flight requests get ``grace`` seconds) and join the thread."""
        # uvicorn treats a graceful-shutdown timeout below 1 s as 0 and logs an error even with
        # no connection open; the grace is only an upper bound, so 1 s costs nothing when idle.
        self._grace = max(grace, 1.0)
        with contextlib.suppress(RuntimeError):  # loop already closed: nothing to stop
            self._loop.call_soon_threadsafe(self._request_stop)
        self._join(timeout)

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        elif self._main is not None:  # still starting: abandon the start-up
            self._main.cancel()

    def _join(self, timeout: float) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("servekit thread %s did not stop in %s s", self._thread.name, timeout)

    # -- on the server thread --------------------------------------------------------------
    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            self._main = loop.create_task(self._serve())
            loop.run_until_complete(self._main)
        except BaseException as exc:  # start-up cancelled or failed: report it to the caller
            if not self._ready.done():
                self._ready.set_exception(exc)
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
                # Threads of asyncio.to_thread (model loading) belong to this loop: join them.
                loop.run_until_complete(loop.shutdown_default_executor())
            asyncio.set_event_loop(None)
            loop.close()

    async def _serve(self) -> None:
        if self.plan.server.workers != 1:  # worker processes are `servekit serve`'s
            log.warning(
                "server.workers is %s: a notebook serves from one process, in this kernel "
                "(run `servekit serve` for several workers)",
                self.plan.server.workers,
            )
        servekit = ServeKit(self.plan)
        self.servekit = servekit
        try:
            addresses = await servekit.start(wait_for_models=True)
        except BaseException:
            with contextlib.suppress(Exception):
                await servekit.stop(grace=1.0)
            raise
        self._stop = asyncio.Event()
        self._ready.set_result(addresses)
        try:
            await self._stop.wait()
        finally:
            await servekit.stop(grace=self._grace)
