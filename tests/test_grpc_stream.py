"""ModelStreamInfer: responses in request order, and a bad request does not close the stream.

Driven by tritonclient.grpc's ``start_stream`` / ``async_stream_infer`` (callback API) and by
tritonclient.grpc.aio's ``stream_infer`` (async iterator API), as users write them.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from loops import run_in_own_loop
from servers import ServerProcess, identity_name

pytestmark = pytest.mark.slow

Request = tuple[str, list[grpcclient.InferInput], str]


def identity_request(value: float, request_id: str, model: str | None = None) -> Request:
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[value, -value]], dtype=np.float32))
    return (model or identity_name("FP32"), [tensor], request_id)


def wrong_input_request(request_id: str) -> Request:
    tensor = grpcclient.InferInput("NOT_AN_INPUT", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 2), dtype=np.float32))
    return (identity_name("FP32"), [tensor], request_id)


def mixed_requests() -> list[Request]:
    """Good requests with a bad input and an unknown model in between."""
    return [
        identity_request(1.0, "a"),
        identity_request(2.0, "b"),
        wrong_input_request("bad-input"),
        identity_request(3.0, "c"),
        identity_request(4.0, "bad-model", model="no_such_model"),
        *(identity_request(float(i), f"n{i}") for i in range(5, 25)),
    ]


def check_answers(requests: list[Request], answers: list[tuple[Any, Any]]) -> None:
    assert len(answers) == len(requests)
    for (_model, inputs, request_id), (result, error) in zip(requests, answers, strict=True):
        if request_id == "bad-input":
            assert result is None and "NOT_AN_INPUT" in error.message()
        elif request_id == "bad-model":
            assert result is None and "no_such_model" in error.message()
        else:
            assert error is None, error
            assert result.get_response().id == request_id, "responses come in request order"
            sent = inputs[0]._get_content()
            assert result.as_numpy("OUTPUT0").tobytes() == sent


def test_stream_with_callbacks(server: ServerProcess) -> None:
    assert server.grpc_target is not None
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    requests = mixed_requests()
    with grpcclient.InferenceServerClient(server.grpc_target) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for model, inputs, request_id in requests:
                client.async_stream_infer(model, inputs, request_id=request_id)
            received = [answers.get(timeout=30) for _ in requests]
            # The stream is still open after the failures: one more round trip on it.
            model, inputs, request_id = identity_request(99.0, "after")
            client.async_stream_infer(model, inputs, request_id=request_id)
            result, error = answers.get(timeout=30)
            assert error is None and result.get_response().id == "after"
        finally:
            client.stop_stream()
    check_answers(requests, received)


def test_stream_with_asyncio(server: ServerProcess) -> None:
    requests = mixed_requests()

    async def generate() -> AsyncIterator[dict[str, Any]]:
        for model, inputs, request_id in requests:
            yield {"model_name": model, "inputs": inputs, "request_id": request_id}
            await asyncio.sleep(0)

    async def run() -> list[tuple[Any, Any]]:
        assert server.grpc_target is not None
        async with aioclient.InferenceServerClient(server.grpc_target) as client:
            return [pair async for pair in client.stream_infer(generate())]

    answers = run_in_own_loop(run)
    check_answers(requests, answers)


def test_many_streams_at_once(server: ServerProcess) -> None:
    """Concurrent streams do not mix up their responses."""

    async def one_stream(client: aioclient.InferenceServerClient, tag: str) -> None:
        requests = [identity_request(float(i), f"{tag}-{i}") for i in range(30)]

        async def generate() -> AsyncIterator[dict[str, Any]]:
            for model, inputs, request_id in requests:
                yield {"model_name": model, "inputs": inputs, "request_id": request_id}

        ids = [result.get_response().id async for result, _ in client.stream_infer(generate())]
        assert ids == [r[2] for r in requests]

    async def run() -> None:
        assert server.grpc_target is not None
        async with aioclient.InferenceServerClient(server.grpc_target) as client:
            await asyncio.gather(*(one_stream(client, f"s{i}") for i in range(6)))

    run_in_own_loop(run)
