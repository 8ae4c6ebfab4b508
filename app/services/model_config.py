"""Triton's model configuration extension: a ModelConfig derived from the plan and the model.

Nothing is stored twice: the configuration is computed on request from the compiled ModelPlan
(version policy, batching, instances, parameters) and the signature of the loaded version
(input and output datatypes and shapes). The result is a plain dict in the JSON shape Triton's
HTTP endpoint answers; the gRPC adapter parses the same dict into ``inference.ModelConfig``.
As in Triton, with ``max_batch_size > 0`` the batch dimension is not part of ``dims``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from app.config.compiler import ModelPlan
from app.config.schema import VersionPolicy
from app.datatypes import lookup
from app.types import ModelSignature, TensorSpec

if TYPE_CHECKING:
    from app.services.dataplane import DataPlane

# Runtime implementation -> the Triton backend that plays the same role.
BACKEND: dict[str, str] = {"onnxruntime": "onnxruntime", "python": "python"}


def model_config_for(dataplane: DataPlane, name: str, version: str | None = None) -> dict[str, Any]:
    """The configuration of ``name`` as served at ``version`` (default: the default version)."""
    entry, found = dataplane.repository.resolve(name, version)
    signature = dataplane.signature_of(name, str(found.version))
    platform = found.runtime.platform if found.runtime is not None else entry.plan.format_name
    return model_config(entry.plan, signature, platform)


def model_config(plan: ModelPlan, signature: ModelSignature, platform: str) -> dict[str, Any]:
    """Triton's ModelConfig (JSON shape, proto field names) of a planned and loaded model."""
    batch = plan.max_batch_size
    config: dict[str, Any] = {
        "name": plan.name,
        "platform": platform,
        "backend": BACKEND.get(plan.implementation, plan.implementation),
        "version_policy": version_policy(plan.config.version_policy if plan.config else None),
        "max_batch_size": batch,
        "input": [_input(spec, batch) for spec in signature.inputs],
        "output": [_output(spec, batch) for spec in signature.outputs],
        "instance_group": [{"name": f"{plan.name}_0", "kind": "KIND_CPU", "count": plan.instances}],
        "parameters": {
            key: {"string_value": _text(value)} for key, value in plan.parameters.items()
        },
    }
    batching = plan.config.dynamic_batching if plan.config else None
    if batching is not None:
        config["dynamic_batching"] = {
            "preferred_batch_size": list(batching.preferred_batch_size),
            "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
        }
    if plan.implementation == "onnxruntime":
        config["default_model_filename"] = "model.onnx"
    return config


def version_policy(policy: VersionPolicy | None) -> dict[str, Any]:
    """serve.yaml's version policy in Triton's ModelVersionPolicy shape."""
    if policy is None:
        return {"latest": {"num_versions": 1}}
    if policy.latest is not None:
        return {"latest": {"num_versions": policy.latest.num_versions}}
    if policy.all is not None:
        return {"all": {}}
    assert policy.specific is not None
    return {"specific": {"versions": list(policy.specific.versions)}}


def dims(spec: TensorSpec, max_batch_size: int) -> list[int]:
    """The tensor's dims as Triton reports them: without the batch dim when batching."""
    shape = list(spec.shape)
    return shape[1:] if max_batch_size > 0 and shape else shape


def _input(spec: TensorSpec, batch: int) -> dict[str, Any]:
    return {
        "name": spec.name,
        "data_type": lookup(spec.datatype).config_name,
        "format": "FORMAT_NONE",
        "dims": dims(spec, batch),
    }


def _output(spec: TensorSpec, batch: int) -> dict[str, Any]:
    return {
        "name": spec.name,
        "data_type": lookup(spec.datatype).config_name,
        "dims": dims(spec, batch),
    }


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)
