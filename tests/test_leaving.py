"""app/servekit/http/client_left.py on its own: the mark an HTTP inference request leaves for
the edge.

The end-to-end behaviour (queued requests of closed sockets never run, on every HTTP surface) is
tests/test_executor_e2e.py; here, what a socket cannot show: the mark is cleared however the wait
ends, and only the edge's cancel becomes ClientLeft.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from loops import run_in_own_loop

from servekit.http.client_left import WAITING, ClientLeft, unless_client_leaves


async def _fails() -> None:
    raise ValueError("the model failed")


def test_a_failure_clears_the_mark() -> None:
    scope: dict[str, Any] = {}

    async def scenario() -> None:
        with pytest.raises(ValueError, match="the model failed"):
            await unless_client_leaves(scope, _fails())  # type: ignore[arg-type]

    run_in_own_loop(scenario)
    assert scope[WAITING] is None


def _cancelled_while_waiting(by_edge: bool, also_elsewhere: bool = False) -> BaseException:
    """What a waiting request's task ends with when cancelled: as the edge does it (clear the
    mark, then cancel), or by someone else."""
    scope: dict[str, Any] = {}

    async def scenario() -> BaseException:
        started = asyncio.Event()

        async def waits() -> None:
            started.set()
            await asyncio.Event().wait()

        async def handler() -> None:
            await unless_client_leaves(scope, waits())  # type: ignore[arg-type]

        task = asyncio.create_task(handler())
        await started.wait()
        if by_edge:
            task, scope[WAITING] = scope[WAITING], None
        task.cancel()
        if also_elsewhere:
            task.cancel()
        try:
            await task
        except BaseException as exc:  # what it ended with is the answer
            assert task.cancelling() == (1 if isinstance(exc, asyncio.CancelledError) else 0)
            return exc
        raise AssertionError("the wait ended by itself")

    ended = run_in_own_loop(scenario)
    assert scope[WAITING] is None
    return ended


def test_the_edges_cancel_is_a_client_that_left() -> None:
    assert isinstance(_cancelled_while_waiting(by_edge=True), ClientLeft)


def test_any_other_cancel_stays_a_cancel() -> None:
    assert isinstance(_cancelled_while_waiting(by_edge=False), asyncio.CancelledError)


def test_the_edges_cancel_with_another_stays_a_cancel() -> None:
    """A stopping server cancelled the task as well: that cancel is not swallowed."""
    ended = _cancelled_while_waiting(by_edge=True, also_elsewhere=True)
    assert isinstance(ended, asyncio.CancelledError)
