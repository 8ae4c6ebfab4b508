"""Triton's generate extension (``/generate``, ``/generate_stream``): flat JSON in, flat JSON out.

A request is one JSON object whose top-level fields are the model's inputs *by name*
(``{"text_input": "Hello", "max_tokens": 8}``), plus ``id`` and an optional ``parameters``
object; any other field is a request parameter (a string, number or boolean), as in Triton.
An input value is a scalar or a flat list; it is shaped to the input's declared shape the way
Triton does it: fixed dimensions take their size, the innermost ``-1`` takes what is left and
other ``-1`` dimensions are 1 (``"Hello"`` for a ``[-1]`` BYTES input is shape ``[1]``).

A response is one JSON object: ``model_name``, ``model_version``, ``id`` when the request had
one, the response parameters, and each output as a field of its name, a scalar when it has one
element (a token) and a flat list otherwise.
"""

from __future__ import annotations

from typing import Any

from servekit.codecs.v2_json import json_data_to_array, output_json_data
from servekit.datatypes import lookup
from servekit.errors import InvalidArgument
from servekit.types import InferRequest, InferResponse, Parameters, Tensor, TensorSpec

_SCALAR = (str, int, float, bool)


def decode_request(
    obj: object, model: str, version: str | None, inputs: tuple[TensorSpec, ...]
) -> InferRequest:
    """The InferRequest of a generate request object (missing inputs are the DataPlane's to
    report, as for any request)."""
    if not isinstance(obj, dict):
        raise InvalidArgument("a generate request must be a JSON object of input fields")
    by_name = {spec.name: spec for spec in inputs}
    tensors: list[Tensor] = []
    parameters: Parameters = {}
    request_id: str | None = None
    for key, value in obj.items():
        spec = by_name.get(key)
        if spec is not None:
            tensors.append(_tensor(spec, value))
        elif key == "id":
            if not isinstance(value, str):
                raise InvalidArgument("'id' must be a string")
            request_id = value
        elif key == "parameters":
            if not isinstance(value, dict):
                raise InvalidArgument("'parameters' must be a JSON object")
            for name, item in value.items():
                parameters[name] = _parameter(name, item)
        else:
            parameters[key] = _parameter(key, value)
    return InferRequest(model, tensors, version, request_id, None, parameters)


def _parameter(name: str, value: object) -> str | int | float | bool:
    if not isinstance(value, _SCALAR):
        raise InvalidArgument(
            f"field {name!r} is not an input of the model, so it is a parameter, which must be "
            "a string, a number or a boolean"
        )
    return value


def _tensor(spec: TensorSpec, value: object) -> Tensor:
    if isinstance(value, list):
        if any(isinstance(item, list | dict) for item in value):
            raise InvalidArgument(f"input {spec.name!r}: give a scalar or a flat list")
        count = len(value)
    elif isinstance(value, dict) or value is None:
        raise InvalidArgument(f"input {spec.name!r}: give a scalar or a flat list")
    else:
        count = 1
    shape = fit_shape(spec.name, spec.shape, count)
    return Tensor(
        spec.name,
        spec.datatype,
        shape,
        json_data_to_array(spec.name, lookup(spec.datatype), shape, value),
    )


def fit_shape(name: str, declared: tuple[int, ...], count: int) -> tuple[int, ...]:
    """``count`` elements in the declared shape: fixed dimensions as declared, the innermost
    ``-1`` what is left, any other ``-1`` one."""
    left = count
    for dim in declared:
        if dim >= 0:
            if dim == 0 or left % dim:
                raise InvalidArgument(
                    f"input {name!r}: {count} element(s) do not fit its shape {list(declared)}"
                )
            left //= dim
    shape = list(declared)
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] < 0:
            shape[index], left = left, 1
    if left != 1:
        raise InvalidArgument(
            f"input {name!r}: {count} element(s) do not fit its shape {list(declared)}"
        )
    return tuple(shape)


def encode_response(response: InferResponse) -> dict[str, Any]:
    """The generate response object (orjson writes the numpy values)."""
    out: dict[str, Any] = {}
    if response.id:
        out["id"] = response.id
    out["model_name"] = response.model_name
    out["model_version"] = response.model_version
    out.update(response.parameters)
    for tensor in response.outputs:
        data = output_json_data(tensor)
        out[tensor.name] = data[0] if tensor.data.size == 1 else data
    return out
