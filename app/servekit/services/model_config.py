"""Triton's model configuration extension: a ModelConfig derived from the plan and the model.

Nothing is stored twice: the configuration is computed on request from the compiled ModelPlan
(version policy, batching, instances, parameters) and the signature of the loaded version (input and
output datatypes and shapes). The result is a typed ``ModelConfiguration``, which the REST adapter
writes as the JSON Triton's HTTP endpoint answers (app/servekit/rest/triton_json.py) and the gRPC
adapter builds ``inference.ModelConfig`` from, field by field. As in Triton, with ``max_batch_size >
0`` the batch dimension is not part of ``dims``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from servekit.config.compiler import LABELS_FILE, ModelPlan
from servekit.config.schema import ModelConfig, VersionPolicy
from servekit.config.sequences import SequenceBatching
from servekit.datatypes import lookup
from servekit.types import ModelSignature, TensorSpec

# Runtime implementation -> the Triton backend that plays the same role.
BACKEND: dict[str, str] = {"onnxruntime": "onnxruntime", "python": "python"}


@dataclass(frozen=True, slots=True)
class VersionPolicyConfig:
    """Triton's ModelVersionPolicy: ``latest`` N, ``all``, or ``specific`` versions."""

    kind: Literal["latest", "all", "specific"]
    num_versions: int = 0
    """For ``latest``."""
    versions: tuple[int, ...] = ()
    """For ``specific``."""


@dataclass(frozen=True, slots=True)
class TensorConfig:
    """One input or output of ModelConfig (``data_type`` as Triton names it: TYPE_FP32...)."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    format: str | None = None
    """Inputs only (serve.yaml's ``format``, default FORMAT_NONE); None for outputs."""
    label_filename: str | None = None
    """Outputs only: "labels.txt" when the labels file beside the model labels this output's
    classes, "" when not (serve.yaml labels have no file); None for inputs."""
    optional: bool = False
    """Inputs only: a request may leave it out (Triton's ModelInput.optional)."""


@dataclass(frozen=True, slots=True)
class InstanceGroupConfig:
    name: str
    kind: str
    count: int


@dataclass(frozen=True, slots=True)
class QueuePolicyConfig:
    """Triton's ModelQueuePolicy: how the model's queue treats waiting requests, from
    serve.yaml's ``maxQueueSize`` and ``queueTimeoutMicroseconds``.

    servekit answers a request that waited past its timeout at once (``REJECT``: 504 /
    DEADLINE_EXCEEDED, it never runs); Triton's ``DELAY`` is not offered. A request's
    ``timeout`` parameter may shorten its own wait but never lengthen it, which is what
    Triton's ``allow_timeout_override: true`` means, so it is always true.
    """

    max_queue_size: int
    """0: no limit."""
    default_timeout_microseconds: int
    """0: no queue timeout."""
    timeout_action: Literal["REJECT"] = "REJECT"
    allow_timeout_override: bool = True


@dataclass(frozen=True, slots=True)
class DynamicBatchingConfig:
    preferred_batch_size: tuple[int, ...]
    max_queue_delay_microseconds: int
    default_queue_policy: QueuePolicyConfig
    """Triton keeps the queue policy inside ``dynamic_batching`` (and sequence batching), so a
    model without dynamic batching reports none, though its queue has the same bounds:
    reporting a ``dynamic_batching`` block only to carry them would tell clients the model
    batches, and a config sent back with a repository load would turn batching on."""


@dataclass(frozen=True, slots=True)
class SequenceControlConfig:
    """Triton's ModelSequenceBatching.Control."""

    kind: str
    int32_false_true: tuple[int, ...] = ()
    fp32_false_true: tuple[float, ...] = ()
    bool_false_true: tuple[bool, ...] = ()
    data_type: str = "TYPE_INVALID"
    """CORRID only (Triton's TYPE_ names)."""


@dataclass(frozen=True, slots=True)
class SequenceStateConfig:
    """Triton's ModelSequenceBatching.State (implicit state)."""

    input_name: str
    output_name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SequenceBatchingConfig:
    """Triton's ModelSequenceBatching: the strategy with its fields, the idle bound, the
    control inputs (name -> controls) and the implicit state tensors."""

    strategy: Literal["direct", "oldest"]
    max_sequence_idle_microseconds: int
    control_inputs: tuple[tuple[str, tuple[SequenceControlConfig, ...]], ...]
    states: tuple[SequenceStateConfig, ...]
    max_queue_delay_microseconds: int = 0
    minimum_slot_utilization: float = 0.0
    """direct only."""
    max_candidate_sequences: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False
    """oldest only (with max_candidate_sequences and preferred_batch_size)."""


@dataclass(frozen=True, slots=True)
class EnsembleStepConfig:
    """One step of Triton's ModelEnsembling (a pipeline's step in serve.yaml)."""

    model_name: str
    model_version: int
    """-1: the version an unversioned request gets (Triton's "latest")."""
    input_map: Mapping[str, str]
    """The step model's input -> the pipeline tensor it takes."""
    output_map: Mapping[str, str]
    """The step model's output -> the pipeline tensor it makes."""


@dataclass(frozen=True, slots=True)
class ModelConfiguration:
    """Triton's ModelConfig of a served model: what ``GET .../config`` and the ModelConfig RPC
    answer, field for field (the adapters write it as JSON or as the protobuf message, so a
    field neither knows cannot be dropped silently)."""

    name: str
    platform: str
    backend: str
    version_policy: VersionPolicyConfig
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    instance_groups: tuple[InstanceGroupConfig, ...]
    parameters: Mapping[str, str]
    """Name -> string value (Triton's ModelParameter)."""
    dynamic_batching: DynamicBatchingConfig | None = None
    default_model_filename: str | None = None
    decoupled: bool = False
    """Triton's ``model_transaction_policy.decoupled``: the model streams its responses."""
    ensemble_steps: tuple[EnsembleStepConfig, ...] = ()
    """Triton's ``ensemble_scheduling.step`` of a pipeline (platform ``ensemble``)."""
    sequence_batching: SequenceBatchingConfig | None = None
    """Triton's ``sequence_batching`` of a stateful model."""


def model_configuration(
    plan: ModelPlan, signature: ModelSignature, platform: str, decoupled: bool = False
) -> ModelConfiguration:
    """Triton's ModelConfig of a planned and loaded model."""
    batch = plan.max_batch_size
    if plan.pipeline:
        return _ensemble(plan, signature)
    return ModelConfiguration(
        name=plan.name,
        platform=platform,
        backend=BACKEND.get(plan.implementation, plan.implementation),
        version_policy=version_policy(plan.config.version_policy if plan.config else None),
        max_batch_size=batch,
        inputs=tuple(_tensor(spec, batch, _format(plan, spec.name)) for spec in signature.inputs),
        outputs=tuple(
            _tensor(spec, batch, None, _label_file(plan, spec.name)) for spec in signature.outputs
        ),
        instance_groups=(InstanceGroupConfig(f"{plan.name}_0", "KIND_CPU", plan.instances),),
        parameters={key: _text(value) for key, value in plan.parameters.items()},
        dynamic_batching=_dynamic_batching(plan.config),
        default_model_filename="model.onnx" if plan.implementation == "onnxruntime" else None,
        decoupled=decoupled,
        sequence_batching=_sequence_batching(plan.sequence),
    )


def _ensemble(plan: ModelPlan, signature: ModelSignature) -> ModelConfiguration:
    """A pipeline as Triton reports an ensemble: no backend, instances or batching of its own,
    its steps as ``ensemble_scheduling``."""
    batch = plan.max_batch_size
    steps = tuple(
        EnsembleStepConfig(
            s.model, -1 if s.version is None else s.version, dict(s.inputs), dict(s.outputs)
        )
        for s in plan.pipeline
    )
    return ModelConfiguration(
        name=plan.name,
        platform="ensemble",
        backend="",
        version_policy=version_policy(None),
        max_batch_size=batch,
        inputs=tuple(_tensor(spec, batch, "FORMAT_NONE") for spec in signature.inputs),
        outputs=tuple(
            _tensor(spec, batch, None, _label_file(plan, spec.name)) for spec in signature.outputs
        ),
        instance_groups=(),
        parameters={key: _text(value) for key, value in plan.parameters.items()},
        ensemble_steps=steps,
    )


def _dynamic_batching(config: ModelConfig | None) -> DynamicBatchingConfig | None:
    """serve.yaml's dynamicBatching, with the queue's bounds as Triton's default queue policy."""
    batching = config.dynamic_batching if config is not None else None
    if config is None or batching is None:
        return None
    policy = QueuePolicyConfig(config.max_queue_size, config.queue_timeout_microseconds)
    return DynamicBatchingConfig(
        tuple(batching.preferred_batch_size), batching.max_queue_delay_microseconds, policy
    )


def _sequence_batching(sequence: SequenceBatching | None) -> SequenceBatchingConfig | None:
    """serve.yaml's sequenceBatching as Triton's ModelSequenceBatching."""
    if sequence is None:
        return None
    controls = tuple(
        (
            c.name,
            tuple(
                SequenceControlConfig(
                    k.kind,
                    tuple(k.int32_false_true or ()),
                    tuple(k.fp32_false_true or ()),
                    tuple(k.bool_false_true or ()),
                    lookup(k.datatype).config_name if k.data_type else "TYPE_INVALID",
                )
                for k in c.control
            ),
        )
        for c in sequence.control_inputs
    )
    states = tuple(
        SequenceStateConfig(
            s.input_name, s.output_name, lookup(s.datatype).config_name, tuple(s.dims)
        )
        for s in sequence.state
    )
    idle = sequence.max_sequence_idle_microseconds
    oldest = sequence.oldest
    if oldest is not None:
        return SequenceBatchingConfig(
            "oldest",
            idle,
            controls,
            states,
            max_queue_delay_microseconds=oldest.max_queue_delay_microseconds,
            max_candidate_sequences=oldest.max_candidate_sequences,
            preferred_batch_size=tuple(oldest.preferred_batch_size),
            preserve_ordering=oldest.preserve_ordering,
        )
    direct = sequence.direct
    return SequenceBatchingConfig(
        "direct",
        idle,
        controls,
        states,
        max_queue_delay_microseconds=direct.max_queue_delay_microseconds if direct else 0,
        minimum_slot_utilization=direct.minimum_slot_utilization if direct else 0.0,
    )


def version_policy(policy: VersionPolicy | None) -> VersionPolicyConfig:
    """serve.yaml's version policy as Triton's ModelVersionPolicy."""
    if policy is None:
        return VersionPolicyConfig("latest", num_versions=1)
    if policy.latest is not None:
        return VersionPolicyConfig("latest", num_versions=policy.latest.num_versions)
    if policy.all is not None:
        return VersionPolicyConfig("all")
    assert policy.specific is not None
    return VersionPolicyConfig("specific", versions=tuple(policy.specific.versions))


def dims(spec: TensorSpec, max_batch_size: int) -> tuple[int, ...]:
    """The tensor's dims as Triton reports them: without the batch dim when batching."""
    shape = tuple(spec.shape)
    return shape[1:] if max_batch_size > 0 and shape else shape


def _tensor(
    spec: TensorSpec, batch: int, fmt: str | None, label_filename: str | None = None
) -> TensorConfig:
    config_name = lookup(spec.datatype).config_name
    return TensorConfig(
        spec.name, config_name, dims(spec, batch), fmt, label_filename, spec.optional
    )


def _format(plan: ModelPlan, name: str) -> str:
    """serve.yaml's ``format`` of input ``name`` (Triton's default FORMAT_NONE)."""
    for tensor in plan.inputs or ():
        if tensor.name == name and tensor.format is not None:
            return tensor.format
    return "FORMAT_NONE"


def _label_file(plan: ModelPlan, name: str) -> str:
    """Triton's ``label_filename`` of output ``name``: the file its labels come from, if any."""
    own = any(t.name == name and t.labels is not None for t in plan.outputs or ())
    return LABELS_FILE if plan.labels_file and not own else ""


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)
