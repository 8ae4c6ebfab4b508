"""``servekit build`` picks an engine that answers and explains the engines' common failures
(issue 27), driven as a user runs it (``python -m servekit build``).

docker and podman are stand-ins here: small /bin/sh scripts on a PATH that holds nothing else,
answering as the real tools do (docker's "Cannot connect to the Docker daemon", podman's
registry and crun errors) and logging how they were called. They stand in for external tools
only; the image build itself is tested for real with podman in tests/test_project_build.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

NO_DAEMON = (
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
    "Is the docker daemon running?"
)
REGISTRY = (
    "Error: creating build container: initializing source docker://python:3.11-slim: pinging "
    'container registry registry-1.docker.io: Get "https://registry-1.docker.io/v2/": dial tcp: '
    "lookup registry-1.docker.io: Temporary failure in name resolution"
)
CRUN = (
    "error running container: from /usr/bin/crun creating container for [/bin/sh -c servekit "
    "requirements]: crun: opening file `memory.max` for writing: Permission denied: OCI "
    "permission denied"
)

# $1.. are the arguments; every call is logged; `build` also logs the ignore file it was given
# (podman: --ignorefile F; docker/BuildKit: <Dockerfile>.dockerignore beside -f's Dockerfile).
FAKE = """#!/bin/sh
echo "{name} $*" >> "$FAKE_LOG"
case "$1" in
  info)
    if [ "{daemon}" = yes ]; then echo "Server Version: 27.1.0"; exit 0; fi
    echo "Client: Docker Engine - Community"
    echo "{no_daemon}" >&2
    exit 1 ;;
  image)
    if [ -n "$FAKE_HAS_BASE" ]; then echo "[{{}}]"; exit 0; fi
    echo "Error: {name}: no such image" >&2
    exit 1 ;;
  build)
    previous=""
    for argument in "$@"; do
      if [ "$previous" = "--ignorefile" ]; then ignore="$argument"; fi
      if [ "$previous" = "-f" ]; then ignore="${{argument%/*}}/Dockerfile.dockerignore"; fi
      previous="$argument"
    done
    if [ -n "$ignore" ] && [ -f "$ignore" ]; then
      while IFS= read -r line; do echo "ignored: $line" >> "$FAKE_LOG"; done < "$ignore"
    fi
    echo "STEP 1/6: FROM servekit:0.1.0"
    if [ -n "$FAKE_BUILD_FAILS" ]; then echo "$FAKE_BUILD_FAILS" >&2; exit 125; fi
    echo "Successfully tagged $FAKE_TAG"
    exit 0 ;;
esac
exit 0
"""


def _tools(folder: Path, *, docker: str | None, podman: bool) -> Path:
    """A bin folder with the fake engines asked for (docker: "daemon", "no-daemon" or None)."""
    tools = folder / "bin"
    tools.mkdir()
    found = {"docker": docker is not None, "podman": podman}
    for name, present in found.items():
        if not present:
            continue
        daemon = "yes" if name == "podman" or docker == "daemon" else "no"
        script = tools / name
        script.write_text(FAKE.format(name=name, daemon=daemon, no_daemon=NO_DAEMON))
        script.chmod(0o755)
    return tools


def _project(folder: Path) -> Path:
    project = folder / "project"
    (project / ".venv" / "lib").mkdir(parents=True)
    (project / "model.py").write_text("def predict(x: list[float]) -> list[float]:\n    return x\n")
    (project / "serve.yaml").write_text(
        "models:\n  - name: m\n    modelFormat: {name: python}\n    entrypoint: model:predict\n"
    )
    return project


def build(
    tmp_path: Path, *, docker: str | None, podman: bool, **env: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``servekit build`` with only the fake engines on PATH; (its result, the calls)."""
    log = tmp_path / "calls.log"
    log.write_text("")
    tools = _tools(tmp_path, docker=docker, podman=podman)
    environment = {
        "PATH": str(tools),
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "FAKE_LOG": str(log),
        "FAKE_TAG": "first-hour:1",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "servekit", "build", str(_project(tmp_path)), "-t", "first-hour:1"],
        capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip
    return done, log.read_text()


def test_docker_without_a_daemon_builds_with_podman(tmp_path: Path) -> None:
    done, calls = build(tmp_path, docker="no-daemon", podman=True, FAKE_HAS_BASE="1")
    assert done.returncode == 0, done.stderr
    assert "docker info" in calls and "docker build" not in calls
    assert "podman build --format docker -f" in calls
    assert "building with podman (docker is installed but its daemon does not answer" in (
        done.stdout
    )
    assert "Cannot connect to the Docker daemon" in done.stdout  # what docker said, in short
    assert "building first-hour:1 from" in done.stdout  # says what it is about to do
    assert "ignored: .venv" in calls and "ignored: .git" in calls  # the venv stays out
    assert "podman run --rm -p 127.0.0.1:8000:8000 -p 127.0.0.1:8001:8001" in done.stdout
    assert "-e SERVEKIT_TOKEN" in done.stdout  # how to publish it beyond loopback


def test_docker_with_a_daemon_is_chosen(tmp_path: Path) -> None:
    done, calls = build(tmp_path, docker="daemon", podman=True, FAKE_HAS_BASE="1")
    assert done.returncode == 0, done.stderr
    assert "docker build -f" in calls and "podman build" not in calls
    assert "building with docker (its daemon answers)" in done.stdout
    assert "ignored: **/venv" in calls  # BuildKit's Dockerfile.dockerignore beside -f's file
    assert "docker run --rm -p 127.0.0.1:8000:8000" in done.stdout


def test_docker_without_a_daemon_and_no_podman_says_the_fix(tmp_path: Path) -> None:
    done, calls = build(tmp_path, docker="no-daemon", podman=False)
    assert done.returncode == 1
    assert "docker is installed but its daemon does not answer" in done.stderr
    assert "systemctl start docker" in done.stderr and "apt-get install podman" in done.stderr
    assert "docker build" not in calls and "Traceback" not in done.stderr


def test_neither_engine(tmp_path: Path) -> None:
    done, _ = build(tmp_path, docker=None, podman=False)
    assert done.returncode == 1
    assert "neither docker nor podman is installed" in done.stderr


@pytest.mark.parametrize(
    ("said", "fix"),
    [
        (REGISTRY, "scripts/make-base-image.sh"),
        (CRUN, 'runtime = "runc"'),
        (NO_DAEMON, "systemctl start docker"),
    ],
)
def test_a_known_engine_failure_says_its_fix(tmp_path: Path, said: str, fix: str) -> None:
    done, _ = build(tmp_path, docker=None, podman=True, FAKE_HAS_BASE="1", FAKE_BUILD_FAILS=said)
    assert done.returncode == 1
    assert said in done.stdout  # the engine's own words stay visible
    last = done.stderr.strip().splitlines()[-1]
    assert "failed with exit code 125" in last and fix in last, done.stderr
    assert "docs/ops.md" in last or "podman" in last


def test_an_unknown_failure_is_reported_as_it_is(tmp_path: Path) -> None:
    done, _ = build(
        tmp_path, docker=None, podman=True, FAKE_HAS_BASE="1", FAKE_BUILD_FAILS="disk full"
    )
    assert done.returncode == 1
    assert done.stderr.strip().endswith("failed with exit code 125")


def test_the_first_base_build_is_announced_with_its_time(tmp_path: Path) -> None:
    done, calls = build(tmp_path, docker=None, podman=True)
    assert done.returncode == 0, done.stderr
    assert "podman has no localhost/servekit:" in done.stdout
    assert "building it first" in done.stdout and "3-4 minutes" in done.stdout
    assert calls.count("podman build") == 2  # servekit's image, then the project's
