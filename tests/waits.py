"""Bounded waits on conditions: what tests use instead of sleeping "long enough".

A sleep guesses how long something takes and is either too short on a loaded machine (a flaky
test) or too long everywhere (a slow one). These poll the condition itself and fail, naming
what they waited for, when the deadline passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.01


def wait_until(
    condition: Callable[[], object], timeout: float = 20.0, what: str = "the condition"
) -> None:
    """Poll ``condition`` until it is true; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_S)


async def async_wait_until(
    condition: Callable[[], object], timeout: float = 10.0, what: str = "the condition"
) -> None:
    """``wait_until`` inside an event loop: yields to the loop between polls."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(POLL_S)
