"""Running asyncio client code from synchronous tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def run_in_own_loop(factory: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    """Run ``factory()`` on a fresh event loop in a worker thread, bounded by ``timeout``.

    The test process's main thread may already be running a loop (Playwright's sync API leaves
    one), where ``asyncio.run`` refuses to start; the coroutine is created inside the worker so
    it is never left un-awaited.
    """
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(lambda: asyncio.run(asyncio.wait_for(factory(), timeout)))
        return future.result(timeout + 10)
