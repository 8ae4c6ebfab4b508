"""Round trips of servekit.codecs.v2_proto over every datatype (hypothesis), through the wire bytes.

A request is built the way a client would (typed or raw contents), serialized, parsed back and
decoded; the arrays must be bit-for-bit what was sent. Responses are encoded, serialized and
read back with tritonclient's own InferResult, the decoder real users have.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.grpc import service_pb2 as triton_pb

from servekit.codecs import v2_proto
from servekit.codecs.raw import tensor_to_buffer
from servekit.datatypes import DATATYPES, lookup
from servekit.errors import InvalidArgument
from servekit.protos import grpc_service_pb2 as pb
from servekit.types import InferRequest, InferResponse, RequestedOutput, Tensor

SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def tensors(draw: Any, datatype: str) -> np.ndarray:  # type: ignore[type-arg]
    shape = draw(SHAPES)
    if datatype == "BYTES":
        count = int(np.prod(shape))
        items = draw(st.lists(st.binary(max_size=12), min_size=count, max_size=count))
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    dtype = lookup(datatype).dtype
    return draw(hnp.arrays(dtype, shape))  # type: ignore[no-any-return]


def same(got: np.ndarray, want: np.ndarray) -> None:  # type: ignore[type-arg]
    assert got.shape == want.shape
    if want.dtype == object:
        assert list(got.flat) == list(want.flat)
    else:
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def wire(message: Any) -> pb.ModelInferRequest:
    return pb.ModelInferRequest.FromString(message.SerializeToString())


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_request_round_trip(datatype: str, data: st.DataObject) -> None:
    array = data.draw(tensors(datatype))
    raw = datatype not in v2_proto.CONTENTS_FIELD or data.draw(st.booleans())
    request = pb.ModelInferRequest(model_name="m", model_version="3", id="x")
    tensor = request.inputs.add(name="in", datatype=datatype, shape=array.shape)
    if raw:
        request.raw_input_contents.append(bytes(tensor_to_buffer(lookup(datatype), array)))
    else:
        getattr(tensor.contents, v2_proto.CONTENTS_FIELD[datatype]).extend(
            array.reshape(-1).tolist()
        )
    decoded = v2_proto.decode_request(wire(request))
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "3", "x")
    same(decoded.inputs[0].data, array)


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_response_round_trip_through_tritonclient(datatype: str, data: st.DataObject) -> None:
    array = data.draw(tensors(datatype))
    typed = data.draw(st.booleans())
    request = InferRequest("m", [], parameters={"binary_data_output": not typed})
    response = InferResponse("m", "1", [Tensor("out", datatype, array.shape, array)], id="r")
    encoded = v2_proto.encode_response(request, response)
    assert bool(encoded.raw_output_contents) == (not typed or datatype == "FP16")
    parsed = triton_pb.ModelInferResponse.FromString(encoded.SerializeToString())
    if encoded.raw_output_contents:
        result = grpcclient.InferResult(parsed).as_numpy("out")
        if datatype == "BYTES":  # tritonclient gives numpy bytes_ elements
            result = np.array([bytes(x) for x in result.flat], dtype=object).reshape(array.shape)
        same(result, array)
    else:
        decoded = v2_proto.typed_to_array(
            "out", lookup(datatype), array.shape, encoded.outputs[0].contents
        )
        same(decoded, array)


def test_parameters_round_trip() -> None:
    values = {"b": True, "i": -3, "u": 2**63 + 1, "s": "text", "d": 0.25}
    proto = {k: v2_proto.parameter_to_proto(v) for k, v in values.items()}
    assert v2_proto.parameters_from_proto(proto) == values


def test_requested_output_parameters_choose_raw_per_output() -> None:
    request = InferRequest(
        "m", [], outputs=[RequestedOutput("a", {"binary_data": False}), RequestedOutput("b")]
    )
    assert not request.wants_binary("a", default=True) and request.wants_binary("b", default=True)
    data = np.ones(2, np.int32)
    outputs = [Tensor("a", "INT32", (2,), data), Tensor("b", "INT32", (2,), data)]
    encoded = v2_proto.encode_response(request, InferResponse("m", "1", outputs))
    assert len(encoded.raw_output_contents) == 2, "raw for one output means raw for all"


def test_typed_empty_fp16_is_accepted_but_values_are_not() -> None:
    contents = pb.InferTensorContents()
    assert v2_proto.typed_to_array("x", lookup("FP16"), (0, 3), contents).shape == (0, 3)
    contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidArgument, match="raw_input_contents"):
        v2_proto.typed_to_array("x", lookup("FP16"), (1,), contents)


def test_output_and_response_parameters_are_encoded() -> None:
    """Output parameters (a tabular model's content_type) and response parameters reach the
    protobuf answer (assigning them to protobuf's message map at once raised: a 500)."""
    request = InferRequest("m", [])
    output = Tensor("predict", "INT64", (2,), np.array([1, 2]), {"content_type": "np"})
    response = InferResponse("m", "1", [output], parameters={"content_type": "pd", "n": 3})
    encoded = v2_proto.encode_response(request, response)
    assert encoded.outputs[0].parameters["content_type"].string_param == "np"
    assert encoded.parameters["content_type"].string_param == "pd"
    assert encoded.parameters["n"].int64_param == 3
