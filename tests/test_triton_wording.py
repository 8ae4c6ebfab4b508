"""The error texts Triton's clients and example programs check, over HTTP and gRPC alike.

Triton's examples look for "Request for unknown model" (at the start), "failed to get model
version from specified version string '<v>'", "contents field must not be specified when using
raw_input_contents for '<input>' for model '<model>'" and "failed to load"; servekit's own
detail may follow Triton's words. Written against tritonclient (HTTP and gRPC) and gRPC stubs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from servers import ServerProcess
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

ROW = np.arange(16, dtype=np.float32).reshape(1, 16)


@pytest.fixture(scope="module")
def clients(server: ServerProcess) -> Iterator[dict[str, Any]]:
    assert server.grpc_target is not None
    with (
        httpclient.InferenceServerClient(server.http_host_port) as http,
        grpcclient.InferenceServerClient(server.grpc_target) as grpc_client,
    ):
        yield {"http": (http, httpclient), "grpc": (grpc_client, grpcclient)}


def _failure(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def _infer(kind: tuple[Any, Any], model: str, version: str = "") -> Callable[[], object]:
    client, module = kind
    tensor = module.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(ROW)
    return lambda: client.infer(model, [tensor], model_version=version)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_unknown_model_and_version(clients: dict[str, Any], transport: str) -> None:
    kind = clients[transport]
    error = _failure(_infer(kind, "wrong_model_name"))
    assert error.message().startswith("Request for unknown model: 'wrong_model_name' is not found")
    assert error.status() in ("400", "404", "StatusCode.NOT_FOUND")
    error = _failure(_infer(kind, "mlp", "9"))
    assert error.message().startswith("Request for unknown model: 'mlp' version 9 is not found")
    assert "versions 1, 2" in error.message()  # our detail, after Triton's words
    error = _failure(lambda: kind[0].get_model_metadata("wrong_model_name"))
    assert "Request for unknown model" in error.message()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_non_numeric_version_is_invalid_argument(clients: dict[str, Any], transport: str) -> None:
    error = _failure(_infer(clients[transport], "mlp", "wrong_specification"))
    assert (
        "failed to get model version from specified version string 'wrong_specification'"
        in error.message()
    )
    assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_contents_with_raw_input_contents(server: ServerProcess) -> None:
    assert server.grpc_target is not None
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        tensor.contents.fp32_contents.extend(ROW.reshape(-1).tolist())
    request.raw_input_contents.append(ROW[0, :8].tobytes())  # one entry for two inputs, too
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' "
        "for model 'add_sub'" in str(caught.value)
    )


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_load_failures_say_failed_to_load(clients: dict[str, Any], transport: str) -> None:
    client = clients[transport][0]
    error = _failure(lambda: client.load_model("wrong_model_name"))
    # Triton's L0 tests look for this sentence when loading a model the repository lacks.
    assert error.message().startswith(
        "failed to load 'wrong_model_name', failed to poll from model repository"
    )
    # A file parameter no file system accepts (a name over NAME_MAX): Triton's words, while the
    # status stays INVALID_ARGUMENT / 400 (bad input, not a server fault; Triton's own example
    # program notes INVALID_ARGUMENT as the right code, TRI-958).
    long_file = {"file:" + "A" * 256: b"\0"}
    error = _failure(lambda: client.load_model("add_sub", config="{}", files=long_file))
    assert "failed to load 'add_sub', failed to poll from model repository" in error.message()
    assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    bad_config = '"parameters": {"config": {{"max_batch_size": "16"}}}'
    error = _failure(lambda: client.load_model("add_sub", config=bad_config))
    assert "failed to load 'add_sub'" in error.message()
    assert client.is_model_ready("add_sub")
