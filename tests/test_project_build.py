"""``servekit build``: a saved project's image, built with podman and answering tritonclient.

A scikit-learn pipeline served from memory is saved (``server.save``), its serve.yaml given a
``server.requirements`` list, servekit's image built from this checkout and ``servekit build``
makes the project's image on top; the container, run hardened as docs/ops.md says (read-only
root, no capabilities), answers a tritonclient request with what the notebook's server
answered. podman setup as in tests/podman_image.py.

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
from podman_image import BASE, BASE_COMMAND, REPO, podman, readable
from test_container import HARDENED, host_port, running, wait_ready

import servekit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_build_saved_project_and_answer_tritonclient(
    podman_env: dict[str, str],
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


def test_build_include_models_bakes_remote_models_into_the_image(
    podman_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """``servekit build --include-models`` against moto's S3 server: the image serves both
    versions of the remote model with the store stopped (it holds the files and a serve.yaml
    naming them), and no secret reaches the build's output."""
    import onnxruntime as ort
    from test_remote_storage import SECRET, Moto, _model_bytes

    if subprocess.run(["podman", "image", "exists", BASE], env=podman_env).returncode != 0:
        assert shutil.which("mmdebstrap"), "apt-get install mmdebstrap to make the base image"
        subprocess.run(BASE_COMMAND, env=podman_env, check=True, timeout=900)
    project = tmp_path / "remote-project"
    project.mkdir()
    (project / "serve.yaml").write_text(
        "# models kept in S3\nmodels:\n  - name: remote\n    modelFormat: {name: onnx}\n"
        "    storageUri: s3://models/mlp   # two versions\n    versionPolicy: {all: {}}\n"
    )
    readable(project)
    run_id = uuid.uuid4().hex[:8]
    tag = f"localhost/servekit-baked-test:{run_id}"
    base = f"localhost/servekit-base-test:{run_id}"
    store = Moto(tmp_path / "moto.log")
    try:
        store.s3.create_bucket(Bucket="models")
        for version in (1, 2):
            store.s3.put_object(
                Bucket="models", Key=f"mlp/{version}/model.onnx", Body=_model_bytes(version)
            )
        env = {
            **podman_env, "SERVEKIT_CONTAINER_ENGINE": "podman", "AWS_ENDPOINT_URL": store.url,
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
        }  # fmt: skip
        podman(podman_env, "build", "--pull=never", "--format", "docker", "-t", base, str(REPO),
               timeout=1500)  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "servekit", "build", str(project), "--tag", tag, "--base",
             base, "--include-models"],
            env=env, capture_output=True, text=True, timeout=1700,
        )  # fmt: skip
    finally:
        store.stop()  # from here on the image has nothing to fetch from
    log = done.stdout + done.stderr
    try:
        assert done.returncode == 0, log[-6000:]
        assert "servekit: fetching model remote from s3://models/mlp" in log
        assert "adding the remote models remote" in log
        assert SECRET not in log
        with running(podman_env, *HARDENED, "-p", "127.0.0.1::8000", tag) as name:
            address = host_port(podman_env, name, 8000)
            wait_ready(podman_env, name, address)
            shown = podman(podman_env, "exec", name, "cat", "/srv/serve.yaml")
            assert 'storageUri: "baked-models/remote"   # two versions' in shown, shown
            client = httpclient.InferenceServerClient(address)
            x = np.full((1, 16), 0.5, dtype=np.float32)
            for version in (1, 2):
                inp = httpclient.InferInput("input", [1, 16], "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                got = client.infer("remote", [inp], model_version=str(version)).as_numpy("output")
                session = ort.InferenceSession(_model_bytes(version))
                (want,) = session.run(None, {"input": x})
                np.testing.assert_allclose(got, want, rtol=1e-6)
            client.close()
    finally:
        podman(podman_env, "rmi", "-f", tag, check=False)
        podman(podman_env, "rmi", base, check=False)  # the tag only; shared layers stay
