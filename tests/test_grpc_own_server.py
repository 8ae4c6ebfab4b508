"""gRPC behaviour that needs its own serve.yaml: message size limits and a batching model.

One server with ``grpcMaxMessageBytes: 65536`` and a model with ``maxBatchSize`` and
``dynamicBatching``: its configuration drops the batch dimension from ``dims`` as Triton does,
and messages over the limit are refused with RESOURCE_EXHAUSTED in either direction.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import helper
from servers import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

LIMIT = 65536
CONFIG = f"""\
server: {{grpcMaxMessageBytes: {LIMIT}}}
models:
  - name: batched
    modelFormat: {{name: onnx}}
    storageUri: batched.onnx
    maxBatchSize: 8
    dynamicBatching: {{maxQueueDelayMicroseconds: 200, preferredBatchSize: [4, 8]}}
    instances: 2
    maxQueueSize: 64
    queueTimeoutMicroseconds: 30000000
  - name: wide
    modelFormat: {{name: onnx}}
    storageUri: wide.onnx
  - name: tile
    modelFormat: {{name: onnx}}
    storageUri: tile.onnx
  - name: spare
    modelFormat: {{name: onnx}}
    storageUri: spare.onnx
"""


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("grpc_own")
    onnx.save(onnx_builders.identity("FP32", ["batch", 4]), str(root / "batched.onnx"))
    onnx.save(onnx_builders.identity("UINT8"), str(root / "wide.onnx"))
    onnx.save(tile_model(4), str(root / "tile.onnx"))
    onnx.save(onnx_builders.identity("INT32"), str(root / "spare.onnx"))
    (root / "serve.yaml").write_text(CONFIG)
    with running_server(root / "serve.yaml", grpc=True) as server:
        yield server


@pytest.fixture(scope="module")
def client(own_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    assert own_server.grpc_target is not None
    with grpcclient.InferenceServerClient(own_server.grpc_target) as connected:
        yield connected


def test_batched_config_drops_the_batch_dim(
    own_server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    config = client.get_model_config("batched").config
    assert config.max_batch_size == 8
    assert list(config.input[0].dims) == [4] and list(config.output[0].dims) == [4]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 200
    assert config.instance_group[0].count == 2
    http = httpclient.InferenceServerClient(own_server.http_host_port)
    try:
        over_http = http.get_model_config("batched")
    finally:
        http.close()
    assert over_http["input"][0]["dims"] == [4]
    assert over_http["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    # the queue's bounds as Triton's default queue policy, the same over both protocols
    policy = config.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 64 and policy.default_timeout_microseconds == 30_000_000
    assert policy.allow_timeout_override and policy.timeout_action == 0  # REJECT
    assert over_http["dynamic_batching"]["default_queue_policy"] == {
        "timeout_action": "REJECT",
        "default_timeout_microseconds": 30_000_000,
        "allow_timeout_override": True,
        "max_queue_size": 64,
    }
    assert not client.get_model_config("wide").config.HasField("dynamic_batching")


def test_batched_inference_and_statistics(client: grpcclient.InferenceServerClient) -> None:
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = grpcclient.InferInput("INPUT0", [3, 4], "FP32").set_data_from_numpy(rows)
    assert client.infer("batched", [tensor]).as_numpy("OUTPUT0").tolist() == rows.tolist()
    stats = client.get_inference_statistics("batched").model_stats[0]
    assert stats.inference_count >= 3 and stats.execution_count >= 1


def _uint8_input(size: int) -> list[grpcclient.InferInput]:
    data = np.zeros((1, size), dtype=np.uint8)
    return [grpcclient.InferInput("INPUT0", [1, size], "UINT8").set_data_from_numpy(data)]


def test_request_under_the_limit(client: grpcclient.InferenceServerClient) -> None:
    assert client.infer("wide", _uint8_input(LIMIT // 2)).as_numpy("OUTPUT0").shape == (
        1,
        LIMIT // 2,
    )


def test_request_over_the_limit_is_resource_exhausted(
    client: grpcclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("wide", _uint8_input(LIMIT + 1))
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert client.is_server_live()


def test_response_over_the_limit_is_resource_exhausted(own_server: ServerProcess) -> None:
    """A request under the limit whose answer is over it: the server refuses to send it."""
    assert own_server.grpc_target is not None
    options = [("grpc.max_receive_message_length", 8 * LIMIT)]  # the client would accept it
    with grpcclient.InferenceServerClient(own_server.grpc_target, channel_args=options) as big:
        data = np.ones((1, LIMIT // 8), dtype=np.uint8)
        small = [
            grpcclient.InferInput("INPUT0", list(data.shape), "UINT8").set_data_from_numpy(data)
        ]
        assert big.infer("tile", small).as_numpy("OUTPUT0").shape == (1, LIMIT // 2)
        data = np.ones((1, LIMIT // 2), dtype=np.uint8)
        large = [
            grpcclient.InferInput("INPUT0", list(data.shape), "UINT8").set_data_from_numpy(data)
        ]
        with pytest.raises(InferenceServerException) as info:
            big.infer("tile", large)
        assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert big.is_server_live()


def test_health_follows_unload_and_load(
    own_server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    """Health is read from the repository: repository RPCs change it at once."""
    assert own_server.grpc_target is not None
    with grpc.insecure_channel(own_server.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)

        def status() -> int:
            request = health_pb2.HealthCheckRequest(service="spare")
            value: int = health.Check(request, timeout=10).status
            return value

        assert status() == health_pb2.HealthCheckResponse.SERVING
        client.unload_model("spare")
        assert status() == health_pb2.HealthCheckResponse.NOT_SERVING
        assert not client.is_model_ready("spare")
        client.load_model("spare")
        assert status() == health_pb2.HealthCheckResponse.SERVING
        assert client.is_model_ready("spare")


def tile_model(times: int) -> onnx.ModelProto:
    """``OUTPUT0 = tile(INPUT0, [1, times])``: an answer ``times`` larger than the request."""
    repeats = helper.make_tensor("repeats", onnx.TensorProto.INT64, [2], [1, times])
    graph = helper.make_graph(
        [helper.make_node("Tile", ["INPUT0", "repeats"], ["OUTPUT0"])],
        "tile",
        [helper.make_tensor_value_info("INPUT0", onnx.TensorProto.UINT8, [1, "n"])],
        [helper.make_tensor_value_info("OUTPUT0", onnx.TensorProto.UINT8, [1, "m"])],
        initializer=[repeats],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
