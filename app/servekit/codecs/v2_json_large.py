"""Large V2 JSON requests decoded without building a Python object per number.

``orjson.loads`` turns each JSON number into a Python float or int (32 bytes with its list
slot), so a JSON tensor costs 8-20 times its text in memory before numpy sees it, and the
parse holds the GIL throughout. Here the numeric ``"data"`` arrays are cut out of the body and
read by numpy's C parser (``np.fromstring`` with a separator, which releases the GIL), a few MiB
at a time, straight into an array of the input's datatype; only the rest of the request (names,
shapes, parameters: small) goes through orjson. Peak memory is the body, the arrays and one
chunk.

What numpy's reader cannot take (BYTES, BOOL, strings such as "NaN", numbers of the wrong kind)
stays in the rest of the request and is decoded the usual way (:mod:`servekit.codecs.v2_json`),
with its usual checks and messages, as long as that rest is at most ``generic_limit`` bytes;
beyond it the request is refused with a pointer to the binary tensor data extension. The
result is the same :class:`InferRequest` the usual decoder builds, with the same element
count, kind and range checks (nesting inside ``data`` is flattened, not checked for raggedness).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field

import numpy as np

from servekit.codecs import v2_json
from servekit.datatypes import DataType, element_count, narrow_floats, narrow_integers
from servekit.errors import InvalidArgument, ResourceExhausted
from servekit.types import InferRequest

CHUNK_BYTES = 4 * 1024 * 1024
"""Text handed to numpy per call: bounds the temporary copy."""
PLACEHOLDER = "\x00servekit-data"
"""Key of the object standing in for a cut-out ``data`` array (a NUL no client key needs)."""
_SPACE = b" \t\r\n"
_FAST_KINDS = "iuf"
_NON_FINITE_LETTERS = (b"n", b"N", b"i", b"I")


@dataclass
class Segments:
    """The cut-out ``data`` arrays of one body: byte ranges, read on demand."""

    body: bytes | bytearray
    ranges: list[tuple[int, int]]
    used: set[int] = field(default_factory=set)

    def array(
        self, index: object, name: str, datatype: DataType, shape: tuple[int, ...]
    ) -> np.ndarray:
        if type(index) is not int or not 0 <= index < len(self.ranges) or index in self.used:
            raise InvalidArgument(f"input {name!r}: malformed 'data'")
        self.used.add(index)
        start, end = self.ranges[index]
        if datatype.dtype.kind not in _FAST_KINDS:  # BOOL: true/false, one byte each after
            data = v2_json.loads(memoryview(self.body)[start:end])
            return v2_json.json_data_to_array(name, datatype, shape, data)
        return _read_numbers(self.body, start + 1, end - 1, name, datatype, shape)


def decode_request(
    body: bytes | bytearray, model_name: str, model_version: str | None, generic_limit: int
) -> InferRequest:
    """Decode a V2 JSON request body (see the module docstring)."""
    ranges = _numeric_arrays(body)
    parts: list[bytes | bytearray] = []
    position = 0
    for index, (start, end) in enumerate(ranges):
        parts += [body[position:start], b'{"\\u0000servekit-data":%d}' % index]
        position = end
    parts.append(body[position:])
    rest = b"".join(parts)
    if len(rest) > generic_limit:
        raise ResourceExhausted(
            f"JSON inference request too large to decode: over {generic_limit} bytes of it "
            "are not plain numeric tensor data (BYTES, BOOL or strings); send large tensors "
            "with the binary tensor data extension (Inference-Header-Content-Length)"
        )
    segments = Segments(body, ranges)
    request = v2_json.decode_request(
        v2_json.loads(rest), model_name, model_version, segments=segments
    )
    if len(segments.used) != len(ranges):
        # A "data" key outside an input (parameters, a string): decode the plain way instead.
        if len(body) > generic_limit:
            raise InvalidArgument("malformed inference request: 'data' outside an input")
        return v2_json.decode_request(v2_json.loads(body), model_name, model_version)
    return request


def _numeric_arrays(body: bytes | bytearray) -> list[tuple[int, int]]:
    """Byte ranges ``[start, end)`` of ``"data": [...]`` arrays holding no string or object.

    Every scan is a C-level ``find``/``count``; a candidate that is not a balanced array of
    such text is left in place (the usual decoder takes it)."""
    found: list[tuple[int, int]] = []
    position = 0
    size = len(body)
    while (key := body.find(b'"data"', position)) != -1:
        position = key + 6
        if key and body[key - 1] == 0x5C:  # an escaped quote inside a string
            continue
        start = _skip_space(body, position)
        if start >= size or body[start] != 0x3A:  # ':'
            continue
        start = _skip_space(body, start + 1)
        if start >= size or body[start] != 0x5B:  # '['
            continue
        stop = min(_find(body, b'"', start), _find(body, b"{", start), _find(body, b"}", start))
        end = body.rfind(b"]", start, stop) + 1
        if end <= start or body[end:stop].strip(_SPACE + b",") != b"":
            continue
        if body.count(b"[", start, end) != body.count(b"]", start, end):
            continue
        found.append((start, end))
        position = end
    return found


def _find(body: bytes | bytearray, what: bytes, start: int) -> int:
    at = body.find(what, start)
    return len(body) if at == -1 else at


def _skip_space(body: bytes | bytearray, position: int) -> int:
    while position < len(body) and body[position] in _SPACE:
        position += 1
    return position


def _read_numbers(
    body: bytes | bytearray,
    start: int,
    end: int,
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
) -> np.ndarray:
    """The numbers of ``body[start:end]`` (commas, spaces, brackets) as ``datatype``."""
    label = f"input {name!r}"
    count = element_count(shape)
    if count > (end - start) // 2 + 1:  # each number takes a digit and a comma
        raise InvalidArgument(f"{label}: shape {list(shape)} needs {count} elements, got fewer")
    out = np.empty(count, dtype=datatype.dtype)
    view = memoryview(body)
    filled = 0
    position = start
    while position < end:
        cut = body.find(b",", min(position + CHUNK_BYTES, end), end)
        cut = end if cut == -1 else cut
        piece = bytes(view[position:cut])  # numpy reads bytes only (the body may be a bytearray)
        if b"[" in piece or b"]" in piece:
            piece = piece.translate(None, b"[]")
        values = _parse(piece, label, datatype)
        if filled + values.size > count:
            raise InvalidArgument(f"{label}: shape {list(shape)} needs {count} elements, got more")
        out[filled : filled + values.size] = values
        filled += values.size
        position = cut + 1
    if filled != count:
        raise InvalidArgument(f"{label}: shape {list(shape)} needs {count} elements, got {filled}")
    return out.reshape(shape)


def _parse(piece: bytes, label: str, datatype: DataType) -> np.ndarray:
    kind = datatype.dtype.kind
    if not piece.strip(_SPACE):
        return np.empty(0, dtype=datatype.dtype)
    parse_as = np.dtype(np.float64 if datatype.name == "FP64" else np.float32)
    if kind == "i":
        parse_as = np.dtype(np.int64)
    elif kind == "u":
        if b"-" in piece:
            raise _out_of_range(label, datatype)
        parse_as = np.dtype(np.uint64)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            values = np.fromstring(piece, dtype=parse_as, sep=",")
    except (ValueError, DeprecationWarning):
        what = "integers" if kind in "iu" else "numbers"
        raise InvalidArgument(
            f"{label}: 'data' holds values that are not {what}, not valid for {datatype.name}"
        ) from None
    if kind == "f":
        if not np.isfinite(values).all() and not any(t in piece for t in _NON_FINITE_LETTERS):
            raise InvalidArgument(f"{label}: value out of range for {datatype.name}")
        return narrow_floats(label, values, datatype) if datatype.name == "FP16" else values
    low, high = (0, 2**64 - 1) if kind == "u" else (-(2**63), 2**63 - 1)
    if values.size and (int(values.max()) == high or int(values.min()) == low != 0):
        # strtoll clamps what does not fit: read this piece exactly (Python ints, any size).
        exact = json.loads(b"[" + piece + b"]")
        try:
            values = np.array(exact, dtype=parse_as)
        except OverflowError:
            raise _out_of_range(label, datatype) from None
    return narrow_integers(label, values, datatype)


def _out_of_range(label: str, datatype: DataType) -> InvalidArgument:
    info = np.iinfo(datatype.dtype)
    return InvalidArgument(
        f"{label}: value out of range for {datatype.name} [{info.min}, {info.max}]"
    )
