"""The inference route answers on its own (servekit.rest.infer), yet keeps Litestar's behaviour:
the body limit (announced or streamed), 405 with Allow, OPTIONS, chunked bodies, {"error": ...}.

One real ``servekit serve`` subprocess with ``maxRequestBytes`` at its minimum (1024), driven
with httpx (raw bodies, chunked uploads) and tritonclient.http.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import onnx
import onnx_builders
import pytest
import tritonclient.http as httpclient
from servers import ServerProcess, running_server

pytestmark = pytest.mark.slow

CONFIG = """
server: {maxRequestBytes: 1024}
models:
  - name: mlp
    modelFormat: {name: onnx}
    storageUri: ./mlp.onnx
"""
INFER = "/v2/models/mlp/infer"
VALID = b'{"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": %s}]}' % (
    str([0.5] * 16).encode()
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("infer_route")
    onnx.save(onnx_builders.mlp(), str(root / "mlp.onnx"))
    (root / "serve.yaml").write_text(CONFIG)
    with running_server(root / "serve.yaml", grpc=False) as process:
        yield process


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        yield http
    server.assert_healthy()


def _json_body(x: np.ndarray) -> dict[str, object]:
    return {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": x.tolist()}]}


def test_tritonclient_json_and_binary(server: ServerProcess) -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 16) / 16
    client = httpclient.InferenceServerClient(server.http_host_port)
    try:
        results = []
        for binary in (False, True):
            tensor = httpclient.InferInput("input", [1, 16], "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            wanted = httpclient.InferRequestedOutput("output", binary_data=binary)
            results.append(client.infer("mlp", [tensor], outputs=[wanted]).as_numpy("output"))
    finally:
        client.close()
    assert results[0].shape == (1, 4)
    np.testing.assert_array_equal(results[0], results[1])


def test_announced_body_over_the_limit_is_413(client: httpx.Client) -> None:
    reply = client.post(INFER, content=b"x" * 2000)
    assert reply.status_code == 413
    assert reply.json() == {"error": "Request Entity Too Large"}


def test_streamed_body_over_the_limit_is_413(client: httpx.Client) -> None:
    chunks = iter([b"x" * 600, b"x" * 600])  # no Content-Length: chunked transfer
    reply = client.post(INFER, content=chunks)
    assert reply.status_code == 413
    assert reply.json() == {"error": "Request Entity Too Large"}


def test_chunked_body_within_the_limit_is_served(client: httpx.Client) -> None:
    body = httpx.Request("POST", "/", json=_json_body(np.zeros(16, dtype=np.float32))).content
    reply = client.post(INFER, content=iter([body[:50], body[50:]]))
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["shape"] == [1, 4]


def test_other_methods_get_405_with_allow_and_options_answers(client: httpx.Client) -> None:
    for method in ("GET", "PUT", "DELETE"):
        reply = client.request(method, INFER)
        assert reply.status_code == 405
        assert reply.json() == {"error": "Method Not Allowed"}
        assert set(reply.headers["allow"].replace(" ", "").split(",")) == {"POST", "OPTIONS"}
    reply = client.options(INFER)
    assert reply.status_code == 204
    assert "POST" in reply.headers["allow"]


@pytest.mark.parametrize(
    ("path", "body", "headers", "status"),
    [
        ("/v2/models/nope/infer", VALID, {}, 404),
        ("/v2/models/mlp/versions/7/infer", VALID, {}, 404),
        (INFER, b'{"inputs": [', {}, 400),
        (INFER, b"{}", {"Inference-Header-Content-Length": "x"}, 400),
        (INFER, b"{}", {"Inference-Header-Content-Length": "9"}, 400),
    ],
)
def test_errors_are_json(
    client: httpx.Client, path: str, body: bytes, headers: dict[str, str], status: int
) -> None:
    reply = client.post(path, content=body, headers=headers)
    assert reply.status_code == status
    assert set(reply.json()) == {"error"}
