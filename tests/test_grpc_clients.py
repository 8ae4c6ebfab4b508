"""tritonclient.grpc, sync and asyncio, against a real ``servekit serve`` process.

Results are checked against onnxruntime running the same model files (an independent oracle),
errors by their gRPC status and message; the RPCs servekit does not offer answer UNIMPLEMENTED
with a reason instead of gRPC's bare default.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from loops import run_in_own_loop
from servers import ServerProcess
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

ROWS = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    assert server.grpc_target is not None
    with grpcclient.InferenceServerClient(server.grpc_target) as connected:
        yield connected


def oracle(model_store: Path, version: int, rows: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
    path = model_store.parent / "mlp" / str(version) / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    result: np.ndarray = session.run(["output"], {"input": rows})[0]  # type: ignore[type-arg]
    return result


def mlp_input(rows: np.ndarray = ROWS) -> list[grpcclient.InferInput]:  # type: ignore[type-arg]
    tensor = grpcclient.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return [tensor]


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("broken_garbage")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "servekit"
    assert {"binary_tensor_data", "model_configuration", "statistics"} <= set(meta["extensions"])
    model = client.get_model_metadata("mlp", as_json=True)
    assert model["versions"] == ["1", "2"] and model["platform"] == "onnxruntime_onnx"
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "16"]}]


@pytest.mark.parametrize("version", ["", "1", "2"])
def test_infer_matches_onnxruntime(
    client: grpcclient.InferenceServerClient, model_store: Path, version: str
) -> None:
    result = client.infer("mlp", mlp_input(), model_version=version, request_id="r-7")
    response = result.get_response()
    assert response.model_version == (version or "2") and response.id == "r-7"
    expected = oracle(model_store, int(version or 2), ROWS)
    np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-5, atol=1e-6)


def test_requested_output_subset(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "FP32")
        inputs.append(tensor.set_data_from_numpy(a))
    wanted = [grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=wanted)
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert not result.as_numpy("OUTPUT1").any()


@pytest.mark.parametrize(
    ("model", "version", "status"),
    [
        ("no_such_model", "", "StatusCode.NOT_FOUND"),
        ("mlp", "7", "StatusCode.NOT_FOUND"),
        ("broken_lfs", "", "StatusCode.UNAVAILABLE"),
    ],
)
def test_errors_carry_status_and_message(
    client: grpcclient.InferenceServerClient, model: str, version: str, status: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, mlp_input(), model_version=version)
    assert info.value.status() == status
    assert model in info.value.message()


def test_absurd_shape_is_invalid_argument(client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("input", [2**40, 16], "FP32")
    tensor._raw_content = np.zeros(16, np.float32).tobytes()  # what a lying client would send
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [tensor])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_server_live()


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda c: c.get_trace_settings(), "trace"),
        (lambda c: c.get_log_settings(), "logging"),
    ],
)
def test_unoffered_rpcs_are_unimplemented_with_a_reason(
    client: grpcclient.InferenceServerClient, call: object, fragment: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        call(client)  # type: ignore[operator]
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert fragment in info.value.message()


def test_asyncio_client(server: ServerProcess, model_store: Path) -> None:
    async def run() -> None:
        assert server.grpc_target is not None
        async with aioclient.InferenceServerClient(server.grpc_target) as client:
            assert await client.is_server_ready()
            assert await client.is_model_ready("mlp", "1")
            batches = [ROWS * i for i in range(8)]
            results = await asyncio.gather(
                *(client.infer("mlp", mlp_input(b), model_version="1") for b in batches)
            )
            for rows, result in zip(batches, results, strict=True):
                expected = oracle(model_store, 1, rows)
                np.testing.assert_allclose(
                    result.as_numpy("output"), expected, rtol=1e-5, atol=1e-6
                )
            config = await client.get_model_config("mlp", as_json=True)
            assert config["config"]["name"] == "mlp"
            stats = await client.get_inference_statistics("mlp", "1", as_json=True)
            assert int(stats["model_stats"][0]["inference_count"]) >= len(batches)
            with pytest.raises(InferenceServerException) as info:
                await client.infer("no_such_model", mlp_input())
            assert info.value.status() == "StatusCode.NOT_FOUND"

    run_in_own_loop(run)


def test_classification_answers_the_top_classes(client: grpcclient.InferenceServerClient) -> None:
    """The classification extension (tests/test_classification.py has the details): a model
    that does not batch ranks its whole output, answered as BYTES "value:index"."""
    wanted = [grpcclient.InferRequestedOutput("output", class_count=2)]
    result = client.infer("mlp", mlp_input(), outputs=wanted)
    top = result.as_numpy("output")
    assert top is not None and top.shape == (2,)
    values = [float(item.decode().split(":")[0]) for item in top]
    assert values == sorted(values, reverse=True)
