"""app/servekit/http/taskless.py alone: a coroutine's first step taken at once, the rest driven
without a task.

The answer at the connection runs this way for every plain inference request
(tests/test_infer_front.py feeds the edge raw bytes; tests/test_executor_e2e.py has clients
leave while their requests wait in a thread's queue). Here, what the driver itself must keep
of a task's meaning: a coroutine that never waits needs no task, one that waits goes on where
it stopped with what it waited for, in its context, with ``eager.RUNNING`` naming what
drives it; cancelling reaches the coroutine where it waits (or at its next step); a failure
after a wait is reported, not lost; done callbacks run when it ends.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from loops import run_in_own_loop

from servekit.http import taskless as eager

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


async def _from_a_callback(coroutine: Any, context: contextvars.Context) -> Any:
    """``eager.run`` called as the edge calls it: from a protocol's callback, outside any task."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def callback() -> None:
        try:
            done.set_result(eager.run(loop, coroutine, context))
        except BaseException as exc:
            done.set_exception(exc)

    loop.call_soon(callback)
    return await done


def test_a_coroutine_that_never_waits_runs_to_its_end_without_a_task() -> None:
    seen: list[Any] = []

    async def answer() -> None:
        seen.append((VAR.get(), asyncio.current_task()))

    async def scenario() -> Any:
        VAR.set("request")
        context = contextvars.copy_context()
        VAR.set("connection")
        return await _from_a_callback(answer(), context)

    assert run_in_own_loop(scenario) is None
    assert seen == [("request", None)]  # in the request's context, with no task


async def _ended(resumed: eager.Resumed) -> None:
    """Wait (bounded) until ``resumed`` has ended, through its done callback."""
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    resumed.add_done_callback(lambda _: ended.set_result(None))
    await asyncio.wait_for(ended, 10)


def test_a_coroutine_that_waits_goes_on_without_a_task_with_what_it_waited_for() -> None:
    seen: list[Any] = []

    async def answer(first: asyncio.Future[int], second: asyncio.Future[int]) -> None:
        seen.append(("before", asyncio.current_task()))
        seen.append(await first)
        await asyncio.sleep(0)  # a bare yield on the way
        try:
            await second
        except ValueError as exc:
            seen.append(str(exc))
        seen.append(("after", VAR.get(), asyncio.current_task(), eager.RUNNING))

    async def scenario() -> eager.Resumed:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[int] = loop.create_future()
        second: asyncio.Future[int] = loop.create_future()
        VAR.set("request")
        resumed = await _from_a_callback(answer(first, second), contextvars.copy_context())
        assert resumed is not None and not resumed.done()
        VAR.set("connection")
        first.set_result(7)
        loop.call_later(0.01, second.set_exception, ValueError("the model failed"))
        await _ended(resumed)
        return resumed

    resumed = run_in_own_loop(scenario)
    assert resumed.done()
    assert seen[:3] == [("before", None), 7, "the model failed"]
    # in the request's context, named by RUNNING while it runs (no task: no current_task())
    assert seen[3] == ("after", "request", None, resumed)
    assert eager.RUNNING is None  # only while a step runs


@pytest.mark.parametrize("caught", [False, True])
def test_cancelling_reaches_the_coroutine_where_it_waits(caught: bool) -> None:
    seen: list[str] = []

    async def answer(waited: asyncio.Future[int]) -> None:
        try:
            await waited
        except asyncio.CancelledError:
            seen.append("cancelled while waiting")
            if not caught:
                raise
            running = eager.RUNNING
            assert running is not None
            seen.append(f"uncancel {running.uncancel()}")  # the edge's cancel, counted once
        seen.append("went on")

    async def scenario() -> tuple[bool, bool, bool]:
        loop = asyncio.get_running_loop()
        waited: asyncio.Future[int] = loop.create_future()
        resumed = await _from_a_callback(answer(waited), contextvars.copy_context())
        assert resumed is not None
        await asyncio.sleep(0)
        cancelled = resumed.cancel()
        await _ended(resumed)
        return cancelled, waited.cancelled(), resumed.cancel()

    cancelled, future_cancelled, cancelled_again = run_in_own_loop(scenario)
    assert cancelled and future_cancelled  # what it waited for was cancelled, as under a task
    assert not cancelled_again  # an ended answer cannot be cancelled
    assert seen == ["cancelled while waiting"] + (["uncancel 0", "went on"] if caught else [])


def test_a_cancel_between_waits_is_thrown_at_the_next_step() -> None:
    seen: list[str] = []

    async def answer() -> None:
        await asyncio.sleep(0)  # a bare yield: nothing to cancel while it is pending
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            seen.append("cancelled at its next step")
            raise
        seen.append("not cancelled")

    async def scenario() -> None:
        resumed = await _from_a_callback(answer(), contextvars.copy_context())
        assert resumed is not None
        assert resumed.cancel()
        await _ended(resumed)

    run_in_own_loop(scenario)
    assert seen == ["cancelled at its next step"]


def test_a_failure_after_a_wait_goes_to_the_loops_exception_handler() -> None:
    reported: list[dict[str, Any]] = []

    async def answer(waited: asyncio.Future[int]) -> None:
        await waited
        raise RuntimeError("after the wait")

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context))
        waited: asyncio.Future[int] = loop.create_future()
        resumed = await _from_a_callback(answer(waited), contextvars.copy_context())
        assert resumed is not None
        waited.set_result(1)
        await _ended(resumed)

    run_in_own_loop(scenario)
    assert [str(context["exception"]) for context in reported] == ["after the wait"]


def test_yielding_what_is_not_a_future_is_refused_as_a_task_refuses_it() -> None:
    seen: list[str] = []

    class Odd:
        def __await__(self) -> Any:
            yield "not a future"

    async def answer() -> None:
        try:
            await Odd()
        except RuntimeError as exc:
            seen.append(str(exc))

    async def scenario() -> None:
        resumed = await _from_a_callback(answer(), contextvars.copy_context())
        assert resumed is not None
        await _ended(resumed)

    run_in_own_loop(scenario)
    assert seen == ["the answer yielded 'not a future', not a future"]


def test_done_callbacks_run_once_when_it_ends_or_at_once_after() -> None:
    calls: list[str] = []

    async def answer(waited: asyncio.Future[int]) -> None:
        await waited

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        waited: asyncio.Future[int] = loop.create_future()
        resumed = await _from_a_callback(answer(waited), contextvars.copy_context())
        assert resumed is not None
        resumed.add_done_callback(lambda r: calls.append(f"before, done {r.done()}"))
        assert calls == []
        waited.set_result(1)
        await _ended(resumed)
        resumed.add_done_callback(lambda r: calls.append(f"after, done {r.done()}"))

    run_in_own_loop(scenario)
    assert calls == ["before, done True", "after, done True"]


def test_a_failure_in_the_first_step_is_the_callers() -> None:
    async def answer() -> None:
        raise RuntimeError("at once")

    async def scenario() -> None:
        with pytest.raises(RuntimeError, match="at once"):
            await _from_a_callback(answer(), contextvars.copy_context())

    run_in_own_loop(scenario)
