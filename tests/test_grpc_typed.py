"""Typed ``InferTensorContents`` over a raw gRPC channel, built with servekit's generated classes.

tritonclient.grpc always sends raw contents; other V2 clients (KServe's, MLServer's, hand-made
ones) send typed contents. Here every datatype goes typed to an identity model, the answer comes
back raw by default and typed when asked with ``binary_data_output: false``, and every way of
sending inconsistent typed data is refused with INVALID_ARGUMENT and a message.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from servers import DATATYPES, ServerProcess, identity_name

from servekit.codecs.raw import tensor_from_bytes
from servekit.codecs.v2_proto import CONTENTS_FIELD
from servekit.datatypes import lookup
from servekit.protos import grpc_service_pb2 as pb
from servekit.protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

TYPED = [d for d in DATATYPES if d in CONTENTS_FIELD]


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    assert server.grpc_target is not None
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def values(datatype: str, count: int) -> np.ndarray:  # type: ignore[type-arg]
    """Edge values first (min/max for integers), then a pattern."""
    dtype = lookup(datatype).dtype
    if datatype == "BYTES":
        return np.array([f"é{i}".encode() * (i % 3) for i in range(count)], dtype=object)
    if datatype == "BOOL":
        return np.arange(count) % 3 == 0
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        out = (np.arange(count) % 100).astype(dtype)
        out[:2] = [info.min, info.max]
        return out
    return (np.arange(count) / 7 - 1).astype(dtype)


def typed_request(datatype: str, array: np.ndarray, **params: Any) -> pb.ModelInferRequest:  # type: ignore[type-arg]
    request = pb.ModelInferRequest(
        model_name=identity_name(datatype),
        id="typed-1",
        parameters={k: pb.InferParameter(bool_param=v) for k, v in params.items()},
    )
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=array.shape)
    getattr(tensor.contents, CONTENTS_FIELD[datatype]).extend(array.reshape(-1).tolist())
    return request


def output_array(response: pb.ModelInferResponse) -> np.ndarray:  # type: ignore[type-arg]
    out = response.outputs[0]
    datatype = lookup(out.datatype)
    shape = tuple(out.shape)
    if response.raw_output_contents:
        return tensor_from_bytes(out.name, datatype, shape, response.raw_output_contents[0])
    flat = list(getattr(out.contents, CONTENTS_FIELD[out.datatype]))
    if datatype.is_bytes:
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return array.reshape(shape)
    return np.array(flat, dtype=datatype.dtype).reshape(shape)


@pytest.mark.parametrize("datatype", TYPED)
def test_typed_in_raw_out(stub: pb_grpc.GRPCInferenceServiceStub, datatype: str) -> None:
    array = values(datatype, 12).reshape(3, 4)
    response = stub.ModelInfer(typed_request(datatype, array), timeout=10)
    assert len(response.raw_output_contents) == 1, "raw output contents by default"
    assert not response.outputs[0].HasField("contents")
    assert response.id == "typed-1"
    got = output_array(response)
    assert got.shape == (3, 4)
    assert [bytes(x) if datatype == "BYTES" else x for x in got.flat] == list(array.flat)


@pytest.mark.parametrize("datatype", TYPED)
def test_typed_in_typed_out_when_asked(
    stub: pb_grpc.GRPCInferenceServiceStub, datatype: str
) -> None:
    array = values(datatype, 6).reshape(2, 3)
    request = typed_request(datatype, array, binary_data_output=False)
    response = stub.ModelInfer(request, timeout=10)
    assert not response.raw_output_contents
    field = CONTENTS_FIELD[datatype]
    assert [fd.name for fd, _ in response.outputs[0].contents.ListFields()] == [field]
    assert list(output_array(response).flat) == list(array.flat)


def test_fp16_has_no_typed_field_so_it_is_answered_raw(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    array = np.array([[1.5, -2.0, 65504.0]], dtype=np.float16)
    request = pb.ModelInferRequest(
        model_name=identity_name("FP16"),
        raw_input_contents=[array.tobytes()],
        parameters={"binary_data_output": pb.InferParameter(bool_param=False)},
    )
    request.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 3])
    response = stub.ModelInfer(request, timeout=10)
    assert np.frombuffer(response.raw_output_contents[0], np.float16).tolist() == array[0].tolist()


def _refused(stub: pb_grpc.GRPCInferenceServiceStub, request: pb.ModelInferRequest) -> str:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    details: str = info.value.details()
    assert details
    return details


def test_narrow_integers_out_of_range_are_refused_not_wrapped(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    request = pb.ModelInferRequest(model_name=identity_name("INT8"))
    request.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 2]).contents.int_contents.extend(
        [1, 300]
    )
    assert "out of range" in _refused(stub, request)


def test_contents_in_the_wrong_field(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name=identity_name("FP32"))
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2]).contents.int_contents.extend(
        [1, 2]
    )
    assert "fp32_contents" in _refused(stub, request)


def test_fp16_typed_contents_are_refused(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name=identity_name("FP16"))
    tensor = request.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    assert "raw_input_contents" in _refused(stub, request)


@pytest.mark.parametrize("count", [15, 17])
def test_element_count_must_match_the_shape(
    stub: pb_grpc.GRPCInferenceServiceStub, count: int
) -> None:
    request = pb.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 16])
    tensor.contents.fp32_contents.extend([0.5] * count)
    assert "16" in _refused(stub, request)


@pytest.mark.parametrize("raw", [False, True])
def test_absurd_shapes_are_refused_before_allocating(
    stub: pb_grpc.GRPCInferenceServiceStub, raw: bool
) -> None:
    request = pb.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[2**40, 16])
    if raw:
        request.raw_input_contents.append(np.zeros(16, np.float32).tobytes())
    else:
        tensor.contents.fp32_contents.extend([0.0] * 16)
    assert "shape" in _refused(stub, request)


def test_negative_dims_are_refused(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[-1, 16])
    assert "non-negative" in _refused(stub, request)


def test_raw_contents_are_all_or_nothing(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.zeros(16, np.float32).tobytes())
    assert "raw_input_contents" in _refused(stub, request)


def test_typed_and_raw_for_one_input_is_refused(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name=identity_name("FP32"))
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    tensor.contents.fp32_contents.append(1.0)
    request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    assert "contents field must not be specified when using raw_input_contents for 'INPUT0'" in (
        _refused(stub, request)
    )


def test_unknown_datatype(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name=identity_name("FP32"))
    request.inputs.add(name="INPUT0", datatype="FP8", shape=[1, 1])
    assert "FP8" in _refused(stub, request)
