"""Model configuration and statistics extensions, on HTTP and gRPC, with tritonclient.

Both transports answer from the same core functions, so besides checking each one against what
the model is, the tests check the two answers agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from servers import ServerProcess, identity_name
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

Clients = tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient]


@pytest.fixture(scope="module")
def clients(server: ServerProcess) -> Iterator[Clients]:
    assert server.grpc_target is not None
    http = httpclient.InferenceServerClient(server.http_host_port)
    grpc = grpcclient.InferenceServerClient(server.grpc_target)
    yield http, grpc
    http.close()
    grpc.close()


def grpc_json(message: dict[str, Any]) -> dict[str, Any]:
    """Protobuf JSON spells int64/uint64 as strings; turn digit strings back into ints."""

    def fix(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        return value

    fixed: dict[str, Any] = fix(message)
    return fixed


@pytest.mark.parametrize("version", ["", "1", "2"])
def test_config_of_a_model(clients: Clients, version: str) -> None:
    http, grpc = clients
    config = http.get_model_config("mlp", version)
    assert config["name"] == "mlp"
    assert config["platform"] == "onnxruntime_onnx" and config["backend"] == "onnxruntime"
    assert config["version_policy"] == {"all": {}}
    assert config["max_batch_size"] == 0
    assert config["input"] == [
        {"name": "input", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [-1, 16]}
    ]
    assert config["output"] == [{"name": "output", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    over_grpc = grpc_json(grpc.get_model_config("mlp", version, as_json=True)["config"])
    over_grpc["input"][0].setdefault("format", "FORMAT_NONE")  # protobuf JSON omits defaults
    for key in ("name", "platform", "backend", "version_policy", "input", "output"):
        assert over_grpc[key] == config[key], key


def test_config_datatypes(clients: Clients) -> None:
    http, grpc = clients
    for datatype, config_type in [
        ("BYTES", "TYPE_STRING"),
        ("FP16", "TYPE_FP16"),
        ("BOOL", "TYPE_BOOL"),
    ]:
        name = identity_name(datatype)
        assert http.get_model_config(name)["input"][0]["data_type"] == config_type
        assert grpc.get_model_config(name).config.output[0].data_type == getattr(
            grpcclient.model_config_pb2, config_type
        )


@pytest.mark.parametrize(
    ("model", "version", "code"),
    [
        ("no_such_model", "", "NOT_FOUND"),
        ("mlp", "9", "NOT_FOUND"),
        ("broken_garbage", "", "UNAVAILABLE"),
    ],
)
def test_config_errors(clients: Clients, model: str, version: str, code: str) -> None:
    http, grpc = clients
    with pytest.raises(InferenceServerException) as info:
        http.get_model_config(model, version)
    assert info.value.status() == {"NOT_FOUND": "404", "UNAVAILABLE": "503"}[code]
    with pytest.raises(InferenceServerException) as info:
        grpc.get_model_config(model, version)
    assert info.value.status() == f"StatusCode.{code}"
    assert model in info.value.message()


def _stats(entry: dict[str, Any]) -> tuple[int, int, int, int]:
    inference = entry["inference_stats"]
    return (
        int(entry.get("inference_count", 0)),
        int(entry.get("execution_count", 0)),
        int(inference["success"].get("count", 0)),
        int(inference["fail"].get("count", 0)),
    )


def test_statistics_grow_after_inferences(clients: Clients) -> None:
    http, grpc = clients
    before = _stats(http.get_inference_statistics("mlp", "1")["model_stats"][0])
    rows = np.ones((3, 16), dtype=np.float32)
    for _ in range(4):
        tensor = grpcclient.InferInput("input", [3, 16], "FP32").set_data_from_numpy(rows)
        grpc.infer("mlp", [tensor], model_version="1")
    tensor = httpclient.InferInput("input", [3, 16], "FP32").set_data_from_numpy(rows)
    http.infer("mlp", [tensor], model_version="1")
    bad = grpcclient.InferInput("input", [3, 15], "FP32")
    bad.set_data_from_numpy(np.ones((3, 15), np.float32))
    with pytest.raises(InferenceServerException):
        grpc.infer("mlp", [bad], model_version="1")
    over_http = http.get_inference_statistics("mlp", "1")["model_stats"][0]
    over_grpc = grpc_json(grpc.get_inference_statistics("mlp", "1", as_json=True)["model_stats"][0])
    assert over_http["name"] == "mlp" and over_http["version"] == "1"
    after = _stats(over_http)
    assert after == _stats(over_grpc)
    # Without batching each request counts one inference and one execution.
    assert [a - b for a, b in zip(after, before, strict=True)] == [5, 5, 5, 1]
    inference = over_http["inference_stats"]
    assert inference["compute_infer"]["ns"] > 0 and inference["success"]["ns"] > 0
    assert over_http["last_inference"] > 0


def test_statistics_scopes(clients: Clients) -> None:
    http, grpc = clients
    everything = http.get_inference_statistics()["model_stats"]
    pairs = {(e["name"], e["version"]) for e in everything}
    assert {("mlp", "1"), ("mlp", "2"), ("add_sub", "1")} <= pairs
    assert not any(name == "broken_garbage" for name, _ in pairs), "only loaded versions"
    both = http.get_inference_statistics("mlp")["model_stats"]
    assert [e["version"] for e in both] == ["1", "2"]
    over_grpc = grpc.get_inference_statistics(as_json=True)["model_stats"]
    assert {(e["name"], e["version"]) for e in over_grpc} == pairs


@pytest.mark.parametrize(("model", "version"), [("no_such_model", ""), ("mlp", "9")])
def test_statistics_errors(clients: Clients, model: str, version: str) -> None:
    http, grpc = clients
    with pytest.raises(InferenceServerException) as info:
        http.get_inference_statistics(model, version)
    assert info.value.status() == "404"
    with pytest.raises(InferenceServerException) as info:
        grpc.get_inference_statistics(model, version)
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_openapi_documents_the_extension_routes(server: ServerProcess) -> None:
    document = httpx.get(f"{server.http_url}/openapi", timeout=10).json()
    paths = set(document["paths"])
    assert {
        "/v2/models/{model}/config",
        "/v2/models/{model}/versions/{version}/config",
        "/v2/models/stats",
        "/v2/models/{model}/stats",
        "/v2/models/{model}/versions/{version}/stats",
    } <= paths
