"""Triton's binary tensor data extension for HTTP, and the raw binary request.

A body is a JSON header of ``Inference-Header-Content-Length`` bytes followed by the tensors'
raw bytes in the order of the JSON's inputs (or outputs). A header length of 0 is the raw binary
request: the whole body is the single input of the model. Tensors are numpy views over the body.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servekit.codecs import v2_json
from servekit.codecs.raw import Buffer, tensor_from_bytes, tensor_to_buffer
from servekit.datatypes import DataType, element_count, lookup
from servekit.errors import InvalidArgument
from servekit.types import InferRequest, InferResponse, Tensor, TensorSpec

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
    view = memoryview(body)
    obj = v2_json.loads(view[:header_length])
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
    entries: list[dict[str, Any]] = []
    if not request.outputs and not request.parameters and not request.shared_memory:
        # The usual request: nothing asked of the outputs, so every one is JSON data.
        if response.id is None and not response.parameters:
            content = v2_json.encode_plain(response)
            if content is not None:
                return content, None
        for tensor in response.outputs:
            entry = v2_json.output_entry(tensor)
            entry["data"] = v2_json.output_json_data(tensor)
            entries.append(entry)
        return v2_json.dumps(v2_json.response_header(response, entries)), None
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
