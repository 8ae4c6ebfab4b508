# servekit image: runs `servekit serve --host 0.0.0.0` in /srv, which serves /srv/serve.yaml, as a
# non-root user (uid 10001). Where the environment is MLServer's (KServe's kserve-mlserver
# runtime sets MLSERVER_MODEL_IMPLEMENTATION), the same command serves the MLServer project
# $MLSERVER_MODELS_DIR (default /mnt/models) instead, as MLServer's image would. The server's
# own default is loopback only, which no port mapping or Service reaches from outside the
# container: the command names every interface, and a replacement command must too.
# Tokens (server.auth) belong in the environment or a mounted file, not in the image.
#   podman build --format docker -t servekit:0.1.0 .      (or: docker build -t servekit:0.1.0 .)
#   podman run --rm -p 8000:8000 -p 8001:8001 servekit:0.1.0
# The image holds this folder's serve.yaml and models/; mount your own serve.yaml over
# /srv/serve.yaml (a ConfigMap, see `servekit export k8s`) to change settings without a rebuild.
# docs/ops.md explains building, running and the Kubernetes/KServe exports.

# ---- requirements: servekit's dependencies and build tools, read from pyproject.toml ---------
FROM python:3.11-slim AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); print('\n'.join(p['build-system']['requires'] + p['project']['dependencies']))" > /requirements.txt
# The extras of the model formats KServe's runtimes serve (kserve-servekit, and kserve-mlserver
# with this image): sklearn, xgboost, lightgbm, mlflow. The image has no GPU: xgboost-cpu, the
# same module without CUDA's NCCL libraries (hundreds of MB).
ARG EXTRAS="sklearn xgboost lightgbm mlflow"
RUN python3 -c "import os, tomllib; x = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']; print('\n'.join(r.replace('xgboost>=', 'xgboost-cpu>=') for e in os.environ['EXTRAS'].split() for r in x[e]))" > /extras.txt

# ---- deps: a virtualenv with the dependencies only ------------------------------------------
FROM python:3.11-slim AS deps
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
# Only the requirement list reaches this layer: an edit elsewhere in pyproject.toml (tests,
# lint settings) or in the code reuses the slow dependency install.
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY --from=requirements /extras.txt /tmp/extras.txt
RUN /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt -r /tmp/extras.txt

# ---- wheel: servekit built from this folder, so its package data (dashboard templates, static
# files, py.typed) ships exactly as `pip install servekit` ships it -------------------------------
FROM deps AS wheel
WORKDIR /src
COPY . .
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# ---- runtime: the same base, the virtualenv, the config and models, nothing else ------------
FROM python:3.11-slim
LABEL org.opencontainers.image.title="servekit" \
      org.opencontainers.image.description="serve.yaml -> Open Inference Protocol (KServe V2) over HTTP and gRPC" \
      org.opencontainers.image.licenses="Apache-2.0"
# /srv on the Python path: Python models' modules beside serve.yaml import from there even when
# serve.yaml itself is mounted elsewhere (KServe: /etc/servekit).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/srv \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# LightGBM's library needs OpenMP's runtime, which the slim base lacks. Unpinned on purpose:
# Debian's point releases replace the version (a pinned one leaves the mirror), and bookworm's
# libgomp1 only ever gets fixes.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
# A system user that owns nothing but its (empty) storage folder for models pushed by clients;
# the code, serve.yaml and models stay root-owned and read-only to the server.
RUN groupadd --system --gid 10001 servekit \
    && useradd --system --uid 10001 --gid servekit --home-dir /srv --no-create-home \
        --shell /usr/sbin/nologin servekit \
    && install -d -o servekit -g servekit /srv/.servekit
COPY --from=deps /opt/venv /opt/venv
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && python3 -c "import servekit.cli, servekit.server, servekit.export.k8s, sklearn, xgboost, lightgbm, mlflow.pyfunc"
WORKDIR /srv
# serve.yaml, the modules of Python models beside it (if any), and the model files.
COPY serve.yaml *.py ./
COPY models ./models
USER 10001:10001

# HTTP (REST, dashboard, /metrics) and gRPC.
EXPOSE 8000 8001
# Kubernetes probes /v2/health/live and /v2/health/ready itself (`servekit export k8s`); this
# HEALTHCHECK serves docker/podman (kept only by --format docker images).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/live', timeout=2).status != 200)"]
# servekit is PID 1 and handles SIGTERM itself: in-flight requests finish, then it exits 0.
# The HEALTHCHECK above and the probes need no token: health stays open whatever server.auth says.
ENTRYPOINT ["servekit"]
# No CONFIG named: /srv/serve.yaml, or MLServer's folder in an MLServer environment (above).
CMD ["serve", "--host", "0.0.0.0"]
