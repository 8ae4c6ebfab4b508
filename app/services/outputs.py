"""Model outputs checked against the version's declared metadata before anyone encodes them.

A Python model may return anything: ``None``, a list of the wrong length, an array of another
rank. Encoded as they come, such outputs became 200 answers with ``"NaN"`` or shapes the
metadata never announced, and clients learned of the bug from wrong numbers. Here each output
must have the declared datatype, rank and fixed dimensions, or the request fails with a 500
naming the output and what was wrong (the model author's bug, not the client's).

The checks are precomputed per loaded version, so a request pays a few comparisons per output.
"""

from __future__ import annotations

import numpy as np

from app.datatypes import DATATYPES
from app.errors import Internal
from app.runtimes.base import Arrays
from app.types import ModelSignature, Tensor, TensorSpec


class OutputCheck:
    """The output checks of one loaded model version."""

    def __init__(
        self, model: str, signature: ModelSignature, loose: frozenset[str] = frozenset()
    ) -> None:
        """``loose``: outputs whose shape the metadata only guessed (see PythonModel)."""
        self._model = model
        self._dtypes = {s.name: DATATYPES[s.datatype].dtype for s in signature.outputs}
        self._fixed = {
            s.name: tuple((i, d) for i, d in enumerate(s.shape) if d >= 0)
            for s in signature.outputs
        }
        self._loose = loose

    def tensors(self, results: Arrays, wanted: list[TensorSpec]) -> list[Tensor]:
        """The wanted outputs as Tensors; Internal naming the first output that is wrong."""
        out = []
        for spec in wanted:
            array = results.get(spec.name)
            if not isinstance(array, np.ndarray):
                raise Internal(self._wrong(spec, "is missing" if array is None else "not an array"))
            shape = array.shape
            if array.dtype != self._dtypes[spec.name] and not (
                spec.datatype == "BYTES" and array.dtype.kind == "O"
            ):
                raise Internal(self._wrong(spec, f"has numpy type {array.dtype}"))
            wrong = len(shape) != len(spec.shape) and spec.name not in self._loose
            if not wrong and spec.name not in self._loose:
                for index, size in self._fixed[spec.name]:
                    if shape[index] != size:
                        wrong = True
                        break
            if wrong:
                raise Internal(
                    self._wrong(
                        spec,
                        f"has shape {list(shape)}, the metadata says "
                        f"{list(spec.shape)} (-1 is any size)",
                    )
                )
            out.append(Tensor(spec.name, spec.datatype, shape, array))
        return out

    def _wrong(self, spec: TensorSpec, what: str) -> str:
        return f"model {self._model!r} output {spec.name!r} ({spec.datatype}) {what}"
