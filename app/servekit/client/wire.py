"""The client side of the V2 binary tensor data extension, for ``servekit.connect``.

Requests carry every input as binary data after a small JSON header and ask for every output as
binary data, so no tensor is ever spelled out as JSON numbers in either direction. The byte
layout is the server's own (``servekit.codecs.raw``), so client and server cannot disagree on it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, MutableSet, Sequence
from typing import Any

import numpy as np

from servekit.client.casting import CastWarning, cast_to
from servekit.codecs import v2_json
from servekit.codecs.raw import tensor_from_bytes, tensor_to_buffer
from servekit.datatypes import DataType, as_bytes_array, from_numpy, lookup
from servekit.errors import InvalidArgument

Array = np.ndarray


def to_array(name: str, value: Any, datatype: str | None = None) -> Array:
    """An input value as an array: arrays keep their dtype (explicit wins), while lists and
    scalars take the model's declared ``datatype`` so that ``[[0.1, 0.2]]`` works for FP32."""
    if isinstance(value, np.ndarray):
        array = value
    elif datatype is not None and datatype != "BYTES":
        try:
            array = np.asarray(value, dtype=lookup(datatype).dtype)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"input {name!r}: cannot convert to {datatype}: {exc}") from None
    else:
        array = np.asarray(value)
    if array.dtype.kind in "OSU":
        return as_bytes_array(array)
    # Row-major little-endian, as runtimes and the wire expect (a no-op for the usual array).
    return np.ascontiguousarray(array, dtype=from_numpy(array.dtype).dtype)


def named(model: str, inputs: Any, declared: Sequence[str]) -> Mapping[str, Any]:
    """``inputs`` as name -> value: a mapping as it is; a bare array (or list) for a model of
    one declared input becomes that input's value; anything else is refused with the names the
    model takes (a bare array has no name to travel under)."""
    if isinstance(inputs, Mapping):
        return inputs
    if len(declared) == 1:
        return {declared[0]: inputs}
    kind = type(inputs).__name__
    if not declared:
        raise InvalidArgument(
            f"{model}: inputs are a dict of input name -> array (got a {kind}; the model's "
            "inputs are not known: is it loaded?)"
        )
    names = ", ".join(repr(n) for n in declared)
    raise InvalidArgument(
        f"{model}: the model takes {len(declared)} inputs ({names}): pass a dict of input name "
        f"-> array, e.g. {{{declared[0]!r}: ...}}, not a {kind}"
    )


def to_arrays(
    model: str,
    inputs: Mapping[str, Any],
    declared: Mapping[str, str],
    warned: MutableSet[tuple[str, str, str]],
    stacklevel: int = 3,
) -> dict[str, Array]:
    """Every input as an array of the model's declared datatype: lists take it, numpy arrays are
    cast to it when their values survive (app/servekit/client/casting.py). Each cast of a model's
    input is reported once (``warned`` remembers which were)."""
    arrays: dict[str, Array] = {}
    for name, value in inputs.items():
        datatype = declared.get(name)
        array = to_array(name, value, datatype)
        if isinstance(value, np.ndarray) and datatype is not None:
            cast = cast_to(name, array, datatype)
            if cast is not None:
                key = (model, name, f"{array.dtype}->{datatype}")
                if key not in warned:
                    warned.add(key)
                    warnings.warn(
                        f"{model}: input {name!r} cast from {from_numpy(array.dtype).name} to "
                        f"{datatype}, the model's datatype (the values fit; said once)",
                        CastWarning,
                        stacklevel=stacklevel,
                    )
                array = cast
        arrays[name] = array
    return arrays


def encode_request(
    inputs: Mapping[str, Array],
    outputs: Sequence[str] | None = None,
    input_parameters: Mapping[str, Mapping[str, Any]] | None = None,
    request_parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int]:
    """A binary-extension request body and its JSON header length (``input_parameters``,
    ``request_parameters``: content types, for a DataFrame's columns)."""
    entries: list[dict[str, Any]] = []
    buffers: list[Any] = []
    for name, array in inputs.items():
        datatype = from_numpy(array.dtype)
        buffer = tensor_to_buffer(datatype, array)
        size = memoryview(buffer).nbytes
        entries.append(
            {
                "name": name,
                "datatype": datatype.name,
                "shape": list(array.shape),
                "parameters": {**(input_parameters or {}).get(name, {}), "binary_data_size": size},
            }
        )
        buffers.append(buffer)
    header: dict[str, Any] = {
        "inputs": entries,
        "parameters": {**(request_parameters or {}), "binary_data_output": True},
    }
    if outputs:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    head = v2_json.dumps(header)
    return b"".join([head, *buffers]), len(head)


def decode_response(body: bytes, header_length: int | None) -> dict[str, Array]:
    """Outputs of a V2 response (pure JSON or JSON + binary data) as name -> array."""
    length = len(body) if header_length is None else header_length
    obj = v2_json.loads(memoryview(body)[:length])
    cursor = length
    results: dict[str, Array] = {}
    for entry in obj.get("outputs", []):
        name = entry["name"]
        datatype: DataType = lookup(entry["datatype"])
        shape = tuple(entry["shape"])
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            array = tensor_from_bytes(name, datatype, shape, body, cursor, size)
            cursor += size
        else:
            array = v2_json.json_data_to_array(name, datatype, shape, entry.get("data", []))
        # A copy, so the caller's arrays are writeable and do not pin the response body.
        results[name] = array.copy()
    return results
