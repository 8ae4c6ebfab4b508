"""``servekit build [FOLDER] [--tag T]``: the image of a project folder, with docker or podman.

A project image is servekit's image (the repository's Dockerfile: non-root user 10001, health
check, ``servekit serve`` as PID 1 draining on SIGTERM, fine with a read-only root) plus the
folder: serve.yaml, modules and models copied to /srv, then the packages of its requirements.txt
and serve.yaml's ``server.requirements`` installed (app/servekit/project/dockerfile.py). serve.yaml
is
validated here first, so a refused requirement (an option, a URL, a path) or any other mistake
is said before the engine starts.

servekit's image is built first when the engine does not have it yet, from the servekit source
tree this command runs from (a checkout or an editable install); an installed wheel has no
Dockerfile, so then the command says how to get that image (docs/ops.md).

The folder's own Dockerfile is used when it has one (``server.save`` writes one); otherwise
servekit's project Dockerfile is passed to the engine without writing into the folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import servekit
from servekit.config.loader import ConfigError, load_config
from servekit.project.dockerfile import BASE_IMAGE, PROJECT_DOCKERFILE

ENGINE_ENV = "SERVEKIT_CONTAINER_ENGINE"
"""Names the engine (docker or podman) when both are installed; default: docker, then podman."""


class BuildError(RuntimeError):
    """The image could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class Built:
    engine: str
    tag: str

    def run_command(self) -> str:
        """How to run the image (ports 8000 HTTP and 8001 gRPC), hardened as in docs/ops.md.

        The ports are published on this machine's loopback only: the image's server listens on
        every interface of its container and needs no token, so a plain ``-p 8000:8000`` would
        hand every model, and inference, to anyone on the network."""
        return (
            f"{self.engine} run --rm -p 127.0.0.1:8000:8000 -p 127.0.0.1:8001:8001 "
            f"--read-only --tmpfs /tmp {self.tag}"
        )

    def public_hint(self) -> str:
        """How to publish the image beyond this machine: with a token (SERVEKIT_TOKEN)."""
        return (
            f"to publish it on every interface, give it a token: {self.engine} run --rm "
            "-e SERVEKIT_TOKEN -p 8000:8000 -p 8001:8001 --read-only --tmpfs /tmp "
            f"{self.tag} (with SERVEKIT_TOKEN set here; clients send 'Authorization: Bearer')"
        )


def engine() -> str:
    """docker or podman, whichever is installed (``SERVEKIT_CONTAINER_ENGINE`` chooses)."""
    chosen = os.environ.get(ENGINE_ENV)
    for name in [chosen] if chosen else ["docker", "podman"]:
        if name and shutil.which(name):
            return name
    raise BuildError(
        "neither docker nor podman is installed: install one (apt-get install podman) to build "
        "an image; the project folder itself runs anywhere with `servekit serve serve.yaml`"
    )


def default_tag(folder: Path) -> str:
    """The folder's name as an image name (lower case, [a-z0-9._-])."""
    name = re.sub(r"[^a-z0-9._-]+", "-", folder.resolve().name.lower()).strip(".-_")
    return f"{name or 'servekit-project'}:latest"


def source_tree() -> Path | None:
    """The servekit checkout this code runs from, if it is one (Dockerfile + pyproject)."""
    root = Path(servekit.__file__).resolve().parents[2]  # app/servekit/__init__.py
    has_all = (root / "Dockerfile").is_file() and (root / "pyproject.toml").is_file()
    return root if has_all else None


def _qualified(engine_name: str, image: str) -> str:
    """podman names local images localhost/NAME; docker keeps the short name."""
    if engine_name == "podman" and "/" not in image.split(":")[0]:
        return f"localhost/{image}"
    return image


def _run(argv: list[str], timeout: float) -> None:
    print("+ " + " ".join(argv), flush=True)
    try:
        done = subprocess.run(argv, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{argv[0]} build took longer than {timeout:.0f} s") from None
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv[:2])} failed with exit code {done.returncode}")


def _build_args(engine_name: str) -> list[str]:
    # podman: --format docker keeps the HEALTHCHECK (OCI images drop it).
    return ["build", "--format", "docker"] if engine_name == "podman" else ["build"]


def ensure_base(engine_name: str, base: str, timeout: float) -> str:
    """servekit's image, built from the source tree if the engine does not have it."""
    image = _qualified(engine_name, base)
    exists = subprocess.run(
        [engine_name, "image", "inspect", image], capture_output=True, timeout=60, check=False
    )
    if exists.returncode == 0:
        return image
    tree = source_tree()
    if tree is None:
        raise BuildError(
            f"{engine_name} has no image {image} (servekit's own image) and this servekit is "
            "not a source checkout to build it from: build it from servekit's repository "
            f"(`{engine_name} build -t {base} .` there, see docs/ops.md) or pass --base IMAGE"
        )
    _run([engine_name, *_build_args(engine_name), "-t", image, str(tree)], timeout)
    return image


def build(
    folder: str | os.PathLike[str] = ".",
    tag: str | None = None,
    base: str = BASE_IMAGE,
    timeout: float = 1800.0,
) -> Built:
    """Build the image of ``folder``; returns the engine and tag (see :meth:`Built.run_command`)."""
    root = Path(folder).expanduser()
    if not (root / "serve.yaml").is_file():
        raise BuildError(f"{root} has no serve.yaml: `servekit build` builds a project folder")
    try:
        load_config(root / "serve.yaml")  # server.requirements included: checked on load
    except ConfigError as exc:
        raise BuildError(f"the project's serve.yaml is not valid:\n{exc}") from None
    engine_name = engine()
    image = ensure_base(engine_name, base, timeout)
    chosen = tag or default_tag(root)
    with tempfile.TemporaryDirectory(prefix="servekit-build-") as scratch:
        dockerfile = root / "Dockerfile"
        if not dockerfile.is_file():
            dockerfile = Path(scratch) / "Dockerfile"
            dockerfile.write_text(PROJECT_DOCKERFILE)
        argv = [
            engine_name, *_build_args(engine_name), "-f", str(dockerfile),
            "--build-arg", f"SERVEKIT_IMAGE={image}", "-t", chosen, str(root),
        ]  # fmt: skip
        _run(argv, timeout)
    return Built(engine_name, chosen)
