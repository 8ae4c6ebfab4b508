"""The queue's bounds in the model configuration, as Triton's ``default_queue_policy``, and what
a configuration pushed with a repository load may set: the policy read back from
``GET .../config`` round-trips, and ``maxQueueDelayMicroseconds`` is bounded (1 s) in serve.yaml
and in pushed configs alike."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from tritonclient.grpc import model_config_pb2 as triton_model_config_pb2

from servekit.config.compiler import compile_plan
from servekit.config.loader import ConfigError, parse_config
from servekit.config.schema import MAX_QUEUE_DELAY_MICROSECONDS, ModelConfig
from servekit.errors import InvalidArgument
from servekit.grpc.triton_proto import model_config_message
from servekit.models.pushed_config import parse_load_config
from servekit.rest.triton_json import model_config_json
from servekit.runtimes.python import register_object
from servekit.server import ServeKit
from servekit.services.model_config import ModelConfiguration

IO = (
    "    inputs: [{name: x, datatype: FP32, shape: [-1, 2]}]\n"
    "    outputs: [{name: x, datatype: FP32, shape: [-1, 2]}]\n"
)


def _identity(x: Any) -> Any:
    return x


def _configurations(tmp_path: Path, extra: str) -> dict[str, ModelConfiguration]:
    """The configurations of a batching and a plain model sharing ``extra`` (queue bounds)."""
    entry = register_object(_identity)
    text = (
        "models:\n"
        f"  - name: batched\n    modelFormat: {{name: python}}\n    entrypoint: {entry}\n{IO}"
        "    maxBatchSize: 8\n    dynamicBatching: {maxQueueDelayMicroseconds: 250}\n"
        f"{extra}"
        f"  - name: plain\n    modelFormat: {{name: python}}\n    entrypoint: {entry}\n{IO}"
        f"{extra}"
    )

    async def scenario() -> dict[str, ModelConfiguration]:
        kit = ServeKit(compile_plan(parse_config(text), tmp_path))
        await kit.control.start()
        try:
            return {name: kit.dataplane.model_config(name) for name in ("batched", "plain")}
        finally:
            await kit.stop()

    return asyncio.run(scenario())


POLICY = {
    "timeout_action": "REJECT",
    "default_timeout_microseconds": 5000,
    "allow_timeout_override": True,
    "max_queue_size": 7,
}


def test_the_queue_policy_is_reported_like_triton(tmp_path: Path) -> None:
    found = _configurations(tmp_path, "    maxQueueSize: 7\n    queueTimeoutMicroseconds: 5000\n")
    batched = model_config_json(found["batched"])
    assert batched["dynamic_batching"] == {
        "preferred_batch_size": [],
        "max_queue_delay_microseconds": 250,
        "default_queue_policy": POLICY,
    }
    message = model_config_message(found["batched"])
    # What a Triton gRPC client reads: our bytes parsed with tritonclient's own descriptors.
    theirs = triton_model_config_pb2.ModelConfig.FromString(message.SerializeToString())
    policy = theirs.dynamic_batching.default_queue_policy
    assert policy.timeout_action == triton_model_config_pb2.ModelQueuePolicy.REJECT
    assert (policy.default_timeout_microseconds, policy.max_queue_size) == (5000, 7)
    assert policy.allow_timeout_override is True
    shown = MessageToDict(
        message.dynamic_batching.default_queue_policy,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    assert {k: (int(v) if k.endswith("microseconds") else v) for k, v in shown.items()} == POLICY
    # Triton has the policy only inside dynamic (or sequence) batching: a plain model, whose
    # queue has the same bounds, reports no dynamic_batching (it does not batch).
    assert "dynamic_batching" not in model_config_json(found["plain"])
    assert not model_config_message(found["plain"]).HasField("dynamic_batching")


def test_default_bounds_are_reported(tmp_path: Path) -> None:
    batched = model_config_json(_configurations(tmp_path, "")["batched"])
    policy = batched["dynamic_batching"]["default_queue_policy"]
    assert policy["max_queue_size"] == ModelConfig.model_fields["max_queue_size"].default == 1024
    assert policy["default_timeout_microseconds"] == 0  # no queue timeout, as Triton's 0


def _push(config: dict[str, Any], current: ModelConfig | None = None) -> ModelConfig:
    files = [PurePosixPath("1/model.onnx")]
    return parse_load_config("m", json.dumps(config), current, files)


def test_a_config_read_back_keeps_its_queue_policy(tmp_path: Path) -> None:
    found = _configurations(tmp_path, "    maxQueueSize: 7\n    queueTimeoutMicroseconds: 5000\n")
    read = model_config_json(found["batched"])
    read.update(name="m", platform="onnxruntime_onnx")
    model = _push(read)
    assert (model.max_queue_size, model.queue_timeout_microseconds) == (7, 5000)
    assert model.dynamic_batching is not None
    assert model.dynamic_batching.max_queue_delay_microseconds == 250
    # proto JSON spellings (lowerCamelCase, int64 as strings) are read the same way
    camel = {
        "platform": "onnxruntime_onnx",
        "maxBatchSize": 4,
        "dynamicBatching": {
            "defaultQueuePolicy": {"maxQueueSize": 3, "defaultTimeoutMicroseconds": "900"}
        },
    }
    model = _push(camel)
    assert (model.max_queue_size, model.queue_timeout_microseconds) == (3, 900)


def test_a_delaying_queue_policy_is_refused() -> None:
    config = {
        "platform": "onnxruntime_onnx",
        "max_batch_size": 4,
        "dynamic_batching": {"default_queue_policy": {"timeout_action": "DELAY"}},
    }
    with pytest.raises(InvalidArgument, match="timeout_action 'DELAY' is not offered"):
        _push(config)


OVER = MAX_QUEUE_DELAY_MICROSECONDS + 1


@pytest.mark.parametrize(
    "config",
    [
        {
            "platform": "onnxruntime_onnx",
            "max_batch_size": 4,
            "dynamic_batching": {"max_queue_delay_microseconds": str(OVER)},
        },
        {
            "modelFormat": {"name": "onnx"},
            "maxBatchSize": 4,
            "dynamicBatching": {"maxQueueDelayMicroseconds": 2**62},
        },
    ],
    ids=["triton", "servekit"],
)
def test_a_pushed_batching_delay_is_bounded(config: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument) as refused:
        _push(config)
    message = refused.value.message
    assert "maxQueueDelayMicroseconds" in message and "over 1000000 (1 s)" in message
    assert "Value error" not in message


def test_the_bound_itself_is_accepted_everywhere() -> None:
    config = {
        "platform": "onnxruntime_onnx",
        "max_batch_size": 4,
        "dynamic_batching": {"max_queue_delay_microseconds": MAX_QUEUE_DELAY_MICROSECONDS},
    }
    model = _push(config)
    assert model.dynamic_batching is not None
    assert model.dynamic_batching.max_queue_delay_microseconds == MAX_QUEUE_DELAY_MICROSECONDS


def test_serve_yaml_has_the_same_bound() -> None:
    text = (
        "models:\n  - {name: m, modelFormat: {name: onnx}, storageUri: m.onnx, maxBatchSize: 4,\n"
        f"     dynamicBatching: {{maxQueueDelayMicroseconds: {OVER}}}}}\n"
    )
    with pytest.raises(ConfigError, match=r"over 1000000 \(1 s\)"):
        parse_config(text)
