"""The per-version executor, driven through the DataPlane in process: where calls run (loop or
the model's threads), queue limits, deadlines, cancellation, output checks, statistics, and
that one model's stuck calls delay neither other models nor model control."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf.json_format import MessageToDict

from servekit.config.compiler import compile_plan
from servekit.config.loader import parse_config
from servekit.errors import DeadlineExceeded, Internal, Overloaded
from servekit.grpc.triton_proto import statistics_message
from servekit.models.repository import VersionEntry
from servekit.rest.triton_json import statistics_json
from servekit.runtimes.base import CALL_DEADLINE
from servekit.runtimes.cancel import cancel_event
from servekit.runtimes.python import PythonModel, register_object
from servekit.server import ServeKit
from servekit.services.dataplane import DataPlane
from servekit.services.execution import placement
from servekit.services.execution.executor import ModelExecutor
from servekit.services.execution.placement import Mode
from servekit.types import InferRequest, Tensor

IO = (
    "inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
    "    outputs: [{name: y, datatype: FP32, shape: [-1]}]"
)
WAIT = 10.0  # bound of every wait on a condition (never reached when things work)
BATCHING = "    maxBatchSize: 8\n    dynamicBatching: {maxQueueDelayMicroseconds: 100}\n"
ROOMY = "inlineBelowMicroseconds: 100000"
"""A bound no preemption on a busy machine reaches: a fast model stays measured fast."""


@pytest.fixture(autouse=True)
def python_stands_in_for_an_inline_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where calls run is decided the same way for every runtime that may run on the loop
    (``may_run_inline``: ONNX Runtime). These tests need a model whose time and behaviour they
    control (sleep, block, raise, exit), so they let Python functions stand in for such a
    runtime; that a real Python model never runs on the loop is tests/test_loop_safety.py."""
    monkeypatch.setattr(PythonModel, "may_run_inline", True)


def model(name: str, fn: object, extra: str = "") -> str:
    return (
        f"  - name: {name}\n    modelFormat: {{name: python}}\n"
        f"    entrypoint: {register_object(fn)}\n    {IO}\n{extra}"
    )


_KITS: dict[int, ServeKit] = {}  # DataPlane id -> the in-process server (no listener) it is of


async def serve(tmp_path: Path, *models: str, server: str = "") -> DataPlane:
    text = f"server: {{{server}}}\nmodels:\n" + "".join(models)
    kit = ServeKit(compile_plan(parse_config(text), tmp_path))
    await kit.control.start()
    _KITS[id(kit.dataplane)] = kit
    return kit.dataplane


async def stop(dataplane: DataPlane) -> None:
    await _KITS.pop(id(dataplane)).stop()


def version_of(dataplane: DataPlane, name: str) -> VersionEntry:
    """The version a request for ``name`` uses (the repository's own entry: in-flight count,
    executor)."""
    _, version = _KITS[id(dataplane)].repository.resolve(name, None)
    return version


def request(name: str, *values: float, **parameters: Any) -> InferRequest:
    x = np.array(values, dtype=np.float32)
    return InferRequest(name, [Tensor("x", "FP32", x.shape, x)], parameters=parameters)


def executor_of(dataplane: DataPlane, name: str) -> ModelExecutor:
    version = version_of(dataplane, name)
    assert isinstance(version.executor, ModelExecutor)
    return version.executor


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


class Gate:
    """A model that blocks until released, and records the first value of every call."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.calls: list[float] = []
        self.running = 0

    def __call__(self, x: Any) -> Any:
        self.calls.append(float(x.flat[0]))
        self.running += 1
        try:
            assert self.open.wait(WAIT)
        finally:
            self.running -= 1
        return x


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def test_first_calls_run_in_threads_then_a_fast_model_moves_to_the_loop(tmp_path: Path) -> None:
    threads: list[str] = []

    def fast(x: Any) -> Any:
        threads.append(threading.current_thread().name)
        return x * 2

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("fast", fast), server=ROOMY)
        for _ in range(placement.LEARN_FAST + 3):
            response = await dataplane.infer(request("fast", 1.0, 2.0))
            assert response.outputs[0].data.tolist() == [2.0, 4.0]
        loop_thread = threading.current_thread().name
        assert threads[0] != loop_thread  # an unknown model never starts on the loop
        assert threads[-1] == loop_thread
        assert executor_of(dataplane, "fast").mode is Mode.INLINE
        await stop(dataplane)

    run(scenario)


@pytest.mark.parametrize("extra", ["", BATCHING], ids=["unbatched", "batching"])
def test_a_sleeping_model_never_runs_on_the_loop(tmp_path: Path, extra: str) -> None:
    threads: list[str] = []

    def sleepy(x: Any) -> Any:
        threads.append(threading.current_thread().name)
        time.sleep(0.002)  # 2 ms of waiting, no CPU: four times inlineBelowMicroseconds
        return x

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("sleepy", sleepy, extra))
        for _ in range(placement.LEARN_SLOW + 5):
            await dataplane.infer(request("sleepy", 1.0))
        assert threading.current_thread().name not in threads
        assert executor_of(dataplane, "sleepy").mode is Mode.THREADS
        await stop(dataplane)

    run(scenario)


def test_a_batching_model_runs_lone_requests_on_the_loop_and_batches_in_its_threads(
    tmp_path: Path,
) -> None:
    calls: list[tuple[str, int]] = []  # (thread, rows) of every model call

    def fast(x: Any) -> Any:
        calls.append((threading.current_thread().name, int(x.shape[0])))
        return x * 2

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("fast", fast, BATCHING), server=ROOMY)
        loop_thread = threading.current_thread().name
        for _ in range(placement.LEARN_FAST + 3):  # one at a time: nobody to batch with
            response = await dataplane.infer(request("fast", 1.0))
            assert response.outputs[0].data.tolist() == [2.0]
        assert calls[0][0] != loop_thread  # a new version's first call never runs on the loop
        assert calls[-1] == (loop_thread, 1)  # measured fast: no thread hop at low load
        assert executor_of(dataplane, "fast").mode is Mode.INLINE
        calls.clear()
        answers = await asyncio.gather(*(dataplane.infer(request("fast", v)) for v in range(6)))
        assert [a.outputs[0].data.tolist() for a in answers] == [[2.0 * v] for v in range(6)]
        assert calls == [(calls[0][0], 6)]  # the six arrived together: one call of six rows,
        assert calls[0][0] != loop_thread  # in the model's thread
        stats = dataplane.statistics.of("fast", 1)
        assert stats.execution_count == placement.LEARN_FAST + 3 + 1
        assert stats.inference_count == placement.LEARN_FAST + 3 + 6
        assert executor_of(dataplane, "fast").mode is Mode.INLINE  # a batch's time is no verdict
        await stop(dataplane)

    run(scenario)


def test_a_batching_models_lone_request_runs_at_once_only_when_the_server_holds_no_other(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("fast", lambda x: x + 1, BATCHING), server=ROOMY)
        kit = _KITS[id(dataplane)]
        for _ in range(placement.LEARN_FAST + 1):
            await dataplane.infer(request("fast", 1.0))
        assert executor_of(dataplane, "fast").mode is Mode.INLINE
        stats = dataplane.statistics.of("fast", 1)
        in_progress = 1
        kit.state.requests_in_progress = lambda: in_progress
        queued_before = sum(stats.batch_reasons.values())  # one per call that went via the queue
        for _ in range(5):  # alone on the server: no loop pass spent waiting for company
            assert (await dataplane.infer(request("fast", 1.0))).outputs[0].data.tolist() == [2.0]
        assert sum(stats.batch_reasons.values()) == queued_before
        in_progress = 3  # others in progress may be about to join: the request queues a pass
        answers = await asyncio.gather(*(dataplane.infer(request("fast", v)) for v in range(4)))
        assert [a.outputs[0].data.tolist() for a in answers] == [[v + 1.0] for v in range(4)]
        assert sum(stats.batch_reasons.values()) == queued_before + 1  # all four in one call
        await stop(dataplane)

    run(scenario)


def test_a_batching_models_lone_request_keeps_off_the_loop_while_others_are_in_progress(
    tmp_path: Path,
) -> None:
    """Found alone in the queue a loop pass later, it runs in the model's thread, not on the
    loop: requests in progress elsewhere (a gRPC call being read, an HTTP body still coming)
    reach the executor while the loop is free, and join the next batch. On the loop, its call
    would hold them back, and at 64 in flight most batches were of one row."""
    threads: list[str] = []

    def fast(x: Any) -> Any:
        threads.append(threading.current_thread().name)
        return x + 1

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("fast", fast, BATCHING), server=ROOMY)
        kit = _KITS[id(dataplane)]
        for _ in range(placement.LEARN_FAST + 1):
            await dataplane.infer(request("fast", 1.0))
        loop_thread = threading.current_thread().name
        assert threads[-1] == loop_thread and executor_of(dataplane, "fast").mode is Mode.INLINE
        kit.state.requests_in_progress = lambda: 3
        threads.clear()
        for _ in range(3):
            assert (await dataplane.infer(request("fast", 1.0))).outputs[0].data.tolist() == [2.0]
        assert threads and loop_thread not in threads
        assert executor_of(dataplane, "fast").mode is Mode.INLINE  # still placed on the loop
        kit.state.requests_in_progress = lambda: 1
        threads.clear()
        await dataplane.infer(request("fast", 1.0))
        assert threads == [loop_thread]  # alone again: on the loop at once
        await stop(dataplane)

    run(scenario)


@pytest.mark.parametrize("extra", ["", BATCHING], ids=["unbatched", "batching"])
def test_a_model_that_exits_on_the_loop_fails_only_its_request(tmp_path: Path, extra: str) -> None:
    def exits(x: Any) -> Any:
        if float(x.flat[0]) == 13.0:
            raise SystemExit(3)  # model code calling sys.exit()
        if float(x.flat[0]) == 14.0:
            raise Stop  # a BaseException of some library's own
        return x

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("exits", exits, extra), server=ROOMY)
        for _ in range(placement.LEARN_FAST + 1):
            await dataplane.infer(request("exits", 1.0))
        assert executor_of(dataplane, "exits").mode is Mode.INLINE
        with pytest.raises(Internal, match="SystemExit"):  # unbatched: run_inline; batching:
            await dataplane.infer(request("exits", 13.0))  # a lone call from the queue
        with pytest.raises(Internal, match="Stop"):  # never a request left hanging
            await asyncio.wait_for(dataplane.infer(request("exits", 14.0)), WAIT)
        assert executor_of(dataplane, "exits").mode is Mode.INLINE  # they ran on the loop
        assert (await dataplane.infer(request("exits", 2.0))).outputs[0].data.tolist() == [2.0]
        await stop(dataplane)

    run(scenario)


class Stop(BaseException):
    pass


def test_a_backlog_that_cannot_stack_runs_in_the_models_threads(tmp_path: Path) -> None:
    calls: list[str] = []

    def fast(x: Any) -> Any:
        calls.append(threading.current_thread().name)
        return x

    async def scenario() -> None:
        extra = BATCHING + "    instances: 2\n"
        dataplane = await serve(tmp_path, model("fast", fast, extra), server=ROOMY)
        eight = request("fast", *range(8))  # a full batch: no other request stacks with it
        for _ in range(placement.LEARN_FAST + 2):  # one at a time: learnt fast at 8 rows
            await dataplane.infer(eight)
        loop_thread = threading.current_thread().name
        assert calls[-1] == loop_thread
        calls.clear()
        await asyncio.gather(*(dataplane.infer(eight) for _ in range(6)))
        assert len(calls) == 6
        # Queued together, none stacks with another: they are a backlog for the model's two
        # threads, not lone requests (at most the last may find the queue empty and both idle).
        assert calls.count(loop_thread) <= 1, calls
        await stop(dataplane)

    run(scenario)


@pytest.mark.parametrize(
    "extra", ["    maxBatchSize: 64\n", BATCHING], ids=["unbatched", "batching"]
)
def test_a_request_larger_than_any_measured_fast_runs_in_a_thread(
    tmp_path: Path, extra: str
) -> None:
    calls: list[tuple[str, int]] = []

    def fast(x: Any) -> Any:
        calls.append((threading.current_thread().name, int(x.shape[0])))
        return x

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("fast", fast, extra), server=ROOMY)
        _KITS[id(dataplane)].state.requests_in_progress = lambda: 1
        for _ in range(placement.LEARN_FAST + 2):
            await dataplane.infer(request("fast", 1.0))
        loop_thread = threading.current_thread().name
        assert calls[-1] == (loop_thread, 1)
        big = request("fast", *range(8))
        await dataplane.infer(big)
        assert calls[-1][1] == 8 and calls[-1][0] != loop_thread  # not yet timed at 8 rows
        await dataplane.infer(big)
        assert calls[-1] == (loop_thread, 8)  # timed fast at 8 rows in its thread
        await stop(dataplane)

    run(scenario)


def test_slow_calls_on_the_loop_send_a_version_back_to_its_threads(tmp_path: Path) -> None:
    slow = threading.Event()

    def moody(x: Any) -> Any:
        if slow.is_set():
            time.sleep(0.003)
        return x

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("moody", moody))
        executor: ModelExecutor | None = None
        for strike in range(placement.MAX_STRIKES + 1):
            slow.clear()
            for _ in range(50):  # learning again, then back on the loop
                await dataplane.infer(request("moody", 1.0))
                executor = executor_of(dataplane, "moody")
                if executor.mode is Mode.INLINE:
                    break
            assert executor is not None and executor.mode is Mode.INLINE, strike
            slow.set()
            await dataplane.infer(request("moody", 1.0))  # runs on the loop, takes 3 ms
            assert executor.mode is not Mode.INLINE
            await dataplane.infer(request("moody", 1.0))  # in a thread: slow, so it counts
        slow.clear()
        for _ in range(placement.LEARN_FAST + 5):
            await dataplane.infer(request("moody", 1.0))
        assert executor is not None and executor.mode is Mode.THREADS  # for good
        await stop(dataplane)

    run(scenario)


def test_one_slow_moment_on_the_loop_is_forgiven(tmp_path: Path) -> None:
    """A fast model preempted mid-call (another process took the core) is measured again in
    its threads and comes back to the loop; it never goes off the loop for good for that."""
    slow = threading.Event()

    def preempted(x: Any) -> Any:
        if slow.is_set():
            slow.clear()  # one slow call only
            time.sleep(0.003)
        return x

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("m", preempted))
        executor = None
        for _ in range(placement.MAX_STRIKES + 3):
            for _ in range(50):
                await dataplane.infer(request("m", 1.0))
                executor = executor_of(dataplane, "m")
                if executor.mode is Mode.INLINE:
                    break
            assert executor is not None and executor.mode is Mode.INLINE
            slow.set()
            await dataplane.infer(request("m", 1.0))
        for _ in range(placement.LEARN_FAST + 2):
            await dataplane.infer(request("m", 1.0))
        assert executor is not None and executor.mode is Mode.INLINE
        await stop(dataplane)

    run(scenario)


def test_a_full_queue_answers_overloaded_at_once(tmp_path: Path) -> None:
    gate = Gate()

    async def scenario() -> None:
        dataplane = await serve(
            tmp_path,
            model("gate", gate, "    maxQueueSize: 2\n"),
            server="inlineBelowMicroseconds: 0",
        )
        waiting = [asyncio.create_task(dataplane.infer(request("gate", i))) for i in range(3)]
        await until(lambda: gate.running == 1, "the first call to start")
        executor = executor_of(dataplane, "gate")
        assert executor.queued == 2
        started = time.perf_counter()
        with pytest.raises(Overloaded, match="maxQueueSize 2") as caught:
            await dataplane.infer(request("gate", 9))
        assert time.perf_counter() - started < 0.5  # at once, not after the queue
        assert caught.value.retry_after_seconds >= 1
        gate.open.set()
        await asyncio.gather(*waiting)
        assert gate.calls == [0.0, 1.0, 2.0]
        assert dataplane.statistics.of("gate", 1).fail.count == 1
        await stop(dataplane)

    run(scenario)


def test_expired_requests_never_run(tmp_path: Path) -> None:
    gate = Gate()

    async def scenario() -> None:
        dataplane = await serve(
            tmp_path,
            model("gate", gate, "    queueTimeoutMicroseconds: 300000\n"),
            server="inlineBelowMicroseconds: 0",
        )
        first = asyncio.create_task(dataplane.infer(request("gate", 1)))
        await until(lambda: gate.running == 1, "the first call to start")
        with pytest.raises(DeadlineExceeded, match="'timeout' parameter"):
            await dataplane.infer(request("gate", 2, timeout=20_000))  # 20 ms, as Triton: us
        with pytest.raises(DeadlineExceeded, match="deadline passed while it waited"):
            await dataplane.infer(request("gate", 3), deadline=time.monotonic() + 0.02)
        with pytest.raises(DeadlineExceeded, match="queueTimeoutMicroseconds: 300000"):
            await dataplane.infer(request("gate", 4))  # 300 ms in the queue
        with pytest.raises(DeadlineExceeded, match="had passed when it arrived"):
            await dataplane.infer(request("gate", 5), deadline=time.monotonic() - 1)
        gate.open.set()
        await first
        await dataplane.infer(request("gate", 6))
        assert gate.calls == [1.0, 6.0]
        version = version_of(dataplane, "gate")
        assert version.in_flight == 0
        await stop(dataplane)

    run(scenario)


def test_a_timeout_parameter_is_the_whole_requests_deadline(tmp_path: Path) -> None:
    """Triton's ``timeout`` parameter (microseconds) ends a request still running when it
    passes, as a gRPC deadline or requestTimeoutSeconds does, and raises the call's cancel
    flag; one that finishes in time is answered."""
    seen: list[bool] = []

    def patient(x: Any) -> Any:
        if x.flat[0] > 0:
            seen.append(cancel_event().wait(WAIT))  # runs until cancelled (or WAIT)
        return x

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("m", patient))
        answer = await dataplane.infer(request("m", 0, timeout=10_000_000))  # 10 s: in time
        assert answer.outputs[0].data.tolist() == [0.0]
        started = time.perf_counter()
        with pytest.raises(DeadlineExceeded, match="'timeout' parameter"):
            await dataplane.infer(request("m", 1, timeout=50_000))  # 50 ms
        assert time.perf_counter() - started < WAIT / 2
        await until(lambda: seen == [True], "the model to see its cancel flag")
        await stop(dataplane)

    run(scenario)


def test_a_bad_timeout_parameter_is_a_client_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("m", lambda x: x))
        for bad in (-1, "soon", 1.5, True):
            with pytest.raises(Exception, match="timeout") as caught:
                await dataplane.infer(request("m", 1, timeout=bad))
            assert caught.value.code.value == "INVALID_ARGUMENT"  # type: ignore[attr-defined]
        await stop(dataplane)

    run(scenario)


def test_a_deadline_passing_mid_call_answers_and_raises_the_cancel_flag(tmp_path: Path) -> None:
    seen: list[bool] = []
    finish = threading.Event()

    def patient(x: Any) -> Any:
        seen.append(cancel_event().wait(WAIT))  # a model that waits can stop early
        assert finish.wait(WAIT)
        return x

    async def scenario() -> None:
        dataplane = await serve(
            tmp_path, model("patient", patient), server="requestTimeoutSeconds: 0.05"
        )
        started = time.perf_counter()
        with pytest.raises(DeadlineExceeded, match="while the model was computing"):
            await dataplane.infer(request("patient", 1))
        assert time.perf_counter() - started < WAIT / 2
        await until(lambda: seen == [True], "the model to see its cancel flag")
        version = version_of(dataplane, "patient")
        assert version.in_flight == 1  # its thread still runs: not idle, whatever the client
        finish.set()
        await until(lambda: version.in_flight == 0, "the thread to return")
        await stop(dataplane)

    run(scenario)


def test_the_call_deadline_follows_the_request_into_the_models_thread(tmp_path: Path) -> None:
    """An isolated model stops a call at CALL_DEADLINE: the executor sets it per call from the
    request's deadline (the client's, capped by requestTimeoutSeconds), and clears it after."""
    seen: list[float | None] = []

    def reader(x: Any) -> Any:
        seen.append(CALL_DEADLINE.get())
        return x

    async def scenario() -> None:
        dataplane = await serve(
            tmp_path, model("reader", reader), server="requestTimeoutSeconds: 30"
        )
        before = time.monotonic()
        await dataplane.infer(request("reader", 1))  # a new version's first call: in a thread
        client = time.monotonic() + 5
        await dataplane.infer(request("reader", 1), client)
        assert len(seen) == 2
        first, second = seen
        assert first is not None and before + 29 < first <= time.monotonic() + 30
        assert second == client  # the client's deadline is earlier than the cap
        await stop(dataplane)

    run(scenario)


def test_a_cancelled_request_leaves_the_queue(tmp_path: Path) -> None:
    gate = Gate()

    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("gate", gate), server="inlineBelowMicroseconds: 0")
        first = asyncio.create_task(dataplane.infer(request("gate", 1)))
        await until(lambda: gate.running == 1, "the first call to start")
        second = asyncio.create_task(dataplane.infer(request("gate", 2)))
        executor = executor_of(dataplane, "gate")
        await until(lambda: executor.queued == 1, "the second to queue")
        second.cancel()  # the client went away
        await until(lambda: executor.queued == 0, "the queue to drop it")
        gate.open.set()
        await first
        assert gate.calls == [1.0]
        version = version_of(dataplane, "gate")
        assert version.in_flight == 0
        await stop(dataplane)

    run(scenario)


@pytest.mark.parametrize(
    ("returned", "why"),
    [
        (None, "returned None for output 'y'"),
        (np.zeros((2, 2), np.float32), r"output 'y' \(FP32\) has shape \[2, 2\]"),
        (np.float32(1.0), r"output 'y' \(FP32\) has shape \[\]"),
    ],
)
def test_outputs_are_checked_against_the_metadata(
    tmp_path: Path, returned: object, why: str
) -> None:
    async def scenario() -> None:
        dataplane = await serve(tmp_path, model("liar", lambda x: returned))
        with pytest.raises(Internal, match=why):
            await dataplane.infer(request("liar", 1, 2))
        await stop(dataplane)

    run(scenario)


def test_fixed_output_dimensions_are_checked(tmp_path: Path) -> None:
    fixed = (
        "  - name: fixed\n    modelFormat: {name: python}\n"
        f"    entrypoint: {register_object(lambda x: np.zeros((1, 3), np.float32))}\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]\n"
    )

    async def scenario() -> None:
        dataplane = await serve(tmp_path, fixed)
        with pytest.raises(Internal, match=r"shape \[1, 3\], the metadata says \[-1, 4\]"):
            await dataplane.infer(request("fixed", 1))
        await stop(dataplane)

    run(scenario)


def test_statistics_count_rows_and_executions_as_triton(tmp_path: Path) -> None:
    gate = Gate()
    batched = (
        "  - name: rows\n    modelFormat: {name: python}\n"
        f"    entrypoint: {register_object(gate)}\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1, 2]}]\n"
        "    outputs: [{name: x, datatype: FP32, shape: [-1, 2]}]\n"
        "    maxBatchSize: 8\n    dynamicBatching: {maxQueueDelayMicroseconds: 0}\n"
    )

    def rows(*values: float) -> InferRequest:
        x = np.array([[v, v] for v in values], dtype=np.float32)
        return InferRequest("rows", [Tensor("x", "FP32", x.shape, x)])

    async def scenario() -> None:
        dataplane = await serve(tmp_path, batched)
        first = asyncio.create_task(dataplane.infer(rows(1)))
        await until(lambda: gate.running == 1, "the first call to start")
        others = [asyncio.create_task(dataplane.infer(rows(10 * i, 10 * i + 1))) for i in (1, 2, 3)]
        executor = executor_of(dataplane, "rows")
        await until(lambda: executor.queued == 3, "three requests to queue")
        gate.open.set()
        await first
        answers = await asyncio.gather(*others)
        for i, answer in zip((1, 2, 3), answers, strict=True):
            assert answer.outputs[0].data[:, 0].tolist() == [10 * i, 10 * i + 1]
        stats = dataplane.statistics.of("rows", 1)
        assert stats.inference_count == 7  # batch elements
        assert stats.execution_count == 2  # model runs: 1 row, then the three stacked
        assert {size: d.count for size, d in stats.batch_sizes.items()} == {1: 1, 6: 1}
        assert stats.success.count == 4
        assert sum(stats.queue_histogram) == 4
        assert stats.batch_reasons == {"queue_drained": 2}
        (typed,) = _KITS[id(dataplane)].catalog.model_statistics("rows", "1")  # what both render
        (as_json,) = statistics_json((typed,))["model_stats"]
        (as_proto,) = statistics_message((typed,)).model_stats
        for shown in (as_json, MessageToDict(as_proto, preserving_proto_field_name=True)):
            assert int(shown["inference_count"]) == 7
            assert int(shown["execution_count"]) == 2
            assert int(shown["inference_stats"]["success"]["count"]) == 4
            assert [int(b["batch_size"]) for b in shown["batch_stats"]] == [1, 6]
        await stop(dataplane)

    run(scenario)


def test_stuck_calls_delay_neither_other_models_nor_loads(tmp_path: Path) -> None:
    gate = Gate()

    async def scenario() -> None:
        dataplane = await serve(
            tmp_path,
            model("stuck", gate, "    instances: 2\n"),
            model("other", lambda x: x + 1),
            server="inlineBelowMicroseconds: 0",
        )
        control = _KITS[id(dataplane)].control
        for i in range(6):  # more abandoned calls than the loop's default executor has room for
            with pytest.raises(DeadlineExceeded):
                await dataplane.infer(request("stuck", i), deadline=time.monotonic() + 0.02)
        assert gate.running == 2  # each instance's thread is stuck; the rest never ran
        started = time.perf_counter()
        answer = await dataplane.infer(request("other", 1))
        assert answer.outputs[0].data.tolist() == [2.0]
        await control.load("other")  # a load (a worker thread of the loop) is not held up
        unloading = asyncio.create_task(control.unload("stuck"))  # waits for its threads
        await control.unload("other")  # another model's control does not wait for that
        await control.load("other")
        assert time.perf_counter() - started < WAIT / 2
        assert not unloading.done()
        gate.open.set()
        await asyncio.wait_for(unloading, WAIT)
        await stop(dataplane)

    run(scenario)


def test_live_edits_of_the_server_bounds_apply_to_the_next_request(tmp_path: Path) -> None:
    """``inlineBelowMicroseconds`` and ``requestTimeoutSeconds`` are live: a serve.yaml edit
    (ModelControl.apply_plan) reaches a version's executor without a reload."""
    gate = Gate()
    gate.open.set()

    async def scenario() -> None:
        entry = model("gate", gate)  # one entrypoint: the edit leaves the model as it is
        dataplane = await serve(tmp_path, entry)
        for _ in range(placement.LEARN_FAST + 1):
            await dataplane.infer(request("gate", 1))
        executor = executor_of(dataplane, "gate")
        assert executor.mode is Mode.INLINE
        kit = _KITS[id(dataplane)]
        server = "{inlineBelowMicroseconds: 0, requestTimeoutSeconds: 0.05}"
        edited = parse_config(f"server: {server}\nmodels:\n{entry}")
        done = await kit.control.apply_plan(compile_plan(edited, tmp_path))
        assert done["reloaded"] == []  # the model itself is unchanged
        assert executor_of(dataplane, "gate") is executor
        await dataplane.infer(request("gate", 2))
        assert executor.mode is Mode.THREADS  # 0: every call off the loop, from now on
        gate.open.clear()
        with pytest.raises(DeadlineExceeded):
            await dataplane.infer(request("gate", 3))  # held past the new 50 ms cap
        gate.open.set()
        await until(lambda: gate.running == 0, "the held call to return")
        await stop(dataplane)

    run(scenario)


def test_a_fast_model_reaches_the_loop_while_the_loop_is_busy(tmp_path: Path) -> None:
    """A learning call is timed while the loop waits for it with the GIL released: timed
    while the loop ran other work, a fast model's call in a thread waited for the GIL (up to
    the 5 ms switch interval), looked slow, and a busy server never moved it onto the loop."""

    async def scenario() -> None:
        def fast(x: Any) -> Any:
            time.sleep(0)  # lets go of the GIL mid-call, as onnxruntime does
            return x * 2

        dataplane = await serve(tmp_path, model("fast", fast))
        stop_spinning = False

        async def spin() -> None:  # other requests keeping the loop busy
            while not stop_spinning:
                until = time.perf_counter() + 0.002
                while time.perf_counter() < until:
                    pass
                await asyncio.sleep(0)

        spinner = asyncio.create_task(spin())
        try:
            executor = None
            for _ in range(placement.LEARN_SLOW * 2):  # a noisy machine may cost some samples
                await dataplane.infer(request("fast", 1.0))
                executor = executor_of(dataplane, "fast")
                if executor.mode is Mode.INLINE:
                    break
            assert executor is not None and executor.mode is Mode.INLINE
        finally:
            stop_spinning = True
            await spinner
        await stop(dataplane)

    run(scenario)


def test_onnx_outputs_are_trusted_unless_overridden(tmp_path: Path) -> None:
    """onnxruntime returns the graph's own types: without output overrides the hot path does
    not re-check them; an override makes the metadata ours, so it is checked."""
    import onnx
    from onnx_builders import mlp

    onnx.save(mlp(16, 8, 4), tmp_path / "m.onnx")
    plain = "  - name: plain\n    modelFormat: {name: onnx}\n    storageUri: ./m.onnx\n"
    renamed = (
        "  - name: typed\n    modelFormat: {name: onnx}\n    storageUri: ./m.onnx\n"
        "    outputs: [{name: output, datatype: FP32, shape: [-1, 4]}]\n"
    )

    async def scenario() -> None:
        dataplane = await serve(tmp_path, plain, renamed)
        x = np.ones((1, 16), np.float32)
        for name in ("plain", "typed"):
            response = await dataplane.infer(
                InferRequest(name, [Tensor("input", "FP32", x.shape, x)])
            )
            assert response.outputs[0].shape == (1, 4)
        assert executor_of(dataplane, "plain").check.trusted
        assert not executor_of(dataplane, "typed").check.trusted
        await stop(dataplane)

    run(scenario)


def test_requests_read_together_run_back_to_back_on_the_loop(tmp_path: Path) -> None:
    """An unbatched model measured fast: requests the listener read in one loop pass
    (``read_together``) wait for the pass's end and then run on the loop one after the other,
    before any of them is answered (the model's code and data stay in the core's caches), those
    with a deadline too; one with a timeout (it must start at once) does not wait, nor one that
    finds the queue full (``maxQueueSize``), so it is not refused; read alone, each runs at
    once."""
    order: list[str] = []

    def fast(x: Any) -> Any:
        order.append(f"call {x.flat[0]:g} on the loop: {threading.current_thread().name}")
        return x

    async def scenario() -> None:
        small = "    maxQueueSize: 1\n"
        dataplane = await serve(tmp_path, model("m", fast), model("q", fast, small), server=ROOMY)
        for name in ("m", "q"):
            for _ in range(placement.LEARN_FAST + 2):  # in a thread, then on the loop
                await dataplane.infer(request(name, 0))
            assert executor_of(dataplane, name).mode is Mode.INLINE
        loop_thread = threading.current_thread().name

        async def one(
            value: float, name: str = "m", deadline: float | None = None, **parameters: Any
        ) -> None:
            answer = await dataplane.infer(request(name, value, **parameters), deadline)
            order.append(f"answer {answer.outputs[0].data.flat[0]:g}")

        state = _KITS[id(dataplane)].state
        state.read_together = lambda: 1
        order.clear()
        await asyncio.gather(one(1), one(2), one(3, deadline=time.monotonic() + WAIT))
        calls = [f"call {v} on the loop: {loop_thread}" for v in (1, 2, 3)]
        assert order == [*calls, "answer 1", "answer 2", "answer 3"]

        order.clear()
        await asyncio.gather(one(1), one(2, timeout=1))  # 1 us: it must start at once
        assert order == [calls[1], "answer 2", calls[0], "answer 1"]

        order.clear()
        await asyncio.gather(one(1, "q"), one(2, "q"), one(3, "q"))  # room for one to wait
        assert order == [calls[1], "answer 2", calls[2], "answer 3", calls[0], "answer 1"]

        state.read_together = lambda: 0
        order.clear()
        await asyncio.gather(one(1), one(2))
        assert order == [calls[0], "answer 1", calls[1], "answer 2"]
        await stop(dataplane)

    run(scenario)
