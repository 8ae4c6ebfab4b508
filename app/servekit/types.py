"""Transport-neutral request, response and metadata types of the dataplane.

Tensors hold numpy arrays (views over request bytes where the codec allows). Plain slotted
dataclasses rather than pydantic models: these are built on every request, and validation is
done once, by the dataplane, against the model's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Parameters = dict[str, Any]


@dataclass(slots=True)
class Tensor:
    """A named tensor: ``data`` already has ``shape`` and the dtype of ``datatype``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (e.g. binary_data)."""

    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """One inference request, whatever protocol it came over."""

    model_name: str
    inputs: list[Tensor]
    model_version: str | None = None
    id: str | None = None
    outputs: list[RequestedOutput] | None = None
    parameters: Parameters = field(default_factory=dict)
    shared_memory: bool = False
    """Some input or requested output names a shared-memory region (set by the codecs; the
    DataPlane then reads and writes those through app/servekit/services/shared_memory.py)."""

    def outputs_in_shared_memory(self) -> frozenset[str]:
        """Names of the requested outputs written to shared memory: the response carries
        their datatype and shape only, no data."""
        if not self.shared_memory or not self.outputs:
            return frozenset()
        return frozenset(o.name for o in self.outputs if "shared_memory_region" in o.parameters)

    def wants_binary(self, output: str, default: bool) -> bool:
        """Whether ``output`` goes back as raw bytes rather than JSON/typed values.

        The same parameters decide on every transport: the output's own ``binary_data``, else
        the request's ``binary_data_output``, else the transport's ``default`` (HTTP: JSON,
        gRPC: raw contents).
        """
        if self.outputs:
            for requested in self.outputs:
                if requested.name == output and "binary_data" in requested.parameters:
                    return bool(requested.parameters["binary_data"])
        return bool(self.parameters.get("binary_data_output", default))


@dataclass(slots=True)
class InferResponse:
    """The result of one inference request."""

    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Metadata of one model input or output: V2 datatype and shape (-1 for a dynamic dim)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = field(default=False, compare=False)
    """Inputs only: a request may leave it out (serve.yaml's ``optional: true``, Triton's
    ModelInput.optional); the model then receives only the inputs that were sent. Marked
    from serve.yaml after a runtime loads (runtimes.load_runtime), so not compared: a
    restarted isolated process reporting the same tensors reports the same signature."""
    categories: tuple[str | int | float, ...] | None = field(default=None, compare=False)
    """Inputs only: the values a fitted model knows for this column (a OneHotEncoder's
    ``categories_``, a LightGBM or XGBoost categorical feature's categories), shown in
    metadata as ``parameters.categories`` (MLServer's metadata tensors carry ``parameters``)
    so that a form can offer them and the benchmark can send one; None when not known."""
    parameters: dict[str, Any] | None = field(default=None, compare=False)
    """Metadata only: the tensor's ``parameters`` as the model's own metadata gives them (an
    MLServer custom runtime's, e.g. model-settings.json's ``content_type``), shown with
    ``categories`` in metadata's ``parameters``."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "datatype": self.datatype}
        out["shape"] = list(self.shape)
        if self.optional:  # only when set: V2 metadata has no such key, clients ignore extras
            out["optional"] = True
        parameters = dict(self.parameters or {})
        if self.categories is not None:
            parameters["categories"] = list(self.categories)
        if parameters or self.parameters is not None:
            out["parameters"] = parameters
        return out


GRPS_MESSAGE = "GRPS_MESSAGE"
"""Input and output of a model that takes whole grps messages."""


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """What a loaded model version takes and gives.

    The name indexes are built once per loaded version, not on every request that checks
    its inputs against them.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    grps_message: bool = False
    """The model takes and gives whole grps messages: one BYTES input and output named
    :data:`GRPS_MESSAGE` holding a serialized GrpsMessage (app/servekit/services/grps.py)."""
    tabular: str | None = None
    """A tabular model's layout, ``columns`` (one input per feature) or ``matrix`` (one
    [-1, F] input): the DataPlane then reads requests with MLServer's content types
    (app/servekit/codecs/content_types.py) instead of checking each input by name and
    datatype."""
    default_outputs: tuple[str, ...] | None = None
    """The outputs a request that names none gets (None: all). A tabular model answers
    ``predict`` alone unless ``predict_proba`` is asked for, as MLServer's runtimes do."""
    parameters: dict[str, Any] | None = field(default=None, compare=False)
    """The model's own metadata ``parameters`` (an MLServer custom runtime's ``metadata()``),
    answered in model metadata; None: the model has none."""
    input_index: dict[str, TensorSpec] = field(init=False, compare=False, repr=False)
    output_index: dict[str, TensorSpec] = field(init=False, compare=False, repr=False)
    defaults: tuple[TensorSpec, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_index", {s.name: s for s in self.inputs})
        object.__setattr__(self, "output_index", {s.name: s for s in self.outputs})
        chosen = self.default_outputs
        defaults = self.outputs if chosen is None else tuple(self.output_index[n] for n in chosen)
        object.__setattr__(self, "defaults", defaults)


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """The V2 model metadata response."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: dict[str, Any] | None = None
    """The model's own metadata parameters (``ModelSignature.parameters``); None: none."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "versions": list(self.versions),
            "platform": self.platform,
            "inputs": [t.as_dict() for t in self.inputs],
            "outputs": [t.as_dict() for t in self.outputs],
        }
        if self.parameters is not None:
            out["parameters"] = dict(self.parameters)
        return out
