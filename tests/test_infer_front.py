"""The inference front (servekit.rest.front): ``POST /v2/models/{m}[/versions/{v}]/infer`` is
answered before Litestar's routing, and every answer is the one Litestar's own route gives.

In process: the real application of a ServeKit (every route), called through httpx's ASGI
transport twice per case, once as served (the front) and once through Litestar alone
(``Litestar.__call__``, the routing every request took before the front), and the two answers
compared: status, headers and body. No listener; the edge's own checks are tested elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnx_builders
import pytest
from inprocess import Serve
from litestar import Litestar

from servekit.codecs import v2_json
from servekit.datatypes import lookup
from servekit.errors import InvalidArgument
from servekit.rest import front
from servekit.rest.front import InferenceApp

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


class _LitestarOnly:
    """The same application, every request routed by Litestar (the front skipped)."""

    def __init__(self, app: InferenceApp) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await Litestar.__call__(self.app, scope, receive, send)


async def _both(
    app: InferenceApp, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[httpx.Response, httpx.Response]:
    answers = []
    for asgi in (app, _LitestarOnly(app)):
        transport = httpx.ASGITransport(app=asgi)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://servekit") as http:
            answers.append(await http.request(method, path, content=body, headers=headers))
    return answers[0], answers[1]


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
