"""The Dockerfile written into a project folder (``server.save``, ``servekit build``).

A project image is servekit's image plus the project: its ``serve.yaml``, Python modules and
models under ``/srv``, and the packages its ``requirements.txt`` and serve.yaml's
``server.requirements`` name, installed by one pip run (so pip resolves them together, and a
conflict between the two fails the build instead of one silently winning). The list is read
inside the build by ``servekit requirements``, the base image's own servekit, which checks every
entry again (app/servekit/config/pip_requirements.py): this Dockerfile stays the same text whatever
serve.yaml says, and an edit of the list needs no new Dockerfile. Everything else comes from
servekit's image (the repository's Dockerfile, see docs/ops.md) and is kept: the non-root user
10001, the health check, ``servekit serve /srv/serve.yaml --host 0.0.0.0`` as PID 1 draining
in-flight requests on SIGTERM, and a server that runs with a read-only root filesystem.
"""

from __future__ import annotations

from servekit.version import __version__

BASE_IMAGE = f"servekit:{__version__}"
"""The tag ``servekit build`` gives servekit's own image when it builds it first."""

PROJECT_DOCKERFILE = f"""\
# A servekit project image: servekit's image + this folder's serve.yaml, modules and models.
# Build it with `servekit build .` (docker or podman; it builds servekit's image first if
# needed), or by hand once servekit's image exists (docs/ops.md of servekit):
#   podman build --format docker --build-arg SERVEKIT_IMAGE={BASE_IMAGE} -t my-models .
# Run it:   podman run --rm -p 8000:8000 -p 8001:8001 my-models
ARG SERVEKIT_IMAGE={BASE_IMAGE}
FROM ${{SERVEKIT_IMAGE}}
USER 0:0
# serve.yaml, the Python modules beside it and the model files, root-owned and read-only to
# the server (the base image's own example project is replaced); then the packages the models
# import: requirements.txt when the folder has one and serve.yaml's server.requirements (package
# names and versions only, printed by `servekit requirements`), in one pip run. servekit and
# its dependencies are in the base image.
RUN rm -rf /srv/models /srv/*.py /srv/serve.yaml
COPY --chown=root:root . /srv/
RUN servekit requirements /srv/serve.yaml > /tmp/requirements.txt \\
    && if [ -f /srv/requirements.txt ]; then \\
        echo "-r /srv/requirements.txt" >> /tmp/requirements.txt; \\
    fi \\
    && if [ -s /tmp/requirements.txt ]; then \\
        pip install --no-cache-dir -r /tmp/requirements.txt; \\
    fi \\
    && rm /tmp/requirements.txt
USER 10001:10001
"""

DOCKERIGNORE = """\
# Not part of the image: the build files, version control, virtualenvs (often gigabytes),
# caches and the server's own storage.
Dockerfile
.dockerignore
.git
.venv
venv
**/.venv
**/venv
**/__pycache__
**/*.pyc
.cache
.pytest_cache
.mypy_cache
.ruff_cache
.tox
.servekit
**/.ipynb_checkpoints
"""
"""Written beside a saved project's Dockerfile; ``servekit build`` passes it to the engine for a
folder that has no ``.dockerignore`` of its own."""
