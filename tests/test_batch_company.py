"""Requests read in one loop pass keep each other company: a batching model batches them,
an unbatched one on the loop runs them back to back at the pass's end.

The HTTP listener answers the requests it reads in one loop pass one after the other, each at
once (app/servekit/http/taskless.py). When the model is placed on the loop, each of them used to be
the only request in progress when it reached the model (the one before it already answered,
the next still unread in its socket's buffer), so each ran alone: at 64 in flight, 1.6 rows per
model run. The edge now counts what it reads per pass in the load signal
(app/servekit/services/execution/load.py), which adds it to the requests in progress.

In process: a batching ONNX model placed on the loop, behind the edge's protocol over
transports that record what is sent, fed raw HTTP/1.1 as sockets would feed it. Several
connections read in one pass (no turn of the loop between them) must share model runs, and a
connection read alone must still run at once. An unbatched model's calls of one pass come
one after the other, before the pass's answers are written (a call made between other requests'
reads and writes found the model's code and data gone from the core's caches: the tiny MLP's
call took 14-19 us there against 4.6 us in a loop).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_builders
import onnxruntime as ort
import pytest
import uvicorn
from inprocess import Serve
from uvicorn.server import ServerState
from waits import async_wait_until
from wires import Wire

from servekit.config.schema import NetworkLimits
from servekit.http.connection import EdgeProtocol
from servekit.http.limits import EdgeState
from servekit.rest.front import inference_lane
from servekit.server import ServeKit
from servekit.services.execution import placement
from servekit.services.execution.placement import Mode

pytestmark = pytest.mark.anyio

CONFIG = (
    "server: {inlineBelowMicroseconds: 100000}\n"  # no preemption makes the model look slow
    "models:\n  - name: mlp\n    modelFormat: {name: onnx}\n    storageUri: ./mlp.onnx\n"
    "    maxBatchSize: 8\n    dynamicBatching: {}\n"
)


def _post(row: list[float]) -> bytes:
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": row}]}
    ).encode()
    head = f"POST /v2/models/mlp/infer HTTP/1.1\r\nhost: servekit\r\ncontent-length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


def _answer(sent: bytes) -> list[float]:
    body = json.loads(sent.split(b"\r\n\r\n", 1)[1])
    return [float(v) for v in body["outputs"][0]["data"]]


def _listener(kit: ServeKit, wire: Callable[[], Wire] = Wire) -> Callable[[], Connection]:
    """Connections to ``kit`` through the edge's protocol, wired to the server's counts as
    ``servekit serve`` wires them (``ServeKit.start``)."""
    app = kit.http_app()  # one application behind both ways, as the server has
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
    config.load()

    class Protocol(EdgeProtocol):
        edge = EdgeState(NetworkLimits(), 100, note_read=kit.state.load.note_read)
        lane = inference_lane(app)

    state = ServerState()
    state.default_headers = []
    kit.state.load.listen_http(state.tasks)

    def connection() -> Connection:
        protocol = Protocol(config=config, server_state=state, app_state={})
        sent = wire()
        protocol.connection_made(sent)
        return protocol, sent

    return connection


Connection = tuple[EdgeProtocol, Wire]


async def test_requests_read_in_one_loop_pass_share_model_runs(
    serve: Serve, tmp_path: Path
) -> None:
    model = onnx_builders.mlp()
    onnx.save(model, str(tmp_path / "mlp.onnx"))
    services = await serve(CONFIG)
    kit = services.kit
    connection = _listener(kit)

    rng = np.random.default_rng(1)
    rows = rng.standard_normal((6, 16)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString())
    expected = session.run(None, {"input": rows})[0]

    async def one_by_one(row: int) -> None:
        protocol, wire = connection()
        protocol.data_received(_post(rows[row].tolist()))
        await async_wait_until(lambda: b"\r\n\r\n" in wire.sent, what="the answer")
        np.testing.assert_allclose(_answer(wire.sent), expected[row], rtol=1e-5)
        protocol.connection_lost(None)
        await asyncio.sleep(0)  # the next request comes in a pass of its own

    for _ in range(placement.LEARN_FAST + 1):  # measured fast: placed on the loop
        await one_by_one(0)
    version = kit.repository.resolve("mlp", None)[1]
    assert version.executor is not None and version.executor.mode is Mode.INLINE
    stats = kit.dataplane.statistics.of("mlp", 1)
    await asyncio.sleep(0)  # the warm-up's pass is behind

    def queued() -> int:  # model runs of requests that went through the queue
        return sum(stats.batch_reasons.values())

    runs, before = stats.execution_count, queued()
    await one_by_one(0)  # alone: it runs at once (on the loop), one run of its own
    assert (stats.execution_count, queued()) == (runs + 1, before)
    await asyncio.sleep(0)  # a pass that read nothing: the last pass that read any read one

    runs, done = stats.execution_count, stats.inference_count
    opened = [connection() for _ in range(5)]
    for row, (protocol, _) in enumerate(opened, start=1):  # five sockets ready in one pass
        protocol.data_received(_post(rows[row].tolist()))
    await async_wait_until(lambda: stats.inference_count == done + 5, what="five answers")
    for row, (_, wire) in enumerate(opened, start=1):
        np.testing.assert_allclose(_answer(wire.sent), expected[row], rtol=1e-5)
    # the first ran at once, alone when it was read; the four after it waited for company
    assert stats.execution_count == runs + 2, "requests read in one pass each ran alone"
    assert stats.batch_reasons.get("queue_drained") or stats.batch_reasons.get("max_size")

    runs, before = stats.execution_count, queued()
    await one_by_one(0)  # the first read after a crowded pass: it waits a pass for company
    assert (stats.execution_count, queued()) == (runs + 1, before + 1)
    runs, before = stats.execution_count, queued()
    await one_by_one(0)  # the pass before read one: at once again
    assert (stats.execution_count, queued()) == (runs + 1, before)
    for protocol, _ in opened:
        protocol.connection_lost(None)


async def test_an_unbatched_model_runs_one_pass_s_requests_back_to_back(
    serve: Serve, tmp_path: Path
) -> None:
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
    services = await serve(CONFIG.replace("    maxBatchSize: 8\n    dynamicBatching: {}\n", ""))
    kit = services.kit
    events: list[str] = []  # model calls and the listener's writes, in order

    class Recorded(Wire):
        def write(self, data: Any) -> None:
            events.append("write")
            super().write(data)

    connection = _listener(kit, Recorded)
    version = kit.repository.resolve("mlp", None)[1]
    assert version.executor is not None and version.runtime is not None
    predict = version.runtime.predict

    def recorded(*args: Any) -> Any:
        events.append("call")
        return predict(*args)

    row = [0.5] * 16
    for _ in range(placement.LEARN_FAST + 1):  # measured fast: placed on the loop
        protocol, wire = connection()
        protocol.data_received(_post(row))
        await async_wait_until(lambda wire=wire: b"\r\n\r\n" in wire.sent, what="an answer")
        await asyncio.sleep(0)  # the next request comes in a pass of its own
    assert version.executor.mode is Mode.INLINE
    version.runtime.predict = recorded  # type: ignore[method-assign]
    await asyncio.sleep(0)
    events.clear()

    protocol, wire = connection()
    protocol.data_received(_post(row))  # alone: answered within the read, as before
    assert events == ["call", "write"] and b"\r\n\r\n" in wire.sent
    await asyncio.sleep(0)  # a pass that read nothing: the last pass that read any read one
    await asyncio.sleep(0)

    events.clear()
    opened = [connection() for _ in range(5)]
    for protocol, _ in opened:  # five sockets ready in one pass
        protocol.data_received(_post(row))
    await async_wait_until(lambda: events.count("write") == 5, what="five answers")
    # the first ran when it was read, alone; the four read after it ran together after the pass
    assert events == ["call", "write", *["call"] * 4, *["write"] * 4], events
    expected = _answer(opened[0][1].sent)
    for _, sent in opened:
        assert _answer(sent.sent) == expected
