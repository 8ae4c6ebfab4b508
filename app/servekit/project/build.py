"""``servekit build [FOLDER] [--tag T]``: the image of a project folder, with docker or podman.

A project image is servekit's image (the repository's Dockerfile: non-root user 10001, health check,
``servekit serve`` as PID 1 draining on SIGTERM, fine with a read-only root) plus the folder:
serve.yaml, modules and models copied to /srv, then the packages of its requirements.txt and
serve.yaml's ``server.requirements`` installed (app/servekit/project/dockerfile.py). serve.yaml is
validated here first, so a refused requirement (an option, a URL, a path) or any other mistake is
said before the engine starts.

servekit's image is built first when the engine does not have it yet, from the servekit source
tree this command runs from (a checkout or an editable install); an installed wheel has no
Dockerfile, so then the command says how to get that image (docs/ops.md).

The folder's own Dockerfile is used when it has one (``server.save`` writes one); otherwise
servekit's project Dockerfile is passed to the engine without writing into the folder.

Remote models (``storageUri: s3://...``) are fetched when the container starts, by default;
``include_models`` (``--include-models``) fetches them now and adds them to the image in a
layer of their own (app/servekit/project/bake.py).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from servekit.config.loader import ConfigError, load_config
from servekit.project.bake import BakeError, bake, remote_models
from servekit.project.dockerfile import BASE_IMAGE, DOCKERIGNORE, PROJECT_DOCKERFILE
from servekit.project.engines import EngineError, choose_engine, diagnose

FIRST_BASE_BUILD = "about 3-4 minutes, once: it installs servekit's dependencies"
"""How long building servekit's own image takes the first time (docs/ops.md measures it)."""
TAIL_LINES = 400
"""How much of the engine's output is kept to recognise a known failure in."""


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
    """docker when its daemon answers, else podman (``SERVEKIT_CONTAINER_ENGINE`` chooses);
    app/servekit/project/engines.py."""
    try:
        chosen = choose_engine()
    except EngineError as exc:
        raise BuildError(str(exc)) from None
    print(f"servekit: building with {chosen.name} ({chosen.why})", flush=True)
    return chosen.name


def default_tag(folder: Path) -> str:
    """The folder's name as an image name (lower case, [a-z0-9._-])."""
    name = re.sub(r"[^a-z0-9._-]+", "-", folder.resolve().name.lower()).strip(".-_")
    return f"{name or 'servekit-project'}:latest"


def source_tree() -> Path | None:
    """The servekit checkout this code runs from, if it is one (Dockerfile + pyproject)."""
    root = Path(__file__).resolve().parents[3]  # app/servekit/project/build.py
    has_all = (root / "Dockerfile").is_file() and (root / "pyproject.toml").is_file()
    return root if has_all else None


def _qualified(engine_name: str, image: str) -> str:
    """podman names local images localhost/NAME; docker keeps the short name."""
    if engine_name == "podman" and "/" not in image.split(":")[0]:
        return f"localhost/{image}"
    return image


def _run(argv: list[str], timeout: float) -> None:
    """Run the engine, its output shown as it comes; a failure says the fix when it is a known
    one (no registry, crun, no daemon: app/servekit/project/engines.py)."""
    print("+ " + " ".join(argv), flush=True)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
    except OSError as exc:
        raise BuildError(f"{argv[0]} could not run: {exc.strerror}") from None
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        process.kill()

    timer = threading.Timer(timeout, expire)
    timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            print(line, end="", flush=True)
            tail.append(line)
        code = process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:  # interrupted (Ctrl-C): leave no engine behind
            process.kill()
            process.wait()
    if expired.is_set():
        raise BuildError(f"{argv[0]} build took longer than {timeout:.0f} s")
    if code != 0:
        fix = diagnose("".join(tail))
        message = f"{' '.join(argv[:2])} failed with exit code {code}"
        raise BuildError(f"{message}: {fix}" if fix else message)


def _build_args(engine_name: str) -> list[str]:
    # podman: --format docker keeps the HEALTHCHECK (OCI images drop it).
    return ["build", "--format", "docker"] if engine_name == "podman" else ["build"]


def _ignore_args(
    engine_name: str, root: Path, dockerfile: Path, scratch: Path
) -> tuple[Path, list[str]]:
    """Keep virtualenvs, caches and .git out of the build context of a folder without its own
    .dockerignore (a project's .venv is often gigabytes), without writing into the folder:
    podman takes ``--ignorefile``; docker (BuildKit) reads ``<Dockerfile>.dockerignore`` beside
    the Dockerfile, so the Dockerfile is used from a copy in ``scratch`` next to that file.
    Returns the Dockerfile to pass and the engine's extra arguments."""
    if (root / ".dockerignore").is_file() or (root / ".containerignore").is_file():
        return dockerfile, []
    ignore = scratch / "Dockerfile.dockerignore"
    ignore.write_text(DOCKERIGNORE)
    if engine_name == "podman":
        return dockerfile, ["--ignorefile", str(ignore)]
    copy = scratch / "Dockerfile"
    if dockerfile != copy:
        copy.write_text(dockerfile.read_text())
    return copy, []


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
    print(
        f"servekit: {engine_name} has no {image} (servekit's own image) yet: building it first "
        f"from {tree} ({FIRST_BASE_BUILD})",
        flush=True,
    )
    _run([engine_name, *_build_args(engine_name), "-t", image, str(tree)], timeout)
    return image


def build(
    folder: str | os.PathLike[str] = ".",
    tag: str | None = None,
    base: str = BASE_IMAGE,
    timeout: float = 1800.0,
    include_models: bool = False,
) -> Built:
    """Build the image of ``folder``; returns the engine and tag (see :meth:`Built.run_command`).
    ``include_models``: bake serve.yaml's remote models into the image instead of leaving
    them to be fetched when it starts."""
    root = Path(folder).expanduser()
    if not (root / "serve.yaml").is_file():
        raise BuildError(f"{root} has no serve.yaml: `servekit build` builds a project folder")
    try:
        config = load_config(root / "serve.yaml")  # server.requirements included: checked
    except ConfigError as exc:
        raise BuildError(f"the project's serve.yaml is not valid:\n{exc}") from None
    remote = remote_models(config)
    if remote and not include_models:
        print(
            f"servekit: {len(remote)} remote model(s) ({', '.join(remote)}) are fetched when "
            "the container starts (--include-models bakes them into the image)",
            flush=True,
        )
    engine_name = engine()
    image = ensure_base(engine_name, base, timeout)
    chosen = tag or default_tag(root)
    with tempfile.TemporaryDirectory(prefix="servekit-build-") as scratch:
        dockerfile = root / "Dockerfile"
        which = "its own Dockerfile"
        if not dockerfile.is_file():
            dockerfile = Path(scratch) / "Dockerfile"
            dockerfile.write_text(PROJECT_DOCKERFILE)
            which = "servekit's project Dockerfile"
        print(
            f"servekit: building {chosen} from {root} ({which}, on {image}): its serve.yaml, "
            "modules and models, then the packages of requirements.txt and "
            "server.requirements",
            flush=True,
        )
        dockerfile, ignore = _ignore_args(engine_name, root, dockerfile, Path(scratch))
        argv = [
            engine_name, *_build_args(engine_name), "-f", str(dockerfile), *ignore,
            "--build-arg", f"SERVEKIT_IMAGE={image}", "-t", chosen, str(root),
        ]  # fmt: skip
        baked = None
        if include_models:
            context = Path(scratch) / "bake"
            context.mkdir()
            try:
                baked = bake(root, config, context)
            except BakeError as exc:
                raise BuildError(str(exc)) from None
        _run(argv, timeout)
        if baked is not None:
            print(f"servekit: adding the remote models {', '.join(baked.models)} to {chosen}")
            _run([
                engine_name, *_build_args(engine_name), "-f", str(baked.context / "Dockerfile"),
                "--build-arg", f"PROJECT_IMAGE={_qualified(engine_name, chosen)}",
                "-t", chosen, str(baked.context),
            ], timeout)  # fmt: skip
    return Built(engine_name, chosen)
