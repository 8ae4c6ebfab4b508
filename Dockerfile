# servekit image: runs `servekit serve /srv/serve.yaml` as a non-root user.
# Build: docker build -t servekit .   (or podman, see docs/ops.md)
# Run:   docker run -p 8000:8000 -p 8001:8001 servekit
# Replace /srv/serve.yaml and /srv/models by mounting your own (e.g. a ConfigMap and a volume).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/servekit
COPY pyproject.toml README.md ./
COPY app ./app
COPY templates ./templates
RUN python3 -m pip install --no-cache-dir . \
    && useradd --system --uid 10001 --home-dir /srv --shell /usr/sbin/nologin servekit

WORKDIR /srv
COPY --chown=10001:10001 serve.yaml /srv/serve.yaml
COPY --chown=10001:10001 models /srv/models
USER 10001

EXPOSE 8000 8001
# Liveness probe; Kubernetes uses /v2/health/live and /v2/health/ready (see `servekit export k8s`).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/v2/health/live', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["servekit"]
CMD ["serve", "/srv/serve.yaml", "--host", "0.0.0.0"]
