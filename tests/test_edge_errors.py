"""Malformed requests are the client's mistake on every surface (issue 13): 400 /
INVALID_ARGUMENT with a short message, never a 500, UNKNOWN or a traceback in the log.

Run against the session's server (tests/conftest.py), which must stay healthy after each.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import pytest
from servers import ServerProcess, identity_name

from servekit.protos import grpc_service_pb2 as pb

pytestmark = pytest.mark.slow  # end to end: real server processes

DEEP = 1000
GARBAGE = b"\x0a\xff\xff\xff\xff\x0f"
"""A length-delimited field 1 whose length runs far past the end: no message decodes it."""


class _Nested:
    """``leaf`` inside ``depth`` lists, written out as JSON text (json.dumps would recurse)."""

    def __init__(self, depth: int, leaf: Any) -> None:
        self.text = "[" * depth + json.dumps(leaf) + "]" * depth


def _nested(depth: int, leaf: Any) -> _Nested:
    return _Nested(depth, leaf)


def _post(http: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST ``body`` as JSON, with any :class:`_Nested` value spliced in as raw text."""
    marks: dict[str, str] = {}

    def default(value: object) -> str:
        assert isinstance(value, _Nested)
        mark = f"@@{len(marks)}@@"
        marks[mark] = value.text
        return mark

    text = json.dumps(body, default=default)
    for mark, raw in marks.items():
        text = text.replace(json.dumps(mark), raw)
    return http.post(path, content=text, headers={"content-type": "application/json"})


def _short_400(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text[:500]
    message: str = response.json()["error"]
    assert len(message) < 300, message
    return message


def test_v2_shape_of_1000_dimensions(http: httpx.Client) -> None:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1] * DEEP, "data": [1.0]}
    response = http.post(f"/v2/models/{identity_name('FP32')}/infer", json={"inputs": [tensor]})
    assert "at most 64 are supported" in _short_400(response)


@pytest.mark.parametrize(("datatype", "leaf"), [("BYTES", "a"), ("FP32", 1.0)])
def test_v2_data_nested_1000_deep(http: httpx.Client, datatype: str, leaf: Any) -> None:
    tensor = {"name": "INPUT0", "datatype": datatype, "shape": [1], "data": _nested(DEEP, leaf)}
    response = _post(http, f"/v2/models/{identity_name(datatype)}/infer", {"inputs": [tensor]})
    _short_400(response)


@pytest.mark.parametrize(("datatype", "leaf"), [("BYTES", "a"), ("FP32", 1.0)])
def test_v1_instances_nested_1000_deep(http: httpx.Client, datatype: str, leaf: Any) -> None:
    body = {"instances": _nested(DEEP, leaf)}
    response = _post(http, f"/v1/models/{identity_name(datatype)}:predict", body)
    _short_400(response)


def test_grps_ndarray_nested_1000_deep(http: httpx.Client) -> None:
    body = {"model": identity_name("FP32"), "ndarray": _nested(DEEP, 1.0)}
    response = _post(http, "/grps/v1/infer/predict", body)
    assert response.status_code == 400, response.text[:500]


def test_repository_config_nested_5000_deep(http: httpx.Client) -> None:
    config = "[" * 5000 + "]" * 5000
    response = http.post("/v2/repository/models/deep/load", json={"parameters": {"config": config}})
    assert response.status_code == 400, response.text[:500]


def test_a_long_model_name_is_cut_in_the_answer(http: httpx.Client) -> None:
    """60,000 characters (a 1 MB one no longer passes the 64 KiB header limit: 431)."""
    response = http.get(f"/v2/models/{'m' * 60_000}")
    assert response.status_code == 404
    assert "(60000 characters)" in response.json()["error"]
    assert len(response.text) < 300


# --- gRPC ----------------------------------------------------------------------------------------


def test_grpc_shape_of_1000_dimensions(channel: grpc.Channel, server: ServerProcess) -> None:
    tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1] * DEEP)
    tensor.contents.fp32_contents.append(1.0)
    request = pb.ModelInferRequest(model_name=identity_name("FP32"), inputs=[tensor])
    infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as caught:
        infer(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 64" in caught.value.details()
    server.assert_healthy()


def test_grpc_1_mb_model_name_stays_not_found(channel: grpc.Channel) -> None:
    metadata = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelMetadata",
        request_serializer=pb.ModelMetadataRequest.SerializeToString,
        response_deserializer=pb.ModelMetadataResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as caught:
        metadata(pb.ModelMetadataRequest(name="m" * 1024 * 1024), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(caught.value.details()) < 300


UNARY = [
    "/inference.GRPCInferenceService/ServerLive",
    "/inference.GRPCInferenceService/ServerReady",
    "/inference.GRPCInferenceService/ModelReady",
    "/inference.GRPCInferenceService/ServerMetadata",
    "/inference.GRPCInferenceService/ModelMetadata",
    "/inference.GRPCInferenceService/ModelInfer",
    "/inference.GRPCInferenceService/ModelConfig",
    "/inference.GRPCInferenceService/ModelStatistics",
    "/inference.GRPCInferenceService/RepositoryIndex",
    "/inference.GRPCInferenceService/RepositoryModelLoad",
    "/inference.GRPCInferenceService/RepositoryModelUnload",
    "/grps.protos.v1.GrpsService/Predict",
    "/grps.protos.v1.GrpsService/CheckLiveness",
    "/grps.protos.v1.GrpsService/ServerMetadata",
    "/grpc.health.v1.Health/Check",
]
STREAMS = [
    ("unary_stream", "/grps.protos.v1.GrpsService/PredictStreaming"),
    ("unary_stream", "/grpc.health.v1.Health/Watch"),
    ("stream_stream", "/inference.GRPCInferenceService/ModelStreamInfer"),
    ("stream_stream", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
]


def test_undecodable_protobuf_is_invalid_argument_on_every_method(
    channel: grpc.Channel, server: ServerProcess
) -> None:
    """Every method answers INVALID_ARGUMENT; the log gets at most one WARNING line for all
    of them (rate-limited) and no ERROR traceback."""
    logged_before = server.log().count("undecodable request")
    codes: dict[str, grpc.StatusCode] = {}
    for method in UNARY:
        call = channel.unary_unary(method)
        with pytest.raises(grpc.RpcError) as caught:
            call(GARBAGE, timeout=10)
        codes[method] = caught.value.code()
    for kind, method in STREAMS:
        with pytest.raises(grpc.RpcError) as caught:
            if kind == "unary_stream":
                list(channel.unary_stream(method)(GARBAGE, timeout=10))
            else:
                list(channel.stream_stream(method)(iter([GARBAGE]), timeout=10))
        codes[method] = caught.value.code()
    wrong = {m: c for m, c in codes.items() if c != grpc.StatusCode.INVALID_ARGUMENT}
    assert not wrong, wrong
    log = server.log()
    assert log.count("undecodable request") - logged_before <= 1
    assert "Unexpected [" not in log  # grpcio's ERROR line for a failing deserializer
    server.assert_healthy()


def test_json_config_error_message_is_json(http: httpx.Client) -> None:
    """(The repository answer above is an {"error": ...} object, like every other.)"""
    response = http.post(
        "/v2/repository/models/deep/load", json={"parameters": {"config": "{" * 10}}
    )
    assert response.status_code == 400
    assert set(json.loads(response.text)) == {"error"}
