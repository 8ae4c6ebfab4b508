"""grps ``GrpsMessage`` <-> :class:`InferRequest` / :class:`InferResponse` (seed 001).

A grps request carries one kind of user data and the response answers in the same kind where
the model's outputs allow it:

- ``gtensors``: named tensors, each with a grps dtype and one ``flat_*`` field. Unnamed tensors
  map to the model's inputs by position. grps lacks BOOL and unsigned 16/32/64-bit types, so
  those inputs travel in the grps dtype that holds them (``CARRIER``: BOOL as DT_UINT8, UINT16
  as DT_INT32, UINT32/UINT64 as DT_INT64), range-checked, never wrapped.
- ``ndarray`` (HTTP JSON only): a nested list, one DT_FLOAT32 tensor, the model's single input.
- ``str_data`` / ``bin_data``: one element for the model's single BYTES input, shaped to that
  input's rank ([1], [1, 1], ...); a single one-element BYTES output answers in kind.
- ``gmap``: one scalar per input, keyed by input name; one-element outputs answer as a gmap.

Everything else answers as ``gtensors``. Model selection is ``name`` or ``name-version`` (the
message's ``model`` wins over the HTTP ``?model=``); none selects the first model of serve.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from servekit.datatypes import (
    element_count,
    lookup,
    narrow_floats,
    narrow_integers,
    refuse_booleans,
)
from servekit.errors import InvalidArgument
from servekit.protos import grps_pb2 as pb
from servekit.types import InferRequest, Tensor, TensorSpec


@dataclass(frozen=True, slots=True)
class _Kind:
    """How one grps dtype travels: its flat field, the numpy dtype of that field, its V2 twin."""

    field: str
    wire: np.dtype[Any] | None  # None: strings
    datatype: str


KINDS: dict[pb.DataType, _Kind] = {
    pb.DT_UINT8: _Kind("flat_uint8", np.dtype("u4"), "UINT8"),
    pb.DT_INT8: _Kind("flat_int8", np.dtype("i4"), "INT8"),
    pb.DT_INT16: _Kind("flat_int16", np.dtype("i4"), "INT16"),
    pb.DT_INT32: _Kind("flat_int32", np.dtype("i4"), "INT32"),
    pb.DT_INT64: _Kind("flat_int64", np.dtype("i8"), "INT64"),
    pb.DT_FLOAT16: _Kind("flat_float16", np.dtype("f4"), "FP16"),
    pb.DT_FLOAT32: _Kind("flat_float32", np.dtype("f4"), "FP32"),
    pb.DT_FLOAT64: _Kind("flat_float64", np.dtype("f8"), "FP64"),
    pb.DT_STRING: _Kind("flat_string", None, "BYTES"),
}
FLAT_FIELDS = tuple(k.field for k in KINDS.values())
CARRIER: dict[str, pb.DataType] = {k.datatype: dt for dt, k in KINDS.items()} | {
    "BOOL": pb.DT_UINT8,
    "UINT16": pb.DT_INT32,
    "UINT32": pb.DT_INT64,
    "UINT64": pb.DT_INT64,
}
"""V2 datatype -> the grps dtype that carries it."""

GMAP_FIELDS: dict[str, str] = {
    "s_s": "BYTES",
    "s_b": "BYTES",
    "s_i32": "INT32",
    "s_i64": "INT64",
    "s_f": "FP32",
    "s_d": "FP64",
}
"""gmap field -> the V2 datatype of its values."""
KINDS_OF_DATA = "gtensors, ndarray (HTTP JSON), str_data, bin_data or gmap"


def dtype_name(dtype: int) -> str:
    return pb.DataType.Name(dtype) if dtype in pb.DataType.values() else str(dtype)


# -- requests -----------------------------------------------------------------------------------
def request_kind(message: pb.GrpsMessage, ndarray: object = None) -> str:
    """Which user data a request carries; ``ndarray`` is the HTTP layer's nested list."""
    kind = "ndarray" if ndarray is not None else message.WhichOneof("data_oneof")
    if kind is None:
        raise InvalidArgument(f"the request carries no data: set one of {KINDS_OF_DATA}")
    if kind == "ndarray" and ndarray is None:
        raise InvalidArgument("ndarray is only for HTTP JSON requests; send gtensors instead")
    return kind


def decode_request(
    message: pb.GrpsMessage,
    name: str,
    version: str | None,
    specs: tuple[TensorSpec, ...],
    ndarray: object = None,
) -> InferRequest:
    """Build the InferRequest for model ``name`` whose inputs are ``specs``."""
    kind = request_kind(message, ndarray)
    if kind == "gtensors":
        inputs = [_gtensor(t, i, specs) for i, t in enumerate(message.gtensors.tensors)]
    elif kind == "ndarray":
        inputs = [_ndarray(ndarray, _single(name, specs, kind))]
    elif kind in ("str_data", "bin_data"):
        spec = _single(name, specs, kind, "BYTES")
        data = np.empty(1, dtype=object)
        data[0] = message.str_data.encode() if kind == "str_data" else message.bin_data
        inputs = [Tensor(spec.name, "BYTES", _unit(spec), data.reshape(_unit(spec)))]
    else:
        inputs = _gmap(message.gmap, specs)
    return InferRequest(model_name=name, model_version=version, inputs=inputs)


def _single(model: str, specs: tuple[TensorSpec, ...], kind: str, datatype: str = "") -> TensorSpec:
    if len(specs) != 1 or (datatype and specs[0].datatype != datatype):
        takes = ", ".join(f"{s.name} ({s.datatype} {list(s.shape)})" for s in specs)
        need = f"a single {datatype} input" if datatype else "a single input"
        raise InvalidArgument(
            f"{kind} needs a model with {need}; model {model!r} takes {takes}: send gtensors"
        )
    return specs[0]


def _unit(spec: TensorSpec) -> tuple[int, ...]:
    """One element shaped to the input's rank."""
    return tuple(1 for _ in spec.shape)


def _gtensor(tensor: pb.GenericTensor, index: int, specs: tuple[TensorSpec, ...]) -> Tensor:
    label = repr(tensor.name) if tensor.name else f"#{index}"
    spec = next((s for s in specs if s.name == tensor.name), None)
    if not tensor.name:
        if index >= len(specs):
            raise InvalidArgument(f"tensor {label} has no name and the model has no input {index}")
        spec = specs[index]
    kind = KINDS.get(tensor.dtype)
    if kind is None:
        known = ", ".join(dtype_name(d) for d in KINDS)
        raise InvalidArgument(f"tensor {label}: dtype {dtype_name(tensor.dtype)}; use {known}")
    if spec is not None and CARRIER[spec.datatype] != tensor.dtype:
        raise InvalidArgument(
            f"input {spec.name!r} is {spec.datatype}: send it as "
            f"{dtype_name(CARRIER[spec.datatype])}, not {dtype_name(tensor.dtype)}"
        )
    for other in FLAT_FIELDS:
        if other != kind.field and len(getattr(tensor, other)):
            raise InvalidArgument(
                f"tensor {label} is {dtype_name(tensor.dtype)}: its values go in {kind.field}, "
                f"not {other}"
            )
    values = getattr(tensor, kind.field)
    shape = tuple(tensor.shape)
    if element_count(shape) != len(values):
        raise InvalidArgument(
            f"tensor {label}: shape {list(shape)} holds {element_count(shape)} values but "
            f"{kind.field} has {len(values)}"
        )
    datatype = spec.datatype if spec is not None else kind.datatype
    name = spec.name if spec is not None else tensor.name
    if kind.wire is None:
        data = np.empty(len(values), dtype=object)
        for i, text in enumerate(values):
            data[i] = text.encode()
    else:
        wire = np.fromiter(values, kind.wire, count=len(values))
        data = _narrow(label, wire, datatype)
    return Tensor(name, datatype, shape, data.reshape(shape))


def _narrow(label: str, wire: NDArray[Any], datatype: str) -> NDArray[Any]:
    """Wire values -> the model's datatype, refusing values that do not fit."""
    target = lookup(datatype).dtype
    if datatype == "BOOL":
        if wire.size and not np.isin(wire, (0, 1)).all():
            raise InvalidArgument(f"tensor {label} is BOOL: values must be 0 or 1")
    elif target.kind in "iu":
        return narrow_integers(f"tensor {label}", wire, lookup(datatype))
    elif target.kind == "f":  # FP16 travels as float32: 1e6 does not fit
        return narrow_floats(f"tensor {label}", wire, lookup(datatype))
    return wire.astype(target, copy=False)


def _ndarray(value: object, spec: TensorSpec) -> Tensor:
    if spec.datatype != "FP32":
        raise InvalidArgument(
            f"ndarray is DT_FLOAT32 data but input {spec.name!r} is {spec.datatype}: send gtensors"
        )
    try:
        array = np.asarray(value)
    except ValueError:
        raise InvalidArgument("ndarray must be a rectangular nested list of numbers") from None
    label = f"ndarray for input {spec.name!r}"
    refuse_booleans(label, value, array, "FP32")
    if array.dtype.kind not in "iuf":
        raise InvalidArgument("ndarray must be a rectangular nested list of numbers")
    data = narrow_floats(label, array, lookup("FP32"))
    return Tensor(spec.name, "FP32", array.shape, data)


def _gmap(gmap: pb.GenericMapData, specs: tuple[TensorSpec, ...]) -> list[Tensor]:
    by_name = {s.name: s for s in specs}
    inputs: list[Tensor] = []
    for field, natural in GMAP_FIELDS.items():
        for key, value in getattr(gmap, field).items():
            spec = by_name.get(key)
            if spec is None:
                raise InvalidArgument(
                    f"gmap {field} key {key!r}: the model has no such input; "
                    f"its inputs are {', '.join(by_name)}"
                )
            if (natural == "BYTES") != (spec.datatype == "BYTES"):
                raise InvalidArgument(f"gmap {field} cannot carry input {key!r} ({spec.datatype})")
            if natural == "BYTES":
                data = np.empty(1, dtype=object)
                data[0] = value.encode() if isinstance(value, str) else value
            else:
                wire = np.array([value], dtype=lookup(natural).dtype)
                target = lookup(spec.datatype)
                if target.dtype.kind == "f":  # floats round as floats do, but must not overflow
                    data = narrow_floats(f"gmap {field} key {key!r}", wire, target)
                else:
                    data = wire.astype(target.dtype)
                # integers and BOOL must hold the value exactly
                if data.dtype.kind in "biu" and not (data.astype(wire.dtype) == wire).all():
                    raise InvalidArgument(
                        f"gmap {field} key {key!r}: {value} is not a valid {spec.datatype} value"
                    )
            inputs.append(Tensor(key, spec.datatype, _unit(spec), data.reshape(_unit(spec))))
    return inputs
