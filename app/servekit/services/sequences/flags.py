"""What a request to a sequence model says of its sequence: its correlation ID (the
``sequence_id`` parameter: a non-zero unsigned integer or a non-empty string) and its
``sequence_start`` and ``sequence_end`` flags, checked with Triton's words."""

from __future__ import annotations

from dataclasses import dataclass

from servekit.errors import InvalidArgument
from servekit.types import InferRequest

CorrelationId = int | str
UINT64_MAX = (1 << 64) - 1
MAX_CORRELATION_ID_BYTES = 256
"""Longest string correlation ID (UTF-8 bytes): IDs are kept, logged and given to the model."""


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """What a request says of its sequence (its parameters, checked)."""

    correlation_id: CorrelationId
    start: bool
    end: bool


def sequence_flags(request: InferRequest) -> SequenceFlags:
    """The correlation ID and START/END flags of a request to a sequence model (Triton's
    words when there is no ID)."""
    params = request.parameters
    raw = params.get("sequence_id")
    if isinstance(raw, bool) or not isinstance(raw, int | str | None):
        raise InvalidArgument("parameter 'sequence_id' must be an unsigned integer or a string")
    if isinstance(raw, int) and not 0 <= raw <= UINT64_MAX:
        raise InvalidArgument("parameter 'sequence_id' must be an unsigned 64-bit integer")
    if isinstance(raw, str) and len(raw) > MAX_CORRELATION_ID_BYTES // 4:
        size = len(raw.encode("utf-8", "surrogatepass"))
        if size > MAX_CORRELATION_ID_BYTES:
            raise InvalidArgument(
                f"parameter 'sequence_id' is a string of {size} bytes; a string correlation "
                f"ID is at most {MAX_CORRELATION_ID_BYTES} bytes (UTF-8)"
            )
    if raw is None or raw == 0 or raw == "":
        raise InvalidArgument(
            f"inference request to model '{request.model_name}' must specify a non-zero or "
            "non-empty correlation ID"
        )
    flags = []
    for name in ("sequence_start", "sequence_end"):
        value = params.get(name, False)
        if not isinstance(value, bool):
            raise InvalidArgument(f"parameter {name!r} must be true or false")
        flags.append(value)
    return SequenceFlags(raw, flags[0], flags[1])
