"""The DataPlane driven directly, in process, with fake models (tests/fakes.py): metadata,
validation of requests, inference, version selection and statistics, in milliseconds each.

The end-to-end tests check the same rules through every protocol; these pin the rule itself,
in the one place every adapter calls.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_builders
import pytest
from fakes import (
    Echo,
    Failing,
    Sum,
    WrongOutput,
    python_model,
    request,
    rows,
    tensor,
)
from inprocess import Serve, Services

from servekit.errors import Internal, InvalidArgument, NotFound, Unavailable
from servekit.types import InferRequest, RequestedOutput, Tensor

pytestmark = pytest.mark.anyio


async def with_fakes(serve: Serve, yaml_text: str = "models: []\n") -> Services:
    services = await serve(yaml_text)
    await services.control.add(python_model("sum"), Sum())
    await services.control.add(python_model("echo"), Echo())
    return services


# -- metadata ------------------------------------------------------------------------------------
async def test_metadata_comes_from_the_model(serve: Serve) -> None:
    services = await with_fakes(serve)
    metadata = services.dataplane.model_metadata("sum").as_dict()
    assert metadata == {
        "name": "sum",
        "versions": ["1"],
        "platform": "python",
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "b", "datatype": "FP32", "shape": [-1, 4]},
        ],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 4]}],
    }
    assert services.dataplane.model_metadata("echo", "1").inputs[0].datatype == "BYTES"


async def test_declared_metadata_wins_over_hints(serve: Serve) -> None:
    services = await serve()
    declared = python_model(
        "declared", inputs=[{"name": "a", "shape": [2, 4]}], outputs=[{"name": "output"}]
    )
    await services.control.add(declared, Sum())
    inputs = services.dataplane.model_metadata("declared").inputs
    assert [(s.name, s.datatype, s.shape) for s in inputs] == [("a", "FP32", (2, 4))]


async def test_metadata_of_unknown_models_and_versions(serve: Serve) -> None:
    services = await with_fakes(serve)
    with pytest.raises(NotFound, match="Request for unknown model: 'nope' is not found"):
        services.dataplane.model_metadata("nope")
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'sum' version 2 is not found"):
        services.dataplane.model_metadata("sum", "2")
    with pytest.raises(
        InvalidArgument,
        match=r"^failed to get model version from specified version string 'latest'.*has version 1",
    ):
        services.dataplane.model_metadata("sum", "latest")
    with pytest.raises(NotFound):
        services.dataplane.model_ready("nope")
    with pytest.raises(NotFound):
        services.dataplane.model_ready("sum", "2")
    assert services.dataplane.model_ready("sum") and services.dataplane.model_ready("sum", "1")


async def test_server_metadata_names_the_server(serve: Serve) -> None:
    services = await serve("server: {name: unit}\nmodels: []\n")
    metadata = services.dataplane.server_metadata().as_dict()
    assert metadata["name"] == "unit"
    assert "binary_tensor_data" in metadata["extensions"]
    assert services.dataplane.live()


# -- inference ------------------------------------------------------------------------------
async def test_sum(serve: Serve) -> None:
    services = await with_fakes(serve)
    response = await services.dataplane.infer(request("sum", a=rows(1, 2), b=rows(10, 20)))
    assert (response.model_name, response.model_version) == ("sum", "1")
    (output,) = response.outputs
    assert (output.name, output.datatype, output.shape) == ("output", "FP32", (2, 4))
    np.testing.assert_array_equal(output.data, rows(11, 22))


async def test_echo_bytes_and_request_id(serve: Serve) -> None:
    services = await with_fakes(serve)
    words = [b"", b"caf\xc3\xa9", b"\x00\xff"]
    answer = request("echo", tensor("text", words, "BYTES"))
    answer.id = "req-7"
    response = await services.dataplane.infer(answer)
    assert response.id == "req-7"
    assert response.outputs[0].datatype == "BYTES"
    assert list(response.outputs[0].data) == words


async def test_requested_outputs(serve: Serve) -> None:
    services = await with_fakes(serve)
    asked = request("sum", a=rows(1), b=rows(1), outputs=["output"])
    assert [o.name for o in (await services.dataplane.infer(asked)).outputs] == ["output"]
    unknown = request("sum", a=rows(1), b=rows(1), outputs=["nope"])
    with pytest.raises(InvalidArgument, match="has no output 'nope'; its outputs are output"):
        await services.dataplane.infer(unknown)
    classify = request("sum", a=rows(1), b=rows(1))
    classify.outputs = [RequestedOutput("output", {"classification": 2})]
    (top,) = (await services.dataplane.infer(classify)).outputs  # tests/test_classification.py
    assert (top.datatype, top.shape, list(top.data)) == (
        "BYTES",
        (2,),
        [b"2.000000:0", b"2.000000:1"],
    )
    classify.outputs = [RequestedOutput("output", {"classification": 0})]
    with pytest.raises(InvalidArgument, match="'classification' must be a positive integer"):
        await services.dataplane.infer(classify)


async def test_model_errors_are_clean(serve: Serve) -> None:
    services = await serve()
    await services.control.add(python_model("failing"), Failing())
    with pytest.raises(Internal, match=r"the model raised ValueError: the model is broken"):
        await services.dataplane.infer(request("failing", x=[1.0]))
    # A ServeError the model raises on purpose keeps its own code and words.
    with pytest.raises(InvalidArgument, match="negative numbers are refused"):
        await services.dataplane.infer(request("failing", x=[-1.0]))


@pytest.mark.parametrize(
    ("mode", "message"),
    [("missing", "did not return output 'output'"), ("garbage", "not convertible to FP32")],
)
async def test_wrong_outputs_are_internal_errors(serve: Serve, mode: str, message: str) -> None:
    services = await serve()
    await services.control.add(
        python_model("wrong", outputs=[{"name": "output", "datatype": "FP32"}]), WrongOutput(mode)
    )
    with pytest.raises(Internal, match=message):
        await services.dataplane.infer(request("wrong", x=[1.0]))


# -- validation -----------------------------------------------------------------------------
def _sum_with(*inputs: Tensor) -> InferRequest:
    return request("sum", *inputs)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([tensor("a", rows(1))], r"needs input\(s\) b"),
        ([tensor("a", rows(1)), tensor("c", rows(1))], "has no input 'c'; its inputs are a, b"),
        ([tensor("a", rows(1)), tensor("a", rows(1))], "input 'a' is given twice"),
        (
            [tensor("a", rows(1)), tensor("b", [[1, 2, 3, 4]], "BYTES")],
            "input 'b' must be FP32, got BYTES",
        ),
        (
            [tensor("a", rows(1)), tensor("b", np.ones((1, 3)))],
            r"input 'b': shape \[1, 3\] does not match the model's \[-1, 4\]",
        ),
        ([tensor("a", rows(1)), tensor("b", np.ones(4))], r"shape \[4\] does not match"),
        ([tensor("a", rows(1)), tensor("b", np.ones((1, 1, 4)))], r"shape \[1, 1, 4\]"),
    ],
    ids=["missing", "unknown", "twice", "datatype", "dimension", "rank-low", "rank-high"],
)
async def test_inputs_are_checked_against_the_metadata(
    serve: Serve, inputs: list[Tensor], message: str
) -> None:
    services = await with_fakes(serve)
    with pytest.raises(InvalidArgument, match=message):
        await services.dataplane.infer(_sum_with(*inputs))


@pytest.mark.parametrize("shape", [(1, 2**62), (2**40, 3), (1,) * 64])
async def test_absurd_shapes_are_refused_before_the_model(
    serve: Serve, shape: tuple[int, ...]
) -> None:
    """A shape that cannot match is refused on its dimensions alone (no data is looked at)."""
    services = await with_fakes(serve)
    absurd = Tensor("b", "FP32", shape, np.zeros(0, np.float32))
    with pytest.raises(InvalidArgument, match="does not match the model's"):
        await services.dataplane.infer(_sum_with(tensor("a", rows(1)), absurd))


async def test_empty_batch_is_a_valid_request(serve: Serve) -> None:
    services = await with_fakes(serve)
    empty = np.zeros((0, 4), np.float32)
    response = await services.dataplane.infer(request("sum", a=empty, b=empty))
    assert response.outputs[0].shape == (0, 4)


async def test_max_batch_size_bounds_the_first_dimension(serve: Serve) -> None:
    services = await serve()
    await services.control.add(python_model("sum", maxBatchSize=2), Sum())
    await services.dataplane.infer(request("sum", a=rows(1, 2), b=rows(1, 2)))
    with pytest.raises(InvalidArgument, match="batch of 3 exceeds maxBatchSize 2"):
        await services.dataplane.infer(request("sum", a=rows(1, 2, 3), b=rows(1, 2, 3)))


async def test_unknown_model(serve: Serve) -> None:
    services = await with_fakes(serve)
    with pytest.raises(NotFound, match="Request for unknown model: 'nope' is not found"):
        await services.dataplane.infer(request("nope", a=rows(1)))


# -- versions -------------------------------------------------------------------------------
def write_versions(folder: Path, versions: tuple[int, ...] = (1, 2, 3)) -> None:
    """mlp versions (different weights each) under ``folder``/models/mlp/<n>/model.onnx."""
    for version in versions:
        path = folder / "models" / "mlp" / str(version) / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(onnx_builders.mlp(seed=version), str(path))


def mlp_yaml(policy: str = "", extra: str = "") -> str:
    return (
        "models:\n  - {name: mlp, modelFormat: {name: onnx}, storageUri: models/mlp"
        + (f", versionPolicy: {policy}" if policy else "")
        + extra
        + "}\n"
    )


X = np.ones((1, 16), np.float32)


async def served_version(services: Services, version: str | None = None) -> str:
    response = await services.dataplane.infer(request("mlp", input=X, version=version))
    return response.model_version


@pytest.mark.parametrize(
    ("policy", "versions"),
    [
        ("", ["3"]),
        ("{latest: {numVersions: 2}}", ["2", "3"]),
        ("{all: {}}", ["1", "2", "3"]),
        ("{specific: {versions: [1, 3]}}", ["1", "3"]),
    ],
    ids=["default-latest", "latest-2", "all", "specific"],
)
async def test_version_policies(
    serve: Serve, tmp_path: Path, policy: str, versions: list[str]
) -> None:
    write_versions(tmp_path)
    services = await serve(mlp_yaml(policy))
    assert list(services.dataplane.model_metadata("mlp").versions) == versions
    assert await served_version(services) == versions[-1]  # no version: the highest ready
    for version in versions:
        assert await served_version(services, version) == version
    for version in sorted({"1", "2", "3"} - set(versions)):
        with pytest.raises(NotFound, match=f"unknown model: 'mlp' version {version} is not found"):
            await served_version(services, version)
        with pytest.raises(NotFound):
            services.dataplane.model_ready("mlp", version)


async def test_versions_give_different_answers(serve: Serve, tmp_path: Path) -> None:
    write_versions(tmp_path)
    services = await serve(mlp_yaml("{all: {}}"))
    answers = [
        (await services.dataplane.infer(request("mlp", input=X, version=v))).outputs[0].data
        for v in ("1", "2")
    ]
    assert not np.array_equal(*answers)


async def test_default_version(serve: Serve, tmp_path: Path) -> None:
    write_versions(tmp_path)
    services = await serve(mlp_yaml("{all: {}}", ", defaultVersion: 1"))
    assert await served_version(services) == "1"
    assert await served_version(services, "") == "1"
    assert await served_version(services, "3") == "3"


async def test_a_missing_specific_version_is_unavailable(serve: Serve, tmp_path: Path) -> None:
    write_versions(tmp_path, (1,))
    services = await serve(
        "server: {strictReadiness: false}\n" + mlp_yaml("{specific: {versions: [1, 4]}}")
    )
    assert services.states() == {("mlp", "1"): "READY", ("mlp", "4"): "UNAVAILABLE"}
    assert "version 4 has no folder" in services.reason("mlp")
    with pytest.raises(Unavailable, match="version 4 is unavailable"):
        await served_version(services, "4")
    assert services.dataplane.model_ready("mlp")
    assert not services.dataplane.model_ready("mlp", "4")
    assert await served_version(services) == "1"


# -- statistics -----------------------------------------------------------------------------
async def test_statistics_count_successes_and_failures(serve: Serve) -> None:
    services = await with_fakes(serve)
    await services.control.add(python_model("failing"), Failing())
    assert services.statistics("sum")["inference_count"] == 0
    for _ in range(3):
        await services.dataplane.infer(request("sum", a=rows(1, 2), b=rows(1, 2)))
    with pytest.raises(InvalidArgument):  # refused by validation: a failure of this version
        await services.dataplane.infer(request("sum", a=rows(1)))
    with pytest.raises(NotFound):  # no such model: nobody's statistics
        await services.dataplane.infer(request("nope", a=rows(1)))
    with pytest.raises(Internal):
        await services.dataplane.infer(request("failing", x=[1.0]))
    stats = services.statistics("sum")
    assert (stats["name"], stats["version"]) == ("sum", "1")
    assert stats["inference_count"] == 3 and stats["execution_count"] == 3
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 3 and inference["fail"]["count"] == 1
    assert inference["compute_infer"]["count"] == 3
    assert stats["last_inference"] > 0
    failing = services.statistics("failing")["inference_stats"]
    assert (failing["success"]["count"], failing["fail"]["count"]) == (0, 1)
    assert services.statistics("echo")["inference_count"] == 0


async def test_statistics_count_rows_with_batching(serve: Serve) -> None:
    services = await serve()
    await services.control.add(python_model("sum", maxBatchSize=8), Sum())
    await services.dataplane.infer(request("sum", a=rows(1, 2, 3), b=rows(1, 2, 3)))
    stats = services.statistics("sum")
    assert (stats["inference_count"], stats["execution_count"]) == (3, 1)
    assert [b["batch_size"] for b in stats["batch_stats"]] == [3]
