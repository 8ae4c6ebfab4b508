"""What the dataplane works out once per loaded version, so that a request does not.

Every inference request used to look up its version's statistics by (name, version), turn
the version number into text for the answer, and check its inputs against the metadata by
walking the signature's specs with a generator per shape. A :class:`PreparedVersion` is built
with the version's executor (``DataPlane._build_executor``) and holds the results: the
statistics object, the version's text, and the input checks compiled into one tuple per input
(datatype, rank, fixed dimensions).

Its :meth:`~PreparedVersion.check` is a fast path for the common request only: every input
given once, with the right datatype and shape. Anything else (a missing, unknown or repeated
input, a wrong datatype or shape, a batch over ``maxBatchSize``, a tabular model) answers None,
and the caller takes the general way (app/servekit/services/execution/inputs.py), which accepts
the same requests with the same result and words every refusal. So the fast path never
refuses anything itself, and no error text is written twice.
"""

from __future__ import annotations

from typing import Any

from servekit.services.execution.inputs import requested_outputs
from servekit.services.stats import VersionStats
from servekit.types import InferRequest, ModelSignature, TensorSpec

_Rule = tuple[str, int, tuple[tuple[int, int], ...]]
"""An input's datatype, rank and (index, size) of its fixed dimensions."""

Checked = tuple[dict[str, Any], list[TensorSpec], dict[str, int] | None, int, list[str]]
"""The runtime's feed, the outputs to compute, the class counts asked for (None: none), the
request's rows and the names of the outputs to compute."""


class PreparedVersion:
    """The per-request constants of one loaded version (see the module docstring)."""

    __slots__ = (
        "_batch_bound",
        "_count",
        "_default_names",
        "_defaults",
        "_rules",
        "signature",
        "stats",
        "tabular",
        "version_text",
    )

    def __init__(
        self, signature: ModelSignature, max_batch_size: int, stats: VersionStats, version: int
    ) -> None:
        self.signature = signature
        """The signature the checks were compiled from (a request whose runtime reports
        another takes the general way)."""
        self.stats = stats
        self.version_text = str(version)
        self.tabular = signature.tabular is not None
        self._rules: dict[str, _Rule] | None = None
        if not self.tabular:  # a tabular model's inputs are content types: the general way
            self._rules = {
                s.name: (
                    s.datatype,
                    len(s.shape),
                    tuple((i, d) for i, d in enumerate(s.shape) if d >= 0),
                )
                for s in signature.inputs
            }
        self._count = len(signature.inputs)
        self._batch_bound = max_batch_size
        self._defaults = list(signature.defaults)
        self._default_names = [s.name for s in signature.defaults]

    def check(self, request: InferRequest) -> Checked | None:
        """The checked request, or None: take the general way (see the module docstring)."""
        rules = self._rules
        inputs = request.inputs
        if rules is None or len(inputs) != self._count:
            return None
        bound = self._batch_bound
        feed: dict[str, Any] = {}
        for tensor in inputs:
            rule = rules.get(tensor.name)
            if rule is None or tensor.datatype != rule[0]:
                return None
            shape = tensor.shape
            if len(shape) != rule[1]:
                return None
            for index, size in rule[2]:
                if shape[index] != size:
                    return None
            if bound > 0 and shape and shape[0] > bound:
                return None
            feed[tensor.name] = tensor.data
        if len(feed) != self._count:  # a name given twice
            return None
        rows = 1
        if bound > 0:
            shape = inputs[0].shape if inputs else ()
            if shape:
                rows = shape[0]
        if not request.outputs:
            return feed, list(self._defaults), None, rows, list(self._default_names)
        wanted, classes = requested_outputs(request, self.signature)
        return feed, wanted, classes, rows, [s.name for s in wanted]
