"""Numpy inputs cast to the datatype the model declares, when nothing is lost.

numpy makes float64 and int64 arrays by default, while models (ONNX from scikit-learn or
PyTorch above all) mostly take FP32 and INT32/INT64: ``server.infer("iris", {"X": X_test})``
must work as it does with Triton's clients after an ``astype``. The notebook API therefore casts
an array whose dtype differs from the declared one when the values given survive the cast:

- float to a narrower float: every finite value within the target's range (rounding to the
  nearest representable value is what ``astype`` does and what users expect; NaN and
  infinities stay what they are);
- integer to integer, integer to float, bool to anything: every value comes back unchanged.

Anything else (a float to an integer, a value out of range) is refused with both datatypes
named: the caller decides. A cast is reported once per model input as a warning.
"""

from __future__ import annotations

import numpy as np

from servekit.datatypes import from_numpy, lookup
from servekit.errors import InvalidArgument


class CastWarning(UserWarning):
    """An input array was cast to the model's datatype (once per model input)."""


def cast_to(name: str, array: np.ndarray, datatype: str) -> np.ndarray | None:
    """``array`` as ``datatype`` when the cast keeps the values, None when no cast is needed;
    raises InvalidArgument naming both datatypes when it would change them."""
    if datatype == "BYTES" or array.dtype.kind in "OSU":
        return None
    given = from_numpy(array.dtype).name
    if given == datatype:
        return None
    target = lookup(datatype).dtype
    if _exact(array, target):
        return array.astype(target)
    raise InvalidArgument(
        f"input {name!r}: the model takes {datatype}, the array is {given} and its values do not "
        f"fit {datatype}; convert it yourself (array.astype(np.{target.name}))"
    )


def _exact(array: np.ndarray, target: np.dtype) -> bool:
    source = array.dtype
    if source.kind == "f" and target.kind == "f":
        finite = array[np.isfinite(array)]
        limit = np.finfo(target).max
        return bool(finite.size == 0 or np.abs(finite).max() <= limit)
    if source.kind in "biu" and target.kind in "biuf":
        if target.kind == "b":
            return bool(np.isin(array, (0, 1)).all())
        if target.kind in "iu" and array.size:
            info = np.iinfo(target)
            return bool(array.min() >= info.min and array.max() <= info.max)
        if target.kind == "f":
            with np.errstate(over="ignore", invalid="ignore"):
                back = array.astype(target).astype(source)
            return bool(np.array_equal(back, array))
        return True
    return False
