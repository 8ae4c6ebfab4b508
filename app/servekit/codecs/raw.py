"""The raw byte layout of a tensor, shared by HTTP binary data and gRPC raw contents.

Fixed-size datatypes are little-endian, row-major, with no padding; BOOL is one byte per
element; BYTES elements are each prefixed by their length as a 4-byte little-endian unsigned
integer. Decoding returns numpy *views* over the caller's buffer wherever the datatype allows,
so request bytes are never copied on the hot path.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

from servekit.datatypes import DataType, as_bytes_array, element_count, lookup
from servekit.errors import InvalidArgument

_LENGTH = struct.Struct("<I")

Buffer = bytes | bytearray | memoryview


MAX_DIMS = 64
"""Most dimensions a tensor may have (numpy's own limit; ONNX Runtime has none lower)."""


def check_shape(name: str, shape: Iterable[int]) -> tuple[int, ...]:
    """A client-given shape as a tuple of non-negative ints, or a clear error."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise InvalidArgument(f"input {name!r}: shape must be a list of integers") from None
    if len(dims) > MAX_DIMS:
        raise InvalidArgument(
            f"input {name!r}: shape has {len(dims)} dimensions, at most {MAX_DIMS} are supported"
        )
    for dim in dims:
        if type(dim) is not int or dim < 0:
            raise InvalidArgument(
                f"input {name!r}: shape {list(dims)} must hold non-negative integers"
            )
    return dims


def tensor_from_bytes(
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    buffer: Buffer,
    offset: int = 0,
    size: int | None = None,
) -> np.ndarray:
    """Decode ``size`` bytes of ``buffer`` at ``offset`` into an array of ``shape``.

    The element count implied by ``shape`` is checked against the byte size *before* anything
    is allocated, so an absurd shape such as ``[2**40, 16]`` is refused, never attempted.
    """
    if size is None:
        size = len(buffer) - offset
    count = element_count(shape)
    if not datatype.is_bytes:
        expected = count * datatype.itemsize
        if expected != size:
            raise InvalidArgument(
                f"input {name!r}: shape {list(shape)} of {datatype.name} needs {expected} bytes, "
                f"got {size}"
            )
        return np.frombuffer(buffer, dtype=datatype.dtype, count=count, offset=offset).reshape(
            shape
        )
    return _bytes_elements(name, shape, count, memoryview(buffer)[offset : offset + size])


def _bytes_elements(name: str, shape: tuple[int, ...], count: int, view: memoryview) -> np.ndarray:
    """Split length-prefixed BYTES elements; every byte must belong to exactly one element."""
    if count > len(view) // 4:
        raise InvalidArgument(
            f"input {name!r}: shape {list(shape)} needs {count} BYTES elements but only "
            f"{len(view)} bytes were sent"
        )
    out = np.empty(count, dtype=object)
    pos, end = 0, len(view)
    for i in range(count):
        if pos + 4 > end:
            raise InvalidArgument(f"input {name!r}: BYTES element {i} is missing its length")
        (length,) = _LENGTH.unpack_from(view, pos)
        pos += 4
        if pos + length > end:
            raise InvalidArgument(
                f"input {name!r}: BYTES element {i} declares {length} bytes, "
                f"only {end - pos} remain"
            )
        out[i] = bytes(view[pos : pos + length])
        pos += length
    if pos != end:
        raise InvalidArgument(
            f"input {name!r}: {end - pos} bytes left over after {count} BYTES elements"
        )
    return out.reshape(shape)


def tensor_to_buffer(datatype: DataType, array: np.ndarray) -> Buffer:
    """The raw layout of ``array`` as a bytes-like object (no copy for contiguous arrays)."""
    if datatype.is_bytes:
        parts: list[bytes] = []
        for item in as_bytes_array(array).flat:
            parts.append(_LENGTH.pack(len(item)))
            parts.append(item)
        return b"".join(parts)
    contiguous = np.ascontiguousarray(array, dtype=datatype.dtype)
    # A flat uint8 view rather than memoryview.cast: cast refuses empty tensors (a 0 dim).
    return contiguous.reshape(-1).view(np.uint8).data


def datatype_of(name: str, datatype: object) -> DataType:
    """Look up a client-given datatype name, naming the tensor in the error."""
    if not isinstance(datatype, str):
        raise InvalidArgument(f"tensor {name!r}: datatype must be a string")
    return lookup(datatype)
