"""Pipelines (serve.yaml ``pipeline:``, Triton's ensembles) driven in process.

The same DataPlane every protocol calls: a featurise -> ONNX -> post-process pipeline answers
what the three models answer called in turn; steps whose inputs are ready run at the same time;
a failing step fails the request with the step named; metadata, configuration, readiness and
statistics treat the pipeline as a model and its steps as theirs. Config errors come back with
their YAML line (tests/pipeline_models.py holds the models).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from inprocess import Serve, Services
from pipeline_models import CONFIG, rows, write_project

from servekit.config.compiler import compile_plan
from servekit.config.loader import ConfigError, load_config, parse_config
from servekit.config.overrides import Overrides, apply_overrides
from servekit.errors import DeadlineExceeded, Internal, InvalidArgument, Unavailable
from servekit.grpc.triton_proto import model_config_message
from servekit.rest.triton_json import model_config_json
from servekit.types import InferRequest, RequestedOutput, Tensor

pytestmark = pytest.mark.anyio


async def start(serve: Serve, tmp_path: Path) -> Services:
    write_project(tmp_path)
    services: Services = await serve(CONFIG)
    return services


def fp32(name: str, data: np.ndarray) -> Tensor:
    return Tensor(name, "FP32", data.shape, data)


async def call(services: Services, model: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    request = InferRequest(model, [fp32(k, v) for k, v in inputs.items()])
    response = await services.dataplane.infer(request)
    return {t.name: t.data for t in response.outputs}


async def test_the_pipeline_answers_as_its_models_called_in_turn(
    serve: Serve, tmp_path: Path
) -> None:
    services = await start(serve, tmp_path)
    raw = rows(5)
    features = (await call(services, "featurise", raw=raw))["features"]
    scores = (await call(services, "mlp", input=features))["output"]
    expected = await call(services, "postprocess", scores=scores)
    got = await call(services, "classify", RAW=raw)
    assert list(got) == ["LABEL", "PROBABILITIES"]
    np.testing.assert_array_equal(got["LABEL"], expected["label"])
    np.testing.assert_array_equal(got["PROBABILITIES"], expected["probabilities"])
    alone = await call(services, "combined", raw=raw)  # the one-model version agrees
    np.testing.assert_allclose(alone["probabilities"], got["PROBABILITIES"], rtol=1e-6)


async def test_only_the_outputs_asked_for(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    request = InferRequest("classify", [fp32("RAW", rows(2))], outputs=[RequestedOutput("LABEL")])
    response = await services.dataplane.infer(request)
    assert [t.name for t in response.outputs] == ["LABEL"]
    assert response.model_name == "classify"


async def test_independent_steps_run_at_the_same_time(serve: Serve, tmp_path: Path) -> None:
    # left and right meet at a barrier of two: run one after the other, neither would return
    services = await start(serve, tmp_path)
    x = np.array([1.0, 2.0], np.float32)
    got = await call(services, "fan", X=x)
    np.testing.assert_array_equal(got["TOTAL"], (x + 1) + (x * 2))


async def test_a_light_python_step_runs_on_the_loop(serve: Serve, tmp_path: Path) -> None:
    """A chain's Python step measured fast in its threads runs on the loop (no thread hop);
    the same model called directly stays in its threads, as every Python model does."""
    services = await start(serve, tmp_path)
    x = np.ones(2, np.float32)
    on_loop = False
    for _ in range(40):  # learnt from its first calls in threads (fast ones, on a busy machine)
        on_loop = bool((await call(services, "located", X=x))["ON_LOOP"].all())
        if on_loop:
            break
    assert on_loop
    assert not (await call(services, "whereabouts", x=x))["on_loop"].any()


async def test_a_light_step_queued_behind_a_thread_call_catches_up_on_the_loop(
    serve: Serve, tmp_path: Path
) -> None:
    """At steady concurrency a step that finds its model busy in a thread queues; once the
    thread call ends it runs on the loop, not in another thread (before, every later request
    queued behind the previous one's thread call and the step never got back to the loop)."""
    services = await start(serve, tmp_path)
    x = np.ones(2, np.float32)
    for _ in range(40):  # the step's placement is learnt first, as above
        if (await call(services, "located", X=x))["ON_LOOP"].all():
            break
    direct = asyncio.ensure_future(call(services, "whereabouts", x=x))  # takes the thread
    step = asyncio.ensure_future(call(services, "located", X=x))  # queues behind it
    assert not (await direct)["on_loop"].any()
    assert (await step)["ON_LOOP"].all()


async def test_a_step_that_calls_models_never_runs_on_the_loop(
    serve: Serve, tmp_path: Path
) -> None:
    """Its sync ``servekit.models.infer`` waits for the loop: on the loop it would be refused.
    (A bound of 0.2 s, so that its calls, hops included, are measured light.)"""
    write_project(tmp_path)
    services = await serve("server: {inlineBelowMicroseconds: 200000}\n" + CONFIG)
    raw = rows(1)
    expected = (await call(services, "classify", RAW=raw))["LABEL"]
    for _ in range(10):
        got = await call(services, "calls_as_a_step", RAW=raw)
        np.testing.assert_array_equal(got["LABEL"], expected)


async def test_an_optional_pipeline_input_may_be_left_out(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    a, b = np.array([1.0, 2.0], np.float32), np.array([10.0, 20.0], np.float32)
    assert (await call(services, "maybe", A=a))["TOTAL"].tolist() == [1.0, 2.0]
    assert (await call(services, "maybe", A=a, B=b))["TOTAL"].tolist() == [11.0, 22.0]
    inputs = services.dataplane.model_metadata("maybe").as_dict()["inputs"]
    assert [i.get("optional", False) for i in inputs] == [False, True]
    with pytest.raises(InvalidArgument, match="'maybe' needs input"):
        await call(services, "maybe", B=b)


async def test_a_failing_step_is_named(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    with pytest.raises(Internal, match=r"pipeline 'broken' step 0 \(model 'explode'\)") as caught:
        await call(services, "broken", X=np.ones(2, np.float32))
    assert "post-processing table is missing" in caught.value.message
    assert services.statistics("broken")["inference_stats"]["fail"]["count"] == 1
    assert services.statistics("explode")["inference_stats"]["fail"]["count"] == 1


async def test_the_deadline_covers_every_step(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    module = sys.modules["pipeline_user_models"]
    request = InferRequest("stalled", [fp32("X", np.ones(2, np.float32))])
    try:
        with pytest.raises(DeadlineExceeded, match=r"pipeline 'stalled' step 1 \(model 'stall'\)"):
            await services.dataplane.infer(request, time.monotonic() + 0.3)
    finally:
        module.RELEASE.set()
    assert services.statistics("add")["inference_stats"]["success"]["count"] == 1
    assert services.statistics("stalled")["inference_stats"]["fail"]["count"] == 1


async def test_a_pipeline_accepted_before_a_graceful_stop_finishes(
    serve: Serve, tmp_path: Path
) -> None:
    services = await start(serve, tmp_path)
    module = sys.modules["pipeline_user_models"]
    request = InferRequest("draining", [fp32("X", np.ones(2, np.float32))])
    accepted = asyncio.create_task(services.dataplane.infer(request))
    try:
        assert await asyncio.to_thread(module.STALLED.wait, 10)
        stopping = asyncio.create_task(services.stop())
        await asyncio.sleep(0)  # stop() has begun: draining
        with pytest.raises(Unavailable, match="stopping"):
            await services.dataplane.infer(request)
    finally:
        module.RELEASE.set()
    response = await asyncio.wait_for(accepted, 10)  # its second step ran after the drain began
    assert response.outputs[0].data.tolist() == [2.0, 2.0]
    await asyncio.wait_for(stopping, 10)


async def test_the_pipeline_checks_its_own_inputs(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    with pytest.raises(InvalidArgument, match="'classify' needs input"):
        await services.dataplane.infer(InferRequest("classify", []))
    wrong = Tensor("RAW", "FP64", (1, 8), np.ones((1, 8)))
    with pytest.raises(InvalidArgument, match="must be FP32"):
        await services.dataplane.infer(InferRequest("classify", [wrong]))


async def test_metadata_config_and_statistics(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    dataplane = services.dataplane
    metadata = dataplane.model_metadata("classify").as_dict()
    assert metadata["platform"] == "ensemble"
    assert [t["name"] for t in metadata["inputs"]] == ["RAW"]
    config = dataplane.model_config("classify")
    as_json = model_config_json(config)
    assert as_json["platform"] == "ensemble" and as_json["backend"] == ""
    steps = as_json["ensemble_scheduling"]["step"]
    assert steps[1] == {
        "model_name": "mlp",
        "model_version": 1,
        "input_map": {"input": "FEATURES"},
        "output_map": {"output": "SCORES"},
    }
    assert steps[0]["model_version"] == -1
    message = model_config_message(config)
    assert [s.model_name for s in message.ensemble_scheduling.step] == [
        "featurise",
        "mlp",
        "postprocess",
    ]
    assert dict(message.ensemble_scheduling.step[2].output_map) == {
        "label": "LABEL",
        "probabilities": "PROBABILITIES",
    }
    await call(services, "classify", RAW=rows(3))
    for name in ("classify", "featurise", "mlp", "postprocess"):
        stats = services.statistics(name)
        assert stats["inference_stats"]["success"]["count"] == 1, name
    assert services.statistics("combined")["inference_stats"]["success"]["count"] == 0


async def test_ready_only_when_every_step_is(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    assert services.dataplane.model_ready("classify")
    assert services.dataplane.model_ready("classify", "1")
    await services.control.unload("mlp")
    assert not services.dataplane.model_ready("classify")
    assert not services.dataplane.model_ready("classify", "1")
    with pytest.raises(Unavailable, match=r"pipeline 'classify' step 1 \(model 'mlp'\)"):
        await call(services, "classify", RAW=rows(1))


NESTED = """
  - name: nested
    maxBatchSize: 64
    inputs: [{name: R, datatype: FP32, shape: [-1, 8]}]
    outputs: [{name: L, datatype: INT64, shape: [-1]}]
    pipeline:
      - {model: classify, inputs: {RAW: R}, outputs: {LABEL: L}}
  - name: loose
    maxBatchSize: 64
    inputs: [{name: R, datatype: FP32, shape: [-1, -1]}]
    outputs: [{name: F, datatype: FP32, shape: [-1, 16]}]
    pipeline:
      - {model: featurise, inputs: {raw: R}, outputs: {features: F}}
"""


async def test_steps_the_quick_way_does_not_cover(serve: Serve, tmp_path: Path) -> None:
    """A pipeline as a step, and a step input that fails the step model's check, go through
    the DataPlane as any request: the same answer, the same refusal, the step named."""
    write_project(tmp_path)
    services = await serve(CONFIG + NESTED)
    raw = rows(3)
    expected = (await call(services, "classify", RAW=raw))["LABEL"]
    for _ in range(2):
        np.testing.assert_array_equal((await call(services, "nested", R=raw))["L"], expected)
    assert services.statistics("classify")["inference_stats"]["success"]["count"] == 3
    features = (await call(services, "loose", R=raw))["F"]
    np.testing.assert_array_equal(features[:, 8:], raw * raw)
    wide = np.ones((2, 9), np.float32)
    with pytest.raises(InvalidArgument, match=r"pipeline 'loose' step 0 \(model 'featurise'\)"):
        await call(services, "loose", R=wide)
    with pytest.raises(InvalidArgument, match=r"shape \[2, 9\] does not match the model's"):
        await call(services, "loose", R=wide)


VERSIONED = """
models:
  - {name: mlp, modelFormat: {name: onnx}, storageUri: models/mlp, maxBatchSize: 8}
  - name: scored
    maxBatchSize: 8
    inputs: [{name: X, datatype: FP32, shape: [-1, 16]}]
    outputs: [{name: Y, datatype: FP32, shape: [-1, 4]}]
    pipeline:
      - {model: mlp, inputs: {input: X}, outputs: {output: Y}}
  - name: pinned
    maxBatchSize: 8
    inputs: [{name: X, datatype: FP32, shape: [-1, 16]}]
    outputs: [{name: Y, datatype: FP32, shape: [-1, 4]}]
    pipeline:
      - {model: mlp, version: 2, inputs: {input: X}, outputs: {output: Y}}
"""


async def test_a_step_follows_its_models_versions_and_reloads(serve: Serve, tmp_path: Path) -> None:
    """A step's call is worked out once per model version: a new serving version, a reload
    with new weights and an unload are each seen by the next request."""
    import onnx
    import onnx_builders

    folder = tmp_path / "models" / "mlp"

    def weights(version: int, seed: int) -> None:
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        onnx.save(onnx_builders.mlp(seed=seed), str(folder / str(version) / "model.onnx"))

    weights(1, 1)
    weights(2, 2)
    services = await serve(VERSIONED)
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)

    async def mlp() -> np.ndarray:
        return (await call(services, "mlp", input=x))["output"]

    async def both() -> tuple[np.ndarray, np.ndarray]:
        return (await call(services, "scored", X=x))["Y"], (await call(services, "pinned", X=x))[
            "Y"
        ]

    two = await mlp()
    for _ in range(3):  # the calls are worked out, and kept
        scored, pinned = await both()
        np.testing.assert_array_equal(scored, two)
        np.testing.assert_array_equal(pinned, two)
    weights(3, 3)
    await services.control.load("mlp")  # version 3 serves; version 2 is not kept
    three = await mlp()
    assert not np.array_equal(three, two)
    np.testing.assert_array_equal((await call(services, "scored", X=x))["Y"], three)
    with pytest.raises(Unavailable, match=r"pipeline 'pinned' step 0 \(model 'mlp'\)"):
        await call(services, "pinned", X=x)
    weights(3, 4)  # new weights under the same version number: a reload
    await services.control.load("mlp")
    four = await mlp()
    assert not np.array_equal(four, three)
    np.testing.assert_array_equal((await call(services, "scored", X=x))["Y"], four)
    await services.control.unload("mlp")
    with pytest.raises(Unavailable, match=r"pipeline 'scored' step 0 \(model 'mlp'\)"):
        await call(services, "scored", X=x)


# -- serve.yaml ---------------------------------------------------------------------------------
def problems(tmp_path: Path, text: str) -> str:
    write_project(tmp_path)
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        compile_plan(load_config(path), tmp_path, path)
    return str(caught.value)


def line_of(text: str, needle: str, after: str = "") -> int:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i in range(start, len(lines)) if needle in lines[i]) + 1


def edited(old: str, new: str) -> str:
    assert old in CONFIG
    return CONFIG.replace(old, new, 1)


def test_unknown_step_model(tmp_path: Path) -> None:
    text = edited("{model: featurise, inputs", "{model: featurize, inputs")
    found = problems(tmp_path, text)
    line = line_of(text, "featurize")
    assert f"serve.yaml:{line}: models[3].pipeline[0].model: step 0 runs model 'featurize'" in found


def test_unmapped_tensor(tmp_path: Path) -> None:
    text = edited("inputs: {scores: SCORES}", "inputs: {scores: SCORE}")
    found = problems(tmp_path, text)
    line = line_of(text, "SCORE}")
    assert f"serve.yaml:{line}: models[3].pipeline[2].inputs.scores: step 2 input" in found
    assert "tensor 'SCORE', which is no pipeline input and no step's output" in found
    assert "no step takes" not in found


def test_type_mismatch(tmp_path: Path) -> None:
    text = edited("{name: LABEL, datatype: INT64", "{name: LABEL, datatype: INT32")
    found = problems(tmp_path, text)
    assert "pipeline output 'LABEL' is INT32, but step 2 makes it INT64" in found
    text = edited("{name: total, datatype: FP32", "{name: total, datatype: FP64")
    found = problems(tmp_path, text)
    assert "is FP32, but step 0 makes it FP64" in found


def test_a_step_input_the_model_does_not_have(tmp_path: Path) -> None:
    found = problems(tmp_path, edited("inputs: {raw: RAW}", "inputs: {rows: RAW}"))
    assert "model 'featurise' has no input 'rows'; its inputs are raw" in found


def test_steps_waiting_on_each_other(tmp_path: Path) -> None:
    text = edited("{model: left, inputs: {x: X}", "{model: left, inputs: {x: TOTAL}")
    found = problems(tmp_path, text)
    assert "models[8].pipeline: its steps wait on each other's outputs (a cycle)" in found


def test_pipelines_running_each_other(tmp_path: Path) -> None:
    text = edited(
        "{model: explode, inputs: {x: X}, outputs: {y: Y}}",
        "{model: fan, inputs: {X: X}, outputs: {TOTAL: Y}}",
    )
    text = text.replace(
        "{model: left, inputs: {x: X}, outputs: {y: L}}",
        "{model: broken, inputs: {X: X}, outputs: {Y: L}}",
    )
    found = problems(tmp_path, text)
    assert "pipelines run each other: fan -> broken -> fan" in found
    assert "pipelines run each other: broken -> fan -> broken" in found


def test_a_tensor_made_twice(tmp_path: Path) -> None:
    text = edited(
        "{model: right, inputs: {x: X}, outputs: {y: R}}",
        "{model: right, inputs: {x: X}, outputs: {y: L}}",
    )
    found = problems(tmp_path, text)
    assert "tensor 'L' is made by step 1 already" in found


def test_a_pipeline_has_no_model_of_its_own(tmp_path: Path) -> None:
    text = edited("  - name: broken\n", "  - name: broken\n    storageUri: x.onnx\n")
    found = problems(tmp_path, text)
    assert "a pipeline runs other models and has no storageUri" in found
    text = edited("  - name: broken\n", "  - name: broken\n    modelFormat: {name: onnx}\n")
    assert "a pipeline has no modelFormat" in problems(tmp_path, text)
    text = edited("    outputs: [{name: Y, datatype: FP32, shape: [-1]}]\n", "")
    assert "a pipeline declares its outputs" in problems(tmp_path, text)
    text = edited(
        "    modelFormat: {name: onnx}\n    storageUri: mlp.onnx\n", "    storageUri: mlp.onnx\n"
    )
    assert "models[1].modelFormat: Field required" in problems(tmp_path, text)


def test_only_a_pipeline_takes_its_steps_along() -> None:
    text = """
models:
  - {name: a, modelFormat: {name: onnx}, storageUri: a.onnx}
  - {name: b, modelFormat: {name: onnx}, storageUri: b.onnx}
  - name: inner
    inputs: [{name: X, datatype: FP32, shape: [-1]}]
    outputs: [{name: Y, datatype: FP32, shape: [-1]}]
    pipeline: [{model: a, inputs: {x: X}, outputs: {y: Y}}]
  - name: outer
    inputs: [{name: X, datatype: FP32, shape: [-1]}]
    outputs: [{name: Y, datatype: FP32, shape: [-1]}]
    pipeline: [{model: inner, inputs: {X: X}, outputs: {Y: Y}}]
"""
    config = apply_overrides(parse_config(text), "serve.yaml", Overrides(only="outer"))
    assert [m.name for m in config.models] == ["a", "inner", "outer"]
