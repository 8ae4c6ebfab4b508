"""The calls Triton's example programs make, driven by tritonclient against ``servekit serve``.

Issue 15 is done when Triton's example programs pass unmodified. Some are vendored, unmodified
and with their licence, in ``tests/triton_examples/`` and run as they are (the sequence and
ensemble programs: test_triton_sequence_examples.py, test_pipelines_e2e.py); for the rest this
module makes the same kinds of calls in its own words and keeps CI on them: a
server renamed in serve.yaml (the health/metadata programs check the name), health and metadata
with query parameters, the model-control round (load, a malformed override, a Triton override
with a number written as a string, unload, an unknown name), and the aio clients with gzip and
deflate in both directions. The model is Triton's ``simple`` (INT32 [-1, 16], sum and
difference, maxBatchSize 8) built as ONNX.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import onnx
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from servers import ServerProcess, start_server
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

SERVE_YAML = """
server: {name: triton}
models:
  - {name: simple, modelFormat: {name: onnx}, storageUri: ./simple, maxBatchSize: 8}
  - {name: control, modelFormat: {name: onnx}, storageUri: ./simple, maxBatchSize: 8}
"""

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), -3, dtype=np.int32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("examples")
    (root / "simple" / "1").mkdir(parents=True)
    onnx.save(onnx_builders.add_sub("INT32"), root / "simple" / "1" / "model.onnx")
    (root / "serve.yaml").write_text(SERVE_YAML)
    process = start_server(root / "serve.yaml")
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(params=["http", "grpc"])
def transport(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[tuple[Any, Any]]:
    """(client, tritonclient module) for one transport."""
    if request.param == "http":
        with httpclient.InferenceServerClient(server.http_host_port) as http:
            yield http, httpclient
    else:
        assert server.grpc_target is not None
        with grpcclient.InferenceServerClient(server.grpc_target) as grpc_client:
            yield grpc_client, grpcclient


def _inputs(module: Any, rows: int = 1) -> list[Any]:
    tensors = []
    for name, value in (("INPUT0", A), ("INPUT1", B)):
        tensor = module.InferInput(name, [rows, 16], "INT32")
        tensor.set_data_from_numpy(np.repeat(value, rows, axis=0))
        tensors.append(tensor)
    return tensors


def _config(client: Any, model: str) -> dict[str, Any]:
    if isinstance(client, httpclient.InferenceServerClient):
        return dict(client.get_model_config(model))
    return dict(client.get_model_config(model, as_json=True)["config"])


def test_health_and_metadata_as_the_examples_ask(transport: tuple[Any, Any]) -> None:
    client, module = transport
    if module is httpclient:
        # The HTTP program adds query parameters to these calls; they must be ignored.
        assert client.is_server_live(query_params={"test_1": 1, "test_2": 2})
        meta = client.get_model_metadata("simple", query_params={"test_1": 1})
        server_meta = client.get_server_metadata()
    else:
        assert client.is_server_live()
        meta = client.get_model_metadata("simple", as_json=True)
        server_meta = client.get_server_metadata(as_json=True)
    assert client.is_server_ready() and client.is_model_ready("simple")
    assert server_meta["name"] == "triton"  # server.name in serve.yaml
    assert meta["name"] == "simple"
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        client.get_model_metadata("no_such_model")


def test_model_control_round(transport: tuple[Any, Any]) -> None:
    client, module = transport
    client.load_model("control")
    assert client.is_model_ready("control")
    assert _config(client, "control")["max_batch_size"] == 8

    # Not JSON at all: refused with Triton's words, the model keeps serving.
    with pytest.raises(InferenceServerException, match="failed to load 'control'"):
        client.load_model("control", config='"parameters": {"config": {{"max_batch_size": 4}}}')
    assert client.is_model_ready("control")

    # Triton's JSON form of the model configuration writes 64-bit numbers as strings.
    client.load_model("control", config=json.dumps({"max_batch_size": str(16)}))
    assert _config(client, "control")["max_batch_size"] == 16
    result = client.infer("control", _inputs(module, rows=12))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.repeat(A + B, 12, axis=0))

    client.unload_model("control")
    assert not client.is_model_ready("control")
    with pytest.raises(InferenceServerException, match="failed to load 'not_a_model'"):
        client.load_model("not_a_model")
    client.load_model("control", config=json.dumps({"max_batch_size": 8}))  # as it was
    assert client.is_model_ready("control")


async def _aio_round(server: ServerProcess, coding: str) -> None:
    async with httpaio.InferenceServerClient(server.http_host_port) as http:
        result = await http.infer(
            "simple",
            _inputs(httpaio),
            outputs=[httpaio.InferRequestedOutput("OUTPUT0", binary_data=True)],
            request_compression_algorithm=coding,
            response_compression_algorithm=coding,
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        stats = await http.get_inference_statistics("simple")
        assert stats["model_stats"][0]["inference_count"] >= 1
    assert server.grpc_target is not None
    async with grpcaio.InferenceServerClient(server.grpc_target) as grpc_client:
        answer = await grpc_client.infer("simple", _inputs(grpcaio), compression_algorithm=coding)
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_aio_clients_with_compression(server: ServerProcess, coding: str) -> None:
    asyncio.run(_aio_round(server, coding))


def test_typed_int32_contents_over_the_grpc_stub(server: ServerProcess) -> None:
    """The explicit-contents program: int_contents in, raw little-endian INT32 out."""
    assert server.grpc_target is not None
    request = service_pb2.ModelInferRequest(model_name="simple", model_version="")
    for name, value in (("INPUT0", A), ("INPUT1", B)):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents[:] = value.reshape(-1).tolist()
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT1")
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            request, timeout=30
        )
    sums, differences = (np.frombuffer(raw, np.int32) for raw in response.raw_output_contents)
    np.testing.assert_array_equal(sums, (A + B).reshape(-1))
    np.testing.assert_array_equal(differences, (A - B).reshape(-1))
