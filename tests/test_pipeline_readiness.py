"""Readiness that agrees everywhere (issue 40, item 3): a pipeline whose step names a version
the version policy does not load is not READY in the repository index, the dashboard's JSON or
``/v2/models/<p>/ready``; ``servekit validate`` says so, and exits 1 on any problem it prints
(a missing MLmodel file, a warm-up sample that does not fit the model's inputs)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import onnx
import onnx_builders
import pytest
from servers import start_server
from waits import wait_until

from servekit.cli import main

FEATURES = """\
import numpy as np


def featurise(raw):
    return {"features": np.concatenate([raw, raw * raw], axis=1)}


def postprocess(scores):
    return {"label": scores.argmax(axis=1)}
"""

PIPELINE = """\
models:
  - name: featurise
    modelFormat: {name: python}
    entrypoint: "features:featurise"
    inputs: [{name: raw, datatype: FP32, shape: [-1, 8]}]
    outputs: [{name: features, datatype: FP32, shape: [-1, 16]}]
  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp}
  - name: postprocess
    modelFormat: {name: python}
    entrypoint: "features:postprocess"
    inputs: [{name: scores, datatype: FP32, shape: [-1, 4]}]
    outputs: [{name: label, datatype: INT64, shape: [-1]}]
  - name: classify
    inputs: [{name: RAW, datatype: FP32, shape: [-1, 8]}]
    outputs: [{name: LABEL, datatype: INT64, shape: [-1]}]
    pipeline:
      - {model: featurise, inputs: {raw: RAW}, outputs: {features: FEATURES}}
      - {model: mlp, version: 1, inputs: {input: FEATURES}, outputs: {output: SCORES}}
      - {model: postprocess, inputs: {scores: SCORES}, outputs: {label: LABEL}}
"""


def write_pipeline(folder: Path) -> Path:
    """The docs' pipeline with its step pinned to mlp version 1, while the default version
    policy (the latest one) loads only version 2."""
    for version in (1, 2):
        (folder / "mlp" / str(version)).mkdir(parents=True)
        onnx.save(
            onnx_builders.mlp(seed=version), str(folder / "mlp" / str(version) / "model.onnx")
        )
    (folder / "features.py").write_text(FEATURES)
    config = folder / "serve.yaml"
    config.write_text(PIPELINE)
    return config


def validate(config: Path) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["validate", str(config)])
    return code, out.getvalue()


def test_validate_names_a_step_pinned_to_a_version_not_loaded(tmp_path: Path) -> None:
    code, said = validate(write_pipeline(tmp_path))
    assert code == 1, said
    assert "serve.yaml:18: models[3].pipeline[1].version" in said, said
    assert "model 'mlp' version 1, which its version policy does not load (it loads: 2)" in said


def test_validate_exits_1_on_a_missing_mlmodel(tmp_path: Path) -> None:
    (tmp_path / "scorer").mkdir()
    (tmp_path / "scorer" / "model.pkl").write_bytes(b"not an MLflow folder")
    config = tmp_path / "serve.yaml"
    config.write_text(
        "models:\n  - name: scorer\n    modelFormat: {name: mlflow}\n    storageUri: scorer\n"
    )
    code, said = validate(config)
    assert code == 1, said
    assert "serve.yaml:4: models[0].storageUri: scorer: no MLmodel file" in said, said


WARMUP = """\
models:
  - name: mlp
    modelFormat: {name: onnx}
    storageUri: mlp.onnx
    maxBatchSize: 8
    warmup:
      - name: zeros
        batchSize: 8
        inputs:
          input: {dataType: FP32, dims: [DIMS], zeroData: true}
"""


@pytest.mark.parametrize(("dims", "fits"), [("16", True), ("12", False)])
def test_validate_checks_a_warmup_against_the_onnx_inputs(
    tmp_path: Path, dims: str, fits: bool
) -> None:
    onnx.save(onnx_builders.mlp(inputs=16), str(tmp_path / "mlp.onnx"))
    config = tmp_path / "serve.yaml"
    config.write_text(WARMUP.replace("DIMS", dims))
    code, said = validate(config)
    if fits:
        assert code == 0, said
        return
    assert code == 1, said
    assert "serve.yaml:6: models[0].warmup: mlp: version 1: warm-up sample 'zeros', input " in said
    assert "shape [8, 12] does not fit the model's input shape [-1, 16]" in said, said


def test_validate_names_a_warmup_input_the_model_lacks(tmp_path: Path) -> None:
    onnx.save(onnx_builders.mlp(inputs=16), str(tmp_path / "mlp.onnx"))
    config = tmp_path / "serve.yaml"
    config.write_text(WARMUP.replace("DIMS", "16").replace("input: {", "INPUT0: {"))
    code, said = validate(config)
    assert code == 1, said
    assert "input 'INPUT0': the model has no such input (its inputs: input)" in said, said


@pytest.mark.slow
def test_a_pipeline_waiting_on_a_step_version_is_ready_nowhere(tmp_path: Path) -> None:
    server = start_server(write_pipeline(tmp_path), grpc=False, wait_ready=False)
    try:
        with server.http_client(timeout=10) as http:

            def index() -> dict[str, dict[str, str]]:
                rows = http.post("/v2/repository/index", json={}).json()
                return {f"{r['name']}/{r.get('version', '')}": r for r in rows}

            wait_until(lambda: index().get("mlp/2", {}).get("state") == "READY", 60, "mlp 2")
            wait_until(lambda: index().get("featurise/1", {}).get("state") == "READY", 60, "x")
            rows = index()
            assert rows["classify/1"]["state"] == "UNAVAILABLE", rows
            why = rows["classify/1"]["reason"]
            assert "step 1 (model 'mlp' version 1) is not ready" in why, why
            assert http.get("/v2/models/classify/ready").status_code != 200
            assert http.get("/v2/models/mlp/ready").status_code == 200
            listed = {
                (r["name"], r["version"]): r for r in http.get("/dashboard/api/models").json()
            }
            assert listed[("classify", "1")]["state"] == "UNAVAILABLE", listed
            assert listed[("classify", "1")]["model_state"] == "UNAVAILABLE"
            assert "step 1 (model 'mlp' version 1)" in listed[("classify", "1")]["reason"]
            detail = http.get("/dashboard/api/models/classify").json()
            assert detail["state"] == "UNAVAILABLE", detail
            assert "step 1 (model 'mlp' version 1)" in detail["reason"]
            overview = http.get("/").text
            assert "classify" in overview
    finally:
        assert server.stop() == 0, server.log()
