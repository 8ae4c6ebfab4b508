"""``servekit build``: a saved project's image, built with podman and answering tritonclient.

A scikit-learn pipeline served from memory is saved (``server.save``), its serve.yaml given a
``server.requirements`` list, servekit's image built from this checkout and ``servekit build``
makes the project's image on top; the container, run hardened as docs/ops.md says (read-only
root, no capabilities), answers a tritonclient request with what the notebook's server
answered. podman setup as in tests/test_container.py.

Nothing is downloaded while the project image builds: the listed requirement (numpy, with a
marker) is one the base image already has, so pip finds it satisfied; the build log shows pip
read the list. servekit's image is built here from this checkout under a tag of this test's
own (layers cached): an image named servekit:VERSION made earlier from other code would lack
``servekit requirements``, which the project Dockerfile runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from test_container import (
    BASE,
    BASE_COMMAND,
    HARDENED,
    REPO,
    host_port,
    podman,
    podman_env,  # noqa: F401 - the fixture
    readable,
    running,
    wait_ready,
)

import servekit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_build_saved_project_and_answer_tritonclient(
    podman_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if subprocess.run(["podman", "image", "exists", BASE], env=podman_env).returncode != 0:
        assert shutil.which("mmdebstrap"), "apt-get install mmdebstrap to make the base image"
        subprocess.run(BASE_COMMAND, env=podman_env, check=True, timeout=900)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((50, 4))
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, X[:, 0] > 0)
    x = X[:3].astype(np.float32)
    folder = tmp_path / "iris-project"
    with servekit.serve(grpc_port=None) as server:
        server.add_model("iris", pipe)
        expected = server.infer("iris", {"X": x})
        server.save(folder)
    saved = yaml.safe_load((folder / "serve.yaml").read_text())
    saved["server"] = {"requirements": ["numpy>=1.26; python_version >= '3.11'"]}
    (folder / "serve.yaml").write_text(yaml.safe_dump(saved))
    readable(folder)
    run_id = uuid.uuid4().hex[:8]
    tag = f"localhost/servekit-project-test:{run_id}"
    base = f"localhost/servekit-base-test:{run_id}"
    env = {**podman_env, "SERVEKIT_CONTAINER_ENGINE": "podman"}
    try:
        podman(podman_env, "build", "--pull=never", "--format", "docker", "-t", base, str(REPO),
               timeout=1500)  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "servekit", "build", str(folder), "--tag", tag, "--base", base],
            env=env, capture_output=True, text=True, timeout=1700,
        )  # fmt: skip
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-6000:]
        loopback = "-p 127.0.0.1:8000:8000 -p 127.0.0.1:8001:8001"  # published on loopback only
        assert f"podman run --rm {loopback} --read-only --tmpfs /tmp {tag}" in done.stdout
        assert "Requirement already satisfied: numpy" in log, log[-6000:]
        with running(podman_env, *HARDENED, "-p", "127.0.0.1::8000", tag) as name:
            address = host_port(podman_env, name, 8000)
            wait_ready(podman_env, name, address)
            client = httpclient.InferenceServerClient(address)
            inp = httpclient.InferInput("X", [3, 4], "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            result = client.infer("iris", [inp])
            for output in ("label", "probabilities"):
                got = result.as_numpy(output)
                assert got.tobytes() == expected[output].tobytes(), output
            client.close()
            podman(podman_env, "healthcheck", "run", name)
            podman(podman_env, "stop", "-t", "20", name, timeout=60)
            code = podman(podman_env, "inspect", "-f", "{{.State.ExitCode}}", name).strip()
            assert code == "0"
    finally:
        podman(podman_env, "rmi", "-f", tag, check=False)
        podman(podman_env, "rmi", base, check=False)  # the tag only; shared layers stay
