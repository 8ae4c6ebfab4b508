"""The one table of Open Inference Protocol datatypes.

Every codec and runtime converts through this table, so that a datatype is described in exactly
one place: its V2 name, its numpy dtype (little-endian, as on the wire) and its element size.
BYTES has no fixed size; its numpy form is an object array of ``bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.errors import InvalidArgument


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
