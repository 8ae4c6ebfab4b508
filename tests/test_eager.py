"""app/servekit/rest/eager.py alone: a coroutine's first step taken at once, the rest in a task.

The answer at the connection runs this way for every plain inference request
(tests/test_infer_front.py feeds the edge raw bytes; tests/test_executor_e2e.py has clients
leave while their requests wait in a thread's queue). Here, what the driver itself must keep
of a task's meaning: a coroutine that never waits needs no task, one that waits goes on where
it stopped with what it waited for, ``current_task()`` names the task after the first wait,
and cancelling that task reaches the coroutine where it waits.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from loops import run_in_own_loop

from servekit.rest import eager

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


def test_a_coroutine_that_waits_goes_on_in_a_task_with_what_it_waited_for() -> None:
    seen: list[Any] = []

    async def answer(first: asyncio.Future[int], second: asyncio.Future[int]) -> None:
        seen.append(("before", asyncio.current_task()))
        seen.append(await first)
        await asyncio.sleep(0)  # a bare yield on the way
        try:
            await second
        except ValueError as exc:
            seen.append(str(exc))
        seen.append(("after", VAR.get(), asyncio.current_task()))

    async def scenario() -> asyncio.Task[None]:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[int] = loop.create_future()
        second: asyncio.Future[int] = loop.create_future()
        VAR.set("request")
        task = await _from_a_callback(answer(first, second), contextvars.copy_context())
        assert task is not None and not task.done()
        VAR.set("connection")
        first.set_result(7)
        loop.call_later(0.01, second.set_exception, ValueError("the model failed"))
        await asyncio.wait_for(task, 10)
        return task

    task = run_in_own_loop(scenario)
    assert seen[:3] == [("before", None), 7, "the model failed"]
    assert seen[3] == ("after", "request", task)


@pytest.mark.parametrize("caught", [False, True])
def test_cancelling_the_task_reaches_the_coroutine_where_it_waits(caught: bool) -> None:
    seen: list[str] = []

    async def answer(waited: asyncio.Future[int]) -> None:
        try:
            await waited
        except asyncio.CancelledError:
            seen.append("cancelled while waiting")
            if not caught:
                raise
            task = asyncio.current_task()
            assert task is not None
            seen.append(f"uncancel {task.uncancel()}")  # the edge's cancel, counted once

    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        waited: asyncio.Future[int] = loop.create_future()
        task = await _from_a_callback(answer(waited), contextvars.copy_context())
        assert task is not None
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait([task], timeout=10)
        return task.cancelled(), waited.cancelled()

    task_cancelled, future_cancelled = run_in_own_loop(scenario)
    assert future_cancelled  # what it waited for was cancelled, as a task's await does
    assert task_cancelled is not caught
    assert seen == ["cancelled while waiting"] + (["uncancel 0"] if caught else [])


def test_a_failure_in_the_first_step_is_the_callers() -> None:
    async def answer() -> None:
        raise RuntimeError("at once")

    async def scenario() -> None:
        with pytest.raises(RuntimeError, match="at once"):
            await _from_a_callback(answer(), contextvars.copy_context())

    run_in_own_loop(scenario)
