"""JSON true/false and out-of-range floats in tensor data, end to end on every JSON-ish transport.

numpy reads ``[true, 1]`` as integers and a C-style cast turns ``1e6`` into FP16 infinity, so
both used to slip through silently. The rules live in the core (``servekit.datatypes``), and here
the shared ``servekit serve`` subprocess shows that V2 JSON, KServe V1 and grps (HTTP JSON and gRPC)
refuse them alike with a message naming the input, while what is valid still passes: BOOL as
true/false, the extremes of each float type, and non-finite values spelled "NaN"/"Infinity".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from servers import ServerProcess, identity_name
from tritonclient.utils import InferenceServerException

from servekit.protos import grps_pb2 as grps
from servekit.protos import grps_pb2_grpc as grps_grpc

pytestmark = pytest.mark.slow

GRPS_PREDICT = "/grps/v1/infer/predict"


def v2_infer(http: httpx.Client, datatype: str, data: list[Any]) -> httpx.Response:
    """One V2 JSON inference of the identity model of ``datatype`` with shape [1, len(data)]."""
    body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, len(data)],
                        "data": data}]}  # fmt: skip
    return http.post(f"/v2/models/{identity_name(datatype)}/infer", json=body)


def refused(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    return str(body["error"])


# -- V2 JSON ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("INT32", [True, 1]),
        ("INT64", [0, 1, False]),
        ("UINT8", [True]),
        ("FP32", [1.5, True]),
        ("FP16", [0.0, False]),
        ("FP64", [1.0, "NaN", True]),
    ],
)
def test_v2_json_booleans_in_numeric_tensors(
    http: httpx.Client, datatype: str, data: list[Any]
) -> None:
    message = refused(v2_infer(http, datatype, data))
    assert "input 'INPUT0'" in message and "true/false" in message and datatype in message


@pytest.mark.parametrize("data", [[1, 0], [True, 1], [False, 0.0]])
def test_v2_json_bool_takes_only_true_and_false(http: httpx.Client, data: list[Any]) -> None:
    message = refused(v2_infer(http, "BOOL", data))
    assert "input 'INPUT0'" in message and "BOOL (JSON true/false only)" in message
    reply = v2_infer(http, "BOOL", [True, False])
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [True, False]


@pytest.mark.parametrize(
    ("datatype", "data"),
    [("FP16", [1.0, 1e6]), ("FP16", [70000]), ("FP32", [1e39]), ("FP32", [0.5, -1e39])],
)
def test_v2_json_floats_out_of_range(http: httpx.Client, datatype: str, data: list[Any]) -> None:
    message = refused(v2_infer(http, datatype, data))
    assert f"input 'INPUT0': value out of range for {datatype}" in message


@pytest.mark.parametrize(
    ("datatype", "largest"), [("FP16", 65504.0), ("FP32", float(np.finfo(np.float32).max))]
)
def test_v2_json_extremes_and_non_finite_strings_pass(
    http: httpx.Client, datatype: str, largest: float
) -> None:
    data = [largest, -largest, "NaN", "Infinity", "-Infinity", 0.5]
    reply = v2_infer(http, datatype, data)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == data


# -- KServe V1 ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("datatype", "instances", "fragment"),
    [
        ("INT32", [[True, 1]], "true/false"),
        ("FP32", [[0.5], [False]], "true/false"),
        ("BOOL", [[1, 0]], "JSON true/false only"),
        ("FP16", [[1e6]], "value out of range for FP16"),
        ("FP32", [[1e39, 1.0]], "value out of range for FP32"),
    ],
)
def test_v1_instances_follow_the_same_rules(
    http: httpx.Client, datatype: str, instances: list[Any], fragment: str
) -> None:
    response = http.post(
        f"/v1/models/{identity_name(datatype)}:predict", json={"instances": instances}
    )
    message = refused(response)
    assert "input 'INPUT0'" in message and fragment in message and datatype in message


# -- grps over HTTP JSON and gRPC ----------------------------------------------------------------
def grps_failure(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    status = response.json()["status"]
    assert status["code"] == 400 and status["status"] == "FAILURE", status
    return str(status["msg"])


def gtensor(dtype: str, field: str, values: list[Any]) -> dict[str, Any]:
    tensor = {"name": "INPUT0", "dtype": dtype, "shape": [1, len(values)], field: values}
    return {"gtensors": {"tensors": [tensor]}}


@pytest.mark.parametrize(
    ("model", "body", "fragment"),
    [
        ("FP32", gtensor("DT_FLOAT32", "flat_float32", [1.5, True]), "true/false"),
        ("FP32", gtensor("DT_FLOAT32", "flat_float32", [True]), "true/false"),
        ("FP32", gtensor("DT_FLOAT32", "flat_float32", ["NaN", False]), "true/false"),
        ("INT32", gtensor("DT_INT32", "flat_int32", [True, 2]), "true/false"),
        ("FP16", gtensor("DT_FLOAT16", "flat_float16", [1.0, 1e6]), "out of range for FP16"),
        ("FP32", {"ndarray": [[0.5, True]]}, "true/false"),
        ("FP32", {"ndarray": [[0.5, 1e39]]}, "out of range for FP32"),
        ("FP16", {"gmap": {"s_f": {"INPUT0": 1e6}}}, "out of range for FP16"),
        ("FP32", {"gmap": {"s_d": {"INPUT0": 1e39}}}, "out of range for FP32"),
    ],
)
def test_grps_json_follows_the_same_rules(
    http: httpx.Client, model: str, body: dict[str, Any], fragment: str
) -> None:
    response = http.post(GRPS_PREDICT, params={"model": identity_name(model)}, json=body)
    assert fragment in grps_failure(response)


def test_grps_json_float16_extremes_pass(http: httpx.Client) -> None:
    values = [65504.0, -65504.0, "Infinity", 0.5]
    body = gtensor("DT_FLOAT16", "flat_float16", values)
    response = http.post(GRPS_PREDICT, params={"model": identity_name("FP16")}, json=body)
    assert response.status_code == 200, response.text
    assert response.json()["gtensors"]["tensors"][0]["flat_float16"] == values


@pytest.mark.parametrize(
    ("model", "message", "fragment"),
    [
        (
            "FP16",
            grps.GrpsMessage(gtensors=grps.GenericTensorData(tensors=[grps.GenericTensor(
                name="INPUT0", dtype=grps.DT_FLOAT16, shape=[1, 2], flat_float16=[1.0, 1e6])])),
            "tensor 'INPUT0': value out of range for FP16",
        ),
        (
            "FP32",
            grps.GrpsMessage(gmap=grps.GenericMapData(s_d={"INPUT0": 1e39})),
            "gmap s_d key 'INPUT0': value out of range for FP32",
        ),
    ],
)  # fmt: skip
def test_grps_grpc_floats_out_of_range(
    channel: grpc.Channel, server: ServerProcess, model: str, message: Any, fragment: str
) -> None:
    message.model = identity_name(model)
    with pytest.raises(grpc.RpcError) as caught:
        grps_grpc.GrpsServiceStub(channel).Predict(message, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in str(caught.value.details())
    server.assert_healthy()


# -- V2 gRPC typed contents (tritonclient.grpc) ------------------------------------------------
@pytest.fixture(scope="module")
def triton(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    yield client
    client.close()


def typed_fp32_input(datatype: str, values: list[float]) -> grpcclient.InferInput:
    """An input whose values go in contents.fp32_contents (tritonclient sends raw otherwise)."""
    tensor = grpcclient.InferInput("INPUT0", [1, len(values)], datatype)
    tensor._input.contents.fp32_contents.extend(values)
    return tensor


def test_typed_fp32_contents_cannot_overflow_and_keep_their_extremes(
    triton: grpcclient.InferenceServerClient,
) -> None:
    """fp32_contents are float32 on the wire: FP32's extremes and infinities pass unchanged."""
    largest = float(np.finfo(np.float32).max)
    values = [largest, -largest, np.inf, -np.inf, 0.5]
    result = triton.infer(identity_name("FP32"), [typed_fp32_input("FP32", values)], timeout=10)
    output = result.as_numpy("OUTPUT0")
    assert output is not None and output.tolist() == [values]


def test_typed_fp16_via_fp32_contents_is_refused(triton: grpcclient.InferenceServerClient) -> None:
    """FP16 has no typed field, so float32 values that FP16 cannot hold never reach a cast."""
    with pytest.raises(InferenceServerException) as caught:
        triton.infer(identity_name("FP16"), [typed_fp32_input("FP16", [1.0, 1e6])], timeout=10)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'INPUT0'" in str(caught.value.message())
