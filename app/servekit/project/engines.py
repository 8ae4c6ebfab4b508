"""Which container engine ``servekit build`` uses, and what its common failures mean.

An engine must *answer*, not merely be installed: a docker CLI without a reachable daemon (a
laptop where Docker Desktop is stopped, a CI image with only the client) fails every build,
so docker is chosen only when ``docker info`` succeeds, and podman (which needs no daemon)
otherwise. ``SERVEKIT_CONTAINER_ENGINE`` names one explicitly.

The engines' own errors on a first build are long and rarely say the fix; :func:`diagnose`
recognises the usual ones in the build's output (no registry reachable for the base image,
podman's crun refusing the cgroup setup, no Docker daemon) and returns the fix docs/ops.md
gives, which ``servekit build`` prints after the engine's own message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

ENGINE_ENV = "SERVEKIT_CONTAINER_ENGINE"
"""Names the engine (docker or podman); default: docker if its daemon answers, else podman."""
INFO_TIMEOUT = 20.0
"""How long ``docker info`` may take to answer (a daemon that is starting up is slow)."""


class EngineError(RuntimeError):
    """No engine can build here; the message says what to install or start."""


@dataclass(frozen=True)
class Engine:
    name: str
    """docker or podman, as run."""
    why: str
    """Why this one, for the line ``servekit build`` prints before it starts."""


def choose_engine(environ: Mapping[str, str] | None = None) -> Engine:
    """The engine to build with (see the module's docstring for the rule)."""
    env = os.environ if environ is None else environ
    chosen = env.get(ENGINE_ENV)
    if chosen:
        if shutil.which(chosen) is None:
            raise EngineError(f"{ENGINE_ENV}={chosen}, but {chosen} is not installed")
        return Engine(chosen, f"{ENGINE_ENV}={chosen}")
    docker = shutil.which("docker") is not None
    podman = shutil.which("podman") is not None
    refusal = _docker_refusal() if docker else None
    if docker and refusal is None:
        return Engine("docker", "its daemon answers")
    if podman:
        if docker:
            why = f"docker is installed but its daemon does not answer ({refusal})"
            return Engine("podman", why)
        return Engine("podman", "docker is not installed")
    if docker:
        raise EngineError(
            f"docker is installed but its daemon does not answer ({refusal}): {NO_DAEMON_FIX}"
        )
    raise EngineError(
        "neither docker nor podman is installed: install one (apt-get install podman; it needs "
        "no daemon) to build an image; the project folder itself runs anywhere with "
        "`servekit serve serve.yaml`"
    )


def _docker_refusal() -> str | None:
    """None when ``docker info`` succeeds, else the first line of what it said."""
    try:
        done = subprocess.run(
            ["docker", "info"], capture_output=True, text=True, timeout=INFO_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return f"`docker info` did not answer within {INFO_TIMEOUT:.0f} s"
    except OSError as exc:
        return f"`docker info` could not run: {exc.strerror}"
    if done.returncode == 0:
        return None
    said = next((line.strip() for line in done.stderr.splitlines() if line.strip()), "")
    return f"`docker info` failed: {said[:200]}" if said else "`docker info` failed"


NO_DAEMON_FIX = (
    "start the Docker daemon (sudo systemctl start docker, or Docker Desktop), or install "
    "podman, which needs none (apt-get install podman), and run again"
)
NO_REGISTRY_FIX = (
    "the engine could not reach a container registry for the base image (python:3.11-slim). "
    "Without one, make that image locally first: scripts/make-base-image.sh in servekit's "
    "repository (docs/ops.md, 'Without a registry (offline base image)'), then run again"
)
CRUN_FIX = (
    "podman's OCI runtime (crun) refused the container's cgroup or limits setup. Give podman a "
    'containers.conf of its own with [engine] runtime = "runc" and [containers] '
    'default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"], export '
    "CONTAINERS_CONF=/path/to/containers.conf (and apt-get install runc), then run again "
    "(docs/ops.md, 'Without a registry (offline base image)')"
)
FAILURES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        (
            "cannot connect to the docker daemon",
            "is the docker daemon running",
            "error during connect",
        ),
        NO_DAEMON_FIX,
    ),
    (
        (
            "pinging container registry",
            "failed to resolve source metadata",
            "did not resolve to an alias",
            "unqualified-search registries",
            "registry-1.docker.io",
            "pull access denied",
            "error pulling image",
            "failed to pull",
        ),
        NO_REGISTRY_FIX,
    ),
    (
        ("crun:", "oci runtime", "cgroup", "setrlimit", "error setting rlimit"),
        CRUN_FIX,
    ),
)
"""(phrases any of which, in lower case, marks the failure; its fix), first match wins."""


def diagnose(output: str) -> str | None:
    """The fix for a failed build whose output is ``output``, when it is a known failure."""
    text = output.lower()
    for phrases, fix in FAILURES:
        if any(phrase in text for phrase in phrases):
            return fix
    return None
