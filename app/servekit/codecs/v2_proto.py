"""The V2 gRPC inference messages (``inference.ModelInferRequest`` / ``ModelInferResponse``).

Inputs arrive either as typed ``contents`` (one repeated field per datatype family, smaller
integers widened to int32/uint32) or as ``raw_input_contents`` in the raw layout of
:mod:`servekit.codecs.raw`, decoded as numpy views over the received bytes. Outputs go back as
``raw_output_contents`` (what tritonclient.grpc decodes) unless the client asks for typed
contents with ``binary_data_output: false`` on the request or ``binary_data: false`` on its
requested outputs, the same parameters the HTTP binary extension uses. FP16 has no typed field
in the protocol and always travels raw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from servekit.codecs.raw import (
    MAX_DIMS,
    check_shape,
    datatype_of,
    tensor_from_bytes,
    tensor_to_buffer,
)
from servekit.codecs.v2_json import IN_SHARED_MEMORY, SHARED_MEMORY_REGION
from servekit.datatypes import (
    DATATYPES,
    DataType,
    as_bytes_array,
    element_count,
    lookup,
    narrow_integers,
)
from servekit.errors import InvalidArgument, contents_with_raw
from servekit.protos import grpc_service_pb2 as pb
from servekit.types import InferRequest, InferResponse, Parameters, RequestedOutput, Tensor

# V2 datatype -> the InferTensorContents field that carries it (FP16: none, raw only).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# Datatypes narrower than their contents field: values are range-checked, never wrapped.
_NARROW = {"UINT8", "UINT16", "INT8", "INT16"}
_WIDE_DTYPE = {"uint_contents": np.dtype("<u4"), "int_contents": np.dtype("<i4")}


# -- parameters ---------------------------------------------------------------------------------
def parameters_from_proto(params: Mapping[str, pb.InferParameter]) -> Parameters:
    """InferParameter map -> plain dict (bool, int, str or float values)."""
    out: Parameters = {}
    for key, param in params.items():
        which = param.WhichOneof("parameter_choice")
        out[key] = getattr(param, which) if which is not None else None
    return out


def parameter_to_proto(value: object) -> pb.InferParameter:
    """A plain value -> InferParameter (bool before int: bool is an int in Python)."""
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        if value >= 2**63:
            return pb.InferParameter(uint64_param=value)
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=str(value))


# -- requests -----------------------------------------------------------------------------------
def decode_request(msg: pb.ModelInferRequest) -> InferRequest:
    """Build an InferRequest from a ModelInferRequest, refusing inconsistent data early.

    An input naming a shared-memory region has no contents; ``raw_input_contents`` then holds
    one entry per other input, in order (as tritonclient sends them)."""
    raw = msg.raw_input_contents
    # Repeated fields are read by slicing: protobuf's (upb) iteration of one ends in an
    # IndexError, and a slice costs about half as many instructions.
    items = msg.inputs[:]
    if raw:
        for item in items:  # Triton checks this first, and its clients check its words
            if item.HasField("contents") and item.contents.ListFields():
                raise contents_with_raw(item.name, msg.model_name)
    taken = 0
    shared = False
    inputs: list[Tensor] = []
    for item in items:
        name = item.name
        datatype = DATATYPES.get(item.datatype) or datatype_of(name, item.datatype)
        shape = tuple(item.shape[:])  # int64 on the wire: only the sign needs checking
        if shape and (min(shape) < 0 or len(shape) > MAX_DIMS):
            check_shape(name, shape)  # raises with the message
        params = parameters_from_proto(item.parameters) if item.parameters else {}
        if params and SHARED_MEMORY_REGION in params:
            if item.HasField("contents") and item.contents.ListFields():
                raise InvalidArgument(
                    f"input {name!r} has both typed contents and 'shared_memory_region'"
                )
            shared = True
            array = IN_SHARED_MEMORY  # read by the DataPlane from the region
        elif raw:
            if taken >= len(raw):
                raise _raw_count(msg)
            array = tensor_from_bytes(name, datatype, shape, raw[taken])
            taken += 1
        else:
            array = typed_to_array(name, datatype, shape, item.contents)
        inputs.append(Tensor(name, datatype.name, shape, array, params))
    if taken != len(raw):
        raise _raw_count(msg)
    outputs = None
    if msg.outputs:
        outputs = [
            RequestedOutput(o.name, parameters_from_proto(o.parameters) if o.parameters else {})
            for o in msg.outputs[:]
        ]
        shared = shared or any(SHARED_MEMORY_REGION in o.parameters for o in outputs)
    return InferRequest(  # model_name, inputs, model_version, id, outputs, parameters, shared
        msg.model_name,
        inputs,
        msg.model_version or None,
        msg.id or None,
        outputs,
        parameters_from_proto(msg.parameters) if msg.parameters else {},
        shared,
    )


def _raw_count(msg: pb.ModelInferRequest) -> InvalidArgument:
    raw = len(msg.raw_input_contents)
    return InvalidArgument(
        f"raw_input_contents has {raw} entries but the request has {len(msg.inputs)} "
        "inputs; give raw contents for every input (not in shared memory) or for none"
    )


def typed_to_array(
    name: str, datatype: DataType, shape: tuple[int, ...], contents: pb.InferTensorContents
) -> NDArray[Any]:
    """Typed contents -> array of ``shape``; the element count is checked before conversion."""
    count = element_count(shape)
    field = CONTENTS_FIELD.get(datatype.name)
    present = [fd.name for fd, _ in contents.ListFields()]
    if field is None:
        if count == 0 and not present:
            return np.empty(shape, dtype=datatype.dtype)
        raise InvalidArgument(
            f"input {name!r}: {datatype.name} has no typed contents field in the protocol; "
            "send it in raw_input_contents"
        )
    wrong = [p for p in present if p != field]
    if wrong:
        raise InvalidArgument(
            f"input {name!r}: {datatype.name} data goes in contents.{field}, "
            f"not contents.{wrong[0]}"
        )
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidArgument(
            f"input {name!r}: shape {list(shape)} needs {count} elements, "
            f"got {len(values)} in contents.{field}"
        )
    if datatype.is_bytes:
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    if datatype.name in _NARROW:
        wide = np.fromiter(values, dtype=_WIDE_DTYPE[field], count=count)
        return narrow_integers(f"input {name!r}", wide, datatype).reshape(shape)
    return np.fromiter(values, dtype=datatype.dtype, count=count).reshape(shape)


# -- responses ----------------------------------------------------------------------------------
def encode_response(
    request: InferRequest, response: InferResponse, typed_in: bool = False
) -> pb.ModelInferResponse:
    """Encode a response: raw output contents, or typed contents if every output asked so.

    ``raw_output_contents`` must have one entry per output when used, so mixing is impossible:
    if any output wants raw (or is FP16, which has no typed field) all of them go raw.
    ``typed_in`` (``server.grpcAnswers: asSent``, the request's inputs came typed): typed
    contents unless the request asks for raw, as KServe's servers and MLServer answer.
    """
    outputs = response.outputs
    if not request.shared_memory and not _typed_answer(request, outputs, typed_in):  # common
        return _raw_answer(response, outputs)
    in_shm = request.outputs_in_shared_memory() if request.shared_memory else frozenset()
    if in_shm:  # only outputs not in shared memory decide (none: raw, empty entries)
        rest = [t for t in outputs if t.name not in in_shm]
        typed = bool(rest) and _typed_answer(request, rest, typed_in)
    else:
        typed = _typed_answer(request, outputs, typed_in)
    tensors = []
    for t in outputs:
        tensor = _OUTPUT(name=t.name, datatype=t.datatype, shape=t.shape)
        if typed and not (in_shm and t.name in in_shm):
            tensor.contents.CopyFrom(_typed_contents(t))
        if t.parameters:
            _set_parameters(tensor.parameters, t.parameters)
        tensors.append(tensor)
    raw = None
    if not typed and not in_shm:
        raw = [_raw_bytes(t) for t in outputs]
    elif not typed:  # an output in shared memory keeps its place, empty (as Triton answers)
        raw = [b"" if t.name in in_shm else _raw_bytes(t) for t in outputs]
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
        outputs=tensors,
        raw_output_contents=raw,
    )
    if response.parameters:
        _set_parameters(message.parameters, response.parameters)
    return message


_OUTPUT = pb.ModelInferResponse.InferOutputTensor


def _raw_answer(response: InferResponse, outputs: list[Tensor]) -> pb.ModelInferResponse:
    """Every output as raw contents, nothing in shared memory (what ``encode_response``
    answers then), built in place by attribute stores: each output added to the message,
    not built apart and copied in, and no keyword constructor (protobuf's upb constructors
    cost about 1.5 times as many instructions as the same fields set one by one)."""
    message = pb.ModelInferResponse()
    message.model_name = response.model_name
    message.model_version = response.model_version
    if response.id:
        message.id = response.id
    add = message.outputs.add
    raw = message.raw_output_contents
    for t in outputs:
        tensor = add()
        tensor.name = t.name
        tensor.datatype = t.datatype
        tensor.shape.extend(t.shape)
        if t.parameters:
            _set_parameters(tensor.parameters, t.parameters)
        raw.append(_raw_bytes(t))
    if response.parameters:
        _set_parameters(message.parameters, response.parameters)
    return message


def _typed_answer(request: InferRequest, outputs: list[Tensor], typed_in: bool) -> bool:
    asked = request.outputs
    if (
        not typed_in
        and "binary_data_output" not in request.parameters
        and (not asked or not any(o.parameters for o in asked))  # no generator when none named
    ):
        return False  # the common case: nobody asked, answer raw
    return all(
        t.datatype in CONTENTS_FIELD and not request.wants_binary(t.name, default=not typed_in)
        for t in outputs
    )


def _set_parameters(target: Any, params: Parameters) -> None:
    """Fill a protobuf parameters map: its values are messages, which protobuf copies in
    one by one (``update`` with message objects raises "Message objects may not be
    assigned")."""
    for key, value in params.items():
        target[key].CopyFrom(parameter_to_proto(value))


def _raw_bytes(tensor: Tensor) -> bytes:
    """The raw layout as ``bytes`` (what a repeated protobuf bytes field takes): one copy.
    An array already in its datatype's numpy type is copied out by ``tobytes`` (C order, the
    raw layout), one call instead of a contiguous view, a reshape, a byte view and bytes()."""
    datatype = lookup(tensor.datatype)
    data = tensor.data
    if not datatype.is_bytes and data.dtype == datatype.dtype:
        return data.tobytes()
    return bytes(tensor_to_buffer(datatype, data))


def _typed_contents(tensor: Tensor) -> pb.InferTensorContents:
    field = CONTENTS_FIELD[tensor.datatype]
    flat: Any
    if tensor.datatype == "BYTES":
        flat = list(as_bytes_array(tensor.data).reshape(-1))
    else:
        flat = tensor.data.reshape(-1).tolist()
    return pb.InferTensorContents(**{field: flat})


# -- streams (ModelStreamInfer) -----------------------------------------------------------------
FINAL_RESPONSE = "triton_final_response"
"""Response parameter, as Triton sets it on every stream response: true on the last response
of a request (the only one of a model that is not decoupled)."""
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
"""Request parameter: a decoupled model's stream ends with an empty response marked final (else
the client cannot tell the last response of a request; a generator knows it has ended only
after its last yield)."""
_FINAL = pb.InferParameter(bool_param=True)
_NOT_FINAL = pb.InferParameter(bool_param=False)


def stream_response(response: pb.ModelInferResponse, final: bool) -> pb.ModelStreamInferResponse:
    """One encoded response on a stream, with its final-response flag."""
    response.parameters[FINAL_RESPONSE].CopyFrom(_FINAL if final else _NOT_FINAL)
    return pb.ModelStreamInferResponse(infer_response=response)


def wants_empty_final(msg: pb.ModelInferRequest) -> bool:
    """Whether the request asked for the empty final response (see EMPTY_FINAL_RESPONSE)."""
    param = msg.parameters.get(EMPTY_FINAL_RESPONSE)
    return (
        param is not None
        and param.WhichOneof("parameter_choice") == "bool_param"
        and (param.bool_param)
    )


def empty_final_response(msg: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    """The empty last response of a decoupled request: no outputs, flagged final."""
    empty = pb.ModelInferResponse(
        model_name=msg.model_name, model_version=msg.model_version, id=msg.id
    )
    return stream_response(empty, final=True)


def error_stream_response(msg: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    """A stream response carrying an error, with the request's model and id for correlation;
    it is the request's last response (flagged final)."""
    failed = pb.ModelInferResponse(
        model_name=msg.model_name, model_version=msg.model_version, id=msg.id
    )
    failed.parameters[FINAL_RESPONSE].CopyFrom(_FINAL)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=failed)
