"""``servekit build``: a saved project's image, built with podman and answering tritonclient.

A scikit-learn pipeline served from memory is saved (``server.save``), ``servekit build`` makes
servekit's image from this checkout and the project's image on top, and the container, run
hardened as docs/ops.md says (read-only root, no capabilities), answers a tritonclient request
with what the notebook's server answered. podman setup as in tests/test_container.py.
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
from test_container import (
    BASE,
    BASE_COMMAND,
    HARDENED,
    host_port,
    podman,
    podman_env,  # noqa: F401 - the fixture
    readable,
    running,
    wait_ready,
)

import app

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
    with app.serve(grpc_port=None) as server:
        server.add_model("iris", pipe)
        expected = server.infer("iris", {"X": x})
        server.save(folder)
    readable(folder)
    tag = f"localhost/servekit-project-test:{uuid.uuid4().hex[:8]}"
    env = {**podman_env, "SERVEKIT_CONTAINER_ENGINE": "podman"}
    done = subprocess.run(
        [sys.executable, "-m", "app", "build", str(folder), "--tag", tag],
        env=env, capture_output=True, text=True, timeout=1700,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"podman run --rm -p 8000:8000 -p 8001:8001 --read-only --tmpfs /tmp {tag}" in (
        done.stdout
    )
    try:
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
