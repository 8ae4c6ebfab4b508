"""The two ways into inference give the same answers: ``POST /v2/models/{m}[/versions/{v}]/infer``
answered at the connection by the inference lane (servekit.http.inference_lane, with the
routes' table of servekit.rest.front) and by Litestar's own route.

In process: the real application of a ServeKit (every route) behind the edge's protocol over a
recording transport, fed raw HTTP/1.1 bytes twice per case, once with the lane and once with
every request going the ASGI way to Litestar, and the two answers compared: status, headers
and body. No listener; the edge's own checks are tested elsewhere.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnx_builders
import pytest
import uvicorn
from inprocess import Serve
from litestar import Litestar
from uvicorn.server import ServerState
from waits import async_wait_until
from wires import Wire

from servekit.codecs import v2_json
from servekit.config.schema import NetworkLimits
from servekit.datatypes import lookup
from servekit.errors import InvalidArgument
from servekit.http import inference_lane as fast
from servekit.http import request_ids
from servekit.http.connection import EdgeProtocol
from servekit.http.limits import EdgeState
from servekit.observability.access import ACCESS, AccessLine
from servekit.observability.tracing import TRACING
from servekit.rest import front
from servekit.rest.front import InferenceApp
from servekit.rest.front import inference_lane as fast_answer

pytestmark = pytest.mark.anyio

X = [[float(v) / 16 for v in range(16)]]
JSON_BODY = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": X[0]}]}
).encode()
HEADER = json.dumps(
    {
        "inputs": [
            {"name": "input", "shape": [1, 16], "datatype": "FP32",
             "parameters": {"binary_data_size": 64}}
        ],
        "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
    }
).encode()  # fmt: skip
BINARY_BODY = HEADER + np.asarray(X, dtype=np.float32).tobytes()


@pytest.fixture
async def app(serve: Serve, tmp_path: Path) -> AsyncIterator[InferenceApp]:
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
    services = await serve(
        "models:\n  - name: mlp\n    modelFormat: {name: onnx}\n    storageUri: ./mlp.onnx\n"
    )
    yield services.kit.http_app()


async def _both(
    app: InferenceApp, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[httpx.Response, httpx.Response]:
    """The answer over a connection with the inference lane on, and with every request going
    the ASGI way to Litestar's route (the two ways into inference), read as responses."""
    host = headers.pop("Host", "servekit")
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    lane, _ = await _over_connection(app, [request], 1, fast=True)
    routed, _ = await _over_connection(app, [request], 1, fast=False)
    return _response(lane), _response(routed)


def _response(sent: bytes) -> httpx.Response:
    """The one HTTP/1.1 response in ``sent`` (request IDs made by the server normalised)."""
    head, body = _normalised(sent).split(b"\r\n\r\n", 1)
    status_line, *lines = head.split(b"\r\n")
    fields = [tuple(line.split(b": ", 1)) for line in lines]
    body = body.removesuffix(b"\n[closed]")
    return httpx.Response(int(status_line.split()[1]), headers=fields, content=body)


def _same(fast: httpx.Response, routed: httpx.Response) -> None:
    assert fast.status_code == routed.status_code, (fast.text, routed.text)
    assert fast.content == routed.content
    assert sorted(fast.headers.multi_items()) == sorted(routed.headers.multi_items())


@pytest.mark.parametrize(
    ("path", "body", "headers", "status"),
    [
        ("/v2/models/mlp/infer", JSON_BODY, {}, 200),
        ("/v2/models/mlp/versions/1/infer", JSON_BODY, {}, 200),
        ("/v2/models/mlp/infer/", JSON_BODY, {}, 200),  # Litestar normalises the path
        (
            "/v2/models/mlp/infer",
            BINARY_BODY,
            {"Inference-Header-Content-Length": str(len(HEADER))},
            200,
        ),
        ("/v2/models/nope/infer", JSON_BODY, {}, 404),
        ("/v2/models/mlp/versions/7/infer", JSON_BODY, {}, 404),
        ("/v2/models/mlp/infer", b"{not json", {}, 400),
        ("/v2/models/mlp/infer", JSON_BODY, {"Content-Encoding": "br"}, 415),
        ("/v2/models/mlp/infer", JSON_BODY, {"Host": "bad host"}, 400),
        ("/v2/models/mlp/ready", b"", {}, 405),  # another route: Litestar's 405
        ("/v2/models/mlp/infer/more", JSON_BODY, {}, 404),
    ],
)
async def test_answers_as_litestars_route_does(
    app: InferenceApp, path: str, body: bytes, headers: dict[str, str], status: int
) -> None:
    fast, routed = await _both(app, "POST", path, body, **headers)
    assert fast.status_code == status, fast.text
    _same(fast, routed)
    if status >= 400:
        assert "error" in fast.json()


async def test_other_methods_and_routes_stay_litestars(app: InferenceApp) -> None:
    for method, path in (("GET", "/v2/models/mlp/infer"), ("OPTIONS", "/v2/models/mlp/infer")):
        fast, routed = await _both(app, method, path)
        _same(fast, routed)
    fast, _ = await _both(app, "GET", "/v2/models/mlp/infer")
    assert fast.status_code == 405
    metadata, _ = await _both(app, "GET", "/v2/models/mlp")
    assert metadata.json()["name"] == "mlp"


async def test_paths_are_learnt_from_litestars_router_and_bounded(
    app: InferenceApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(front, "MAX_PATHS", 3)
    for name in ("a", "b", "c", "d", "e"):
        fast, routed = await _both(app, "POST", f"/v2/models/{name}/infer", JSON_BODY)
        assert fast.status_code == 404
        _same(fast, routed)
    assert 0 < len(app._routes) <= 3
    fast, _ = await _both(app, "POST", "/v2/models/mlp/infer", JSON_BODY)
    assert fast.status_code == 200
    assert np.asarray(fast.json()["outputs"][0]["data"]).shape == (4,)


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
@pytest.mark.parametrize(
    "data",
    [
        [0.5, -1.25, 3.0e4, 1e-8],
        [1e39, 0.5, 0.0, 1.0],  # over FP16 and FP32
        [float("nan"), 1.0, 2.0, 3.0],
        [1.0, 2, 3.0, 4.0],  # an int among floats
        [True, 1.0, 2.0, 3.0],
        [[0.5, 1.0], [2.0, 3.0]],  # nested
        ["NaN", 1.0, 2.0, 3.0],
    ],
)
def test_flat_floats_decode_as_the_general_way_does(datatype: str, data: list[Any]) -> None:
    """The flat-floats shortcut of ``json_data_to_array`` gives what the general way gives:
    the same array, or the same refusal (the general way is forced with a tuple)."""

    def decode(values: Any) -> np.ndarray | str:
        try:
            return v2_json.json_data_to_array("x", lookup(datatype), (2, 2), values)
        except InvalidArgument as exc:
            return exc.message

    fast = decode(data)
    general = decode(_general(data))
    if isinstance(fast, str) or isinstance(general, str):
        assert fast == general
    else:
        assert fast.dtype == general.dtype and fast.shape == general.shape
        np.testing.assert_array_equal(fast, general)


class _general(list[Any]):
    """The same values in a list subclass: ``type(data) is list`` is false, so the shortcut is
    skipped and the general way runs."""


# -- the answer at the connection (servekit.http.inference_lane) ----------------------------------
# The same application behind the edge's protocol (app/servekit/http/connection.py) over a
# transport that
# records what would be sent, fed raw HTTP/1.1 bytes as a socket would feed them: once with the
# inference routes answered at the connection, once with every request through uvicorn's ASGI
# cycle. The bytes sent must be the same (the Date header's value and a made-up request ID
# aside), and the ASGI application must be reached exactly when the request is not plainly the
# common case.

REQUEST_ID = re.compile(rb"\r\nx-request-id: (?!client-id\r\n)[^\r]*")
DATE = re.compile(rb"\r\ndate: [^\r]*")


async def _over_connection(
    app: InferenceApp, chunks: list[bytes], answers: int, fast: bool
) -> tuple[bytes, int]:
    """What the edge sends back for ``chunks`` (each one read from the socket), once
    ``answers`` responses are done (and ``[closed]`` if it closed the connection); and how
    many requests reached the ASGI application."""
    reached = [0]

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        reached[0] += 1
        await app(scope, receive, send)

    config = uvicorn.Config(counted, lifespan="off", log_config=None, access_log=False)
    config.load()  # uvicorn's own wrapping: the proxy-headers middleware

    class Protocol(EdgeProtocol):
        edge = EdgeState(NetworkLimits(), 100)
        lane = fast_answer(app) if fast else None

    wire = Wire()
    state = ServerState()
    state.default_headers = [(b"date", b"Thu, 26 Nov 2026 00:00:00 GMT")]  # as uvicorn's tick
    protocol = Protocol(config=config, server_state=state, app_state={})
    protocol.connection_made(wire)
    for chunk in chunks:
        protocol.data_received(chunk)
        await asyncio.sleep(0)  # a turn of the loop between reads, as between packets
    await async_wait_until(lambda: state.total_requests >= answers, what=f"{answers} answers")
    await async_wait_until(lambda: not state.tasks, what="the requests' tasks to end")
    sent = bytes(wire.sent) + (b"\n[closed]" if wire.closing else b"")
    protocol.connection_lost(None)
    return sent, reached[0]


def _post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: servekit", f"content-length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _normalised(sent: bytes) -> bytes:
    return REQUEST_ID.sub(b"\r\nx-request-id: made", DATE.sub(b"\r\ndate: now", sent))


JSON_POST = _post("/v2/models/mlp/infer", JSON_BODY)
BINARY_POST = _post(
    "/v2/models/mlp/infer", BINARY_BODY, f"inference-header-content-length: {len(HEADER)}"
)
GZIPPED = gzip.compress(JSON_BODY)


@pytest.mark.parametrize(
    ("chunks", "answers", "asgi"),
    [
        ([JSON_POST], 1, 0),
        ([BINARY_POST], 1, 0),
        ([_post("/v2/models/mlp/versions/1/infer", JSON_BODY, "x-request-id: client-id")], 1, 0),
        ([_post("/v2/models/mlp/infer/", JSON_BODY)], 1, 0),  # normalised as Litestar does
        # pipelined: answered in order (the two behind the first by Litestar's route)
        ([JSON_POST + BINARY_POST + JSON_POST], 3, 2),
        ([JSON_POST[:40], JSON_POST[40:-10], JSON_POST[-10:]], 1, 0),  # body still arriving
        ([_post("/v2/models/mlp/infer", JSON_BODY, "connection: close")], 1, 0),
        ([JSON_POST.replace(b"HTTP/1.1", b"HTTP/1.0")], 1, 0),  # no keep-alive: closed
        ([_post("/v2/models/mlp/infer", GZIPPED, "content-encoding: gzip")], 1, 1),  # coded
        # failures: Litestar's answers, through the application
        ([_post("/v2/models/nope/infer", JSON_BODY)], 1, 1),
        ([_post("/v2/models/mlp/versions/7/infer", JSON_BODY)], 1, 1),
        ([_post("/v2/models/mlp/infer", b"{not json")], 1, 1),
        ([_post("/v2/models/mlp/infer", JSON_BODY, "content-encoding: br")], 1, 1),
        ([JSON_POST.replace(b"host: servekit", b"host: bad host")], 1, 1),
        ([_post("/v2/models/mlp/infer", b"{not json") + JSON_POST], 2, 1),
        # not the plain case: the ASGI way
        ([_post("/v2/models/mlp/infer", JSON_BODY, "x-forwarded-for: 10.1.2.3")], 1, 1),
        ([_post("/v2/models/mlp/infer", JSON_BODY, "expect: 100-continue")], 1, 1),
        ([_post("/v2/models/mlp/ready", b"")], 1, 1),
        ([b"GET /v2/models/mlp/infer HTTP/1.1\r\nhost: servekit\r\n\r\n"], 1, 1),
    ],
)
async def test_the_connection_answers_as_the_asgi_cycle_does(
    app: InferenceApp, chunks: list[bytes], answers: int, asgi: int
) -> None:
    fast, reached = await _over_connection(app, chunks, answers, fast=True)
    general, through = await _over_connection(app, chunks, answers, fast=False)
    assert _normalised(fast) == _normalised(general)
    assert through == answers  # every request through the application...
    assert reached == asgi  # ...and with the answer at the connection, only these
    assert len(re.findall(rb"HTTP/1\.1 [2-5]\d\d ", fast)) == answers


async def test_tracing_takes_the_asgi_way_and_the_access_log_does_not(
    app: InferenceApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The access log counts the fast answer at the edge (it tells the counting writer what it
    wrote); tracing wraps the cycle's ``send``, so its requests go the ASGI way."""
    monkeypatch.setattr(ACCESS, "mode", "on")
    lines: list[AccessLine] = []
    monkeypatch.setattr(ACCESS, "write", lines.append)
    fast, reached = await _over_connection(app, [JSON_POST], 1, fast=True)
    assert reached == 0 and fast.startswith(b"HTTP/1.1 200 OK\r\n")
    (line,) = lines
    body = fast.split(b"\r\n\r\n", 1)[1]
    assert (line.protocol, line.method, line.path, line.status) == (
        "HTTP", "POST", "/v2/models/mlp/infer", 200,
    )  # fmt: skip
    assert line.bytes_in > 0 and line.bytes_out == len(body)
    monkeypatch.setattr(ACCESS, "mode", "off")
    monkeypatch.setattr(TRACING, "on", True)
    monkeypatch.setattr(request_ids.traces, "begin", lambda cycle, info: None)
    _, reached = await _over_connection(app, [JSON_POST], 1, fast=True)
    assert reached == 1


async def test_a_token_is_checked_at_the_connection(serve: Serve, tmp_path: Path) -> None:
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
    services = await serve(
        "server:\n  auth:\n    inference: infer-token-for-tests\n"
        "models:\n  - name: mlp\n    modelFormat: {name: onnx}\n    storageUri: ./mlp.onnx\n"
    )
    app = services.kit.http_app()
    for token, status, asgi in (("", 401, 1), ("wrong", 401, 1), ("infer-token-for-tests", 200, 0)):
        post = _post("/v2/models/mlp/infer", JSON_BODY, f"authorization: Bearer {token}")
        fast, reached = await _over_connection(app, [post], 1, fast=True)
        general, _ = await _over_connection(app, [post], 1, fast=False)
        assert fast.startswith(b"HTTP/1.1 %d " % status)
        assert _normalised(fast) == _normalised(general)
        assert reached == asgi


def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    app = InferenceApp()
    assert fast_answer(app) is not None
    assert fast_answer(Litestar()) is None
    monkeypatch.setenv(fast.SWITCH, "0")
    assert fast_answer(app) is None
