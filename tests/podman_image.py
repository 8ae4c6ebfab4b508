"""servekit's image, built once per test session with podman (no Docker daemon), for every test
that runs it: tests/test_container.py and the KServe pod harness's podman runner
(tests/kserve_pod.py, tests/test_kserve_image_e2e.py). tests/conftest.py imports the fixtures.

The image is built from the repository's Dockerfile, unmodified, on a locally made base tagged
``localhost/python:3.11-slim`` (docs/ops.md). The fixture hands out the built image's ID, not
its tag: other checkouts on the same machine build under the same tag, and a tag can move
between the build and a ``podman run``. podman missing is a skip off CI and a failure on CI
(tests/needs.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from needs import missing

REPO = Path(__file__).resolve().parents[1]
BASE = "localhost/python:3.11-slim"
IMAGE = "localhost/servekit:test"
# crun refuses this machine's cgroups, and podman's default ulimits are too high here.
CONTAINERS_CONF = (
    '[containers]\ndefault_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]\n'
    '[engine]\nruntime = "runc"\n'
)
BASE_COMMAND = ["bash", str(REPO / "scripts" / "make-base-image.sh"), BASE]
"""The offline base image, made as docs/ops.md tells ops to make it."""
PODMAN_INSTALL = "apt-get install buildah podman runc mmdebstrap"


@pytest.fixture(scope="session")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment for podman commands (CONTAINERS_CONF as docs/ops.md says)."""
    if shutil.which("podman") is None:
        missing("podman", PODMAN_INSTALL)
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env:
        conf = tmp_path_factory.mktemp("podman") / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        env["CONTAINERS_CONF"] = str(conf)
    return env


def podman(env: dict[str, str], *args: str, timeout: float = 120, check: bool = True) -> str:
    result = subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {result.returncode}\n{result.stderr}")
    return result.stdout


@pytest.fixture(scope="session")
def servekit_image(podman_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """Build the image from the Dockerfile (the local base made first if absent); its ID.
    The build's time is printed (``pytest -s``): seconds when only servekit's code changed
    (the dependency layers are cached), minutes cold."""
    exists = subprocess.run(["podman", "image", "exists", BASE], env=podman_env, timeout=60)
    if exists.returncode != 0:
        assert shutil.which("mmdebstrap"), "apt-get install mmdebstrap to make the base image"
        subprocess.run(BASE_COMMAND, env=podman_env, check=True, timeout=900)
    iidfile = tmp_path_factory.mktemp("image") / "iid"
    started = time.monotonic()
    podman(podman_env, "build", "--pull=never", "--format", "docker", "--iidfile", str(iidfile),
           "-t", IMAGE, str(REPO), timeout=1500)  # fmt: skip
    print(f"\nservekit's image built in {time.monotonic() - started:.1f} s")
    return iidfile.read_text().strip()


def readable(path: Path) -> Path:
    """Bind mounts keep host modes: let the container's non-root user read them."""
    for item in [path, *path.rglob("*")]:
        item.chmod(0o755 if item.is_dir() else 0o644)
    return path
