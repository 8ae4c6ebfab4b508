"""``GrpsMessage`` <-> HTTP JSON: protobuf's ``json_format`` with a numpy path for flat arrays.

``json_format`` (with our generated classes) is the reference for every field: snake_case or
camelCase names, enum names or numbers, base64 bytes, oneof checks, and its error messages. It
walks every element in Python, though: 100k floats cost ~0.7 s to print and ~0.13 s to parse.
So plain numeric ``flat_*`` lists are taken out before parsing and put back with numpy (protobuf
still range-checks them on ``extend``), and printed with orjson's native numpy support;
anything unusual (strings, bools, huge numbers) is left to ``json_format`` to accept or refuse.

grps conventions on top of the proto3 JSON mapping: ``ndarray`` is a bare nested list (it has
no protobuf form) and is returned separately; int64 values are printed as JSON numbers, not
strings; the spec's own example spells ``flat_double``, so ``flat_double`` / ``flat_float`` are
accepted for ``flat_float64`` / ``flat_float32``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
from google.protobuf import json_format
from numpy.typing import NDArray

from servekit.codecs import v2_json
from servekit.codecs.grps import FLAT_FIELDS, KINDS
from servekit.datatypes import refuse_booleans
from servekit.errors import InvalidArgument
from servekit.protos import grps_pb2 as pb

ALIASES = {"flat_double": "flat_float64", "flat_float": "flat_float32"}
DATA_KEYS = frozenset(
    key
    for field in pb.GrpsMessage.DESCRIPTOR.oneofs_by_name["data_oneof"].fields
    for key in (field.name, field.json_name)
)
NUMERIC: dict[str, np.dtype[Any]] = {k.field: k.wire for k in KINDS.values() if k.wire is not None}
_BY_KEY = {key: f.name for f in pb.GenericTensor.DESCRIPTOR.fields for key in (f.name, f.json_name)}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def parse_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object (an empty body is ``{}``), before it is read as a GrpsMessage:
    the HTTP adapter takes its own control fields (``streaming``) out of it first."""
    obj = v2_json.loads(body) if body.strip() else {}
    if not isinstance(obj, dict):
        raise InvalidArgument("the body must be a JSON object (a GrpsMessage)")
    return obj


def from_object(obj: dict[str, Any]) -> tuple[pb.GrpsMessage, object]:
    """The GrpsMessage a parsed JSON object spells, and its ndarray (None if absent).

    ``obj`` is consumed (fields are taken out of it while parsing).
    """
    ndarray = obj.pop("ndarray", None)
    if ndarray is not None and not DATA_KEYS.isdisjoint(obj):
        raise InvalidArgument("set only one of gtensors, ndarray, str_data, bin_data or gmap")
    taken = _take_flat(obj)
    try:
        # grps ignores fields it does not know (a client's trace_id, gmap's s_t that its template
        # client sends), at any depth; so do we
        message = json_format.ParseDict(obj, pb.GrpsMessage(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise InvalidArgument(f"not a GrpsMessage: {exc}") from None
    tensors = message.gtensors.tensors
    for index, field, array in taken:
        try:
            getattr(tensors[index], field).extend(array)
        except (ValueError, TypeError) as exc:  # e.g. a value out of the field's range
            raise InvalidArgument(f"gtensors tensor #{index} {field}: {exc}") from None
    return message, ndarray


def _take_flat(obj: dict[str, Any]) -> list[tuple[int, str, NDArray[Any]]]:
    """Remove plain numeric flat_* lists from the tensors of ``obj``; return them as arrays."""
    gtensors = obj.get("gtensors")
    tensors = gtensors.get("tensors") if isinstance(gtensors, dict) else None
    if not isinstance(tensors, list):
        return []
    taken: list[tuple[int, str, NDArray[Any]]] = []
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, dict):
            continue
        for alias, field in ALIASES.items():
            if alias in tensor and field not in tensor:
                tensor[field] = tensor.pop(alias)
        for key in list(tensor):
            field = _BY_KEY.get(key, "")
            label = f"gtensors tensor #{index}"
            array = _numeric(label, tensor[key], field) if field in NUMERIC else None
            if array is not None:
                del tensor[key]
                taken.append((index, field, array))
    return taken


def _numeric(label: str, values: object, field: str) -> NDArray[Any] | None:
    """``values`` as a 1-D numeric array if it plainly is one, else None (json_format decides).

    JSON true/false is refused here whatever else the list holds: json_format would read it
    as 1.0 / 0.0 in a float field, and numpy as 1 / 0 among numbers.
    """
    if not isinstance(values, list) or not values:
        return None
    try:
        array = np.asarray(values)
    except ValueError:
        return None
    refuse_booleans(label, values, array, field)
    allowed = "iuf" if NUMERIC[field].kind == "f" else "iu"
    if array.ndim != 1 or array.dtype.kind not in allowed:
        return None
    if NUMERIC[field] == np.float32 and float(np.abs(array).max()) > _FLOAT32_MAX:
        return None  # json_format refuses floats out of range instead of making them inf
    return array


def dumps(message: pb.GrpsMessage, extra: dict[str, Any] | None = None) -> bytes:
    """The JSON text of ``message`` (plus ``extra`` top-level keys, e.g. an ndarray)."""
    if message.WhichOneof("data_oneof") != "gtensors":
        body = json_format.MessageToDict(message, preserving_proto_field_name=True)
        s_i64 = body.get("gmap", {}).get("s_i64")
        if s_i64:
            body["gmap"]["s_i64"] = {key: int(value) for key, value in s_i64.items()}
    else:
        shell = pb.GrpsMessage()
        shell.CopyFrom(message)
        for tensor in shell.gtensors.tensors:
            for field in FLAT_FIELDS:
                tensor.ClearField(field)
        body = json_format.MessageToDict(shell, preserving_proto_field_name=True)
        printed = body["gtensors"].get("tensors", [])
        for out, tensor in zip(printed, message.gtensors.tensors, strict=True):
            for field in FLAT_FIELDS:
                values = getattr(tensor, field)
                if len(values):
                    out[field] = _flat_json(values, field)
    body.update(extra or {})
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _flat_json(values: Any, field: str) -> Any:
    if field not in NUMERIC:
        return list(values)
    array = np.fromiter(values, NUMERIC[field], count=len(values))
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return [_float(v) for v in array.tolist()]  # proto3 JSON spells these as strings
    return array


def _float(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value
