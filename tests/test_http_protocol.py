"""The HTTP surface as plain HTTP clients (curl, httpx) see it: raw and binary bodies, bad
bodies and headers, KServe V1, health bodies, and ``{"error": ...}`` on every failure."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from servers import ServerProcess

pytestmark = pytest.mark.slow

HEADER = "Inference-Header-Content-Length"


def _mlp(store: Path, rows: np.ndarray, version: int = 2) -> np.ndarray:
    session = ort.InferenceSession(str(store.parent / "mlp" / str(version) / "model.onnx"))
    return np.asarray(session.run(None, {"input": rows})[0])


def _split(body: bytes, header_length: int) -> tuple[dict[str, Any], bytes]:
    return json.loads(body[:header_length]), body[header_length:]


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    message = response.json()["error"]
    assert isinstance(message, str) and message
    return message


def test_raw_binary_request_with_curl(
    server: ServerProcess, model_store: Path, tmp_path: Path
) -> None:
    """Header length 0: the body is the model's single input; the answer is binary too."""
    rows = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    (tmp_path / "body.bin").write_bytes(rows.tobytes())
    done = subprocess.run(
        ["curl", "-sS", "--max-time", "30", "-D", str(tmp_path / "headers.txt"),
         "-o", str(tmp_path / "answer.bin"), "-w", "%{http_code}",
         "-H", f"{HEADER}: 0", "-H", "Content-Type: application/octet-stream",
         "--data-binary", f"@{tmp_path / 'body.bin'}",
         f"{server.http_url}/v2/models/mlp/versions/2/infer"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout == "200", done.stderr
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (
            line.partition(":") for line in (tmp_path / "headers.txt").read_text().splitlines()[1:]
        )
        if k.strip()
    }
    header, data = _split((tmp_path / "answer.bin").read_bytes(), int(headers[HEADER.lower()]))
    assert header["model_name"] == "mlp" and header["model_version"] == "2"
    outputs: list[dict[str, Any]] = header["outputs"]
    (output,) = outputs
    assert output["name"] == "output" and output["shape"] == [3, 4] and output["datatype"] == "FP32"
    assert output["parameters"]["binary_data_size"] == len(data) == 3 * 4 * 4
    got = np.frombuffer(data, dtype="<f4").reshape(3, 4)
    np.testing.assert_allclose(got, _mlp(model_store, rows), rtol=1e-5, atol=1e-6)


def test_raw_binary_request_needs_a_single_input_model(http: httpx.Client) -> None:
    response = http.post("/v2/models/add_sub/infer", content=b"\0" * 128, headers={HEADER: "0"})
    assert "one input" in _error(response, 400)


def test_raw_binary_request_of_the_wrong_size(http: httpx.Client) -> None:
    response = http.post("/v2/models/mlp/infer", content=b"\0" * 10, headers={HEADER: "0"})
    _error(response, 400)


def _binary_body(header: dict[str, object], data: bytes) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    return text + data, {HEADER: str(len(text)), "Content-Type": "application/octet-stream"}


@pytest.mark.parametrize("shape", [[2**40, 16], [2**62, 2**62], [-1, 16], [4, -4], [2**64, 1]])
def test_absurd_shape_in_a_binary_request_is_refused(http: httpx.Client, shape: list[int]) -> None:
    entry: dict[str, Any] = {"name": "input", "shape": shape, "datatype": "FP32"}
    entry["parameters"] = {"binary_data_size": 64}
    body, headers = _binary_body({"inputs": [entry]}, b"\0" * 64)
    _error(http.post("/v2/models/mlp/infer", content=body, headers=headers), 400)


@pytest.mark.parametrize("shape", [[2**40, 16], [2**31, 2**31, 16]])
def test_absurd_shape_in_a_json_request_is_refused(http: httpx.Client, shape: list[int]) -> None:
    request = {
        "inputs": [{"name": "input", "shape": shape, "datatype": "FP32", "data": [0.0] * 16}]
    }
    _error(http.post("/v2/models/mlp/infer", json=request), 400)


def test_binary_sizes_must_match_the_body(http: httpx.Client) -> None:
    entry = {
        "name": "input",
        "shape": [1, 16],
        "datatype": "FP32",
        "parameters": {"binary_data_size": 64},
    }
    short, headers = _binary_body({"inputs": [entry]}, b"\0" * 32)
    _error(http.post("/v2/models/mlp/infer", content=short, headers=headers), 400)
    long, headers = _binary_body({"inputs": [entry]}, b"\0" * 80)
    _error(http.post("/v2/models/mlp/infer", content=long, headers=headers), 400)
    wrong = {**entry, "parameters": {"binary_data_size": 60}}
    body, headers = _binary_body({"inputs": [wrong]}, b"\0" * 60)
    _error(http.post("/v2/models/mlp/infer", content=body, headers=headers), 400)


@pytest.mark.parametrize("value", [str(10**12), "-5", "abc", "1e3", ""])
def test_bad_inference_header_content_length(http: httpx.Client, value: str) -> None:
    body = json.dumps({"inputs": []}).encode()
    response = http.post("/v2/models/mlp/infer", content=body, headers={HEADER: value})
    assert "Inference-Header-Content-Length" in _error(response, 400)


@pytest.mark.parametrize(
    "body", [b"{", b"not json", b'{"inputs": [', b"\xff\xfe", b"", b'{"inputs": [NaN]}']
)
def test_malformed_json(http: httpx.Client, body: bytes) -> None:
    response = http.post(
        "/v2/models/mlp/infer", content=body, headers={"Content-Type": "application/json"}
    )
    _error(response, 400)


@pytest.mark.parametrize("body", ["[]", '"inputs"', "42", "null", "true", '{"inputs": {}}', "{}"])
def test_json_body_that_is_not_a_request_object(http: httpx.Client, body: str) -> None:
    response = http.post(
        "/v2/models/mlp/infer", content=body, headers={"Content-Type": "application/json"}
    )
    _error(response, 400)


def test_json_data_count_must_match_the_shape(http: httpx.Client) -> None:
    request = {
        "inputs": [{"name": "input", "shape": [2, 16], "datatype": "FP32", "data": [0.0] * 31}]
    }
    assert "32" in _error(http.post("/v2/models/mlp/infer", json=request), 400)


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "application/json; charset=utf-8",
        "text/plain",
        "application/octet-stream",
    ],
)
def test_content_type_does_not_matter_for_json_bodies(
    http: httpx.Client, model_store: Path, content_type: str | None
) -> None:
    """Like Triton, the body decides (JSON unless Inference-Header-Content-Length is set)."""
    rows = np.arange(32, dtype=np.float32).reshape(2, 16) / 32
    request = {
        "id": "ct",
        "inputs": [
            {"name": "input", "shape": [2, 16], "datatype": "FP32", "data": rows.ravel().tolist()}
        ],
    }
    headers = {"Content-Type": content_type} if content_type else {}
    response = http.post("/v2/models/mlp/infer", content=json.dumps(request), headers=headers)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["id"] == "ct"
    got = np.array(answer["outputs"][0]["data"], dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(got, _mlp(model_store, rows), rtol=1e-5, atol=1e-6)


def test_health_bodies(http: httpx.Client) -> None:
    live, ready = http.get("/v2/health/live"), http.get("/v2/health/ready")
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert (ready.status_code, ready.json()) == (200, {"ready": True})
    assert http.get("/v2/models/mlp/ready").json()["ready"] is True
    assert http.get("/v2/models/broken_lfs/ready").status_code != 200


def test_wrong_method_is_405(http: httpx.Client) -> None:
    _error(http.get("/v2/models/mlp/infer"), 405)
    _error(http.delete("/v2/health/live"), 405)


@pytest.mark.parametrize("path", ["/nope", "/v2/nope", "/v2/models/mlp/versions/1/nope", "/v3"])
def test_unknown_route_is_404(http: httpx.Client, path: str) -> None:
    _error(http.get(path), 404)
    _error(http.post(path, json={}), 404)


def test_v1_models(http: httpx.Client) -> None:
    names = http.get("/v1/models").json()["models"]
    assert {"mlp", "add_sub", "identity_fp32", "broken_lfs"} <= set(names)
    assert http.get("/v1/models/mlp").json() == {"name": "mlp", "ready": True}
    _error(http.get("/v1/models/no_such_model"), 404)


def test_v1_predict(http: httpx.Client, model_store: Path) -> None:
    rows = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    response = http.post("/v1/models/mlp:predict", json={"instances": rows.tolist()})
    assert response.status_code == 200, response.text
    got = np.array(response.json()["predictions"], dtype=np.float32)
    np.testing.assert_allclose(got, _mlp(model_store, rows), rtol=1e-5, atol=1e-6)


def test_v1_predict_errors(http: httpx.Client) -> None:
    _error(http.post("/v1/models/no_such_model:predict", json={"instances": [[0.0] * 16]}), 404)
    _error(http.post("/v1/models/mlp:predict", json={"inputs": [[0.0] * 16]}), 400)
    _error(http.post("/v1/models/mlp:predict", json={"instances": [[0.0] * 15]}), 400)
    _error(http.post("/v1/models/mlp:predict", content=b"{"), 400)
    _error(http.post("/v1/models/broken_lfs:predict", json={"instances": [[0.0]]}), 503)
