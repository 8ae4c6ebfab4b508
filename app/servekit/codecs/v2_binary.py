"""Triton's binary tensor data extension for HTTP, and the raw binary request.

A body is a JSON header of ``Inference-Header-Content-Length`` bytes followed by the tensors'
raw bytes in the order of the JSON's inputs (or outputs). A header length of 0 is the raw binary
request: the whole body is the single input of the model. Tensors are numpy views over the body.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servekit.codecs import v2_json
from servekit.codecs.raw import MAX_DIMS, Buffer, tensor_from_bytes, tensor_to_buffer
from servekit.datatypes import DATATYPES, DataType, element_count, lookup
from servekit.errors import InvalidArgument
from servekit.types import InferRequest, InferResponse, RequestedOutput, Tensor, TensorSpec

HEADER_LENGTH = "inference-header-content-length"


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The JSON header length from the HTTP header, validated against the body."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise InvalidArgument(
            f"Inference-Header-Content-Length must be an integer, got {value!r}"
        ) from None
    if length < 0 or length > body_length:
        raise InvalidArgument(
            f"Inference-Header-Content-Length {length} is outside the body of {body_length} bytes"
        )
    return length


def decode_request(
    body: bytes | bytearray, header_length: int, model_name: str, model_version: str | None
) -> InferRequest:
    """Decode a JSON header plus binary tensor data; inputs become views over ``body``."""
    obj = v2_json.loads(body[:header_length])  # (a slice of a small header: one copy, no view)
    if type(obj) is dict:
        request = _plain_request(obj, body, header_length, model_name, model_version)
        if request is not None:
            return request
    cursor = header_length

    def take(name: str, datatype: DataType, shape: tuple[int, ...], size: int) -> np.ndarray:
        nonlocal cursor
        if cursor + size > len(body):
            raise InvalidArgument(
                f"input {name!r}: binary_data_size {size} runs past the end of the body"
            )
        array = tensor_from_bytes(name, datatype, shape, body, cursor, size)
        cursor += size
        return array

    request = v2_json.decode_request(obj, model_name, model_version, binary=take)
    if cursor != len(body):
        raise InvalidArgument(
            f"{len(body) - cursor} bytes of binary data follow the inputs but no input claims them"
        )
    return request


def _plain_request(
    obj: dict[str, Any],
    body: bytes | bytearray,
    header_length: int,
    model_name: str,
    model_version: str | None,
) -> InferRequest | None:
    """The usual binary request (what ``tritonclient.http`` sends with ``binary_data=True``):
    ``inputs`` of fixed-size datatypes, each with ``name``, ``datatype``, ``shape`` and
    ``parameters`` holding ``binary_data_size`` alone, and ``outputs`` naming the outputs
    without shared memory; or None, and :func:`decode_request` takes the general way (which
    words every refusal).

    The same InferRequest the general way builds, in fewer steps: no closure, no per-input
    walk through :func:`v2_json._decode_input`'s every case, each tensor one numpy view over
    ``body`` made in one call (``np.ndarray`` over the buffer, no ``frombuffer`` + reshape).
    """
    raw_inputs = obj.get("inputs")
    raw_outputs = obj.get("outputs")
    if type(raw_inputs) is not list or len(obj) != (1 if raw_outputs is None else 2):
        return None
    cursor = header_length
    inputs: list[Tensor] = []
    for item in raw_inputs:
        if type(item) is not dict or len(item) != 4:
            return None
        name = item.get("name")
        raw_type = item.get("datatype")
        dims = item.get("shape")
        parameters = item.get("parameters")
        datatype = _FIXED_SIZE.get(raw_type) if type(raw_type) is str else None
        if (
            type(name) is not str
            or datatype is None
            or type(dims) is not list
            or type(parameters) is not dict
            or len(parameters) != 1
            or len(dims) > MAX_DIMS
        ):
            return None
        size = parameters.get("binary_data_size")
        if type(size) is not int:
            return None
        count = 1
        for dim in dims:
            if type(dim) is not int or dim < 0:
                return None
            count *= dim
        end = cursor + size
        if size != count * datatype.itemsize or end > len(body):
            return None
        shape = tuple(dims)
        array = np.ndarray(shape, datatype.dtype, body, cursor)
        inputs.append(Tensor(name, datatype.name, shape, array, parameters))
        cursor = end
    if cursor != len(body):
        return None
    outputs = None
    if raw_outputs is not None:
        if type(raw_outputs) is not list:
            return None
        outputs = []
        for item in raw_outputs:
            if type(item) is not dict:
                return None
            name = item.get("name")
            parameters = item.get("parameters", _ABSENT)
            if parameters is _ABSENT:
                parameters = {}
                if len(item) != 1:
                    return None
            elif type(parameters) is not dict or len(item) != 2:
                return None
            if type(name) is not str or v2_json.SHARED_MEMORY_REGION in parameters:
                return None
            outputs.append(RequestedOutput(name, parameters))
    # (positional: InferRequest's field order)
    return InferRequest(model_name, inputs, model_version, None, outputs, {}, False)


_FIXED_SIZE: dict[str, DataType] = {
    name: datatype for name, datatype in DATATYPES.items() if not datatype.is_bytes
}
"""The datatypes whose tensors are views over the body (BYTES elements are split one by
one: the general way)."""
_ABSENT = object()


def decode_raw_request(
    body: bytes | bytearray,
    model_name: str,
    model_version: str | None,
    inputs: tuple[TensorSpec, ...],
) -> InferRequest:
    """The raw binary request: the body is the only input, its shape inferred from its size.

    Allowed only for a model with exactly one input that has at most one dynamic dimension (or is
    a BYTES input of shape [1]); every output is returned as binary data.
    """
    if len(inputs) != 1:
        raise InvalidArgument(
            f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with one "
            f"input; {model_name!r} has {len(inputs)}"
        )
    spec = inputs[0]
    datatype = lookup(spec.datatype)
    if datatype.is_bytes:
        # The whole body is one element, so the input must hold exactly one: shape [1].
        if any(dim not in (1, -1) for dim in spec.shape):
            raise InvalidArgument(
                f"a raw binary request sends one BYTES element, but input {spec.name!r} has "
                f"shape {list(spec.shape)}; only shape [1] qualifies"
            )
        shape: tuple[int, ...] = (1,) * len(spec.shape)
        array = np.empty(shape, dtype=object)
        array.flat[0] = bytes(body)
    else:
        shape = _infer_shape(spec, datatype, len(body))
        array = tensor_from_bytes(spec.name, datatype, shape, body)
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=[Tensor(spec.name, datatype.name, shape, array)],
        parameters={"binary_data_output": True},
    )


def _infer_shape(spec: TensorSpec, datatype: DataType, size: int) -> tuple[int, ...]:
    dynamic = [i for i, dim in enumerate(spec.shape) if dim < 0]
    if len(dynamic) > 1:
        raise InvalidArgument(
            f"a raw binary request cannot infer the shape {list(spec.shape)} of input "
            f"{spec.name!r}: it has more than one dynamic dimension"
        )
    fixed = element_count([d for d in spec.shape if d >= 0]) * datatype.itemsize
    if not dynamic:
        return spec.shape
    if fixed == 0 or size % fixed:
        raise InvalidArgument(
            f"raw binary body of {size} bytes does not fit input {spec.name!r} "
            f"with shape {list(spec.shape)} of {datatype.name}"
        )
    shape = list(spec.shape)
    shape[dynamic[0]] = size // fixed
    return tuple(shape)


def encode_response(request: InferRequest, response: InferResponse) -> tuple[bytes, int | None]:
    """Encode a response as JSON, or JSON plus binary data when any output asks for it.

    Returns the body and the JSON header length (None when the body is pure JSON). Outputs
    written to shared memory carry no data (as Triton answers them).
    """
    if not request.outputs and not request.parameters and not request.shared_memory:
        # The usual request: nothing asked of the outputs, so every one is JSON data.
        if response.id is None and not response.parameters:
            content = v2_json.encode_plain(response)
            if content is not None:
                return content, None
        return v2_json.dumps(v2_json.json_response(response)), None
    if (
        request.outputs
        and not request.parameters
        and not request.shared_memory
        and response.id is None
        and not response.parameters
    ):
        plain = _plain_binary(request, response)
        if plain is not None:
            return plain
    entries: list[dict[str, Any]] = []
    buffers: list[Buffer] = []
    in_shm = request.outputs_in_shared_memory() if request.shared_memory else None
    for tensor in response.outputs:
        entry = v2_json.output_entry(tensor)
        if in_shm and tensor.name in in_shm:
            pass  # its bytes are in the client's region: name, datatype and shape only
        elif request.wants_binary(tensor.name, default=False):
            buffer = tensor_to_buffer(lookup(tensor.datatype), tensor.data)
            entry.setdefault("parameters", {})["binary_data_size"] = memoryview(buffer).nbytes
            buffers.append(buffer)
        else:
            entry["data"] = v2_json.output_json_data(tensor)
        entries.append(entry)
    header = v2_json.dumps(v2_json.response_header(response, entries))
    if not buffers:
        return header, None
    return b"".join([header, *buffers]), len(header)


def _plain_binary(request: InferRequest, response: InferResponse) -> tuple[bytes, int] | None:
    """The answer to the usual binary request (every output asked for with ``binary_data:
    true`` alone, none with parameters, each a C-contiguous array of its datatype's dtype), or
    None: the general way of :func:`encode_response` then builds it.

    Byte for byte the general way's answer, but its JSON header, the same on every answer of a
    model version with the same output shapes, is encoded once (:data:`_BINARY_HEADERS`), and
    each array is joined to it as it is (its buffer), with no contiguous copy, flat view or
    memoryview of its own."""
    requested = request.outputs
    assert requested is not None
    for output in requested:
        if output.parameters != _BINARY_ONLY:
            return None
    names = {output.name for output in requested} if len(requested) > 1 else None
    key: tuple[Any, ...] = (response.model_name, response.model_version)
    for tensor in response.outputs:
        datatype = _FIXED_SIZE.get(tensor.datatype)
        if datatype is None or tensor.parameters or tensor.data.dtype != datatype.dtype:
            return None
        if names is None:
            if tensor.name != requested[0].name:
                return None
        elif tensor.name not in names:
            return None
        key += (tensor.name, tensor.datatype, tensor.shape)
    try:
        header = _BINARY_HEADERS.get(key)
    except TypeError:  # a shape given as a list by a runtime: the general way
        return None
    if header is None:
        header = _binary_header(key, response)
    try:
        parts: list[Any] = [header]
        parts += [tensor.data for tensor in response.outputs]  # ndarrays are buffers
        return b"".join(parts), len(header)
    except (BufferError, ValueError, TypeError):  # an array numpy gives no plain buffer of
        return None


def _binary_header(key: tuple[Any, ...], response: InferResponse) -> bytes:
    """The JSON header of a binary answer (see :func:`_plain_binary`), kept under ``key``."""
    entries = []
    for tensor in response.outputs:
        entry = v2_json.output_entry(tensor)
        entry["parameters"] = {"binary_data_size": tensor.data.nbytes}
        entries.append(entry)
    header = v2_json.dumps(v2_json.response_header(response, entries))
    if len(_BINARY_HEADERS) >= _MAX_BINARY_HEADERS:
        _BINARY_HEADERS.clear()
    _BINARY_HEADERS[key] = header
    return header


_BINARY_ONLY = {"binary_data": True}
_BINARY_HEADERS: dict[tuple[Any, ...], bytes] = {}
"""JSON headers of binary answers by (model, version, then name, datatype and shape of each
output)."""
_MAX_BINARY_HEADERS = 4096
