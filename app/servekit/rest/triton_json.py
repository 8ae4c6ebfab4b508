"""Triton's JSON for the typed model configuration and statistics of the core.

``GET /v2/models/{m}/config`` and ``GET /v2/models[/{m}[/versions/{v}]]/stats`` answer these
shapes (what tritonclient.http's ``get_model_config`` and ``get_inference_statistics`` read);
the dashboard shows the same configuration. Keys are protobuf field names, in the order the
proto declares them, as Triton's HTTP endpoint writes them.
"""

from __future__ import annotations

from typing import Any

from servekit.services import (
    DurationStat,
    ModelConfiguration,
    SequenceBatchingConfig,
    TensorConfig,
    VersionPolicyConfig,
    VersionStatistics,
)


def model_config_json(config: ModelConfiguration) -> dict[str, Any]:
    """Triton's ModelConfig JSON."""
    out: dict[str, Any] = {
        "name": config.name,
        "platform": config.platform,
        "backend": config.backend,
        "version_policy": _policy(config.version_policy),
        "max_batch_size": config.max_batch_size,
        "input": [_tensor(t) for t in config.inputs],
        "output": [_tensor(t) for t in config.outputs],
        "instance_group": [
            {"name": g.name, "kind": g.kind, "count": g.count} for g in config.instance_groups
        ],
        "parameters": {key: {"string_value": value} for key, value in config.parameters.items()},
    }
    batching = config.dynamic_batching
    if batching is not None:
        policy = batching.default_queue_policy
        out["dynamic_batching"] = {
            "preferred_batch_size": list(batching.preferred_batch_size),
            "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
            "default_queue_policy": {
                "timeout_action": policy.timeout_action,
                "default_timeout_microseconds": policy.default_timeout_microseconds,
                "allow_timeout_override": policy.allow_timeout_override,
                "max_queue_size": policy.max_queue_size,
            },
        }
    if config.sequence_batching is not None:
        out["sequence_batching"] = _sequence(config.sequence_batching)
    if config.default_model_filename is not None:
        out["default_model_filename"] = config.default_model_filename
    out["model_transaction_policy"] = {"decoupled": config.decoupled}
    if config.ensemble_steps:
        out["ensemble_scheduling"] = {
            "step": [
                {
                    "model_name": step.model_name,
                    "model_version": step.model_version,
                    "input_map": dict(step.input_map),
                    "output_map": dict(step.output_map),
                }
                for step in config.ensemble_steps
            ]
        }
    return out


def _sequence(batching: SequenceBatchingConfig) -> dict[str, Any]:
    """Triton's ``sequence_batching`` JSON (every field, as Triton's endpoint writes it)."""
    out: dict[str, Any] = {
        "max_sequence_idle_microseconds": batching.max_sequence_idle_microseconds,
        "control_input": [
            {
                "name": name,
                "control": [
                    {
                        "kind": c.kind,
                        "int32_false_true": list(c.int32_false_true),
                        "fp32_false_true": list(c.fp32_false_true),
                        "bool_false_true": list(c.bool_false_true),
                        "data_type": c.data_type,
                    }
                    for c in controls
                ],
            }
            for name, controls in batching.control_inputs
        ],
        "state": [
            {
                "input_name": s.input_name,
                "output_name": s.output_name,
                "data_type": s.data_type,
                "dims": list(s.dims),
                "initial_state": [],
                "use_same_buffer_for_input_output": False,
                "use_growable_memory": False,
            }
            for s in batching.states
        ],
    }
    if batching.strategy == "oldest":
        out["oldest"] = {
            "max_candidate_sequences": batching.max_candidate_sequences,
            "preferred_batch_size": list(batching.preferred_batch_size),
            "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
            "preserve_ordering": batching.preserve_ordering,
        }
    else:
        out["direct"] = {
            "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
            "minimum_slot_utilization": batching.minimum_slot_utilization,
        }
    return out


def _policy(policy: VersionPolicyConfig) -> dict[str, Any]:
    if policy.kind == "latest":
        return {"latest": {"num_versions": policy.num_versions}}
    if policy.kind == "all":
        return {"all": {}}
    return {"specific": {"versions": list(policy.versions)}}


def _tensor(tensor: TensorConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tensor.name, "data_type": tensor.data_type}
    if tensor.format is not None:
        out["format"] = tensor.format
    out["dims"] = list(tensor.dims)
    if tensor.optional:  # as protobuf JSON omits a false one
        out["optional"] = True
    if tensor.label_filename:  # as protobuf JSON (the gRPC answer) omits an empty one
        out["label_filename"] = tensor.label_filename
    return out


def statistics_json(rows: tuple[VersionStatistics, ...]) -> dict[str, Any]:
    """Triton's ``{"model_stats": [...]}``."""
    return {"model_stats": [_version(row) for row in rows]}


def _version(row: VersionStatistics) -> dict[str, Any]:
    entry = _triton_version(row)
    if row.shadow:  # servekit's own: a shadow version's copies by outcome
        entry["shadow"] = dict(row.shadow)
    return entry


def _triton_version(row: VersionStatistics) -> dict[str, Any]:
    return {
        "name": row.name,
        "version": row.version,
        "last_inference": row.last_inference,
        "inference_count": row.inference_count,
        "execution_count": row.execution_count,
        "inference_stats": {
            "success": _duration(row.success),
            "fail": _duration(row.fail),
            "queue": _duration(row.queue),
            "compute_input": _duration(row.compute_input),
            "compute_infer": _duration(row.compute_infer),
            "compute_output": _duration(row.compute_output),
            "cache_hit": _duration(row.cache_hit),
            "cache_miss": _duration(row.cache_miss),
        },
        "batch_stats": [
            {
                "batch_size": batch.batch_size,
                "compute_input": _duration(batch.compute_input),
                "compute_infer": _duration(batch.compute_infer),
                "compute_output": _duration(batch.compute_output),
            }
            for batch in row.batch_stats
        ],
    }


def _duration(duration: DurationStat) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}
