"""V1 and grps JSON bodies follow the V2 JSON rules: bounded by ``server.maxJsonRequestBytes``
(413 before the body is read, with the way out named), and from ``large.OFF_LOOP_BYTES``
decoded in a worker thread (V1) while the loop keeps answering.

A server of its own: one identity model, a 2 MiB JSON limit (above the 1 MiB off-loop
threshold) and an 8 MiB body limit, so bodies on each side of each bound are small.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import httpx
import numpy as np
import onnx
import onnx_builders
import orjson
import pytest
from servers import ServerProcess, start_server

from servekit.http import large

pytestmark = pytest.mark.slow

JSON_LIMIT = 2 * 1024 * 1024
BODY_LIMIT = 8 * 1024 * 1024


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    models = tmp_path_factory.mktemp("limits") / "models"
    models.mkdir()
    onnx.save(onnx_builders.identity("FP32"), str(models / "identity.onnx"))
    config = models / "serve.yaml"
    config.write_text(
        f"server: {{maxJsonRequestBytes: {JSON_LIMIT}, maxRequestBytes: {BODY_LIMIT}}}\n"
        "models:\n  - {name: identity, modelFormat: {name: onnx}, storageUri: identity.onnx}\n"
    )
    server = start_server(config, grpc=False)
    yield server
    assert server.stop() == 0, server.log()


def _json_of_size(size: int) -> bytes:
    """A V1 body (one row of floats) of at least ``size`` bytes."""
    count = size // 9 + 1
    return b'{"instances": [[' + b",".join([b"0.1234567"] * count) + b"]]}"


def test_v1_json_over_the_json_limit_is_413(limited: ServerProcess) -> None:
    with limited.http_client(timeout=30) as client:
        answer = client.post(
            "/v1/models/identity:predict",
            content=_json_of_size(JSON_LIMIT + 1),
            headers={"content-type": "application/json"},
        )
    assert answer.status_code == 413, answer.text
    assert "server.maxJsonRequestBytes" in answer.json()["error"]


def test_grps_json_over_the_json_limit_is_413(limited: ServerProcess) -> None:
    body = b'{"str_data": "' + b"x" * (JSON_LIMIT + 1) + b'"}'
    with limited.http_client(timeout=30) as client:
        answer = client.post(
            "/grps/v1/infer/predict", content=body, headers={"content-type": "application/json"}
        )
        metadata = client.post(
            "/grps/v1/metadata/model", content=body, headers={"content-type": "application/json"}
        )
    for reply in (answer, metadata):
        assert reply.status_code == 413, reply.text
        status = reply.json()["status"]
        assert status["code"] == 413 and status["status"] == "FAILURE"
        assert "server.maxJsonRequestBytes" in status["msg"]


def test_grps_binary_is_bounded_by_the_body_limit_only(limited: ServerProcess) -> None:
    """bin_data bodies are not JSON: over the JSON limit is fine, over maxRequestBytes is not."""
    with limited.http_client(timeout=30) as client:
        octets = {"content-type": "application/octet-stream"}
        under = client.post(
            "/grps/v1/infer/predict", content=b"\0" * (JSON_LIMIT * 2), headers=octets
        )
        over = client.post(
            "/grps/v1/infer/predict", content=b"\0" * (BODY_LIMIT + 1), headers=octets
        )
    assert under.status_code != 413, under.text
    assert over.status_code == 413, over.text


def test_large_v1_json_is_decoded_right_while_health_answers(limited: ServerProcess) -> None:
    """Bodies between the off-loop threshold and the limit (decoded in a worker thread) give
    the same predictions; the loop answers health probes meanwhile."""
    rows, cols = 4, large.OFF_LOOP_BYTES // 40
    x = (np.random.default_rng(0).integers(-1024, 1024, (rows, cols)) / 1024).astype(np.float32)
    body = {"instances": x.tolist()}  # exact in float32, short in JSON
    assert large.OFF_LOOP_BYTES <= len(orjson.dumps(body)) < JSON_LIMIT
    url = f"{limited.http_url}/v1/models/identity:predict"

    def predict() -> np.ndarray:
        with httpx.Client(timeout=60) as client:
            reply = client.post(url, json=body)
            assert reply.status_code == 200, reply.text
            return np.asarray(reply.json()["predictions"], np.float32)

    probes: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(predict) for _ in range(3)]
        with limited.http_client(timeout=10) as client:
            while not all(f.done() for f in futures):
                start = time.perf_counter()
                assert client.get("/v2/health/live").status_code == 200
                probes.append(time.perf_counter() - start)
        results = [f.result() for f in futures]
    for result in results:
        np.testing.assert_array_equal(result, x)
    assert probes and max(probes) < 2.0  # generous: a shared 2-core machine
