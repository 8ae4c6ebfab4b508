"""The one load signal (app/servekit/services/execution/load.py) on its own: what the executors
read to decide whether a request runs at once, on the loop, or waits for company."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from servekit.services.execution.load import Load
from servekit.services.state import ServerState

pytestmark = pytest.mark.anyio


async def test_requests_read_in_one_pass_say_the_load_is_there_for_two_passes() -> None:
    loop = asyncio.get_running_loop()
    load = Load()
    load.note_read(loop)
    load.note_read(loop)
    assert load.read_together() == 0  # not counted until someone asks: nothing to pay before
    load.note_read(loop)
    load.note_read(loop)  # this pass reads two
    assert load.read_together() == 1
    await asyncio.sleep(0)  # the next pass: the last one read two
    assert load.read_together() == 1
    load.note_read(loop)  # a pass reading one: the pass before still read two
    assert load.read_together() == 1
    await asyncio.sleep(0)
    assert load.read_together() == 0  # the last pass that read any read one


async def test_in_progress_counts_both_listeners_and_the_pass() -> None:
    loop = asyncio.get_running_loop()
    load = Load()
    assert load.in_progress() == 0  # no listener (in process)
    http: set[object] = {object(), object(), object()}
    load.listen_http(http)
    load.grpc_calls.n = 3
    assert load.in_progress() == 5  # HTTP requests counted up to two: is a request alone?
    load.note_read(loop)
    load.note_read(loop)
    assert load.in_progress() == 6  # several read this pass: one more
    http.clear()
    load.grpc_calls.n = 0
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert load.in_progress() == 1  # passes that read nothing leave the last that read any
    load.note_read(loop)
    await asyncio.sleep(0)
    assert load.in_progress() == 0  # the last pass that read any read one


async def test_a_finished_task_left_in_the_listeners_set_is_not_in_progress() -> None:
    """uvicorn's task leaves its set by a done callback, a loop step after it answered: a
    request read in that step is alone all the same."""
    load = Load()
    answered = asyncio.ensure_future(asyncio.sleep(0))
    await answered
    assert answered.done()
    http: set[object] = {answered, object()}
    load.listen_http(http)
    assert load.in_progress() == 1
    waiting = asyncio.ensure_future(asyncio.sleep(10))
    http.add(waiting)
    assert load.in_progress() == 2
    waiting.cancel()


def test_the_server_state_reads_the_load_signal() -> None:
    """``ServerState``'s callables, which the DataPlane gives each executor, are the signal's."""
    from servekit.config.compiler import compile_plan
    from servekit.config.schema import ServeConfig

    state = ServerState(compile_plan(ServeConfig.model_validate({"models": []}), Path(".")))
    state.load.listen_http({object()})
    state.grpc_calls.n = 1
    assert state.grpc_calls is state.load.grpc_calls
    assert state.requests_in_progress() == 2
    assert state.read_together() == 0
