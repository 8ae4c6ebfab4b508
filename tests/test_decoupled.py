"""Decoupled Python models end to end: a ``predict`` that yields streams one response per result.

A real ``servekit serve`` serves a user module of token-stream models (sync and async
generators, one that fails mid-stream, endless ones that record when they are closed), driven
as users drive Triton's decoupled models: tritonclient.grpc's ``start_stream`` /
``async_stream_infer`` with ``enable_empty_final_response``, tritonclient.grpc.aio's
``stream_infer``, httpx reading ``generate_stream`` Server-Sent Events, and grps'
PredictStreaming over gRPC and HTTP. A client that leaves mid-stream closes the model's
generator and frees its only instance for the next request.
"""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from loops import run_in_own_loop
from servers import ServerProcess, start_server
from tritonclient.utils import InferenceServerException
from waits import async_wait_until, wait_until

from servekit.protos import grps_pb2 as gpb
from servekit.protos import grps_pb2_grpc as gpb_grpc

pytestmark = pytest.mark.slow

USER_MODULE = """
import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TypedDict

import numpy as np
from numpy.typing import NDArray

CLOSED = Path(__file__).with_name("closed.log")


class Token(TypedDict):
    text_output: str


def _text(text_input):
    value = text_input[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def tokens(text_input: list[str], count: NDArray[np.int32]) -> Iterator[Token]:
    for i in range(int(count.reshape(-1)[0])):
        yield {"text_output": f"{_text(text_input)}-{i}"}


async def async_tokens(text_input: list[str], count: NDArray[np.int32]) -> AsyncIterator[Token]:
    for i in range(int(count.reshape(-1)[0])):
        await asyncio.sleep(0)
        yield {"text_output": f"{_text(text_input)}-{i}"}


def words(text_input: list[str]) -> Iterator[Token]:
    for word in _text(text_input).split():
        yield {"text_output": word}


def failing(text_input: list[str]) -> Iterator[Token]:
    yield {"text_output": "first"}
    yield {"text_output": "second"}
    raise ValueError("the model ran out of words")


def shout(text_input: list[str]) -> Token:
    return {"text_output": _text(text_input).upper()}


def endless(text_input: list[str]) -> Iterator[Token]:
    label = _text(text_input)
    try:
        while True:
            time.sleep(0.01)
            yield {"text_output": label}
    finally:
        with CLOSED.open("a") as log:
            log.write(label + "\\n")


async def endless_async(text_input: list[str]) -> AsyncIterator[Token]:
    label = _text(text_input)
    try:
        while True:
            await asyncio.sleep(0.01)
            yield {"text_output": label}
    finally:
        with CLOSED.open("a") as log:
            log.write(label + "\\n")
"""

NAMES = ("tokens", "async_tokens", "words", "failing", "shout", "endless", "endless_async")
CONFIG = "models:\n" + "".join(
    f"  - {{name: {name}, modelFormat: {{name: python}}, entrypoint: 'user_models:{name}'}}\n"
    for name in NAMES
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decoupled")
    (root / "user_models.py").write_text(USER_MODULE)
    (root / "serve.yaml").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    process = start_server(folder / "serve.yaml", grpc=True)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.http_client(timeout=20) as client:
        yield client


def closed(folder: Path) -> list[str]:
    """Labels of the endless generators that were closed, in order."""
    log = folder / "closed.log"
    return log.read_text().split() if log.exists() else []


def wait_closed(folder: Path, label: str) -> None:
    wait_until(lambda: label in closed(folder), what=f"the generator of {label} closed")


def collect(answers: queue.Queue[tuple[Any, Any]]) -> Any:
    """A stream callback (tritonclient calls it with result= and error=) filling ``answers``."""
    return lambda result, error: answers.put((result, error))


def text_inputs(text: str, count: int | None = None) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
    if count is None:
        return [tensor]
    number = grpcclient.InferInput("count", [1], "INT32")
    number.set_data_from_numpy(np.array([count], dtype=np.int32))
    return [tensor, number]


def final(result: grpcclient.InferResult) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def texts(results: list[grpcclient.InferResult]) -> list[str]:
    return [r.as_numpy("text_output").reshape(-1)[0].decode() for r in results]


# -- configuration ------------------------------------------------------------------------------
def test_configuration_says_decoupled(server: ServerProcess, http: httpx.Client) -> None:
    config = http.get("/v2/models/tokens/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert http.get("/v2/models/shout/config").json()["model_transaction_policy"] == {
        "decoupled": False
    }
    assert config["output"] == [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}]
    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    try:
        message = client.get_model_config("tokens").config
        assert message.model_transaction_policy.decoupled
        assert not client.get_model_config("shout").config.model_transaction_policy.decoupled
        assert "generate" in client.get_server_metadata().extensions
    finally:
        client.close()
    assert "generate" in http.get("/v2").json()["extensions"]


# -- gRPC ModelStreamInfer ----------------------------------------------------------------------
@pytest.fixture
def stream_client(server: ServerProcess) -> Iterator[tuple[grpcclient.InferenceServerClient, Any]]:
    """A tritonclient stream whose callback puts (result, error) on a queue."""
    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        yield client, answers
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def until_final(answers: queue.Queue[tuple[Any, Any]]) -> tuple[list[Any], Any]:
    """Results of one request up to its final response; and the error that ended it, if any."""
    results = []
    while True:
        result, error = answers.get(timeout=20)
        if error is not None:
            return results, error
        results.append(result)
        if final(result):
            return results, None


@pytest.mark.parametrize("model", ["tokens", "async_tokens"])
def test_each_yield_is_a_stream_response_with_an_empty_final(
    stream_client: tuple[grpcclient.InferenceServerClient, Any], model: str
) -> None:
    client, answers = stream_client
    client.async_stream_infer(
        model, text_inputs("tok", 4), request_id="r1", enable_empty_final_response=True
    )
    results, error = until_final(answers)
    assert error is None
    assert texts(results[:-1]) == ["tok-0", "tok-1", "tok-2", "tok-3"]
    assert [final(r) for r in results] == [False, False, False, False, True]
    last = results[-1].get_response()
    assert not last.outputs and last.id == "r1" and last.model_name == model
    assert all(r.get_response().id == "r1" for r in results)


def test_without_the_empty_final_every_response_carries_data(
    stream_client: tuple[grpcclient.InferenceServerClient, Any],
) -> None:
    """As Triton: no empty final response unless asked for; the next request's answer follows."""
    client, answers = stream_client
    client.async_stream_infer("tokens", text_inputs("a", 2), request_id="a")
    client.async_stream_infer("shout", text_inputs("b"), request_id="b")
    seen = [answers.get(timeout=20) for _ in range(3)]
    assert all(error is None for _, error in seen)
    results = [result for result, _ in seen]
    assert [r.get_response().id for r in results] == ["a", "a", "b"]
    assert texts(results) == ["a-0", "a-1", "B"]
    # A model that is not decoupled: its one response is final.
    assert [final(r) for r in results] == [False, False, True]


def test_an_error_mid_stream_ends_the_request_not_the_stream(
    stream_client: tuple[grpcclient.InferenceServerClient, Any],
) -> None:
    client, answers = stream_client
    client.async_stream_infer("failing", text_inputs("x"), request_id="f")
    results, error = until_final(answers)
    assert texts(results) == ["first", "second"]
    assert isinstance(error, InferenceServerException)
    assert "ValueError: the model ran out of words" in error.message()
    client.async_stream_infer("words", text_inputs("still here"), request_id="w")
    assert texts([answers.get(timeout=20)[0] for _ in range(2)]) == ["still", "here"]


def test_unary_infer_refuses_a_decoupled_model(server: ServerProcess, http: httpx.Client) -> None:
    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("tokens", text_inputs("x", 1))
    finally:
        client.close()
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "doesn't support models with decoupled transaction policy" in caught.value.message()
    assert "ModelStreamInfer" in caught.value.message()
    body = {
        "inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]},
            {"name": "count", "datatype": "INT32", "shape": [1], "data": [1]},
        ]
    }
    response = http.post("/v2/models/tokens/infer", json=body)
    assert response.status_code == 501
    assert "generate_stream" in response.json()["error"]


def test_aio_stream_infer(server: ServerProcess) -> None:
    assert server.grpc_target is not None
    target = server.grpc_target

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for request_id, model in (("s", "tokens"), ("a", "async_tokens")):
            yield {
                "model_name": model,
                "inputs": aio_inputs("go", 3),
                "request_id": request_id,
            }

    async def run() -> list[tuple[str, str | None, bool]]:
        async with aioclient.InferenceServerClient(target) as client:
            seen = []
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                response = result.get_response()
                out = result.as_numpy("text_output")
                text = None if out is None else out.reshape(-1)[0].decode()
                seen.append((response.id, text, final(result)))
            return seen  # the server ends the call once the requests and their answers are done

    # The aio client has no way to ask for the empty final response (its parameters refuse
    # triton_* names), so every response carries a token, none flagged final.
    assert run_in_own_loop(run) == [(i, f"go-{n}", False) for i in "sa" for n in range(3)]


def aio_inputs(text: str, count: int) -> list[aioclient.InferInput]:
    tensor = aioclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
    number = aioclient.InferInput("count", [1], "INT32")
    number.set_data_from_numpy(np.array([count], dtype=np.int32))
    return [tensor, number]


# -- cancellation: the client leaves, the generator closes, the instance is free -----------------
def test_a_cancelled_grpc_stream_closes_the_generator(server: ServerProcess, folder: Path) -> None:
    assert server.grpc_target is not None
    for attempt in ("grpc-1", "grpc-2"):  # the second gets the only instance: it was freed
        client = grpcclient.InferenceServerClient(server.grpc_target)
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=collect(answers))
        client.async_stream_infer("endless", text_inputs(attempt))
        for _ in range(2):
            result, error = answers.get(timeout=20)
            assert error is None and texts([result]) == [attempt]
        client.stop_stream(cancel_requests=True)
        client.close()
        wait_closed(folder, attempt)


def test_a_cancelled_aio_stream_closes_an_async_generator(
    server: ServerProcess, folder: Path
) -> None:
    assert server.grpc_target is not None
    target = server.grpc_target

    async def one(label: str) -> None:
        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": "endless_async", "inputs": aio_text(label)}
            await asyncio.Event().wait()  # keep the stream open until cancelled

        async def consume(client: aioclient.InferenceServerClient) -> None:
            count = 0
            async for _result, error in client.stream_infer(requests()):
                assert error is None, error
                count += 1
                if count == 2:
                    got_two.set()

        got_two = asyncio.Event()
        async with aioclient.InferenceServerClient(target) as client:
            task = asyncio.create_task(consume(client))
            await asyncio.wait_for(got_two.wait(), 20)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await async_wait_until(lambda: label in closed(folder), 20, f"{label} closed")

    async def run() -> None:
        await one("aio-1")
        await one("aio-2")

    run_in_own_loop(run)


def aio_text(text: str) -> list[aioclient.InferInput]:
    tensor = aioclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return [tensor]


def test_a_disconnected_sse_client_closes_the_generator(
    server: ServerProcess, folder: Path
) -> None:
    for attempt in ("sse-1", "sse-2"):
        with (
            server.http_client(timeout=20) as client,
            client.stream(
                "POST", "/v2/models/endless/generate_stream", json={"text_input": attempt}
            ) as response,
        ):
            assert response.status_code == 200
            events = sse_events(response.iter_lines(), stop_after=2)
            assert [e["text_output"] for e in events] == [attempt, attempt]
        wait_closed(folder, attempt)


def test_a_cancelled_grps_stream_closes_the_generator(server: ServerProcess, folder: Path) -> None:
    assert server.grpc_target is not None
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = gpb_grpc.GrpsServiceStub(channel)
        for attempt in ("grps-1", "grps-2"):
            call = stub.PredictStreaming(
                gpb.GrpsMessage(model="endless", str_data=attempt), timeout=20
            )
            assert [next(call).str_data for _ in range(2)] == [attempt, attempt]
            call.cancel()
            wait_closed(folder, attempt)


# -- HTTP generate / generate_stream ------------------------------------------------------------
def sse_events(lines: Iterator[str], stop_after: int | None = None) -> list[dict[str, Any]]:
    """The JSON of each ``data:`` event (events are separated by blank lines)."""
    events: list[dict[str, Any]] = []
    for line in lines:
        if line.startswith("data: "):
            events.append(json.loads(line[len("data: ") :]))
            if stop_after is not None and len(events) == stop_after:
                break
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return events


def test_generate_stream_sends_one_event_per_token(http: httpx.Client) -> None:
    body = {"id": "42", "text_input": "to be or not", "parameters": {"temperature": 0}}
    with http.stream("POST", "/v2/models/words/generate_stream", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = "".join(response.iter_text())
    assert raw.endswith("\n\n") and raw.startswith("data: {")
    events = sse_events(iter(raw.split("\n")))
    assert [e["text_output"] for e in events] == ["to", "be", "or", "not"]
    assert all(e["id"] == "42" and e["model_name"] == "words" for e in events)
    assert all(e["model_version"] == "1" for e in events)


def test_generate_stream_with_a_version_and_a_numeric_input(http: httpx.Client) -> None:
    body = {"text_input": "n", "count": 3}
    with http.stream("POST", "/v2/models/async_tokens/versions/1/generate_stream", json=body) as r:
        events = sse_events(r.iter_lines())
    assert [e["text_output"] for e in events] == ["n-0", "n-1", "n-2"]


def test_generate_stream_error_mid_stream_is_an_event(http: httpx.Client) -> None:
    with http.stream("POST", "/v2/models/failing/generate_stream", json={"text_input": "x"}) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    assert [e.get("text_output") for e in events[:2]] == ["first", "second"]
    assert list(events[2]) == ["error"]
    assert "ValueError: the model ran out of words" in events[2]["error"]
    assert len(events) == 3


def test_generate_answers_one_response(http: httpx.Client) -> None:
    response = http.post("/v2/models/shout/generate", json={"id": "7", "text_input": "hi"})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "id": "7",
        "model_name": "shout",
        "model_version": "1",
        "text_output": "HI",
    }
    one = http.post("/v2/models/words/generate", json={"text_input": "single"})
    assert one.json()["text_output"] == "single"  # a decoupled model that yields once
    with http.stream("POST", "/v2/models/shout/generate_stream", json={"text_input": "a"}) as r:
        assert [e["text_output"] for e in sse_events(r.iter_lines())] == ["A"]


def test_generate_refuses_a_model_that_yields_several(http: httpx.Client) -> None:
    response = http.post("/v2/models/words/generate", json={"text_input": "two words"})
    assert response.status_code == 400
    assert "exactly 1 response" in response.json()["error"]
    assert "generate_stream" in response.json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "code", "fragment"),
    [
        ("/v2/models/nope/generate_stream", {"text_input": "x"}, 404, "nope"),
        ("/v2/models/words/generate_stream", {}, 400, "needs input(s) text_input"),
        ("/v2/models/words/generate_stream", {"text_input": {"a": 1}}, 400, "flat list"),
        ("/v2/models/words/generate", {"text_input": "x", "extra": [1]}, 400, "parameter"),
        ("/v2/models/tokens/generate_stream", {"text_input": "x", "count": "3"}, 400, "count"),
        ("/v2/models/words/generate_stream", ["text_input"], 400, "JSON object"),
        ("/v2/models/words/versions/9/generate_stream", {"text_input": "x"}, 404, "9"),
    ],
)
def test_generate_errors_before_streaming_are_json(
    http: httpx.Client, path: str, body: Any, code: int, fragment: str
) -> None:
    response = http.post(path, json=body)
    assert response.status_code == code, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert fragment in response.json()["error"]


def test_generate_malformed_json_is_a_400(http: httpx.Client) -> None:
    response = http.post("/v2/models/words/generate_stream", content=b"{nope")
    assert response.status_code == 400 and "malformed JSON" in response.json()["error"]


# -- grps ---------------------------------------------------------------------------------------
def test_grps_grpc_streaming_sends_one_message_per_token(server: ServerProcess) -> None:
    assert server.grpc_target is not None
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = gpb_grpc.GrpsServiceStub(channel)
        replies = list(stub.PredictStreaming(gpb.GrpsMessage(model="words", str_data="a b c")))
        assert [r.str_data for r in replies] == ["a", "b", "c"]
        assert all(r.status.code == 200 and r.model == "words-1" for r in replies)
        failing = stub.PredictStreaming(gpb.GrpsMessage(model="failing", str_data="x"))
        got = []
        with pytest.raises(grpc.RpcError) as caught:
            for reply in failing:
                got.append(reply.str_data)
        assert got == ["first", "second"]
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert "ran out of words" in (caught.value.details() or "")
        with pytest.raises(grpc.RpcError) as unary:
            stub.Predict(gpb.GrpsMessage(model="words", str_data="a b"))
        assert unary.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_grps_http_streaming_sends_one_chunk_per_token(http: httpx.Client) -> None:
    params = {"model": "words", "streaming": "true"}
    with http.stream(
        "POST", "/grps/v1/infer/predict", params=params, json={"str_data": "x y"}
    ) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [m["str_data"] for m in lines] == ["x", "y"]
    with http.stream(
        "POST",
        "/grps/v1/infer/predict",
        params={**params, "model": "failing"},
        json={"str_data": "x"},
    ) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [m.get("str_data") for m in lines[:2]] == ["first", "second"]
    assert lines[2]["status"]["status"] == "FAILURE" and lines[2]["status"]["code"] == 500
    unary = http.post("/grps/v1/infer/predict", params={"model": "words"}, json={"str_data": "x"})
    assert unary.status_code == 501 and "decoupled" in unary.json()["status"]["msg"]


def test_statistics_count_a_stream_once(http: httpx.Client) -> None:
    before = http.get("/v2/models/words/versions/1/stats").json()["model_stats"][0]
    with http.stream("POST", "/v2/models/words/generate_stream", json={"text_input": "a b"}) as r:
        assert len(sse_events(r.iter_lines())) == 2
    after = http.get("/v2/models/words/versions/1/stats").json()["model_stats"][0]
    assert after["inference_count"] == before["inference_count"] + 1
    success = after["inference_stats"]["success"]["count"]
    assert success == before["inference_stats"]["success"]["count"] + 1


def test_stopping_the_server_ends_open_streams(folder: Path) -> None:
    """A stop does not wait out its grace for a stream that never ends: the stream's last
    event says the server is shutting down, and the server exits cleanly. (SIGINT: SIGTERM
    would first serve on, unready, for server.drainDelaySeconds.)"""
    process = start_server(folder / "serve.yaml", grpc=False)
    try:
        with (
            process.http_client(timeout=20) as client,
            client.stream(
                "POST", "/v2/models/endless/generate_stream", json={"text_input": "stop"}
            ) as response,
        ):
            lines = response.iter_lines()
            assert sse_events(lines, stop_after=1)[0]["text_output"] == "stop"
            started = time.monotonic()
            process.process.send_signal(signal.SIGINT)
            events = sse_events(lines)
        assert events[-1] == {"error": "the server is shutting down; the stream ends here"}
        assert process.process.wait(timeout=20) == 0, process.log()
        assert time.monotonic() - started < 8, "the stream held the shutdown"
    finally:
        process.stop()
