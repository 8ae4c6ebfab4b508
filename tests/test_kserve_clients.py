"""KServe's own Python clients (InferenceRESTClient, InferenceGRPCClient) against our server.

The ``kserve`` package cannot be imported beside tritonclient.grpc (both register the protobuf
names of ``inference.GRPCInferenceService``) and it pins its own fastapi, protobuf and grpcio.
So it lives in a virtualenv of its own, built before the tests by ``.ci/kserve-venv`` (CI's
``.ci/run`` does; ``$SERVEKIT_KSERVE_VENV`` says where, default ``.ci/venvs/kserve``) from
``kserve_client_requirements.txt``: the tests never download anything. ``kserve_client_script.py``
runs in it as a subprocess against the session's real server, and its answers are compared with
what tritonclient (HTTP and gRPC, in this process) gets for the very same requests.

Without that venv the tests are skipped, saying how to build it; under CI (``CI=true``) they
fail instead, so CI cannot pass without having run them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from needs import missing
from servers import ServerProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("kserve_client_script.py")
REQUIREMENTS = Path(__file__).with_name("kserve_client_requirements.txt")
SCRIPT_TIMEOUT = 100.0


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
    )


def kserve_python() -> Path:
    """The interpreter of the KServe client venv (skip, or under CI fail, when it is missing)."""
    venv = Path(os.environ.get("SERVEKIT_KSERVE_VENV") or ".ci/venvs/kserve")
    venv = venv if venv.is_absolute() else ROOT / venv
    built = venv / ".complete"  # written by .ci/kserve-venv once the venv imports kserve
    if not built.exists():
        why = (
            f"KServe's clients run in a venv of their own, not built at {venv}: run "
            "`.ci/kserve-venv` once (it downloads kserve; SERVEKIT_KSERVE_VENV chooses where)"
        )
        missing("KServe's client venv", why)
    if built.read_text() != REQUIREMENTS.read_text():
        pytest.fail(
            f"the KServe client venv at {venv} was built from other requirements than "
            f"{REQUIREMENTS.name}: run `.ci/kserve-venv` again"
        )
    return venv / "bin" / "python"


# --- the requests both kinds of clients send --------------------------------------------------


def _cases() -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)

    def tensor(name: str, datatype: str, shape: list[int], data: list[Any]) -> dict[str, Any]:
        return {"name": name, "datatype": datatype, "shape": shape, "data": data}

    def floats(n: int) -> list[float]:
        return [float(x) for x in rng.standard_normal(n).astype(np.float32)]

    return [
        {"id": "mlp", "model": "mlp", "outputs": ["output"],
         "inputs": [tensor("input", "FP32", [3, 16], floats(48))]},
        {"id": "add_sub", "model": "add_sub", "outputs": ["OUTPUT0", "OUTPUT1"],
         "inputs": [tensor("INPUT0", "FP32", [2, 16], floats(32)),
                    tensor("INPUT1", "FP32", [2, 16], floats(32))]},
        {"id": "bytes", "model": "identity_bytes", "outputs": ["OUTPUT0"],
         "inputs": [tensor("INPUT0", "BYTES", [2, 3], ["a", "", "été", "日本", "x\u0000y", " "])]},
        {"id": "fp16", "model": "identity_fp16", "outputs": ["OUTPUT0"],
         "inputs": [tensor("INPUT0", "FP16", [1, 4], [1.5, -2.0, 65504.0, 0.0])]},
        {"id": "uint64", "model": "identity_uint64", "outputs": ["OUTPUT0"],
         "inputs": [tensor("INPUT0", "UINT64", [1, 3], [0, 2**63, 2**64 - 1])]},
        {"id": "bool", "model": "identity_bool", "outputs": ["OUTPUT0"],
         "inputs": [tensor("INPUT0", "BOOL", [1, 3], [True, False, True])]},
    ]  # fmt: skip


CASES = _cases()
NO_JSON = {"fp16"}  # KServe's clients send FP16 only as binary / raw contents
MODES = {"rest": ("rest_json", "rest_binary"), "grpc": ("grpc_raw", "grpc_typed")}
NUMPY = {"BOOL": "bool", "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "O"}


def _numpy(tensor: dict[str, Any]) -> np.ndarray:
    dtype = NUMPY.get(tensor["datatype"], tensor["datatype"].lower())
    data = tensor["data"]
    if tensor["datatype"] == "BYTES":
        data = [s.encode("utf-8") for s in data]
    return np.array(data, dtype=dtype).reshape(tensor["shape"])


def _tritonclient_answers(
    transport: str, server: ServerProcess
) -> dict[str, dict[str, np.ndarray]]:
    """Each case's outputs as tritonclient (binary data / raw contents) gets them from us."""
    module: Any = httpclient if transport == "rest" else grpcclient
    client = module.InferenceServerClient(
        server.http_host_port if transport == "rest" else server.grpc_target
    )
    answers = {}
    try:
        for case in CASES:
            inputs = []
            for tensor in case["inputs"]:
                infer_input = module.InferInput(tensor["name"], tensor["shape"], tensor["datatype"])
                infer_input.set_data_from_numpy(_numpy(tensor))
                inputs.append(infer_input)
            wanted = [module.InferRequestedOutput(name) for name in case["outputs"]]
            result = client.infer(case["model"], inputs, outputs=wanted)
            answers[case["id"]] = {name: result.as_numpy(name) for name in case["outputs"]}
    finally:
        client.close()
    return answers


@pytest.fixture(scope="module")
def triton_answers(server: ServerProcess) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """tritonclient.http's answers for the REST cases, tritonclient.grpc's for the gRPC ones."""
    return {transport: _tritonclient_answers(transport, server) for transport in MODES}


@pytest.fixture(scope="module")
def kserve_results(
    server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """What KServe's clients got from the session server (run once in the kserve venv)."""
    assert server.grpc_target, "the session server must serve gRPC for InferenceGRPCClient"
    python = kserve_python()
    cases = tmp_path_factory.mktemp("kserve") / "cases.json"
    cases.write_text(json.dumps(CASES))
    argv = [str(python), str(SCRIPT), server.http_url, server.grpc_target, str(cases)]
    try:
        done = _run(argv, timeout=SCRIPT_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the KServe client script did not finish in {SCRIPT_TIMEOUT:.0f} s\n"
            f"{server.log()[-3000:]}"
        )
    assert done.returncode == 0, f"KServe client script failed:\n{done.stderr[-5000:]}"
    yield json.loads(done.stdout)
    assert server.alive(), server.log()


def test_rest_health(kserve_results: dict[str, Any]) -> None:
    """is_server_ready/is_server_live read our JSON health bodies; is_model_ready the status."""
    rest = kserve_results["rest"]
    assert (rest["server_ready"], rest["server_live"], rest["model_ready"]) == (True, True, True)
    assert rest["unknown_model_ready"] is False
    assert "404" in rest["unknown_model_infer"]
    assert "no_such_model" in rest["unknown_model_infer"]  # our {"error": ...} reached the user


def test_grpc_health_and_metadata(kserve_results: dict[str, Any], server: ServerProcess) -> None:
    """InferenceGRPCClient's health calls, and ModelMetadata through KServe's generated stub,
    equal what tritonclient.grpc reads."""
    grpc = kserve_results["grpc"]
    assert (grpc["server_ready"], grpc["server_live"], grpc["model_ready"]) == (True, True, True)
    assert grpc["unknown_model_ready"] is False
    assert server.grpc_target
    client = grpcclient.InferenceServerClient(server.grpc_target)
    try:
        triton = client.get_model_metadata("mlp", as_json=True)
    finally:
        client.close()

    def tensors(key: str) -> list[list[Any]]:
        return [[t["name"], t["datatype"], [int(d) for d in t["shape"]]] for t in triton[key]]

    assert grpc["model_metadata"] == {
        "name": triton["name"],
        "versions": triton["versions"],
        "platform": triton["platform"],
        "inputs": tensors("inputs"),
        "outputs": tensors("outputs"),
    }


@pytest.mark.parametrize("transport", sorted(MODES))
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_infer_matches_tritonclient(
    kserve_results: dict[str, Any],
    triton_answers: dict[str, dict[str, dict[str, np.ndarray]]],
    transport: str,
    case: dict[str, Any],
) -> None:
    """Every case, every way KServe's client sends it, decodes to tritonclient's answer."""
    expected = triton_answers[transport][case["id"]]
    modes = [
        m for m in MODES[transport] if not (case["id"] in NO_JSON and m.endswith(("json", "typed")))
    ]
    for mode in modes:
        got = kserve_results[transport][f"{case['id']}/{mode}"]
        assert got["model_name"] == case["model"], mode
        assert got["id"] == f"{case['id']}-{mode}", mode
        if mode.startswith("rest"):
            assert got["binary_outputs"] == (mode == "rest_binary"), mode
        assert sorted(got["outputs"]) == sorted(expected), mode
        for name, want in expected.items():
            output = got["outputs"][name]
            assert output["shape"] == list(want.shape), (mode, name)
            data = output["data"]
            if want.dtype == object:
                data = [s.encode("utf-8") for s in data]
            array = np.array(data, dtype=want.dtype).reshape(want.shape)
            np.testing.assert_array_equal(array, want, err_msg=f"{mode} {name}")
