"""The V2 (Open Inference Protocol) JSON inference request and response objects.

Decoding turns the parsed JSON object into an :class:`InferRequest`; tensors whose bytes follow
the JSON (Triton's binary tensor data extension) are resolved by :mod:`servekit.codecs.v2_binary`
through the ``binary`` callback. Encoding builds the response object with numpy arrays left in
place for orjson to serialize natively (no ``tolist()`` round trip).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from servekit.codecs.raw import MAX_DIMS, check_shape, datatype_of
from servekit.datatypes import (
    DATATYPES,
    DataType,
    narrow_floats,
    narrow_integers,
    refuse_booleans,
)
from servekit.errors import InvalidArgument
from servekit.types import InferRequest, InferResponse, Parameters, RequestedOutput, Tensor

if TYPE_CHECKING:
    from servekit.codecs.v2_json_large import Segments

SHARED_MEMORY_REGION = "shared_memory_region"
"""The parameter naming a registered shared-memory region (Triton's extension)."""
IN_SHARED_MEMORY: np.ndarray = np.empty(0, dtype=np.uint8)
"""Placeholder data of an input whose bytes are in a shared-memory region: the DataPlane reads
them (app/servekit/services/shared_memory.py) before anything looks at the data."""
IN_SHARED_MEMORY.flags.writeable = False
_ONE_SOURCE = (
    "input {name!r}: Input must set only one of the following fields: 'data', "
    "'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But set {given}"
)

MAX_NESTING = 64
"""Deepest nesting of lists in ``data`` (a tensor has at most 64 dimensions)."""

# Given (name, datatype, shape, binary_data_size) return the decoded array.
BinaryResolver = Callable[[str, DataType, tuple[int, ...], int], np.ndarray]

_KIND_OK = {
    "BOOL": "b",
    "UINT8": "iu", "UINT16": "iu", "UINT32": "iu", "UINT64": "iu",
    "INT8": "iu", "INT16": "iu", "INT32": "iu", "INT64": "iu",
    "FP16": "iuf", "FP32": "iuf", "FP64": "iuf",
}  # fmt: skip


# Non-finite floats: Triton reads and writes the bare tokens NaN/Infinity/-Infinity (rapidjson's
# kParseNanAndInfFlag / kWriteNanAndInfFlag) and tritonclient.http sends them for JSON inputs;
# the V2 OpenAPI schema allows numbers, strings and booleans only, so we answer these strings.
NON_FINITE: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def loads(body: bytes | bytearray | memoryview) -> Any:
    """Parse JSON, turning a syntax error into the client's mistake.

    orjson is strict JSON; a body it refuses that holds NaN/Infinity tokens (what tritonclient
    sends for non-finite JSON inputs, and Triton accepts) is parsed again by the standard
    library, then re-checked by orjson for anything else strict JSON forbids (lone surrogates).
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        error = exc
    data = bytes(body)
    if b"NaN" in data or b"Infinity" in data:
        try:
            obj = json.loads(data, parse_constant=NON_FINITE.__getitem__)
            orjson.dumps(obj)
            return obj
        except (ValueError, TypeError, RecursionError):
            pass
    raise InvalidArgument(f"malformed JSON: {error}") from None


def decode_body(
    body: bytes | bytearray, model_name: str, model_version: str | None
) -> InferRequest:
    """Parse and decode a whole V2 JSON request body (:func:`loads`, :func:`decode_request`).

    Knowing the text lets the usual tensor skip a pass over its values: a JSON boolean is the
    token ``true`` or ``false`` in the body, so a body without either cannot hold one, and the
    values of its ``data`` lists are numbers as soon as they convert to floats
    (:func:`_plain_input`)."""
    obj = loads(body)
    if type(obj) is dict and len(obj) == 1:  # inputs only (the usual request): see below
        raw_inputs = obj.get("inputs")
        if type(raw_inputs) is list and len(raw_inputs) == 1:
            item = raw_inputs[0]
            if type(item) is dict and len(item) == 4 and _no_booleans(body):
                tensor = _plain_input(item, numbers=True)
                if tensor is not None:
                    return InferRequest(model_name, [tensor], model_version, None, None, {})
    return decode_request(obj, model_name, model_version)


def _no_booleans(body: bytes | bytearray) -> bool:
    """Whether the JSON text holds no ``true`` or ``false`` token. Asked first of one byte
    each (``r``, ``f``: in no key of a V2 request; a C memchr, where a search for a word walks
    the body byte by byte), and of the words only when that byte is there."""
    return (_R not in body or b"true" not in body) and (_F not in body or b"false" not in body)


_R, _F = ord("r"), ord("f")


def _parameters(owner: str, value: object) -> Parameters:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{owner}: parameters must be a JSON object")
    return value


def decode_request(
    obj: object,
    model_name: str,
    model_version: str | None,
    binary: BinaryResolver | None = None,
    segments: Segments | None = None,
) -> InferRequest:
    """Build an InferRequest from a parsed V2 JSON request object (``segments``: the numeric
    ``data`` arrays :mod:`servekit.codecs.v2_json_large` cut out of a large body)."""
    if not isinstance(obj, dict):
        raise InvalidArgument("inference request must be a JSON object")
    raw_inputs = obj.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidArgument("inference request needs an 'inputs' list")
    shared: list[str] = []  # tensors in shared memory (rare: one list beats a test per tensor)
    if len(raw_inputs) == 1:  # the usual request (a comprehension is a frame of its own)
        item = raw_inputs[0]
        tensor = _plain_input(item) if type(item) is dict and len(item) == 4 else None
        inputs = [_decode_input(item, binary, segments, shared) if tensor is None else tensor]
        if len(obj) == 1:  # inputs only: no outputs, id or parameters to read
            return InferRequest(model_name, inputs, model_version, None, None, {}, bool(shared))
    else:
        inputs = [_decode_input(item, binary, segments, shared) for item in raw_inputs]
    outputs = None
    raw_outputs = obj.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InvalidArgument("'outputs' must be a list")
        outputs = [_decode_output(item, shared) for item in raw_outputs]
    request_id = obj.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidArgument("'id' must be a string")
    raw_parameters = obj.get("parameters")
    parameters = {} if raw_parameters is None else _parameters("request", raw_parameters)
    # (positional: InferRequest's field order; a keyword call costs more on every request)
    return InferRequest(
        model_name, inputs, model_version, request_id, outputs, parameters, bool(shared)
    )


def _decode_output(item: object, shared: list[str]) -> RequestedOutput:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise InvalidArgument("each requested output needs a 'name'")
    name = item["name"]
    parameters = _parameters(f"output {name!r}", item.get("parameters"))
    if SHARED_MEMORY_REGION in parameters:
        shared.append(name)
    return RequestedOutput(name, parameters)


def _plain_input(item: dict[str, Any], numbers: bool = False) -> Tensor | None:
    """The usual input (``name``, ``datatype``, ``shape`` and a ``data`` list, nothing else,
    each of the right kind), or None: :func:`_decode_input` decodes it, and words any error.
    What it checks is what :func:`_decode_input` checks before ``data``, in fewer steps
    (``numbers``: no JSON boolean is in the request, see :func:`decode_body`)."""
    name = item.get("name")
    raw_type = item.get("datatype")
    dims = item.get("shape")
    data = item.get("data")
    if type(name) is not str or type(raw_type) is not str or type(dims) is not list:
        return None
    datatype = DATATYPES.get(raw_type)
    if datatype is None or type(data) is not list or len(dims) > MAX_DIMS:
        return None
    for dim in dims:
        if type(dim) is not int or dim < 0:
            return None
    shape = tuple(dims)
    # ``numbers``: the request holds no JSON boolean (its text has no true/false token), so a
    # small flat list that math.hypot takes (one C pass: it refuses strings, null and lists)
    # holds only ints and floats, and its Euclidean norm bounds every value's magnitude (NaN
    # and infinities fail the test). Within 2**53 (and the datatype's range) an int is exactly
    # a double, so numpy's cast of the list gives what the general way gives (an int64 or
    # float64 array, then cast): no type pass and no range pass over the values.
    bound = _NUMBERS_BOUND.get(raw_type) if numbers else None
    if bound is not None and 0 < len(data) <= _SMALL and type(data[0]) is not list:
        try:
            norm = _HYPOT(*data)
        except (TypeError, ValueError, OverflowError):  # strings ("NaN"), nested lists, ...
            norm = math.inf
        if norm <= bound and len(data) == _PROD(shape):
            if len(shape) == 2 and shape[0] == 1:  # a batch of one row: no reshape
                array = np.array(data, dtype=datatype.dtype, ndmin=2)
            else:
                array = np.array(data, dtype=datatype.dtype).reshape(shape)
            return Tensor(name, datatype.name, shape, array, {})
    return Tensor(name, datatype.name, shape, json_data_to_array(name, datatype, shape, data), {})


def _decode_input(
    item: object, binary: BinaryResolver | None, segments: Segments | None, shared: list[str]
) -> Tensor:
    if not isinstance(item, dict):
        raise InvalidArgument("each input must be a JSON object")
    name = item.get("name")
    if not isinstance(name, str):
        raise InvalidArgument("each input needs a string 'name'")
    raw_type = item.get("datatype")
    datatype = DATATYPES.get(raw_type) if type(raw_type) is str else None
    if datatype is None:
        datatype = datatype_of(name, raw_type)  # says what is wrong
    if "shape" not in item:
        raise InvalidArgument(f"input {name!r}: missing 'shape'")
    shape = check_shape(name, item["shape"])
    raw_parameters = item.get("parameters")
    parameters = {} if raw_parameters is None else _parameters(f"input {name!r}", raw_parameters)
    size = parameters.get("binary_data_size")
    if size is not None:
        if binary is None:
            raise InvalidArgument(
                f"input {name!r}: binary_data_size given but the request has no binary data "
                "(set the Inference-Header-Content-Length header)"
            )
        if type(size) is not int or size < 0:
            raise InvalidArgument(f"input {name!r}: binary_data_size must be a non-negative int")
        if SHARED_MEMORY_REGION in parameters:
            given = "'binary_data_size' 'shared_memory_region'"
            raise InvalidArgument(_ONE_SOURCE.format(name=name, given=given))
        array = binary(name, datatype, shape, size)
    else:
        if "data" not in item:
            if SHARED_MEMORY_REGION in parameters:  # read by the DataPlane from the region
                shared.append(name)
                return Tensor(name, datatype.name, shape, IN_SHARED_MEMORY, parameters)
            raise InvalidArgument(f"input {name!r}: missing 'data'")
        if SHARED_MEMORY_REGION in parameters:
            raise InvalidArgument(
                _ONE_SOURCE.format(name=name, given="'data' 'shared_memory_region'")
            )
        data = item["data"]
        if segments is not None and type(data) is dict and len(data) == 1:
            from servekit.codecs.v2_json_large import PLACEHOLDER

            if PLACEHOLDER in data:
                data = segments.array(data[PLACEHOLDER], name, datatype, shape)
                return Tensor(name, datatype.name, shape, data, parameters)
        array = json_data_to_array(name, datatype, shape, data)
    return Tensor(name, datatype.name, shape, array, parameters)


def json_data_to_array(
    name: str, datatype: DataType, shape: tuple[int, ...], data: object
) -> np.ndarray:
    """Convert nested or flat JSON ``data`` to an array of ``shape``, checking kinds strictly.

    ``1.5`` for an INT32 input or ``"a"`` for FP32 is an error, not a silent cast. BOOL takes
    JSON true/false only and numeric datatypes refuse them (as Triton does). Values out of the
    datatype's range are errors too: integers that do not fit, and finite floats that would
    become infinite (1e6 as FP16); infinities and NaN travel as the strings of ``NON_FINITE``.
    """
    count = _PROD(shape)  # (element_count, in C: Python ints, no overflow either)
    largest = _FLOAT_LARGEST.get(datatype.name)
    # The usual JSON tensor: a flat list of floats for a float input. Straight into a float64
    # array (no dtype discovery, no boolean scan: only floats were seen), and cast only when
    # every value fits the datatype (anything else, NaN included, takes the general way below,
    # which says what is wrong or handles it).
    if (
        largest is not None
        and type(data) is list
        and len(data) == count
        and count
        and _ONLY_FLOATS.issuperset(map(type, data))
    ):
        # On Python floats for a small tensor (a numpy reduction costs far more): a sum of
        # magnitudes within the datatype's range bounds every value, and is false for NaN or
        # an infinity. Each value is then rounded once, as the cast from float64 rounds it.
        if count <= _SMALL and sum(map(abs, data)) <= largest:
            return np.array(data, dtype=datatype.dtype).reshape(shape)
        wide = np.array(data, dtype=np.float64)
        if -largest <= _MIN(wide) and _MAX(wide) <= largest:
            if datatype.name != "FP64":
                wide = wide.astype(datatype.dtype)
            return wide.reshape(shape)
    if not isinstance(data, list):
        data = [data]
    if datatype.is_bytes:
        return _bytes_from_json(name, shape, count, data)
    try:
        inferred = np.asarray(data)
    except (ValueError, TypeError):
        raise InvalidArgument(f"input {name!r}: 'data' is ragged or not numeric") from None
    if inferred.size != count:
        raise InvalidArgument(
            f"input {name!r}: shape {list(shape)} needs {count} elements, got {inferred.size}"
        )
    label = f"input {name!r}"
    if count and datatype.name != "BOOL":
        refuse_booleans(label, data, inferred, datatype.name)
    if count and inferred.dtype.kind == "f" and datatype.dtype.kind in "iu":
        inferred = _exact_ints(name, datatype, data, inferred)
    if count and inferred.dtype.kind in "UO" and datatype.dtype.kind == "f":
        inferred = _non_finite(data, inferred)
    if count and inferred.dtype.kind not in _KIND_OK[datatype.name]:
        only = " (JSON true/false only)" if datatype.name == "BOOL" else ""
        raise InvalidArgument(
            f"{label}: 'data' holds {_describe(inferred.dtype)}, "
            f"not valid for {datatype.name}{only}"
        )
    if datatype.dtype.kind == "f":
        return narrow_floats(label, inferred, datatype).reshape(shape)
    if inferred.dtype.kind in "iu" and datatype.dtype.kind in "iu":
        inferred = narrow_integers(label, inferred, datatype)
    return inferred.astype(datatype.dtype, copy=False).reshape(shape)


_FLOAT_LARGEST = {
    name: float(np.finfo(dtype).max)
    for name, dtype in (("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64))
}
"""The largest finite value of each float datatype (a larger one is refused, not made inf)."""
_ONLY_FLOATS = frozenset({float})
_HYPOT = math.hypot
_NUMBERS_BOUND = {name: min(largest, 2.0**53) for name, largest in _FLOAT_LARGEST.items()}
"""The magnitude below which a list of ints and floats converts exactly as the general way
converts it (see :func:`json_data_to_array`)."""
_SMALL = 256
"""Up to this many values, a tensor's range and finiteness are checked on Python floats (a
few hundred instructions) rather than by numpy reductions (thousands each, whatever the
size); above it, numpy's loops win."""
_PROD = math.prod
_MIN = np.minimum.reduce
_MAX = np.maximum.reduce
_ALL = np.logical_and.reduce
"""ufunc reductions called directly: ``ndarray.all()`` and the like go through Python."""


def _non_finite(data: list[Any], inferred: np.ndarray) -> np.ndarray:
    """Numbers mixed with the strings "NaN"/"Infinity"/"-Infinity" (our JSON output) as floats."""
    flat: list[Any] = []
    _flatten(data, flat)
    values: list[float] = []
    for item in flat:
        if isinstance(item, str) and item in NON_FINITE:
            values.append(NON_FINITE[item])
        elif isinstance(item, float) or (type(item) is int and abs(item) < 2**1023):
            values.append(float(item))
        else:
            return inferred  # not numbers: the caller reports the kind
    return np.array(values, dtype=np.float64).reshape(inferred.shape)


def _exact_ints(name: str, datatype: DataType, data: list[Any], inferred: np.ndarray) -> np.ndarray:
    """numpy turns ints beyond int64 (UINT64 above 2**63-1) into float64; convert exactly."""
    flat: list[Any] = []
    _flatten(data, flat)
    if not all(type(x) is int for x in flat):
        return inferred  # real floats: the caller reports them
    try:
        return np.array(flat, dtype=datatype.dtype).reshape(inferred.shape)
    except OverflowError:
        info = np.iinfo(datatype.dtype)
        raise InvalidArgument(
            f"input {name!r}: value out of range for {datatype.name} [{info.min}, {info.max}]"
        ) from None


def _describe(dtype: np.dtype) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "U": "strings"}.get(
        dtype.kind, "mixed values"
    )


def _bytes_from_json(name: str, shape: tuple[int, ...], count: int, data: list[Any]) -> np.ndarray:
    _nested_shape(name, data)  # ragged nesting is refused, as numpy refuses it for numbers
    flat: list[Any] = []
    _flatten(data, flat)
    if len(flat) != count:
        raise InvalidArgument(
            f"input {name!r}: shape {list(shape)} needs {count} elements, got {len(flat)}"
        )
    out = np.empty(count, dtype=object)
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            raise InvalidArgument(f"input {name!r}: BYTES data must be strings")
        out[i] = item.encode("utf-8")
    return out.reshape(shape)


def _nested_shape(name: str, data: object, depth: int = 0) -> tuple[int, ...]:
    """Shape of nested lists; lists of unequal lengths (or lists beside scalars) are ragged."""
    if not isinstance(data, list):
        return ()
    if depth >= MAX_NESTING:
        raise InvalidArgument(f"input {name!r}: 'data' nested deeper than {MAX_NESTING} lists")
    shapes = {_nested_shape(name, item, depth + 1) for item in data}
    if len(shapes) > 1:
        raise InvalidArgument(f"input {name!r}: 'data' is ragged")
    return (len(data), *next(iter(shapes), ()))


def _flatten(data: list[Any], into: list[Any], depth: int = 0) -> None:
    if depth >= MAX_NESTING:
        raise InvalidArgument(f"'data' nested deeper than {MAX_NESTING} lists")
    for item in data:
        if isinstance(item, list):
            _flatten(item, into, depth + 1)
        else:
            into.append(item)


def output_json_data(tensor: Tensor) -> Any:
    """The ``data`` value of an output: a flat numpy array for orjson, or strings for BYTES."""
    flat = tensor.data.ravel()
    if flat.dtype.kind == "f" and not _finite(flat):
        return [x if math.isfinite(x) else _non_finite_name(x) for x in flat.tolist()]
    if tensor.datatype != "BYTES":
        return np.ascontiguousarray(flat)
    try:
        return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in flat]
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"output {tensor.name!r} holds bytes that are not UTF-8 and cannot be sent as JSON; "
            "request it with the binary_data parameter"
        ) from None


def _finite(flat: np.ndarray) -> bool:
    """Whether every value of a flat float array is finite."""
    if flat.size <= _SMALL:
        total = sum(flat.tolist())  # finite: so is every value (else NaN or an infinity)
        if total - total == 0.0:
            return True
    return bool(_ALL(np.isfinite(flat)))  # (a large sum can overflow: the exact answer)


def _non_finite_name(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def output_json_data_nested(tensor: Tensor) -> Any:
    """An output as nested lists (KServe V1 predictions), BYTES as strings."""
    if tensor.datatype != "BYTES":
        return tensor.data.tolist()
    flat = np.array(output_json_data(tensor), dtype=object)
    return flat.reshape(tensor.data.shape).tolist()


def response_header(response: InferResponse, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The response object around already-built output entries."""
    obj: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id is not None:
        obj["id"] = response.id
    if response.parameters:
        obj["parameters"] = response.parameters
    obj["outputs"] = outputs
    return obj


def json_response(response: InferResponse) -> dict[str, Any]:
    """The V2 JSON document of ``response`` with every output's data as JSON: the answer to a
    request that asks nothing of its outputs, and each event of an ``infer_stream``."""
    outputs = [{**output_entry(t), "data": output_json_data(t)} for t in response.outputs]
    return response_header(response, outputs)


def output_entry(tensor: Tensor) -> dict[str, Any]:
    """The JSON entry of an output without its data."""
    entry: dict[str, Any] = {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": list(tensor.shape),
    }
    if tensor.parameters:
        entry["parameters"] = dict(tensor.parameters)
    return entry


_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_NULL_END = b"null}"


def encode_plain(response: InferResponse) -> bytes | None:
    """The JSON answer of a response with no ``id`` or parameters whose outputs are finite
    numbers without parameters, or None (then the general way builds it).

    Byte for byte what :func:`dumps` makes of :func:`response_header` around
    :func:`output_entry` entries, but the parts that are the same on every answer of a model
    version (the header, each output's name, datatype and shape) are encoded once
    (:data:`_FRAGMENTS`) and only each output's data goes through orjson: a dict per output
    and the walk over them cost more than the numbers themselves for a tiny model."""
    outputs = response.outputs
    if len(outputs) == 1:  # the usual answer: see _encode_one
        content = _encode_one(response, outputs[0])
        if content is not None:
            return content
    head = _FRAGMENTS.get((response.model_name, response.model_version))
    if head is None:
        head = _fragment(
            (response.model_name, response.model_version),
            {"model_name": response.model_name, "model_version": response.model_version},
            b"[]}",
        )
        if head is None:
            return None
    parts = [head]
    for tensor in response.outputs:
        if tensor.parameters or tensor.datatype == "BYTES":
            return None
        flat = tensor.data.ravel()
        if flat.dtype.kind == "f" and not _finite(flat):
            return None
        key = (tensor.name, tensor.datatype, tensor.shape)
        try:
            piece = _FRAGMENTS.get(key)
        except TypeError:  # a shape given as a list by a runtime: the general way
            return None
        if piece is None:
            piece = _fragment(key, output_entry(tensor), _NULL_END)
            if piece is None:
                return None
        parts += (piece, orjson.dumps(np.ascontiguousarray(flat), option=_DUMP_OPTIONS), b"},")
    if len(parts) > 1:
        parts[-1] = b"}]}"
    else:
        parts.append(b"]}")
    return b"".join(parts)


def _encode_one(response: InferResponse, tensor: Tensor) -> bytes | None:
    """:func:`encode_plain`'s answer for one output of one row or one dimension, or None.

    Its whole text up to the numbers is kept under (model, version, name, datatype, shape),
    and orjson writes the array as it is (no flat view, no contiguous copy: one row's
    ``[[...]]`` loses its outer brackets); a NaN or an infinity, which orjson writes as
    ``null`` and the general way as a string, sends it back (None)."""
    data = tensor.data
    if tensor.parameters or tensor.datatype == "BYTES" or type(data) is not np.ndarray:
        return None
    ndim = data.ndim
    if ndim != 1 and (ndim != 2 or len(data) != 1):
        return None
    key = (response.model_name, response.model_version, tensor.name, tensor.datatype, tensor.shape)
    try:
        prefix = _FRAGMENTS.get(key)
    except TypeError:  # a shape given as a list by a runtime: the general way
        return None
    if prefix is None:
        prefix = _one_prefix(key, response, tensor)
        if prefix is None:
            return None
    try:
        text = orjson.dumps(data, option=_DUMP_OPTIONS)
    except orjson.JSONEncodeError:  # not C-contiguous, or a dtype orjson does not write
        return None
    if _N in text:  # ``null``: not a finite number
        return None
    return b"".join((prefix, text[1:-1] if ndim == 2 else text, b"}]}"))


def _one_prefix(key: tuple[Any, ...], response: InferResponse, tensor: Tensor) -> bytes | None:
    """The answer's text before its one output's numbers (see :func:`_encode_one`)."""
    version = (response.model_name, response.model_version)
    head = _FRAGMENTS.get(version)
    if head is None:
        head = _fragment(version, {"model_name": version[0], "model_version": version[1]}, b"[]}")
    entry = (tensor.name, tensor.datatype, tensor.shape)
    piece = _FRAGMENTS.get(entry)
    if piece is None:
        piece = _fragment(entry, output_entry(tensor), _NULL_END)
    if head is None or piece is None:
        return None
    if len(_FRAGMENTS) >= _MAX_FRAGMENTS:
        _FRAGMENTS.clear()
    _FRAGMENTS[key] = prefix = head + piece
    return prefix


_N = ord("n")


def _fragment(key: tuple[Any, ...], obj: dict[str, Any], end: bytes) -> bytes | None:
    """The encoding of ``obj`` with a last member (``"outputs"`` or ``"data"``) left open,
    kept under ``key``; None when its text is not as expected (then nothing is kept)."""
    last = "outputs" if end == b"[]}" else "data"
    obj[last] = [] if last == "outputs" else None
    text = dumps(obj)
    tail = b'"%s":%s' % (last.encode(), end)
    if not text.endswith(tail):
        return None
    fragment = text[: -len(end)] + (b"[" if last == "outputs" else b"")
    if len(_FRAGMENTS) >= _MAX_FRAGMENTS:
        _FRAGMENTS.clear()
    _FRAGMENTS[key] = fragment
    return fragment


_FRAGMENTS: dict[tuple[Any, ...], bytes] = {}
"""Pre-encoded JSON of answers' parts: ``(model, version)`` -> ``{"model_name":..,
"model_version":..,"outputs":[``, ``(name, datatype, shape)`` -> ``{"name":..,"datatype":..,
"shape":[..],"data":``, and ``(model, version, name, datatype, shape)`` -> the two
together (:func:`_encode_one`)."""
_MAX_FRAGMENTS = 4096


def dumps(obj: Any) -> bytes:
    """Serialize a response object (numpy arrays included) to JSON bytes."""
    return orjson.dumps(obj, option=_DUMP_OPTIONS)
