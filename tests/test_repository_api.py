"""Model repository extension over both transports, driven by tritonclient against a real server.

One ``servekit serve`` subprocess (its own store in a temporary folder) serves the module; each
test is written once and runs over tritonclient.http and tritonclient.grpc. Models that a test
changes are pushed under names of that test, so the tests stay independent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx_builders
import pytest
from repo_helpers import Repo, onnx_bytes, unloadable_onnx, write_store
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_store(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[ServerProcess]:
    process = start_server(store, grpc=True)
    yield process
    assert process.stop() == 0, process.log()


def add_sub_inputs() -> dict[str, np.ndarray]:  # type: ignore[type-arg]
    return {
        "INPUT0": RNG.standard_normal((2, 16)).astype(np.float32),
        "INPUT1": RNG.standard_normal((2, 16)).astype(np.float32),
    }


def test_server_announces_the_extension(server: ServerProcess, repo: Repo) -> None:
    if repo.transport == "http":
        extensions = repo.raw.get_server_metadata()["extensions"]
    else:
        extensions = repo.raw.get_server_metadata(as_json=True)["extensions"]
    assert "model_repository" in extensions
    assert "model_repository(unload_dependents)" in extensions


def test_index_lists_every_model_with_state_and_reason(repo: Repo) -> None:
    states = repo.states()
    assert states[("mlp", "1")] == "READY" and states[("mlp", "2")] == "READY"
    assert states[("add_sub", "1")] == "READY"
    assert states[("slow", "1")] == "READY"
    broken = repo.row("broken")
    assert broken["state"] == "UNAVAILABLE"
    assert "not a valid ONNX model" in broken["reason"]
    ready = repo.index(ready=True)
    assert ready and all(r["state"] == "READY" for r in ready)
    assert "broken" not in {r["name"] for r in ready}


def test_broken_model_beside_good_ones(repo: Repo) -> None:
    message = repo.expect_error("INVALID_ARGUMENT", repo.load, "broken")
    assert "broken" in message and "not a valid ONNX model" in message
    assert not repo.ready("broken")
    out = repo.infer("add_sub", inputs := add_sub_inputs())
    np.testing.assert_allclose(out["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"], rtol=1e-6)
    assert repo.ready("mlp")


def test_unload_then_load(repo: Repo, store: Path) -> None:
    """Unloading a pushed model deletes its files and it leaves the index (as Triton forgets a
    model loaded from file overrides); pushing it again brings it back."""
    name = f"cycle_{repo.transport}"
    files = {"file:1/model.onnx": onnx_bytes(onnx_builders.add_sub())}
    repo.load(name, {"backend": "onnxruntime"}, files)
    assert repo.ready(name)
    assert (store.parent / ".servekit" / "storage" / name).is_dir()
    repo.unload(name)
    assert not repo.ready(name)
    assert name not in {r["name"] for r in repo.index()}
    assert not (store.parent / ".servekit" / "storage" / name).exists()
    message = repo.expect_error("NOT_FOUND", repo.infer, name, add_sub_inputs())
    assert name in message
    assert "push it" in repo.expect_error("NOT_FOUND", repo.load, name)
    repo.load(name, {"backend": "onnxruntime"}, files)
    assert repo.ready(name)
    repo.unload(name, dependents=True)  # the optional unload_dependents parameter is accepted
    assert not repo.ready(name)


def test_unload_and_reload_of_a_serve_yaml_model(repo: Repo) -> None:
    repo.unload("mlp")
    assert {r["state"] for r in repo.index() if r["name"] == "mlp"} == {"UNAVAILABLE"}
    repo.load("mlp")
    assert repo.ready("mlp")
    assert repo.states()[("mlp", "2")] == "READY"


def test_unknown_model_and_bad_names(repo: Repo) -> None:
    assert "nothing_here" in repo.expect_error("NOT_FOUND", repo.load, "nothing_here")
    assert "nothing_here" in repo.expect_error("NOT_FOUND", repo.unload, "nothing_here")
    for name in ("a b", "-x", "x" * 200):
        assert "invalid model name" in repo.expect_error("INVALID_ARGUMENT", repo.load, name)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"backend": "onnxruntime"}, id="triton-minimal"),
        pytest.param(
            {
                "name": "{name}",
                "platform": "onnxruntime_onnx",
                "max_batch_size": 8,
                "input": [
                    {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                    {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": ["16"]},
                ],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
                "version_policy": {"latest": {"num_versions": 1}},
                "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
            },
            id="triton-full",
        ),
        pytest.param(
            {
                "name": "{name}",
                "backend": "onnxruntime",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
            },
            id="seed-example",
        ),
        pytest.param({"modelFormat": {"name": "onnx"}, "maxBatchSize": 4}, id="servekit-entry"),
    ],
)
def test_load_with_config_and_files(
    repo: Repo, config: dict[str, object], request: pytest.FixtureRequest
) -> None:
    name = f"pushed_{repo.transport}_{request.node.callspec.id.split('-')[-1]}".replace("-", "_")
    text = json.dumps(config).replace("{name}", name)
    repo.load(name, text, {"file:1/model.onnx": onnx_bytes(onnx_builders.add_sub())})
    assert repo.ready(name)
    inputs = add_sub_inputs()
    out = repo.infer(name, inputs)
    np.testing.assert_allclose(out["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"], rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"], rtol=1e-6)
    assert repo.metadata(name)["platform"] == "onnxruntime_onnx"


def test_push_two_versions_then_replace_and_failed_reload_keeps_serving(
    repo: Repo, store: Path
) -> None:
    name = f"versions_{repo.transport}"
    config = {"modelFormat": {"name": "onnx"}, "versionPolicy": {"all": {}}}
    files = {
        "file:1/model.onnx": onnx_bytes(onnx_builders.mlp(seed=1)),
        "file:2/model.onnx": onnx_bytes(onnx_builders.mlp(seed=2)),
    }
    repo.load(name, config, files)
    assert repo.states()[(name, "1")] == "READY" and repo.states()[(name, "2")] == "READY"
    x = RNG.standard_normal((1, 16)).astype(np.float32)
    first = repo.infer(name, {"input": x})["output"]

    # Loading a loaded model reloads it: new files replace the old ones.
    repo.load(
        name,
        {"backend": "onnxruntime"},
        {"file:1/model.onnx": onnx_bytes(onnx_builders.mlp(seed=5))},
    )
    replaced = repo.infer(name, {"input": x})["output"]
    assert not np.allclose(first, replaced)
    assert (name, "2") not in repo.states()
    pushes = list((store.parent / ".servekit" / "storage" / name).iterdir())
    assert len(pushes) == 1, "the replaced push folder is deleted"

    # A file that is not ONNX is refused before anything is written or reloaded.
    message = repo.expect_error(
        "INVALID_ARGUMENT",
        repo.load,
        name,
        {"backend": "onnxruntime"},
        {"file:1/model.onnx": b"garbage" * 50},
    )
    assert "not a valid ONNX model" in message
    assert repo.row(name)["reason"] == ""
    assert len(list((store.parent / ".servekit" / "storage" / name).iterdir())) == 1

    # A failed reload reports why and keeps the previous load serving.
    message = repo.expect_error(
        "INVALID_ARGUMENT",
        repo.load,
        name,
        {"backend": "onnxruntime"},
        {"file:1/model.onnx": unloadable_onnx()},
    )
    assert "failed to load" in message and "NoSuchOperator" in message
    assert repo.ready(name)
    np.testing.assert_allclose(repo.infer(name, {"input": x})["output"], replaced)
    row = repo.row(name)
    assert row["state"] == "READY" and "reload failed" in row["reason"]
    assert len(list((store.parent / ".servekit" / "storage" / name).iterdir())) == 1


def test_round_trip_of_triton_model_config(repo: Repo) -> None:
    """get_model_config -> edit -> load_model(config=...), as a Triton user would do."""
    name = f"roundtrip_{repo.transport}"
    repo.load(
        name, {"backend": "onnxruntime"}, {"file:1/model.onnx": onnx_bytes(onnx_builders.add_sub())}
    )
    if repo.transport == "http":
        config = repo.raw.get_model_config(name)
    else:
        config = repo.raw.get_model_config(name, as_json=True)["config"]
    config["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
    repo.load(name, json.dumps(config))
    assert repo.ready(name)
    inputs = add_sub_inputs()
    np.testing.assert_allclose(
        repo.infer(name, inputs)["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"]
    )


def test_push_of_a_broken_new_model_stays_beside_the_good_ones(repo: Repo, store: Path) -> None:
    name = f"unloadable_{repo.transport}"
    message = repo.expect_error(
        "INVALID_ARGUMENT",
        repo.load,
        name,
        {"backend": "onnxruntime"},
        {"file:1/model.onnx": unloadable_onnx()},
    )
    assert name in message
    assert repo.row(name)["state"] == "UNAVAILABLE"
    assert repo.ready("add_sub") and repo.ready("mlp")
    assert not (store.parent / ".servekit" / "storage" / name).exists()
    repo.unload(name)  # it never had files to keep: it leaves the index
    assert name not in {r["name"] for r in repo.index()}


def test_push_of_a_file_that_is_not_onnx_writes_nothing(repo: Repo, store: Path) -> None:
    name = f"garbage_{repo.transport}"
    message = repo.expect_error(
        "INVALID_ARGUMENT",
        repo.load,
        name,
        {"backend": "onnxruntime"},
        {"file:1/model.onnx": b"\x00" * 100},
    )
    assert "file:1/model.onnx is not a valid ONNX model" in message
    assert name not in {r["name"] for r in repo.index()}
    assert not (store.parent / ".servekit" / "storage" / name).exists()
    assert repo.ready("add_sub") and repo.ready("mlp")


@pytest.mark.parametrize(
    ("config", "files", "fragment"),
    [
        ("{not json", None, "not valid JSON"),
        ("[1, 2]", None, "JSON object"),
        ("[" * 100_000, None, "nested too deeply"),
        ({"name": "other", "backend": "onnxruntime"}, None, "names model 'other'"),
        ({"platform": "tensorrt_plan"}, {"file:1/model.plan": b"x"}, "no runtime"),
        (None, {"file:1/model.onnx": b"x"}, "config parameter"),
        ({"modelFormat": {"name": "onnx"}, "storageUri": "/etc"}, None, "storageUri"),
        ({"modelFormat": {"name": "onnx"}, "storageUri": "../../"}, None, "storageUri"),
        ({"modelFormat": {"name": "onnx"}, "storageUri": "serve.yaml"}, None, "storageUri"),
        ({"modelFormat": {"name": "onnx"}, "storageUri": ".servekit"}, None, "storageUri"),
        ({"max_batch_size": "many", "backend": "onnxruntime"}, None, "integer"),
        ({"max_batch_size": 2**70, "backend": "onnxruntime"}, None, "beyond int64"),
        ({"modelFormat": {"name": "onnx"}, "maxBatchSize": 2**70}, None, "maxBatchSize"),
        ({"modelFormat": {"name": "onnx"}, "instances": 0}, None, "instances"),
        (  # a pushed config cannot make requests wait on a batch for long (1 s at most)
            {
                "backend": "onnxruntime",
                "max_batch_size": 4,
                "dynamic_batching": {"max_queue_delay_microseconds": "86400000000"},
            },
            None,
            "maxQueueDelayMicroseconds 86400000000 is over 1000000 (1 s)",
        ),
        (
            {
                "backend": "onnxruntime",
                "max_batch_size": 4,
                "dynamic_batching": {"default_queue_policy": {"timeout_action": "DELAY"}},
            },
            None,
            "timeout_action 'DELAY' is not offered",
        ),
    ],
)
def test_bad_load_requests_are_refused(
    repo: Repo, config: object, files: dict[str, bytes] | None, fragment: str
) -> None:
    message = repo.expect_error("INVALID_ARGUMENT", repo.load, "add_sub", config, files)
    assert fragment in message
    assert repo.ready("add_sub")


@pytest.mark.parametrize(
    ("config", "files", "fragment"),
    [
        ({"backend": "python"}, {"file:1/model.py": b"import os"}, "Python model"),
        ({"modelFormat": {"name": "python"}, "entrypoint": "os:system"}, None, "entrypoint"),
        ({"modelFormat": {"name": "python"}, "entrypoint": "slow_model:predict"}, None, "Python"),
        (
            {"modelFormat": {"name": "onnx"}, "runtimeOptions": {"executionProviders": ["Azure"]}},
            None,
            "executionProviders",
        ),
    ],
)
def test_loads_that_would_choose_code_are_denied(
    repo: Repo, config: object, files: dict[str, bytes] | None, fragment: str
) -> None:
    message = repo.expect_error("PERMISSION_DENIED", repo.load, "add_sub", config, files)
    assert fragment in message
    assert repo.ready("add_sub")


def test_size_limit(repo: Repo, store: Path) -> None:
    """maxRequestBytes (3 MB here) bounds pushed files: 413 over HTTP, RESOURCE_EXHAUSTED."""
    big = {"file:1/model.onnx": b"\x00" * 3_500_000}
    message = repo.expect_error(
        "RESOURCE_EXHAUSTED", repo.load, "big", {"backend": "onnxruntime"}, big
    )
    assert message
    assert not (store.parent / ".servekit" / "storage" / "big").exists()
