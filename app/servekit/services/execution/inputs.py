"""A request checked against the model version's metadata before anything runs: its inputs
(names, datatypes, shapes, the batch bound), the outputs it asks for (and their
``classification``), and how many rows it carries.

Two ways, one module. :class:`CompiledInputs` is built once per loaded version (the checks
compiled into one tuple per input: datatype, rank, fixed dimensions) and checks the common
request only: every input given once, with the right datatype and shape. Anything else (a
missing, unknown or repeated input, a wrong datatype or shape, a batch over ``maxBatchSize``, a
tabular model) answers None, and the caller takes the general way (:func:`check_request`),
which accepts the same requests with the same result and words every refusal. So the fast
path never refuses anything itself, and no error text is written twice.
"""

from __future__ import annotations

from typing import Any

from servekit.codecs.content_types import tabular_feed
from servekit.errors import InvalidArgument
from servekit.services.classification import class_count
from servekit.types import InferRequest, ModelSignature, Tensor, TensorSpec

_Rule = tuple[str, int, tuple[tuple[int, int], ...]]
"""An input's datatype, rank and (index, size) of its fixed dimensions."""

Checked = tuple[dict[str, Any], list[TensorSpec], dict[str, int] | None, int, list[str]]
"""The runtime's feed, the outputs to compute, the class counts asked for (None: none), the
request's rows and the names of the outputs to compute."""


class CompiledInputs:
    """The input checks of one loaded version, compiled (see the module docstring)."""

    __slots__ = (
        "_batch_bound",
        "_count",
        "_default_names",
        "_defaults",
        "_only",
        "_rules",
        "_shared",
        "_signature",
    )

    def __init__(
        self, signature: ModelSignature, max_batch_size: int, share_outputs: bool = False
    ) -> None:
        """``share_outputs``: the runtime only reads the list of output names it is given
        (servekit's own runtimes, never a user's ``predict``), so a request that names no
        outputs is given the same two lists every time, not copies."""
        self._signature = signature
        self._shared = share_outputs
        self._rules: dict[str, _Rule] | None = None
        if signature.tabular is None:  # a tabular model's inputs are content types
            self._rules = {
                s.name: (
                    s.datatype,
                    len(s.shape),
                    tuple((i, d) for i, d in enumerate(s.shape) if d >= 0),
                )
                for s in signature.inputs
            }
        self._count = len(signature.inputs)
        self._only: tuple[str, str, int, tuple[tuple[int, int], ...]] | None = None
        """A model with one input: its name and rule (the usual model: no loop, no lookup)."""
        if self._rules is not None and self._count == 1:
            ((name, (datatype, rank, fixed)),) = self._rules.items()
            self._only = (name, datatype, rank, fixed)
        self._batch_bound = max_batch_size
        self._defaults = list(signature.defaults)
        self._default_names = [s.name for s in signature.defaults]

    def check(self, request: InferRequest) -> Checked | None:
        """The checked request, or None: take the general way (:func:`check_request`)."""
        inputs = request.inputs
        only = self._only
        if only is not None:  # the loop below, for one input
            if len(inputs) != 1:
                return None
            tensor = inputs[0]
            shape = tensor.shape
            if tensor.name != only[0] or tensor.datatype != only[1] or len(shape) != only[2]:
                return None
            for index, size in only[3]:
                if shape[index] != size:
                    return None
            rows = 1
            if self._batch_bound > 0 and shape:
                rows = shape[0]
                if rows > self._batch_bound:
                    return None
            feed: dict[str, Any] = {tensor.name: tensor.data}
        else:
            rules = self._rules
            if rules is None or len(inputs) != self._count:
                return None
            bound = self._batch_bound
            feed = {}
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
            if self._shared:
                return feed, self._defaults, None, rows, self._default_names
            return feed, list(self._defaults), None, rows, list(self._default_names)
        wanted, classes = requested_outputs(request, self._signature)
        return feed, wanted, classes, rows, [s.name for s in wanted]


def check_request(
    request: InferRequest, signature: ModelSignature, max_batch_size: int
) -> tuple[dict[str, Any], list[TensorSpec], dict[str, int] | None, int]:
    """The runtime's feed (name -> array), the outputs to compute, the class counts asked for
    (None: none) and the request's rows (1 for a model without a batch dimension). A tabular
    model's inputs are MLServer's content types, columns or a matrix (the codec
    app/servekit/codecs/content_types.py reads them); its rows are always counted, as its calls
    stack the rows of the requests waiting (app/servekit/services/execution/jobs.py)."""
    tabular = signature.tabular
    if tabular is not None:
        feed, rows = tabular_feed(request, signature.inputs, tabular, max_batch_size)
    else:
        feed = validate_inputs(request, signature.input_index, max_batch_size)
        rows = 1
        if max_batch_size > 0 and request.inputs and request.inputs[0].shape:
            rows = request.inputs[0].shape[0]
    wanted, classes = requested_outputs(request, signature)
    return feed, wanted, classes, rows


def validate_inputs(
    request: InferRequest, by_name: dict[str, TensorSpec], max_batch_size: int = 0
) -> dict[str, Any]:
    """Check every input against the model's metadata; return name -> array for the runtime."""
    feed: dict[str, Any] = {}
    for tensor in request.inputs:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise InvalidArgument(
                f"model {request.model_name!r} has no input {tensor.name!r}; "
                f"its inputs are {', '.join(by_name)}"
            )
        if tensor.name in feed:
            raise InvalidArgument(f"input {tensor.name!r} is given twice")
        if tensor.datatype != spec.datatype:
            raise InvalidArgument(
                f"input {tensor.name!r} must be {spec.datatype}, got {tensor.datatype}"
            )
        _check_shape(tensor, spec, max_batch_size)
        feed[tensor.name] = tensor.data
    if len(feed) < len(by_name):  # some left out: only optional ones may be
        missing = [n for n, spec in by_name.items() if n not in feed and not spec.optional]
        if missing:
            model = request.model_name
            raise InvalidArgument(f"model {model!r} needs input(s) {', '.join(missing)}")
    return feed


def _check_shape(tensor: Tensor, spec: TensorSpec, max_batch_size: int) -> None:
    shape = tensor.shape
    ok = len(shape) == len(spec.shape) and all(
        want < 0 or want == got for want, got in zip(spec.shape, shape, strict=True)
    )
    if ok and max_batch_size > 0 and shape and shape[0] > max_batch_size:
        raise InvalidArgument(
            f"input {tensor.name!r}: batch of {shape[0]} exceeds maxBatchSize {max_batch_size}"
        )
    if not ok:
        raise InvalidArgument(
            f"input {tensor.name!r}: shape {list(shape)} does not match the model's "
            f"{list(spec.shape)} (-1 is any size)"
        )


def requested_outputs(
    request: InferRequest, signature: ModelSignature
) -> tuple[list[TensorSpec], dict[str, int] | None]:
    """The outputs to compute: those asked for, in the order asked, or all of them; and the
    class counts of those asked for with ``classification: k`` (checked before the model
    runs; None when none is)."""
    if not request.outputs:
        return list(signature.defaults), None
    by_name = signature.output_index
    wanted = []
    classes: dict[str, int] | None = None
    for requested in request.outputs:
        k = requested.parameters.get("classification")
        if k is not None:
            classes = classes or {}
            classes[requested.name] = class_count(requested.name, k)
        spec = by_name.get(requested.name)
        if spec is None:
            raise InvalidArgument(
                f"model {request.model_name!r} has no output {requested.name!r}; "
                f"its outputs are {', '.join(by_name)}"
            )
        wanted.append(spec)
    return wanted, classes
