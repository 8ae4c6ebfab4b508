"""Triton's classification extension: an output requested with ``classification: k`` answers
its top k classes as BYTES "value:index:label" instead of the tensor.

Triton's rules, kept so its clients (image_client, tritonclient's ``class_count``) read our
answers alike: for a model that batches (``maxBatchSize > 0``) each row of the batch is ranked
on its own and the answer has shape [batch, min(k, classes)]; otherwise the whole tensor is
one row and the shape is [min(k, classes)]. Classes are ranked by value, highest first (ties:
lower index first; Triton leaves ties unordered). The value is printed as C++
``std::to_string`` prints it (floats with six decimals, integers as they are), and ":label" is
added when the model has a label for that index (serve.yaml ``outputs[].labels`` or
labels.txt beside the model), as Triton's ``label_filename``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servekit.config.compiler import ModelPlan
from servekit.errors import InvalidArgument
from servekit.types import Tensor

MAX_ELEMENTS = 1_000_000
"""Largest row ranked (Triton's bound against pathological classification outputs)."""
_RANKED_KINDS = "iuf"  # BOOL and BYTES have no order worth a class ranking (Triton refuses them)


def class_count(output: str, value: object) -> int:
    """The ``classification`` parameter of a requested output as k, or a clear error."""
    if type(value) is not int or value < 1:
        raise InvalidArgument(
            f"output {output!r}: 'classification' must be a positive integer (the number of "
            f"classes to return), got {value!r}"
        )
    return value


def classify(tensor: Tensor, k: int, labels: Sequence[str], batched: bool) -> Tensor:
    """The top ``k`` classes of ``tensor`` as Triton's BYTES classification output."""
    data = tensor.data
    if data.dtype.kind not in _RANKED_KINDS:
        raise InvalidArgument(
            f"output {tensor.name!r}: class result not available for output due to unsupported "
            f"type '{tensor.datatype}'"
        )
    per_row = batched and data.ndim > 0
    rows = data.reshape(data.shape[0] if per_row else 1, -1)
    classes = rows.shape[1]
    if classes > MAX_ELEMENTS:
        raise InvalidArgument(
            f"output {tensor.name!r}: classification output tensor too large ({classes} "
            f"classes, at most {MAX_ELEMENTS})"
        )
    top = min(k, classes)
    text = _float_text if data.dtype.kind == "f" else str
    out = np.empty((rows.shape[0], top), dtype=object)
    for r, row in enumerate(rows):
        for c, index in enumerate(_ranked(row)[:top]):
            index = int(index)
            entry = f"{text(row[index])}:{index}"
            if index < len(labels) and labels[index]:
                entry += f":{labels[index]}"
            out[r, c] = entry.encode("utf-8")
    shape = out.shape if per_row else (top,)
    return Tensor(tensor.name, "BYTES", shape, out.reshape(shape))


def _ranked(row: np.ndarray) -> np.ndarray:
    """Indices of ``row`` by value, highest first, equal values by lower index first.

    (Sorting the reversed row ascending, stably, then reading it backwards; negating the row
    instead would wrap unsigned integers.)"""
    last = row.shape[0] - 1
    ascending = np.argsort(row[::-1], kind="stable")
    ranked: np.ndarray = last - ascending[::-1]
    return ranked


def _float_text(value: object) -> str:
    """A float as ``std::to_string`` writes it (``%f``)."""
    return f"{float(value):f}"  # type: ignore[arg-type]


def classified(outputs: list[Tensor], classes: dict[str, int], plan: ModelPlan) -> list[Tensor]:
    """``outputs`` with those in ``classes`` replaced by their top k classes
    (app/servekit/services/classification.py)."""
    batched = plan.max_batch_size > 0
    return [
        classify(t, classes[t.name], plan.labels(t.name), batched) if t.name in classes else t
        for t in outputs
    ]
