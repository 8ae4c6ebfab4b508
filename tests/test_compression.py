"""Compressed HTTP bodies end to end: tritonclient's request/response compression, curl,
KServe V1 and grps, and the decoded-size limits (a zip bomb is refused, not inflated).

Checked against the same server's uncompressed answers.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from servers import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

ROWS = np.random.default_rng(11).standard_normal((3, 16)).astype(np.float32)
COMPRESS = {"gzip": gzip.compress, "deflate": zlib.compress}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.http_host_port) as connected:
        yield connected


def mlp_inputs(binary: bool, rows: np.ndarray = ROWS) -> list[httpclient.InferInput]:  # type: ignore[type-arg]
    tensor = httpclient.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    return [tensor]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("request_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_coding", [None, "gzip", "deflate"])
def test_tritonclient_compression(
    client: httpclient.InferenceServerClient,
    binary: bool,
    request_coding: str | None,
    response_coding: str | None,
) -> None:
    plain = client.infer("mlp", mlp_inputs(binary)).as_numpy("output")
    result = client.infer(
        "mlp",
        mlp_inputs(binary),
        outputs=[httpclient.InferRequestedOutput("output", binary_data=binary)],
        request_compression_algorithm=request_coding,
        response_compression_algorithm=response_coding,
    )
    np.testing.assert_array_equal(result.as_numpy("output"), plain)


def _v2_body(rows: np.ndarray) -> bytes:  # type: ignore[type-arg]
    inputs = [{"name": "input", "datatype": "FP32", "shape": list(rows.shape),
               "data": rows.reshape(-1).tolist()}]  # fmt: skip
    return json.dumps({"inputs": inputs}).encode()


def test_large_response_is_compressed_when_asked(http: httpx.Client) -> None:
    rows = np.zeros((64, 16), dtype=np.float32)
    body = _v2_body(rows)
    plain = http.post("/v2/models/mlp/infer", content=body, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    for coding in ("gzip", "deflate"):
        answer = http.post(
            "/v2/models/mlp/infer", content=body, headers={"Accept-Encoding": coding}
        )
        assert answer.status_code == 200
        assert answer.headers["content-encoding"] == coding
        assert int(answer.headers["content-length"]) < len(plain.content)
        assert answer.json() == plain.json()  # httpx decodes both codings
    refused = http.post(
        "/v2/models/mlp/infer", content=body, headers={"Accept-Encoding": "gzip;q=0, br"}
    )
    assert "content-encoding" not in refused.headers and refused.json() == plain.json()


def test_small_response_stays_plain(http: httpx.Client) -> None:
    answer = http.post(
        "/v2/models/mlp/infer",
        content=_v2_body(ROWS[:1]),
        headers={"Accept-Encoding": "gzip"},
    )
    assert answer.status_code == 200 and "content-encoding" not in answer.headers


def test_curl_gzip_body(server: ServerProcess, tmp_path: Path) -> None:
    expected = httpx.post(server.http_url + "/v2/models/mlp/infer", content=_v2_body(ROWS))
    packed = tmp_path / "body.gz"
    packed.write_bytes(gzip.compress(_v2_body(ROWS)))
    done = subprocess.run(
        ["curl", "-sS", "--max-time", "30", "-H", "Content-Encoding: gzip",
         "-H", "Content-Type: application/json", "--data-binary", f"@{packed}",
         "--compressed", server.http_url + "/v2/models/mlp/infer"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(done.stdout) == expected.json()


def test_unknown_coding_is_415_naming_it(http: httpx.Client) -> None:
    for path in ("/v2/models/mlp/infer", "/v1/models/mlp:predict", "/grps/v1/infer/predict"):
        answer = http.post(path, content=b"{}", headers={"Content-Encoding": "br"})
        assert answer.status_code == 415, (path, answer.text)
        assert "'br'" in answer.text


def test_corrupt_or_truncated_body_is_400(http: httpx.Client) -> None:
    packed = gzip.compress(_v2_body(ROWS))
    for body in (b"not gzip at all", packed[: len(packed) // 2], packed + b"junk"):
        answer = http.post(
            "/v2/models/mlp/infer", content=body, headers={"Content-Encoding": "gzip"}
        )
        assert answer.status_code == 400, answer.text
        assert "gzip" in answer.json()["error"]


def test_v1_predict_gzip(http: httpx.Client) -> None:
    body = json.dumps({"instances": ROWS.tolist()}).encode()
    plain = http.post("/v1/models/mlp:predict", content=body)
    for coding, pack in COMPRESS.items():
        answer = http.post(
            "/v1/models/mlp:predict", content=pack(body), headers={"Content-Encoding": coding}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json() == plain.json()


def test_grps_predict_gzip(http: httpx.Client) -> None:
    body = json.dumps({"model": "identity_bytes", "str_data": "gzip grps"}).encode()
    for coding, pack in COMPRESS.items():
        answer = http.post(
            "/grps/v1/infer/predict", content=pack(body), headers={"Content-Encoding": coding}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["str_data"] == "gzip grps"


# -- limits on the decoded size ------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_limits(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server whose bodies may be 64 KiB (JSON 16 KiB) decoded."""
    folder = tmp_path_factory.mktemp("limits")
    config = folder / "serve.yaml"
    models = model_store.parent
    config.write_text(
        "server: {maxRequestBytes: 65536, maxJsonRequestBytes: 16384}\n"
        f"models:\n  - {{name: mlp, modelFormat: {{name: onnx}}, storageUri: {models}/mlp}}\n"
    )
    with running_server(config, grpc=False) as server:
        yield server.http_host_port


def _bomb(mebibytes: int) -> bytes:
    """gzip of ``mebibytes`` MiB of zeros (about 1000:1), built a MiB at a time."""
    encoder = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1024 * 1024)
    return b"".join(encoder.compress(zeros) for _ in range(mebibytes)) + encoder.flush()


def test_zip_bomb_is_refused_with_413(small_limits: str) -> None:
    bomb = _bomb(256)
    client = httpclient.InferenceServerClient(small_limits)
    with httpx.Client(base_url=f"http://{small_limits}", timeout=30) as http:
        for headers in ({}, {"Inference-Header-Content-Length": "10"}):
            answer = http.post(
                "/v2/models/mlp/infer",
                content=bomb,
                headers={"Content-Encoding": "gzip", **headers},
            )
            assert answer.status_code == 413, answer.text
        # JSON: the decoded size is held to maxJsonRequestBytes, a small compressed body or not
        rows = np.zeros((400, 16), dtype=np.float32)
        packed = gzip.compress(_v2_body(rows))
        assert len(packed) < 16384 < len(_v2_body(rows))
        answer = http.post(
            "/v2/models/mlp/infer", content=packed, headers={"Content-Encoding": "gzip"}
        )
        assert answer.status_code == 413 and "maxJsonRequestBytes" in answer.text
        # binary under the limit once decoded: fine
        result = client.infer("mlp", mlp_inputs(True, rows), request_compression_algorithm="gzip")
        assert result.as_numpy("output").shape[0] == 400
        with pytest.raises(InferenceServerException, match="Too Large"):
            big = np.zeros((2048, 16), dtype=np.float32)
            client.infer("mlp", mlp_inputs(True, big), request_compression_algorithm="gzip")
    client.close()


def test_v1_and_grps_answers_compressed_when_asked(http: httpx.Client) -> None:
    rows = np.random.default_rng(3).standard_normal((64, 16)).astype(np.float32)
    body = json.dumps({"instances": rows.tolist()}).encode()
    grps_body = {"model": "identity_bytes", "str_data": "grps " * 400}
    plain_v1 = http.post("/v1/models/mlp:predict", content=body, headers={"Accept-Encoding": ""})
    plain_grps = http.post(
        "/grps/v1/infer/predict", json=grps_body, headers={"Accept-Encoding": ""}
    )
    assert "content-encoding" not in plain_v1.headers
    assert "content-encoding" not in plain_grps.headers
    for coding in ("gzip", "deflate"):
        asked = {"Accept-Encoding": coding}
        v1 = http.post("/v1/models/mlp:predict", content=body, headers=asked)
        assert v1.headers["content-encoding"] == coding and v1.json() == plain_v1.json()
        grps = http.post("/grps/v1/infer/predict", json=grps_body, headers=asked)
        assert grps.headers["content-encoding"] == coding and grps.json() == plain_grps.json()
        assert int(grps.headers["content-length"]) < len(plain_grps.content)
