"""``servekit serve --watch``: serve.yaml edits apply live; an invalid edit changes nothing.

A real server subprocess watches a serve.yaml in a temporary folder. The test edits the file
(in place and with an editor's write-then-rename), waits (bounded) for the index to show the
result, and keeps inference running on an untouched model throughout, which must never fail.
``startupModels`` decides what loads at start and which added models load.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx_builders
import pytest
from repo_helpers import Repo, onnx_bytes
from servers import ServerProcess, start_server
from waits import wait_until

from servekit.config.overrides import Overrides, load_plan
from servekit.server import ServeKit
from servekit.services.watch import watch_config

pytestmark = pytest.mark.slow

HEAD = "server: {startupModels: [mlp, added, text]}\nmodels:\n"
MLP = "  - {name: mlp, modelFormat: {name: onnx}, storageUri: models/mlp}\n"
ADD_SUB = "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: models/add_sub.onnx}\n"
ADDED = "  - {name: added, modelFormat: {name: onnx}, storageUri: models/added.onnx}\n"
LAZY = "  - {name: lazy, modelFormat: {name: onnx}, storageUri: models/add_sub.onnx}\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("watch")
    models = root / "models"
    for version in (1, 2):
        (models / "mlp" / str(version)).mkdir(parents=True)
        path = models / "mlp" / str(version) / "model.onnx"
        path.write_bytes(onnx_bytes(onnx_builders.mlp(seed=version)))
    (models / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (models / "added.onnx").write_bytes(onnx_bytes(onnx_builders.identity("FP32")))
    (root / "serve.yaml").write_text(HEAD + MLP + ADD_SUB)
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    process = start_server(folder / "serve.yaml", grpc=True, extra=["--watch"])
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture()
def repo(server: ServerProcess) -> Iterator[Repo]:
    assert server.grpc_target is not None
    client = Repo("http", server.http_url, server.grpc_target)
    yield client
    client.close()


def rewrite(config: Path, text: str) -> None:
    """Save as editors do: write a temporary file, then rename it over the original."""
    temporary = config.with_name(".serve.yaml.swp")
    temporary.write_text(text)
    temporary.replace(config)


def names(repo: Repo) -> set[str]:
    return {r["name"] for r in repo.index()}


def test_startup_models_load_only_the_listed(repo: Repo) -> None:
    assert repo.ready("mlp")
    row = repo.row("add_sub")
    assert row["state"] == "UNAVAILABLE" and row["reason"] == "not loaded"
    repo.load("add_sub")
    assert repo.ready("add_sub")


def test_edits_apply_live_and_other_models_keep_serving(
    repo: Repo, server: ServerProcess, folder: Path
) -> None:
    config = folder / "serve.yaml"
    stop = threading.Event()
    failures: list[str] = []
    served = [0]

    def traffic() -> None:
        client = Repo("grpc", server.http_url, server.grpc_target or "")
        try:
            while not stop.is_set():
                try:
                    client.infer("mlp", {"input": np.ones((1, 16), np.float32)})
                    served[0] += 1
                except Exception as exc:
                    failures.append(str(exc))
        finally:
            client.close()

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        # Add one model (listed in startupModels), one that is not, and remove add_sub.
        config.write_text(HEAD + MLP + ADDED + LAZY)
        wait_until(lambda: repo.ready("added"), what="the added model to be READY")
        wait_until(
            lambda: "add_sub" not in names(repo), what="the removed model to leave the index"
        )
        assert repo.row("lazy") == {
            "name": "lazy",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "not loaded",
        }
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(repo.infer("added", {"INPUT0": x})["OUTPUT0"], x)

        # An invalid edit is reported with its location; the running configuration stays.
        rewrite(
            config,
            HEAD + MLP + ADDED + "  - {name: bad, modelFormat: {name: onnx}, storageURI: x}\n",
        )
        wait_until(
            lambda: "serve.yaml:5: models[2].storageURI: unknown key" in server.log(),
            what="the invalid edit to be reported with its line",
        )
        assert "still serving the previous configuration" in server.log()
        assert names(repo) == {"mlp", "added", "lazy"}
        assert repo.ready("added") and repo.ready("mlp")
    finally:
        stop.set()
        thread.join(30)
    assert not failures, failures[:5]
    assert served[0] > 10
    server.assert_healthy()


def test_a_changed_entry_reloads(repo: Repo, folder: Path) -> None:
    config = folder / "serve.yaml"
    assert ("mlp", "1") not in repo.states()
    rewrite(config, HEAD + MLP.replace("}\n", ", versionPolicy: {all: {}}}\n") + ADDED + LAZY)
    wait_until(lambda: repo.states().get(("mlp", "1")) == "READY", what="mlp version 1 to load")
    assert repo.states()[("mlp", "2")] == "READY"


def test_a_replaced_model_file_reloads(repo: Repo, folder: Path) -> None:
    """Model folders named by serve.yaml are watched too: a new file is a reload."""
    assert repo.metadata("added")["inputs"][0]["datatype"] == "FP32"
    temporary = folder / "models" / "added.onnx.tmp"
    temporary.write_bytes(onnx_bytes(onnx_builders.identity("INT32")))
    temporary.replace(folder / "models" / "added.onnx")
    wait_until(
        lambda: repo.metadata("added")["inputs"][0]["datatype"] == "INT32",
        what="the replaced model file to be served",
    )


def test_a_listener_edit_needs_a_restart(repo: Repo, server: ServerProcess, folder: Path) -> None:
    """maxRequestBytes is the file's to set; httpPort is --http-port's, so editing it changes
    nothing and no restart is asked for (a restart would use --http-port 0 again)."""
    config = folder / "serve.yaml"
    text = config.read_text()
    edited = text.replace("server: {", "server: {maxRequestBytes: 5000000, httpPort: 1, ")
    rewrite(config, edited.replace("lazy", "lazy2"))
    wait_until(lambda: "lazy2" in names(repo), what="the rest of the edit to apply")
    assert "serve.yaml changed server.maxRequestBytes: restart servekit to apply" in server.log()
    assert "httpPort" not in server.log()
    server.assert_healthy()


def test_command_line_flags_hold_for_every_edit(tmp_path: Path) -> None:
    """``--only mlp --storage-uri mounted --watch``: after an edit the server still serves only
    mlp, from the mounted folder, and an edit without mlp is refused, not served."""
    models = tmp_path / "models"
    for version in (1, 2):
        path = models / "mlp" / str(version) / "model.onnx"
        path.parent.mkdir(parents=True)
        path.write_bytes(onnx_bytes(onnx_builders.mlp(seed=version)))
        mounted = tmp_path / "mounted" / str(version) / "model.onnx"  # what KServe mounts
        mounted.parent.mkdir(parents=True)
        mounted.write_bytes(onnx_bytes(onnx_builders.identity("FP32" if version == 1 else "INT32")))
    (models / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    config = tmp_path / "serve.yaml"
    config.write_text("server: {startupModels: none}\nmodels:\n" + MLP + ADD_SUB)
    server = start_server(
        config, grpc=False, extra=["--watch", "--only", "mlp", "--storage-uri", "mounted"]
    )
    repo = Repo("http", server.http_url, "")
    try:
        assert names(repo) == {"mlp"}
        assert repo.states() == {("mlp", "2"): "READY"}
        assert repo.metadata("mlp")["inputs"][0]["datatype"] == "INT32"

        # Serve every version, and add a third model: mlp reloads, nothing else appears.
        rewrite(
            config,
            "server: {startupModels: none}\nmodels:\n"
            + MLP.replace("}\n", ", versionPolicy: {all: {}}}\n")
            + ADD_SUB
            + ADDED,
        )
        wait_until(lambda: ("mlp", "1") in repo.states(), what="the edit to reload mlp")
        wait_until(lambda: repo.ready("mlp"), what="mlp to be READY again")
        assert repo.states() == {("mlp", "1"): "READY", ("mlp", "2"): "READY"}
        x = np.arange(4, dtype=np.float32).reshape(1, 4)  # the mounted identity, not models/mlp
        response = httpx.post(
            f"{server.http_url}/v2/models/mlp/versions/1/infer",
            json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                              "data": x.ravel().tolist()}]},
        )  # fmt: skip
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == x.ravel().tolist()
        for other in ("add_sub", "added"):
            answer = httpx.get(f"{server.http_url}/v2/models/{other}")
            assert answer.status_code == 404, answer.text
            assert answer.json() == {"error": f"Request for unknown model: {other!r} is not found"}

        # An edit that drops the one model --only names cannot be served: the old one stays.
        rewrite(config, "models:\n" + ADD_SUB + ADDED)
        wait_until(
            lambda: "--only 'mlp': no such model (models: add_sub, added)" in server.log(),
            what="the edit without mlp to be refused",
        )
        assert "still serving the previous configuration" in server.log()
        assert names(repo) == {"mlp"} and repo.ready("mlp")
        server.assert_healthy()
    finally:
        repo.close()
        assert server.stop() == 0, server.log()


def test_an_edit_made_while_the_server_starts_is_applied(tmp_path: Path) -> None:
    """The start plan is loaded before the watcher exists; an edit in between must not be lost
    (the watcher's first look compiles the file again instead of taking it as already applied)."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (models / "added.onnx").write_bytes(onnx_bytes(onnx_builders.identity("FP32")))
    config = tmp_path / "serve.yaml"
    config.write_text("server: {startupModels: all}\nmodels:\n" + ADD_SUB)
    overrides = Overrides({"http_port": 0, "grpc_port": None, "host": "127.0.0.1"})

    async def scenario() -> set[str]:
        kit = ServeKit(load_plan(config, overrides))
        await kit.start(wait_for_models=True)
        rewrite(config, "server: {startupModels: all}\nmodels:\n" + ADD_SUB + ADDED)
        watcher = asyncio.create_task(watch_config(kit, overrides, debounce_ms=50))
        try:
            async with asyncio.timeout(30):
                while "added" not in kit.repository.names():
                    await asyncio.sleep(0.05)
            return set(kit.repository.names())
        finally:
            watcher.cancel()
            await kit.stop()

    assert asyncio.run(scenario()) == {"add_sub", "added"}
