"""The typed model configuration and statistics of the core as Triton's protobuf messages.

Built field by field (no JSON detour, no ``ignore_unknown_fields``): a field the core adds is a
type error here until the message carries it, instead of vanishing on the wire.
"""

from __future__ import annotations

from servekit.protos import grpc_service_pb2 as pb
from servekit.protos import model_config_pb2 as mc
from servekit.services import (
    DurationStat,
    ModelConfiguration,
    SequenceBatchingConfig,
    TensorConfig,
    VersionPolicyConfig,
    VersionStatistics,
)


def model_config_message(config: ModelConfiguration) -> mc.ModelConfig:
    """``inference.ModelConfig``."""
    message = mc.ModelConfig(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        version_policy=_policy(config.version_policy),
        max_batch_size=config.max_batch_size,
        input=[_input(t) for t in config.inputs],
        output=[_output(t) for t in config.outputs],
        instance_group=[
            mc.ModelInstanceGroup(
                name=g.name, kind=mc.ModelInstanceGroup.Kind.Value(g.kind), count=g.count
            )
            for g in config.instance_groups
        ],
        parameters={k: mc.ModelParameter(string_value=v) for k, v in config.parameters.items()},
    )
    batching = config.dynamic_batching
    if batching is not None:
        policy = batching.default_queue_policy
        message.dynamic_batching.CopyFrom(
            mc.ModelDynamicBatching(
                preferred_batch_size=batching.preferred_batch_size,
                max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
                default_queue_policy=mc.ModelQueuePolicy(
                    timeout_action=mc.ModelQueuePolicy.TimeoutAction.Value(policy.timeout_action),
                    default_timeout_microseconds=policy.default_timeout_microseconds,
                    allow_timeout_override=policy.allow_timeout_override,
                    max_queue_size=policy.max_queue_size,
                ),
            )
        )
    if config.sequence_batching is not None:
        message.sequence_batching.CopyFrom(_sequence(config.sequence_batching))
    if config.default_model_filename is not None:
        message.default_model_filename = config.default_model_filename
    if config.decoupled:
        message.model_transaction_policy.decoupled = True
    for step in config.ensemble_steps:
        message.ensemble_scheduling.step.add(
            model_name=step.model_name,
            model_version=step.model_version,
            input_map=step.input_map,
            output_map=step.output_map,
        )
    return message


def _sequence(batching: SequenceBatchingConfig) -> mc.ModelSequenceBatching:
    sb = mc.ModelSequenceBatching
    message = sb(
        max_sequence_idle_microseconds=batching.max_sequence_idle_microseconds,
        control_input=[
            sb.ControlInput(
                name=name,
                control=[
                    sb.Control(
                        kind=sb.Control.Kind.Value(c.kind),
                        int32_false_true=c.int32_false_true,
                        fp32_false_true=c.fp32_false_true,
                        bool_false_true=c.bool_false_true,
                        data_type=mc.DataType.Value(c.data_type),
                    )
                    for c in controls
                ],
            )
            for name, controls in batching.control_inputs
        ],
        state=[
            sb.State(
                input_name=s.input_name,
                output_name=s.output_name,
                data_type=mc.DataType.Value(s.data_type),
                dims=s.dims,
            )
            for s in batching.states
        ],
    )
    if batching.strategy == "oldest":
        message.oldest.CopyFrom(
            sb.StrategyOldest(
                max_candidate_sequences=batching.max_candidate_sequences,
                preferred_batch_size=batching.preferred_batch_size,
                max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
                preserve_ordering=batching.preserve_ordering,
            )
        )
    else:
        message.direct.CopyFrom(
            sb.StrategyDirect(
                max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
                minimum_slot_utilization=batching.minimum_slot_utilization,
            )
        )
    return message


def _policy(policy: VersionPolicyConfig) -> mc.ModelVersionPolicy:
    if policy.kind == "latest":
        latest = mc.ModelVersionPolicy.Latest(num_versions=policy.num_versions)
        return mc.ModelVersionPolicy(latest=latest)
    if policy.kind == "all":
        return mc.ModelVersionPolicy(all=mc.ModelVersionPolicy.All())
    specific = mc.ModelVersionPolicy.Specific(versions=policy.versions)
    return mc.ModelVersionPolicy(specific=specific)


def _input(tensor: TensorConfig) -> mc.ModelInput:
    return mc.ModelInput(
        name=tensor.name,
        data_type=mc.DataType.Value(tensor.data_type),
        format=mc.ModelInput.Format.Value(tensor.format or "FORMAT_NONE"),
        dims=tensor.dims,
        optional=tensor.optional,
    )


def _output(tensor: TensorConfig) -> mc.ModelOutput:
    return mc.ModelOutput(
        name=tensor.name,
        data_type=mc.DataType.Value(tensor.data_type),
        dims=tensor.dims,
        label_filename=tensor.label_filename or "",
    )


def statistics_message(rows: tuple[VersionStatistics, ...]) -> pb.ModelStatisticsResponse:
    """``inference.ModelStatisticsResponse``."""
    return pb.ModelStatisticsResponse(model_stats=[_version(row) for row in rows])


def _version(row: VersionStatistics) -> pb.ModelStatistics:
    return pb.ModelStatistics(
        name=row.name,
        version=row.version,
        last_inference=row.last_inference,
        inference_count=row.inference_count,
        execution_count=row.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(row.success),
            fail=_duration(row.fail),
            queue=_duration(row.queue),
            compute_input=_duration(row.compute_input),
            compute_infer=_duration(row.compute_infer),
            compute_output=_duration(row.compute_output),
            cache_hit=_duration(row.cache_hit),
            cache_miss=_duration(row.cache_miss),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=batch.batch_size,
                compute_input=_duration(batch.compute_input),
                compute_infer=_duration(batch.compute_infer),
                compute_output=_duration(batch.compute_output),
            )
            for batch in row.batch_stats
        ],
    )


def _duration(duration: DurationStat) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=duration.count, ns=duration.ns)
