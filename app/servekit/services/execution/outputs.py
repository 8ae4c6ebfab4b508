"""Model outputs checked against the version's declared metadata before anyone encodes them.

A Python model may return anything: ``None``, a list of the wrong length, an array of another
rank. Encoded as they come, such outputs became 200 answers with ``"NaN"`` or shapes the
metadata never announced, and clients learned of the bug from wrong numbers. Here each output
must have the declared datatype, rank and fixed dimensions, or the request fails with a 500
naming the output and what was wrong (the model author's bug, not the client's).

The checks are precomputed per loaded version (one tuple per output: expected numpy dtype,
rank, fixed dimensions), so a request pays an identity test and a length compare per output.
A runtime whose outputs are known to match the metadata (an ONNX model without output
overrides: onnxruntime returns the graph's own types) is trusted, and its outputs are only
wrapped: the tiny-model hot path must not pay for checks that cannot fail.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servekit.datatypes import DATATYPES
from servekit.errors import Internal
from servekit.runtimes.base import Arrays
from servekit.types import ModelSignature, Tensor, TensorSpec

_Rule = tuple[Any, int, tuple[tuple[int, int], ...], bool]
"""(expected numpy dtype, rank, (index, size) of fixed dimensions, shape checked at all)."""


class OutputCheck:
    """The output checks of one loaded model version."""

    __slots__ = ("_model", "_rules", "trusted")

    def __init__(
        self,
        model: str,
        signature: ModelSignature,
        loose: frozenset[str] = frozenset(),
        trusted: bool = False,
    ) -> None:
        """``loose``: outputs whose shape the metadata only guessed (see PythonModel);
        ``trusted``: the runtime's outputs always match the metadata (nothing is checked)."""
        self._model = model
        self.trusted = trusted
        self._rules: dict[str, _Rule] = {
            s.name: (
                DATATYPES[s.datatype].dtype,
                len(s.shape),
                tuple((i, d) for i, d in enumerate(s.shape) if d >= 0),
                s.name not in loose,
            )
            for s in signature.outputs
        }

    def tensors(self, results: Arrays, wanted: list[TensorSpec]) -> list[Tensor]:
        """The wanted outputs as Tensors; Internal naming the first output that is wrong."""
        if self.trusted:  # no comprehension (a frame of its own) for the usual one output
            if len(wanted) == 1:
                only = wanted[0]
                data = results[only.name]
                return [Tensor(only.name, only.datatype, data.shape, data, {})]
            return [Tensor(s.name, s.datatype, (a := results[s.name]).shape, a) for s in wanted]
        out = []
        rules = self._rules
        for spec in wanted:
            array: Any = results.get(spec.name)
            dtype, rank, fixed, shaped = rules[spec.name]
            try:
                if array.dtype is not dtype and array.dtype != dtype:
                    self._check_dtype(spec, array)
                shape = array.shape
            except AttributeError:  # None, a list, a number: not an array at all
                raise Internal(
                    self._wrong(spec, "is missing" if array is None else "not an array")
                ) from None
            if shaped:
                wrong = len(shape) != rank
                if not wrong:
                    for index, size in fixed:
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

    def _check_dtype(self, spec: TensorSpec, array: Any) -> None:
        if not isinstance(array, np.ndarray):
            raise Internal(self._wrong(spec, "not an array"))
        if not (spec.datatype == "BYTES" and array.dtype.kind == "O"):
            raise Internal(self._wrong(spec, f"has numpy type {array.dtype}"))

    def _wrong(self, spec: TensorSpec, what: str) -> str:
        return f"model {self._model!r} output {spec.name!r} ({spec.datatype}) {what}"
