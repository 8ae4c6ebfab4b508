"""Each rule that keeps the repository API from becoming a way into the server, over both
transports (tritonclient.http and tritonclient.grpc) against a real server.

* A load request cannot change what reaches a Python model's code (entrypoint, parameters,
  runtime, runtimeOptions, storageUri) nor make any model a Python model; repeating the declared
  values (a ``GET /v2/models/{m}/config`` round trip) and changing instances still work.
* Pushed files are an ONNX model and the external data it references, nothing else.
* External data must lie in the model's own folder, for serve.yaml models too: otherwise the
  version is UNAVAILABLE with the reason and the outside file is never read.
* No answer names an absolute server path.
* Pushed configs are bounded by ``server.limits`` and by the integer ranges of Triton's config.
* Unloading a pushed model deletes its files.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx_builders
import pytest
from repo_helpers import (
    EXTERNAL_W,
    Repo,
    external_data_model,
    onnx_bytes,
    snapshot,
    unloadable_onnx,
)
from servers import ServerProcess, start_server
from tritonclient.utils import InferenceServerException
from waits import wait_until

from servekit.shown_paths import GENERATION

pytestmark = pytest.mark.slow

USER_MODULE = """
import pickle

import numpy as np
from numpy.typing import NDArray


class Offset:
    def load(self, path="weights.pkl"):
        with open(path, "rb") as fh:
            self.offset = pickle.load(fh)["offset"]

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        return x + self.offset


def leaky(x: NDArray[np.float32]) -> NDArray[np.float32]:
    raise FileNotFoundError(2, "No such file or directory", "/srv/secret/weights/w.bin")
"""

LIMITS = "{maxInstances: 4, maxRuntimeThreads: 4, maxVersions: 3, maxPushedModels: 2}"
ADD_SUB = onnx_bytes(onnx_builders.add_sub())
ONNX = {"backend": "onnxruntime"}


def _external(folder: Path, location: str) -> None:
    """A version folder holding a model whose W lives at ``location``."""
    folder.mkdir(parents=True)
    model, _ = external_data_model(location)
    (folder / "model.onnx").write_bytes(model)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("rules")
    store = base / "store"
    models = store / "models"
    (models / "add_sub" / "1").mkdir(parents=True)
    (models / "add_sub" / "1" / "model.onnx").write_bytes(ADD_SUB)
    (store / "rules_models.py").write_text(USER_MODULE)
    (store / "weights.pkl").write_bytes(pickle.dumps({"offset": 3.0}))
    # The outside file holds valid weights: had onnxruntime read it, the model would be READY.
    outside = base / "outside"
    outside.mkdir()
    _, weights = external_data_model("w.bin")
    (outside / "w.bin").write_bytes(weights)
    _external(models / "ext_ok" / "1", "w.bin")
    (models / "ext_ok" / "1" / "w.bin").write_bytes(weights)
    _external(models / "ext_abs" / "1", str(outside / "w.bin"))
    _external(models / "ext_up" / "1", "../../../../outside/w.bin")
    _external(models / "ext_link" / "1", "w.bin")
    (models / "ext_link" / "1" / "w.bin").symlink_to(outside / "w.bin")
    _external(models / "ext_mem" / "1", "*/_ORT_MEM_ADDR_/*")
    onnx = "modelFormat: {name: onnx}"
    (store / "serve.yaml").write_text(
        f"server: {{modelControl: explicit, strictReadiness: false, limits: {LIMITS}}}\n"
        "runtimes:\n"
        "  - {name: python_too, implementation: python, supportedModelFormats: [{name: python}]}\n"
        "models:\n"
        "  - {name: offset, modelFormat: {name: python}, entrypoint: 'rules_models:Offset',"
        " parameters: {path: weights.pkl}, inputs: [{name: x, datatype: FP32, shape: [-1]}],"
        " outputs: [{name: output, datatype: FP32, shape: [-1]}]}\n"
        "  - {name: leaky, modelFormat: {name: python}, entrypoint: 'rules_models:leaky'}\n"
        f"  - {{name: add_sub, {onnx}, storageUri: models/add_sub, instances: 6}}\n"
        + "".join(
            f"  - {{name: {n}, {onnx}, storageUri: models/{n}}}\n"
            for n in ("ext_ok", "ext_abs", "ext_up", "ext_link", "ext_mem")
        )
    )
    return base


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    process = start_server(root / "store" / "serve.yaml", grpc=True)
    yield process
    assert process.stop() == 0, process.log()


def storage(root: Path) -> Path:
    return root / "store" / ".servekit" / "storage"


class Pushed:
    """Push a model for one test and always unload it after (its files go with it)."""

    def __init__(self, repo: Repo, name: str, config: Any, files: dict[str, bytes]) -> None:
        self.repo, self.name, self.config, self.files = repo, name, config, files

    def __enter__(self) -> str:
        self.repo.load(self.name, self.config, self.files)
        return self.name

    def __exit__(self, *_: object) -> None:
        self.repo.unload(self.name)


def offset_of(repo: Repo) -> list[float]:
    return list(repo.infer("offset", {"x": np.array([1.0], np.float32)})["output"].tolist())


# -- 1. what reaches a Python model's code comes from serve.yaml only ------------------------------
@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"modelFormat": {"name": "python"}, "parameters": {"path": "other.pkl"}}, "parameters"),
        ({"modelFormat": {"name": "python"}, "parameters": {}}, "parameters"),
        ({"parameters": {"path": {"string_value": "other.pkl"}}}, "parameters"),
        ({"backend": "python", "parameters": {"extra": {"string_value": "1"}}}, "parameters"),
        # an MLServer custom runtime's class and settings (app/servekit/runtimes/mlserver_model.py)
        (
            {
                "modelFormat": {"name": "python"},
                "parameters": {"mlserver": {"implementation": "os.system"}},
            },
            "parameters",
        ),
        ({"modelFormat": {"name": "python"}, "entrypoint": "rules_models:leaky"}, "entrypoint"),
        # servekit's own importer: the PyTorch converter
        (
            {
                "modelFormat": {"name": "python"},
                "entrypoint": "servekit.formats.torch_onnx:to_onnx",
            },
            "entrypoint",
        ),
        ({"modelFormat": {"name": "python"}, "runtime": "python_too"}, "runtime"),
        (
            {"modelFormat": {"name": "python"}, "runtimeOptions": {"intraOpThreads": 2}},
            "runtimeOptions",
        ),
        ({"modelFormat": {"name": "python"}, "storageUri": "models"}, "storageUri"),
        # What holds the code in a process of its own, and its bounds (the isolated child's
        # entrypoint and import path come from serve.yaml only).
        ({"modelFormat": {"name": "python"}, "isolation": "process"}, "isolation"),
        (
            {"modelFormat": {"name": "python"}, "isolation": "process", "timeoutSeconds": 5},
            "timeoutSeconds",
        ),
        (
            {
                "modelFormat": {"name": "python"},
                "isolation": "process",
                "memoryLimitBytes": 1 << 30,
            },
            "memoryLimitBytes",
        ),
    ],
)
def test_a_python_models_code_fields_cannot_change(repo: Repo, config: Any, field: str) -> None:
    message = repo.expect_error("PERMISSION_DENIED", repo.load, "offset", config)
    assert field in message and "only serve.yaml" in message
    assert offset_of(repo) == [4.0]


def test_no_load_request_makes_a_python_model(repo: Repo) -> None:
    same_code = {"modelFormat": {"name": "python"}, "entrypoint": "rules_models:Offset"}
    for name in (f"twin_{repo.transport}", "add_sub", "ext_ok"):
        message = repo.expect_error("PERMISSION_DENIED", repo.load, name, same_code)
        assert "Python model" in message
    files = {"file:1/model.py": b"import os"}
    message = repo.expect_error(
        "PERMISSION_DENIED", repo.load, "offset", {"backend": "python"}, files
    )
    assert "storageUri" in message or "pushed" in message
    assert repo.ready("add_sub")


def test_no_load_request_brings_torch_into_the_server(repo: Repo, server: ServerProcess) -> None:
    """The PyTorch path converts in the notebook's process (app/servekit/formats/torch_onnx.py): a
    load
    request naming a PyTorch model, as a Triton config or with a TorchScript file, is refused,
    and the server process never maps torch's libraries."""
    for config in (
        {"modelFormat": {"name": "pytorch"}},
        {"backend": "pytorch", "platform": "pytorch_libtorch"},
    ):
        with pytest.raises(InferenceServerException):
            repo.load(f"net_{repo.transport}", config, {"file:1/model.pt": pickle.dumps([1])})
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "libtorch" not in maps and "/torch/" not in maps


def test_a_python_model_may_repeat_its_config_and_change_instances(repo: Repo) -> None:
    """The Triton round trip: read the config (parameters come back as strings), change the
    instance count, send it back; the serve.yaml parameters stay in force."""
    if repo.transport == "http":
        config = repo.raw.get_model_config("offset")
    else:
        config = repo.raw.get_model_config("offset", as_json=True)["config"]
    assert config["parameters"] == {"path": {"string_value": "weights.pkl"}}
    config["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
    repo.load("offset", json.dumps(config))
    assert offset_of(repo) == [4.0]
    repo.load("offset", {"modelFormat": {"name": "python"}, "instances": 1})
    assert offset_of(repo) == [4.0]


def test_execution_providers_are_chosen_in_serve_yaml(repo: Repo) -> None:
    config = {"modelFormat": {"name": "onnx"}, "runtimeOptions": {"executionProviders": []}}
    for providers in (["AzureExecutionProvider"], ["CPUExecutionProvider", "Other"]):
        config["runtimeOptions"] = {"executionProviders": providers}
        message = repo.expect_error("PERMISSION_DENIED", repo.load, "ext_ok", config)
        assert "executionProviders" in message
    config["runtimeOptions"] = {"executionProviders": ["CPUExecutionProvider"]}
    repo.load("ext_ok", config)
    assert repo.ready("ext_ok")


# -- 2. pushed files: the ONNX model and the external data it references ---------------------------
def test_a_pushed_model_with_its_external_data_serves(repo: Repo, root: Path) -> None:
    model, weights = external_data_model("weights/w.bin")
    files = {"file:1/model.onnx": model, "file:1/weights/w.bin": weights}
    with Pushed(repo, f"ext_push_{repo.transport}", ONNX, files) as name:
        x = np.array([[1, 2, 3, 4]], np.float32)
        np.testing.assert_allclose(repo.infer(name, {"x": x})["y"], x @ EXTERNAL_W)
        assert len(list(storage(root).glob(f"{name}/*/1/weights/w.bin"))) == 1


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ({"file:1/model.onnx": ADD_SUB, "file:1/notes.txt": b"hi"}, "not part of the model"),
        ({"file:1/model.onnx": ADD_SUB, "file:1/x.pkl": b"\x80\x04."}, "not part of the model"),
        ({"file:1/model.onnx": ADD_SUB, "file:1/extra.onnx": ADD_SUB}, "exactly one .onnx"),
        ({"file:1/sub/model.onnx": ADD_SUB}, "exactly one .onnx"),
        ({"file:1/weights.bin": b"0" * 64}, "exactly one .onnx"),
        ({"file:1/model.onnx": b"\x80\x04\x95 not onnx"}, "not a valid ONNX model"),
        (
            {
                "file:1/model.onnx": external_data_model("w.bin")[0],
                "file:1/w.bin": external_data_model("w.bin")[1],
                "file:1/unused.bin": b"0" * 64,
            },
            "file:1/unused.bin is not part of the model",
        ),
        ({"file:1/model.onnx": external_data_model("w.bin")[0]}, "was not pushed"),
        ({"file:1/model.onnx": external_data_model("/etc/passwd")[0]}, "absolute path"),
        ({"file:1/model.onnx": external_data_model("../w.bin")[0]}, "'..'"),
        ({"file:1/model.onnx": external_data_model("*/_ORT_MEM_ADDR_/*")[0]}, "in-memory"),
    ],
    ids=range(11),
)
def test_pushed_files_beyond_the_model_are_refused(
    repo: Repo, root: Path, files: dict[str, bytes], fragment: str
) -> None:
    before = snapshot(root)
    message = repo.expect_error("INVALID_ARGUMENT", repo.load, f"p_{repo.transport}", ONNX, files)
    assert fragment in message
    assert snapshot(root) == before, "a refused push wrote something"
    assert f"p_{repo.transport}" not in {r["name"] for r in repo.index()}


# -- 3. external data stays in the model's own folder (serve.yaml models too) ---------------------
def test_external_data_in_the_models_folder_loads(repo: Repo) -> None:
    x = np.array([[1, 0, 0, 0]], np.float32)
    np.testing.assert_allclose(repo.infer("ext_ok", {"x": x})["y"], x @ EXTERNAL_W)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("ext_abs", "is an absolute path"),
        ("ext_up", "leaves the model's folder"),
        ("ext_link", "leads outside the model's folder through a link"),
        ("ext_mem", "in-memory marker"),
    ],
)
def test_external_data_outside_the_folder_is_unavailable(
    repo: Repo, root: Path, name: str, fragment: str
) -> None:
    row = repo.row(name)
    assert row["state"] == "UNAVAILABLE" and fragment in row["reason"], row
    assert str(root) not in row["reason"]
    message = repo.expect_error("INVALID_ARGUMENT", repo.load, name)  # a reload says the same
    assert fragment in message and str(root) not in message
    message = repo.expect_error("UNAVAILABLE", repo.infer, name, {"x": np.ones((1, 4), np.float32)})
    assert fragment in message


def test_a_pushed_config_cannot_point_at_outside_data(repo: Repo) -> None:
    """A config without files may name a folder under serve.yaml's: the same check applies."""
    name = f"borrow_{repo.transport}"
    config = {"modelFormat": {"name": "onnx"}, "storageUri": "models/ext_up"}
    message = repo.expect_error("INVALID_ARGUMENT", repo.load, name, config)
    assert "leaves the model's folder" in message
    repo.unload(name)
    config["storageUri"] = "models/ext_ok"
    with Pushed(repo, name, config, {}):
        assert repo.ready(name)


# -- 4. no absolute server path in any answer ---------------------------------------------------
def _no_paths(text: str, root: Path) -> None:
    for form in {str(root), str(root.resolve())}:
        assert form not in text, text
    assert ".servekit/storage" not in text and not GENERATION.search(text), text


def test_no_answer_names_a_server_path(repo: Repo, server: ServerProcess, root: Path) -> None:
    texts: list[str] = []
    unloadable = {"file:1/model.onnx": unloadable_onnx()}
    texts.append(repo.expect_error("INVALID_ARGUMENT", repo.load, "u", ONNX, unloadable))
    texts.append(json.dumps(repo.index()))
    texts.append(repo.expect_error("UNAVAILABLE", repo.infer, "u", {"x": np.ones(1, np.float32)}))
    leak = repo.expect_error("INTERNAL", repo.infer, "leaky", {"x": np.ones(1, np.float32)})
    assert "FileNotFoundError" in leak and "…/w.bin" in leak and "Traceback" not in leak
    assert "/srv/secret" not in leak
    pushed = Pushed(repo, f"shown_{repo.transport}", ONNX, {"file:1/model.onnx": ADD_SUB})
    with pushed as name, httpx.Client(base_url=server.http_url) as http:
        detail = http.get(f"/dashboard/api/models/{name}").json()
        assert detail["storage_uri"] == "(pushed files)"
        assert "(pushed files)" in detail["serve_yaml_text"]
        assert http.get("/dashboard/api/models/ext_ok").json()["storage_uri"] == "models/ext_ok"
        for path in ("/dashboard/api/overview", "/dashboard/api/models", "/models/u"):
            texts.append(http.get(path).text)
        for model in ("u", "ext_abs", "ext_link", name):
            texts.append(http.get(f"/dashboard/api/models/{model}").text)
            texts.append(http.get(f"/models/{model}").text)
    repo.unload("u")
    for text in texts:
        _no_paths(text, root)


# -- 5. server.limits and integer ranges --------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({**ONNX, "instance_group": [{"count": 5}]}, "instances 5 exceeds server.limits.maxInst"),
        ({"modelFormat": {"name": "onnx"}, "instances": 1000}, "(4)"),
        (
            {"modelFormat": {"name": "onnx"}, "runtimeOptions": {"intraOpThreads": 5}},
            "runtimeOptions.intraOpThreads 5 exceeds server.limits.maxRuntimeThreads (4)",
        ),
        (
            {"modelFormat": {"name": "onnx"}, "runtimeOptions": {"interOpThreads": 99}},
            "maxRuntimeThreads",
        ),
        (
            {**ONNX, "version_policy": {"latest": {"num_versions": 4}}},
            "versionPolicy.latest.numVersions 4 exceeds server.limits.maxVersions (3)",
        ),
        (
            {**ONNX, "version_policy": {"specific": {"versions": [1, 2, 3, 4]}}},
            "versionPolicy.specific (4 versions) exceeds server.limits.maxVersions (3)",
        ),
        ({**ONNX, "max_batch_size": 2**70}, "beyond int64"),
        ({**ONNX, "max_batch_size": 2**40}, "max_batch_size"),
        ({**ONNX, "instance_group": [{"count": str(2**64)}]}, "beyond int64"),
        ({**ONNX, "input": [{"name": "INPUT0", "dims": [2**64]}]}, "beyond int64"),
    ],
)
def test_pushed_configs_are_bounded(repo: Repo, root: Path, config: Any, fragment: str) -> None:
    before = snapshot(root)
    files = {"file:1/model.onnx": ADD_SUB}
    message = repo.expect_error("INVALID_ARGUMENT", repo.load, "bounded", config, files)
    assert fragment in message
    assert snapshot(root) == before
    message = repo.expect_error("INVALID_ARGUMENT", repo.load, "add_sub", config)
    assert fragment in message


def test_pushing_too_many_version_folders_is_refused(repo: Repo) -> None:
    files = {f"file:{v}/model.onnx": ADD_SUB for v in range(1, 5)}
    config = {**ONNX, "version_policy": {"all": {}}}
    message = repo.expect_error("INVALID_ARGUMENT", repo.load, "many", config, files)
    assert "4 version folders" in message and "maxVersions (3)" in message


def test_values_the_model_already_has_pass_the_limits(repo: Repo) -> None:
    """add_sub has 6 instances in serve.yaml (beyond maxInstances: 4): its config round-trips."""
    if repo.transport == "http":
        config = repo.raw.get_model_config("add_sub")
    else:
        config = repo.raw.get_model_config("add_sub", as_json=True)["config"]
    assert config["instance_group"][0]["count"] == 6
    repo.load("add_sub", json.dumps(config))
    config["instance_group"][0]["count"] = 7
    message = repo.expect_error("INVALID_ARGUMENT", repo.load, "add_sub", json.dumps(config))
    assert "instances 7 exceeds server.limits.maxInstances (4)" in message
    assert repo.ready("add_sub")


def test_the_largest_batch_size_keeps_the_grpc_config_readable(repo: Repo) -> None:
    config = {**ONNX, "max_batch_size": 2**31 - 1}
    files = {"file:1/model.onnx": onnx_bytes(onnx_builders.mlp())}
    with Pushed(repo, f"wide_{repo.transport}", config, files) as name:
        if repo.transport == "http":
            assert repo.raw.get_model_config(name)["max_batch_size"] == 2**31 - 1
        else:
            answer = repo.raw.get_model_config(name, as_json=True)["config"]
            assert int(answer["max_batch_size"]) == 2**31 - 1


def test_pushed_models_and_bytes_are_bounded(repo: Repo, root: Path) -> None:
    """maxPushedModels: 2 here; the bytes limit is tried on a server of its own below."""
    a, b, c = (f"{n}_{repo.transport}" for n in ("first", "second", "third"))
    files = {"file:1/model.onnx": ADD_SUB}
    with Pushed(repo, a, ONNX, files), Pushed(repo, b, ONNX, files):
        before = snapshot(root)
        message = repo.expect_error("RESOURCE_EXHAUSTED", repo.load, c, ONNX, files)
        assert "server.limits.maxPushedModels is 2" in message
        assert snapshot(root) == before
        repo.load(a, ONNX, files)  # replacing a pushed model's files is no new model
        assert repo.ready(a)
    repo.load(c, ONNX, files)
    repo.unload(c)


def test_pushed_bytes_are_counted_on_disk(tmp_path: Path) -> None:
    size = len(ADD_SUB)
    (tmp_path / "serve.yaml").write_text(
        f"server: {{modelControl: explicit, limits: {{maxPushedBytes: {size * 2 + size // 2}}}}}\n"
    )
    server = start_server(tmp_path / "serve.yaml", grpc=False)
    repo = Repo("http", server.http_url, "")
    try:
        files = {"file:1/model.onnx": ADD_SUB}
        repo.load("one", ONNX, files)
        repo.load("two", ONNX, files)
        message = repo.expect_error("RESOURCE_EXHAUSTED", repo.load, "three", ONNX, files)
        assert "server.limits.maxPushedBytes" in message and str(size * 2) in message
        repo.load("two", ONNX, files)  # a replacement counts without the files it replaces
        repo.unload("one")
        repo.load("three", ONNX, files)
        assert repo.ready("three")
    finally:
        repo.close()
        assert server.stop() == 0, server.log()


# -- 6. unloading a pushed model deletes its files -----------------------------------------------
def test_unload_of_a_push_over_a_serve_yaml_model_goes_back_to_serve_yaml(
    repo: Repo, root: Path
) -> None:
    repo.load("add_sub", ONNX, {"file:1/model.onnx": onnx_bytes(onnx_builders.add_sub(size=4))})
    assert [int(d) for d in repo.metadata("add_sub")["inputs"][0]["shape"]] == [-1, 4]
    assert any((storage(root) / "add_sub").iterdir())
    repo.unload("add_sub")
    assert not (storage(root) / "add_sub").exists()
    assert repo.row("add_sub") == {
        "name": "add_sub",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }
    repo.load("add_sub")  # serve.yaml's files and entry again (6 instances, size 16)
    wait_until(lambda: repo.ready("add_sub"), what="add_sub")
    assert [int(d) for d in repo.metadata("add_sub")["inputs"][0]["shape"]] == [-1, 16]
    if repo.transport == "http":
        assert repo.raw.get_model_config("add_sub")["instance_group"][0]["count"] == 6


def test_storage_is_empty_once_every_push_is_unloaded(repo: Repo, root: Path) -> None:
    assert [p for p in storage(root).rglob("*") if p.is_file()] == []
    assert not re.search(r"_(http|grpc)$", " ".join(r["name"] for r in repo.index()))
