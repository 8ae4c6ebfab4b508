"""The one table of Open Inference Protocol datatypes.

Every codec and runtime converts through this table, so that a datatype is described in exactly
one place: its V2 name, its numpy dtype (little-endian, as on the wire) and its element size.
BYTES has no fixed size; its numpy form is an object array of ``bytes``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from servekit.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class DataType:
    """One V2 datatype and its numpy counterpart."""

    name: str
    dtype: np.dtype
    itemsize: int  # bytes per element on the wire; 0 for variable-size BYTES

    @property
    def is_bytes(self) -> bool:
        return self.name == "BYTES"

    @property
    def config_name(self) -> str:
        """Triton's model-configuration enum name (BYTES is TYPE_STRING there)."""
        return "TYPE_STRING" if self.is_bytes else f"TYPE_{self.name}"


def _dt(name: str, dtype: str) -> DataType:
    np_dtype = np.dtype(dtype)
    return DataType(name, np_dtype, 0 if np_dtype.kind == "O" else np_dtype.itemsize)


DATATYPES: dict[str, DataType] = {
    d.name: d
    for d in (
        _dt("BOOL", "?"),
        _dt("UINT8", "u1"),
        _dt("UINT16", "<u2"),
        _dt("UINT32", "<u4"),
        _dt("UINT64", "<u8"),
        _dt("INT8", "i1"),
        _dt("INT16", "<i2"),
        _dt("INT32", "<i4"),
        _dt("INT64", "<i8"),
        _dt("FP16", "<f2"),
        _dt("FP32", "<f4"),
        _dt("FP64", "<f8"),
        _dt("BYTES", "O"),
    )
}

# Inverse, derived: numpy dtype (native byte order) -> V2 datatype. Unicode strings map to BYTES.
_BY_NUMPY: dict[np.dtype, DataType] = {
    d.dtype.newbyteorder("="): d for d in DATATYPES.values() if not d.is_bytes
}


def lookup(name: str) -> DataType:
    """The datatype called ``name``; an unknown name is the client's mistake."""
    try:
        return DATATYPES[name]
    except KeyError:
        known = ", ".join(DATATYPES)
        raise InvalidArgument(f"unknown datatype {name!r}; expected one of {known}") from None


def from_numpy(dtype: np.dtype) -> DataType:
    """The V2 datatype of a numpy dtype (object, bytes and str arrays are BYTES)."""
    if dtype.kind in "OSU":
        return DATATYPES["BYTES"]
    try:
        return _BY_NUMPY[dtype.newbyteorder("=")]
    except KeyError:
        raise InvalidArgument(
            f"numpy dtype {dtype} has no Open Inference Protocol datatype"
        ) from None


def of_column(dtype: Any) -> DataType:
    """The V2 datatype a pandas column of ``dtype`` travels as, the way the notebook's client
    sends a DataFrame (app/servekit/client/frames.py): numbers and booleans as themselves,
    everything else (object, ``str``, ``category``, datetimes as ISO 8601 text) as BYTES.
    Nullable pandas dtypes (``Int64``, ``boolean``) count as their numpy type."""
    kind = getattr(dtype, "kind", "O")
    if kind not in "biuf":
        return DATATYPES["BYTES"]
    numpy_dtype = getattr(dtype, "numpy_dtype", dtype)
    try:
        return from_numpy(np.dtype(numpy_dtype))
    except (InvalidArgument, TypeError):
        return DATATYPES["FP64"]


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    """Product of ``shape`` in Python integers (no overflow, so absurd shapes are caught)."""
    count = 1
    for dim in shape:
        count *= dim
    return count


def as_bytes_array(array: np.ndarray) -> np.ndarray:
    """A BYTES tensor as an object array of ``bytes`` (str elements encoded as UTF-8)."""
    if array.dtype.kind == "O" and all(isinstance(x, bytes) for x in array.flat):
        return array
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.flat):
        if isinstance(item, bytes):
            flat[i] = item
        elif isinstance(item, str):
            flat[i] = item.encode("utf-8")
        elif isinstance(item, np.bytes_):
            flat[i] = bytes(item)
        else:
            flat[i] = str(item).encode("utf-8")
    return out


def from_config_name(name: str) -> DataType:
    """The datatype of a Triton model-configuration name (``TYPE_FP32``, ``TYPE_STRING``)."""
    bare = name.removeprefix("TYPE_")
    return lookup("BYTES" if bare == "STRING" else bare)


def narrow_integers(label: str, values: np.ndarray, datatype: DataType) -> np.ndarray:
    """Integers carried in a wider type (JSON numbers, int32 contents, ...) as ``datatype``.

    Every wire format that carries small integers widened goes through here, so a value that
    does not fit is refused with the same message everywhere instead of silently wrapping.
    """
    target = datatype.dtype
    if values.size and values.dtype != target:
        info = np.iinfo(target)
        if int(values.min()) < info.min or int(values.max()) > info.max:
            raise InvalidArgument(
                f"{label}: value out of range for {datatype.name} [{info.min}, {info.max}]"
            )
    return values.astype(target, copy=False)


def narrow_floats(label: str, values: np.ndarray, datatype: DataType) -> np.ndarray:
    """Numbers carried wider (JSON doubles, grps float32 for FP16, ...) as float ``datatype``.

    A finite value beyond the type's largest finite value (1e6 as FP16, 1e39 as FP32) would
    become infinity in a C-style cast; it is refused instead, like an integer that does not fit.
    Infinities and NaN stay what they are (numpy raises only when a finite value overflows).
    """
    target = datatype.dtype
    if values.dtype == target:
        return values
    try:
        with np.errstate(over="raise"):  # numpy reports overflow in casts (>= 1.24)
            return values.astype(target)
    except FloatingPointError:
        largest = float(np.finfo(target).max)
        raise InvalidArgument(
            f"{label}: value out of range for {datatype.name} [{-largest:g}, {largest:g}]"
        ) from None


# Below this many elements one pass over the Python list is cheaper than numpy's per-call cost;
# above it, looking up each 0/1 position costs about as much as scanning eight elements.
_SCAN_BELOW = 256
_LOOKUP_RATIO = 8


def refuse_booleans(label: str, values: object, array: np.ndarray, target: str) -> None:
    """Refuse JSON true/false among the values of a numeric tensor (``target`` names it).

    numpy reads ``[true, 2]`` as the integers ``[1, 2]``, so a boolean would slip into a numeric
    tensor unnoticed; only BOOL tensors take JSON booleans (as in Triton). ``array`` is what
    ``np.asarray(values)`` made of the parsed JSON ``values``. Small lists are scanned in one
    C-level pass (``map(type, ...)``); large ones mostly by numpy (see ``_large_holds_booleans``).
    """
    kind = array.dtype.kind
    if kind in "iuf" and array.ndim:  # the usual case: numbers, nested array.ndim deep
        if array.size < _SCAN_BELOW:
            found = bool in map(type, _flat(values, array.ndim))
        else:
            found = _large_holds_booleans(values, array)
    else:  # all booleans, or strings and mixed values at any depth, or a bare scalar
        found = kind == "b" or any(type(item) is bool for item in _leaves(values))
    if found:
        raise InvalidArgument(f"{label}: booleans (JSON true/false) are not valid for {target}")


def _large_holds_booleans(values: object, array: np.ndarray) -> bool:
    """A boolean can only sit where the numeric array holds 0 or 1: numpy finds those positions
    and only they are looked up in the list, unless they are common (a 0/1 mask, ReLU outputs),
    when one pass over the whole list is cheaper."""
    flat = array.reshape(-1)
    candidates = np.flatnonzero((flat == 0) | (flat == 1))
    if candidates.size * _LOOKUP_RATIO < flat.size:
        axes = (axis.tolist() for axis in np.unravel_index(candidates, array.shape))
        return any(type(_item(values, index)) is bool for index in zip(*axes, strict=True))
    return bool in map(type, _flat(values, array.ndim))


def _flat(values: Any, depth: int) -> Iterable[Any]:
    """The leaves of lists nested ``depth`` deep (rectangular: numpy made an array of them)."""
    for _ in range(depth - 1):
        values = chain.from_iterable(values)
    return values  # type: ignore[no-any-return]


def _item(values: Any, index: tuple[int, ...]) -> object:
    for i in index:
        values = values[i]
    return values


def _leaves(values: object) -> Iterable[object]:
    if isinstance(values, list):
        for item in values:
            yield from _leaves(item)
    else:
        yield values
