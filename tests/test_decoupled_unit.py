"""Decoupled models in process: ``DataPlane.infer_stream`` over generator models, their closing
and slots, the unary refusal, metadata from ``Iterator[...]`` hints, and the generate codec.

The end-to-end module (test_decoupled.py) drives the same through every protocol; these pin the
rules in the one place the adapters share, in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import TypedDict

import numpy as np
import pytest
from fakes import python_model, tensor
from inprocess import Serve

from servekit.codecs import generate_json
from servekit.errors import Internal, InvalidArgument, Unimplemented
from servekit.types import InferRequest, InferResponse, Tensor, TensorSpec

pytestmark = pytest.mark.anyio


class Token(TypedDict):
    text_output: str


def count_to(n: np.ndarray) -> Iterator[Token]:  # type: ignore[type-arg]
    for i in range(int(n.reshape(-1)[0])):
        yield {"text_output": str(i)}


def count(n: int) -> InferRequest:
    return InferRequest("count", [tensor("n", [n], "INT64")])


class Gate:
    """A sync generator model whose steps wait for the test, recording its life."""

    def __init__(self) -> None:
        self.step = threading.Event()
        self.started = threading.Event()
        self.closed = threading.Event()

    def predict(self, text: list[str]) -> Iterator[str]:
        self.started.set()
        try:
            while True:
                assert self.step.wait(10), "the test never released the step"
                self.step.clear()
                yield "tick"
        finally:
            self.closed.set()


async def test_each_yield_is_a_response_and_statistics_count_once(serve: Serve) -> None:
    services = await serve()
    await services.control.add(
        python_model("count", inputs=[{"name": "n", "datatype": "INT64"}]), count_to
    )
    dataplane = services.dataplane
    assert dataplane.decoupled("count") and not dataplane.decoupled("nope")
    got = [r async for r in dataplane.infer_stream(count(3))]
    assert [r.outputs[0].data.tolist() for r in got] == [[b"0"], [b"1"], [b"2"]]
    assert got[0].outputs[0].shape == (1,)  # a yielded scalar is one element of a [-1] output
    stats = services.statistics("count")
    assert stats["inference_count"] == 1 and stats["inference_stats"]["success"]["count"] == 1
    assert dataplane.model_config("count").decoupled


async def test_unary_infer_refuses_a_decoupled_model(serve: Serve) -> None:
    services = await serve()
    await services.control.add(
        python_model("count", inputs=[{"name": "n", "datatype": "INT64"}]), count_to
    )
    with pytest.raises(Unimplemented, match="decoupled transaction policy"):
        await services.dataplane.infer(count(1))


async def test_a_model_that_is_not_decoupled_answers_once(serve: Serve) -> None:
    services = await serve()

    def double(x: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
        return x * 2

    await services.control.add(
        python_model(
            "double",
            inputs=[{"name": "x", "datatype": "FP32"}],
            outputs=[{"name": "y", "datatype": "FP32"}],
        ),
        double,
    )
    assert not services.dataplane.decoupled("double")
    request = InferRequest("double", [tensor("x", [1.0, 2.0])])
    (only,) = [r async for r in services.dataplane.infer_stream(request)]
    assert only.outputs[0].data.tolist() == [2.0, 4.0]
    assert not services.dataplane.model_config("double").decoupled


async def test_closing_the_stream_closes_a_sync_generator_and_frees_the_instance(
    serve: Serve,
) -> None:
    services = await serve()
    gate = Gate()
    await services.control.add(python_model("gate"), gate)
    request = InferRequest("gate", [tensor("text", [b"x"], "BYTES")])
    stream = services.dataplane.infer_stream(request)
    gate.step.set()
    first = await anext(stream)
    assert first.outputs[0].data.tolist() == [b"tick"]
    await stream.aclose()
    assert gate.closed.is_set()
    # The only instance is free: another stream starts at once.
    gate.closed.clear()
    gate.step.set()
    async with aclosing(services.dataplane.infer_stream(request)) as again:
        assert (await asyncio.wait_for(anext(again), 10)).outputs[0].data.tolist() == [b"tick"]


async def test_cancelling_mid_step_waits_for_the_step_then_closes(serve: Serve) -> None:
    services = await serve()
    gate = Gate()
    await services.control.add(python_model("gate"), gate)
    request = InferRequest("gate", [tensor("text", [b"x"], "BYTES")])

    async def consume() -> list[InferResponse]:
        return [r async for r in services.dataplane.infer_stream(request)]

    task = asyncio.create_task(consume())
    await asyncio.to_thread(gate.started.wait, 10)  # the first step runs in its thread
    task.cancel()
    await asyncio.sleep(0)
    assert not gate.closed.is_set()  # cannot close a generator mid-step
    gate.step.set()  # the step ends; the generator is closed right after
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.closed.is_set()


async def test_cancelling_closes_an_async_generator(serve: Serve) -> None:
    services = await serve()
    closed = asyncio.Event()
    yielded = asyncio.Event()

    async def ticks(text: list[str]) -> AsyncIterator[str]:
        try:
            while True:
                yield "tick"
                yielded.set()
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    await services.control.add(python_model("ticks"), ticks)
    request = InferRequest("ticks", [tensor("text", [b"x"], "BYTES")])

    async def consume() -> None:
        async for _ in services.dataplane.infer_stream(request):
            pass

    task = asyncio.create_task(consume())
    await asyncio.wait_for(yielded.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed.is_set()


async def test_a_failure_mid_stream_is_the_models_error(serve: Serve) -> None:
    services = await serve()

    def fails(text: list[str]) -> Iterator[str]:
        yield "one"
        raise ValueError("no more")

    await services.control.add(python_model("fails"), fails)
    request = InferRequest("fails", [tensor("text", [b"x"], "BYTES")])
    got: list[InferResponse] = []
    with pytest.raises(Internal, match="ValueError: no more"):
        async for response in services.dataplane.infer_stream(request):
            got.append(response)
    assert len(got) == 1
    assert services.statistics("fails")["inference_stats"]["fail"]["count"] == 1


async def test_a_decoupled_model_cannot_batch(serve: Serve) -> None:
    services = await serve()
    config = python_model(
        "count",
        inputs=[{"name": "n", "datatype": "INT64"}],
        maxBatchSize=4,
        dynamicBatching={},
    )
    with contextlib.suppress(Exception):  # the load fails; the reason says why
        await services.control.add(config, count_to)
    assert "cannot use dynamic batching" in services.reason("count")


async def test_streams_wait_for_a_free_instance(serve: Serve) -> None:
    """With one instance, a second stream waits (off the loop) until the first is closed."""
    services = await serve()
    gate = Gate()
    await services.control.add(python_model("gate"), gate)
    request = InferRequest("gate", [tensor("text", [b"x"], "BYTES")])
    first = services.dataplane.infer_stream(request)
    gate.step.set()
    await anext(first)
    second = services.dataplane.infer_stream(request)
    waiting = asyncio.create_task(anext(second))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await first.aclose()
    gate.step.set()
    assert (await asyncio.wait_for(waiting, 10)).outputs[0].data.tolist() == [b"tick"]
    await second.aclose()


# -- the generate codec -------------------------------------------------------------------------
SPECS = (TensorSpec("text_input", "BYTES", (-1,)), TensorSpec("max_tokens", "INT32", (1,)))


def test_generate_request_fields_are_inputs_id_and_parameters() -> None:
    obj = {
        "id": "42",
        "text_input": "hello",
        "max_tokens": 8,
        "parameters": {"temperature": 0.5},
        "stream": False,
    }
    request = generate_json.decode_request(obj, "m", "2", SPECS)
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "42")
    text, tokens = request.inputs
    assert (text.shape, text.data.tolist()) == ((1,), [b"hello"])
    assert (tokens.shape, tokens.data.dtype, tokens.data.tolist()) == ((1,), np.int32, [8])
    assert request.parameters == {"temperature": 0.5, "stream": False}


@pytest.mark.parametrize(
    ("shape", "count", "expected"),
    [
        ((-1,), 3, (3,)),
        ((-1, -1), 3, (1, 3)),
        ((-1, 2), 4, (2, 2)),
        ((2, -1), 6, (2, 3)),
        ((1,), 1, (1,)),
        ((-1,), 0, (0,)),
    ],
)
def test_generate_shapes_fit_as_triton_fits_them(
    shape: tuple[int, ...], count: int, expected: tuple[int, ...]
) -> None:
    assert generate_json.fit_shape("x", shape, count) == expected


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        ({"max_tokens": [1, 2]}, "do not fit"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"text_input": [["a"]]}, "flat list"),
        ({"text_input": None}, "flat list"),
        ({"other": {"a": 1}}, "parameter"),
        ({"parameters": [1]}, "JSON object"),
        ({"id": 3}, "'id'"),
    ],
)
def test_generate_request_errors(obj: object, fragment: str) -> None:
    with pytest.raises(InvalidArgument, match=fragment):
        generate_json.decode_request(obj, "m", None, SPECS)


def test_generate_response_fields() -> None:
    response = InferResponse(
        "m",
        "1",
        [
            Tensor("text_output", "BYTES", (1,), np.array([b"hi"], dtype=object)),
            Tensor("scores", "FP32", (2,), np.array([0.5, 1.0], np.float32)),
        ],
        id=None,
        parameters={"finish": "length"},
    )
    out = generate_json.encode_response(response)
    assert list(out) == ["model_name", "model_version", "finish", "text_output", "scores"]
    assert out["text_output"] == "hi" and list(out["scores"]) == [0.5, 1.0]
