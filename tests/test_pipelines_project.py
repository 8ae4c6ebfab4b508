"""Pipelines beyond one serve.yaml (issue 29, item 5): the notebook serves one with
``add_model(name, pipeline=[...])``, ``server.save`` writes it into the project, and the exports
carry it (``servekit export kserve`` serves a pipeline's InferenceService with its steps).

Real parts throughout: a notebook server in this process, ``servekit serve`` of the saved
folder in a fresh process, the exported ServingRuntime's own args run as KServe would run them,
tritonclient over HTTP (models: tests/pipeline_models.py).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from pipeline_models import MODULE_NAME, rows, write_project
from servers import start_server

import servekit

pytestmark = pytest.mark.slow

STEPS = [
    {"model": "featurise", "inputs": {"raw": "RAW"}, "outputs": {"features": "FEATURES"}},
    {"model": "mlp", "inputs": {"input": "FEATURES"}, "outputs": {"output": "SCORES"}},
    {"model": "postprocess", "inputs": {"scores": "SCORES"}, "outputs": {"label": "LABEL"}},
]


def classify(client: httpclient.InferenceServerClient, model: str, raw: np.ndarray) -> Any:
    tensor = httpclient.InferInput("RAW", list(raw.shape), "FP32")
    tensor.set_data_from_numpy(raw)
    return client.infer(model, [tensor]).as_numpy("LABEL")


@pytest.fixture
def user_module(tmp_path: Path) -> Iterator[Any]:
    """The data scientist's module, importable as a notebook's own code is."""
    folder = tmp_path / "code"
    folder.mkdir()
    write_project(folder)
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(MODULE_NAME), folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(MODULE_NAME, None)


def test_notebook_pipeline_saved_and_served(user_module: Any, tmp_path: Path) -> None:
    module, code = user_module
    raw = rows(5, seed=2)
    saved = tmp_path / "project"
    with servekit.serve(grpc_port=None) as server:
        server.add_model("featurise", module.featurise, inputs=[("raw", "FP32", [-1, 8])],
                         outputs=[("features", "FP32", [-1, 16])], max_batch_size=8)  # fmt: skip
        server.add_model("mlp", (code / "mlp.onnx").read_bytes())
        server.add_model("postprocess", module.postprocess, inputs=[("scores", "FP32", [-1, 4])],
                         outputs=[("label", "INT64", [-1]), ("probabilities", "FP32", [-1, 4])],
                         max_batch_size=8)  # fmt: skip
        rows_table = server.add_model(
            "classify",
            pipeline=STEPS,
            inputs=[("RAW", "FP32", [-1, 8])],
            outputs=[("LABEL", "INT64", [-1])],
            max_batch_size=8,
        )
        assert [r["name"] for r in rows_table] == ["classify"]
        with pytest.raises(Exception, match="no_such_model"):
            server.add_model("bad", pipeline=[{**STEPS[0], "model": "no_such_model"}],
                             inputs=[("RAW", "FP32", [-1, 8])],
                             outputs=[("FEATURES", "FP32", [-1, 16])])  # fmt: skip
        expected = server.infer("classify", {"RAW": raw})["LABEL"]
        features = server.infer("featurise", {"raw": raw})["features"]
        scores = server.infer("mlp", {"input": features})["output"]
        np.testing.assert_array_equal(
            expected, server.infer("postprocess", {"scores": scores})["label"]
        )
        server.save(saved)
    entries = {m["name"]: m for m in yaml.safe_load((saved / "serve.yaml").read_text())["models"]}
    assert "modelFormat" not in entries["classify"]
    assert [s["model"] for s in entries["classify"]["pipeline"]] == [
        "featurise",
        "mlp",
        "postprocess",
    ]
    process = start_server(saved / "serve.yaml")
    try:
        with httpclient.InferenceServerClient(process.http_host_port) as client:
            assert client.get_model_config("classify")["platform"] == "ensemble"
            np.testing.assert_array_equal(classify(client, "classify", raw), expected)
    finally:
        assert process.stop() == 0, process.log()


def export(*args: str) -> dict[str, list[dict[str, Any]]]:
    done = subprocess.run([sys.executable, "-m", "servekit", "export", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    grouped: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all(done.stdout):
        grouped.setdefault(doc["kind"], []).append(doc)
    return grouped


def test_exports_carry_the_pipeline(tmp_path: Path) -> None:
    config = write_project(tmp_path)
    docs = export("kserve", str(config))
    formats = docs["ServingRuntime"][0]["spec"]["supportedModelFormats"]
    assert {"name": "ensemble"} in formats
    (service,) = [s for s in docs["InferenceService"] if s["metadata"]["name"] == "classify"]
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "ensemble"} and "storageUri" not in model
    notes = service["metadata"]["annotations"]
    assert notes["servekit.io/steps"] == "featurise, mlp, postprocess"
    assert "mlp" in notes["servekit.io/todo"]
    k8s = export("k8s", str(config))
    carried = yaml.safe_load(k8s["ConfigMap"][0]["data"]["serve.yaml"])
    (entry,) = [m for m in carried["models"] if m["name"] == "classify"]
    assert len(entry["pipeline"]) == 3


def test_kserve_runtime_args_serve_a_pipeline_with_its_steps(tmp_path: Path) -> None:
    """The ServingRuntime's args for InferenceService ``classify`` (``--only classify
    --storage-uri /mnt/models``): the pipeline and the models its steps run, nothing else."""
    config = write_project(tmp_path)
    (container,) = export("kserve", str(config))["ServingRuntime"][0]["spec"]["containers"]
    mounted = tmp_path / "mnt-models"  # KServe mounts nothing for a pipeline: an empty folder
    mounted.mkdir()
    local = {"{{.Name}}": "classify", "/etc/servekit/serve.yaml": str(config),
             "/mnt/models": str(mounted), "0.0.0.0": "127.0.0.1",
             "8080": "0", "8081": "0"}  # fmt: skip
    argv = [sys.executable, "-m", "servekit", *(local.get(arg, arg) for arg in container["args"])]
    process = start_server(config, command=argv)
    try:
        with httpclient.InferenceServerClient(process.http_host_port) as client:
            served = sorted(m["name"] for m in client.get_model_repository_index())
            assert served == ["classify", "featurise", "mlp", "postprocess"]
            raw = rows(3)
            got = classify(client, "classify", raw)
        assert got.shape == (3,)
    finally:
        assert process.stop() == 0, process.log()
