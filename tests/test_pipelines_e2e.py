"""Pipelines and optional inputs through a real ``servekit serve`` (issue 29).

tritonclient over HTTP and gRPC: the featurise (Python) -> ONNX -> post-process (Python)
pipeline answers exactly what the client gets calling the three models in turn; its metadata
and configuration are an ensemble's (``ensemble_scheduling``), its steps count their own
statistics, a failing step is named in the error. Triton's ``ensemble_image_client.py`` runs
unmodified (tests/triton_examples/) against the image ensemble. And the vLLM backend README's
``generate`` curl, which leaves the model's optional inputs out, is answered as the README says
(tests/pipeline_models.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pipeline_models import png, rows, write_project
from servers import ServerProcess, start_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = write_project(tmp_path_factory.mktemp("pipelines"))
    process = start_server(config)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(params=["http", "grpc"])
def transport(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[tuple[Any, Any]]:
    """(client, tritonclient module) for one transport."""
    if request.param == "http":
        with httpclient.InferenceServerClient(server.http_host_port) as http:
            yield http, httpclient
    else:
        assert server.grpc_target is not None
        with grpcclient.InferenceServerClient(server.grpc_target) as grpc_client:
            yield grpc_client, grpcclient


def infer(client: Any, module: Any, model: str, **inputs: np.ndarray) -> Any:
    tensors = []
    for name, value in inputs.items():
        tensor = module.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return client.infer(model, tensors)


def test_the_pipeline_answers_as_the_three_client_calls(transport: tuple[Any, Any]) -> None:
    client, module = transport
    raw = rows(7, seed=3)
    features = infer(client, module, "featurise", raw=raw).as_numpy("features")
    scores = infer(client, module, "mlp", input=features).as_numpy("output")
    expected = infer(client, module, "postprocess", scores=scores)
    got = infer(client, module, "classify", RAW=raw)
    np.testing.assert_array_equal(got.as_numpy("LABEL"), expected.as_numpy("label"))
    np.testing.assert_array_equal(got.as_numpy("PROBABILITIES"), expected.as_numpy("probabilities"))


def test_metadata_and_config_are_an_ensembles(transport: tuple[Any, Any]) -> None:
    client, module = transport
    assert client.is_model_ready("classify")
    if module is httpclient:
        metadata = client.get_model_metadata("classify")
        config = client.get_model_config("classify")
    else:
        metadata = client.get_model_metadata("classify", as_json=True)
        config = client.get_model_config("classify", as_json=True)["config"]
    assert metadata["platform"] == "ensemble"
    assert [t["name"] for t in metadata["outputs"]] == ["LABEL", "PROBABILITIES"]
    assert config["platform"] == "ensemble"
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["featurise", "mlp", "postprocess"]
    assert steps[1]["input_map"] == {"input": "FEATURES"}
    assert steps[2]["output_map"] == {"label": "LABEL", "probabilities": "PROBABILITIES"}
    assert int(steps[1]["model_version"]) == 1


def test_a_failing_step_is_named(transport: tuple[Any, Any]) -> None:
    client, module = transport
    with pytest.raises(InferenceServerException) as caught:
        infer(client, module, "broken", X=np.ones(3, np.float32))
    assert "pipeline 'broken' step 0 (model 'explode')" in caught.value.message()
    assert "post-processing table is missing" in caught.value.message()


def test_each_step_counts_its_own_statistics(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_host_port) as client:

        def successes(model: str) -> int:
            stats = client.get_inference_statistics(model)["model_stats"][0]
            return int(stats["inference_stats"]["success"]["count"])

        before = {m: successes(m) for m in ("classify", "featurise", "mlp", "postprocess")}
        infer(client, httpclient, "classify", RAW=rows(2))
        infer(client, httpclient, "classify", RAW=rows(4))
        after = {m: successes(m) for m in before}
    assert {m: after[m] - before[m] for m in before} == dict.fromkeys(before, 2)


def test_independent_steps_run_together(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_host_port) as client:
        x = np.array([1.0, 5.0], np.float32)
        got = infer(client, httpclient, "fan", X=x).as_numpy("TOTAL")
    np.testing.assert_array_equal(got, (x + 1) + (x * 2))


# -- Triton's ensemble_image_client.py, run as it is -------------------------------------------
EXAMPLES = Path(__file__).with_name("triton_examples")
PROGRAM = EXAMPLES / "ensemble_image_client.py"
LABELS = ["cat", "dog", "fish", "bird"]


def _classes_by_steps(server: ServerProcess, image: bytes) -> list[str]:
    """What the two steps answer when the client calls them in turn: "value (index) = label"."""
    with httpclient.InferenceServerClient(server.http_host_port) as client:
        data = np.array([[image]], dtype=np.object_)
        tensor = httpclient.InferInput("image", [1, 1], "BYTES")
        tensor.set_data_from_numpy(data)
        features = client.infer("image_preprocess", [tensor]).as_numpy("features")
        scores = infer(client, httpclient, "inception", input=features).as_numpy("output")[0]
    top = np.argsort(-scores, kind="stable")[:2]
    return [f"{scores[i]:f} ({i}) = {LABELS[i]}" for i in top]


def test_the_ensemble_program_is_the_vendored_one_unmodified() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    (digest,) = re.findall(r"\| `([0-9a-f]{64})` \| `ensemble_image_client.py` \|", readme)
    text = PROGRAM.read_bytes()
    assert hashlib.sha256(text).hexdigest() == digest
    assert b"Copyright" in text[:200] and b"Redistribution and use" in text[:600]


@pytest.mark.parametrize("protocol", ["HTTP", "gRPC"])
def test_tritons_ensemble_image_client_unmodified(
    server: ServerProcess, protocol: str, tmp_path: Path
) -> None:
    """Triton's own program (tests/triton_examples/) against ``preprocess_inception_ensemble``
    (an image-decoding Python step, then a tiny ONNX classifier): a folder of PNG files sent as
    one BYTES batch, the classes it prints are what the two models answer called in turn."""
    images = {f"image{i}.png": png(5 + i, 6 + 2 * i, seed=i) for i in range(3)}
    for name, data in images.items():
        (tmp_path / name).write_bytes(data)
    url = server.http_host_port if protocol == "HTTP" else server.grpc_target
    assert url is not None
    argv = [sys.executable, str(PROGRAM), "-m", "preprocess_inception_ensemble", "-c", "2"]
    done = subprocess.run(
        [*argv, "-u", url, "-i", protocol, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("PASS"), done.stdout
    printed = [line.strip() for line in done.stdout.splitlines() if " = " in line]
    expected = [line for data in images.values() for line in _classes_by_steps(server, data)]
    assert printed == expected, done.stdout


def test_a_bad_image_names_the_step(server: ServerProcess, tmp_path: Path) -> None:
    (tmp_path / "notes.png").write_bytes(b"not an image")
    argv = [sys.executable, str(PROGRAM), "-u", server.http_host_port, str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "step 0 (model 'image_preprocess')" in done.stdout + done.stderr
    assert "not a PNG file" in done.stdout + done.stderr


# -- optional inputs: the vLLM backend README's generate request --------------------------------
# The vLLM backend README's request, word for word (triton-inference-server/vllm_backend,
# README.md at 8de0c14): curl's -d sends it as application/x-www-form-urlencoded.
VLLM_README_CURL = (
    'curl -X POST localhost:8000/v2/models/vllm_model/generate -d \'{"text_input": "What is '
    'Triton Inference Server?", "parameters": {"stream": false, "temperature": 0}}\''
)


def test_vllm_readme_curl_as_written(server: ServerProcess) -> None:
    """The README's curl, run by curl, with only the address changed: the optional inputs
    (stream, sampling_parameters, exclude_input_in_output) left out, the answer the README's."""
    command = shlex.split(VLLM_README_CURL.replace("localhost:8000", server.http_host_port))
    done = subprocess.run([*command, "-sS"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer == {
        "model_name": "vllm_model",
        "model_version": "1",
        "text_output": "What is Triton Inference Server? [text_input]",
    }


def test_vllm_readme_generate_leaves_optional_inputs_out(server: ServerProcess) -> None:
    with server.http_client(timeout=20) as http:
        response = http.post(
            "/v2/models/vllm_model/generate",
            json={
                "text_input": "What is Triton Inference Server?",
                "parameters": {"stream": False, "temperature": 0},
            },
        )
        assert response.status_code == 200, response.text
        assert response.json()["text_output"] == "What is Triton Inference Server? [text_input]"
        both = http.post(
            "/v2/models/vllm_model/generate",
            json={"text_input": "hi", "stream": False, "exclude_input_in_output": True},
        )
        assert both.json()["text_output"] == "hi [text_input,stream,exclude_input_in_output]"
        missing = http.post("/v2/models/vllm_model/generate", json={"stream": False})
        assert missing.status_code == 400
        assert "needs input(s) text_input" in missing.json()["error"]
        config = http.get("/v2/models/vllm_model/config").json()
    assert [i.get("optional", False) for i in config["input"]] == [False, True, True, True]


def test_optional_inputs_in_the_grpc_config(server: ServerProcess) -> None:
    assert server.grpc_target is not None
    with grpcclient.InferenceServerClient(server.grpc_target) as client:
        config = client.get_model_config("vllm_model").config
    assert [i.optional for i in config.input] == [False, True, True, True]


def test_pipeline_over_plain_http(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
    with server.http_client(timeout=20) as http:
        response = http.post("/v2/models/fan/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["model_name"] == "fan"
    assert response.json()["outputs"][0]["data"] == [4.0, 7.0]
