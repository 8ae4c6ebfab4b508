"""KServe manifests (``servekit export kserve``): a ServingRuntime, one InferenceService a model.

KServe mounts a model's storageUri at /mnt/models and fills ``{{.Name}}`` in the runtime's args
with the InferenceService's name, so each pod runs ``servekit serve /etc/servekit/serve.yaml
--only {{.Name}} --storage-uri /mnt/models``: one model, with its settings (version policy,
batching, instances, runtime options) read from the serve.yaml ConfigMap. The ServingRuntime
lists the formats of the plan's runtimes with their autoSelect and priority, so KServe's choice
of runtime matches servekit's own (app/servekit/config/compiler.py). As in the Deployment, the
container listens on every interface (``--host 0.0.0.0``), its probes need no token, and the
tokens of ``server.auth`` come from the Secret ops create (app/servekit/export/secrets.py); a
token file may not lie in the folders KServe fills itself (the ConfigMap at /etc/servekit, the
model at /mnt/models).

serve.yaml's ``server.kubernetes`` (KubernetesConfig in app/servekit/config/schema.py) sets each
InferenceService's deployment mode, replicas and scale target, and the startupProbe's allowance.
In KServe's ``Standard`` mode the pod's ``terminationGracePeriodSeconds`` covers the server's
withdrawal and drain (``stop_timing``, as for ``servekit export k8s``). There is no preStop hook:
SIGTERM itself opens servekit's unready-but-serving window, which a preStop ``sleep`` would only
delay; and in ``Knative`` mode Knative refuses both fields (its queue-proxy drains first, through
its own preStop hook, and its revision timeout is the grace period).
"""

from __future__ import annotations

import math
import re

from servekit.config.compiler import BUILTIN_RUNTIMES, ServePlan
from servekit.config.model_dir import FORMATS
from servekit.config.schema import PIPELINE_FORMAT, KubernetesConfig
from servekit.export.k8s import (
    STORAGE_ENV,
    UID,
    ExportError,
    Manifest,
    config_map,
    container_security,
    container_tokens,
    k8s_name,
    labels,
    probe,
    volumes,
)
from servekit.export.scaling import READINESS_FAILURES, READINESS_PERIOD, stop_timing

HTTP_PORT, GRPC_PORT = 8080, 8081
"""KServe routes HTTP to 8080; gRPC goes out as the ``h2c`` port when asked for."""
MODEL_DIR = "/mnt/models"
CONFIG_DIR = "/etc/servekit"
PVC_PLACEHOLDER = "servekit-models"
URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
"""A storageUri KServe can fetch itself (s3://, gs://, pvc://, https://, ...)."""
STARTUP_PERIOD = 5
"""Seconds between two startupProbe checks; ``server.kubernetes.startupSeconds`` sets how many
may fail."""
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"


def kserve_manifests(
    plan: ServePlan, config_text: str, image: str, *, grpc: bool = False
) -> list[Manifest]:
    """ConfigMap + ServingRuntime + one InferenceService per model.

    With ``grpc`` the InferenceServices expose the gRPC port (``h2c``) through KServe instead of
    HTTP: Knative routes one port per service, so a service offers one of the two outside.
    """
    runtime_name = k8s_name(plan.server.name)
    names = [k8s_name(model.name) for model in plan.models]
    for dup in {n for n in names if names.count(n) > 1}:
        clash = [m.name for m, n in zip(plan.models, names, strict=True) if n == dup]
        raise ExportError(f"models {', '.join(clash)} all become InferenceService {dup!r}")
    container = _kserve_container(image, plan.server.kubernetes)
    used = [str(m["mountPath"]) for m in container["volumeMounts"]]
    # No pod fsGroup here (KServe owns the pod spec): token files keep Kubernetes' default mode.
    tokens = container_tokens(plan, CONFIG_DIR, used=used, filled=(CONFIG_DIR, MODEL_DIR))
    container["env"] = [*container["env"], *tokens.env]
    container["volumeMounts"] = [*container["volumeMounts"], *tokens.mounts]
    mounted = {mount["name"] for mount in container["volumeMounts"]}
    runtime = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": runtime_name, "labels": labels(plan)},
        "spec": {
            "supportedModelFormats": supported_formats(plan),
            "protocolVersions": ["v2", "grpc-v2"],
            "multiModel": False,
            # Pod annotations: KServe's own metrics aggregation reads these.
            "annotations": {
                "prometheus.kserve.io/port": str(HTTP_PORT),
                "prometheus.kserve.io/path": "/metrics",
            },
            "containers": [container],
            # Those the container mounts: KServe's storage initializer fills /mnt/models, so
            # the cache a plain Deployment gives remote models has no place here.
            "volumes": [v for v in [*volumes(plan), *tokens.volumes] if v["name"] in mounted],
        },
    }
    services = [
        _inference_service(plan, index, name, runtime_name, grpc)
        for index, name in enumerate(names)
    ]
    return [config_map(plan, config_text), runtime, *services]


def supported_formats(plan: ServePlan) -> list[Manifest]:
    """Every (format, version) of the plan's runtimes once; autoSelect and the highest priority
    as configured (KServe reads priority only for auto-selectable formats)."""
    merged: dict[tuple[str, str | None], Manifest] = {}
    for runtime in plan.runtimes:
        for fmt in runtime.supported_model_formats:
            entry = merged.setdefault((fmt.name, fmt.version), {"name": fmt.name})
            if fmt.version is not None:
                entry["version"] = fmt.version
            if fmt.auto_select:
                entry["autoSelect"] = True
                entry["priority"] = max(entry.get("priority", 0), fmt.priority)
    if any(model.pipeline for model in plan.models):  # its InferenceService names this format
        merged.setdefault((PIPELINE_FORMAT, None), {"name": PIPELINE_FORMAT})
    return list(merged.values())


def _servekit_container(image: str, args: list[str], settings: KubernetesConfig) -> Manifest:
    """What both KServe runtimes' containers share: the name KServe merges an
    InferenceService's predictor into, servekit with ``args``, and the probes. The startupProbe
    waits for readiness (the model loaded and warmed up) for up to ``settings.startup_seconds``
    before the kubelet restarts the container; liveness (the listeners answer) is checked once
    it passed. Readiness is seen within 4 s (as in ``servekit export k8s``: within the default
    ``drainDelaySeconds``); an InferenceService's own readinessProbe, such as
    /v2/models/NAME/ready, replaces it."""
    failures = math.ceil(settings.startup_seconds / STARTUP_PERIOD)
    return {
        "name": "kserve-container",
        "image": image,
        "command": ["servekit"],
        "args": args,
        "env": [STORAGE_ENV],
        "startupProbe": probe(
            "/v2/health/ready", HTTP_PORT, period=STARTUP_PERIOD, failures=failures
        ),
        "livenessProbe": probe("/v2/health/live", HTTP_PORT, period=10, failures=3),
        "readinessProbe": probe(
            "/v2/health/ready", HTTP_PORT, period=READINESS_PERIOD, failures=READINESS_FAILURES
        ),
    }


def _kserve_container(image: str, settings: KubernetesConfig) -> Manifest:
    args = [
        "serve", f"{CONFIG_DIR}/serve.yaml", "--only", "{{.Name}}",
        "--storage-uri", MODEL_DIR, "--host", "0.0.0.0",
        "--http-port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT),
        "--workers", "1",  # the predictor's CPU request below is one core
    ]  # fmt: skip
    return {
        **_servekit_container(image, args, settings),
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {**container_security(), "runAsNonRoot": True, "runAsUser": UID},
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _inference_service(
    plan: ServePlan, index: int, name: str, runtime: str, grpc: bool
) -> Manifest:
    model = plan.models[index]
    fmt: Manifest = {"name": model.format_name}
    if model.format_version is not None:
        fmt["version"] = model.format_version
    spec: Manifest = {"modelFormat": fmt, "runtime": runtime}
    annotations = {"servekit.io/model": model.name}
    uri = model.config.storage_uri if model.config is not None else None
    if model.pipeline:
        annotations.update(_pipeline_notes(plan, index))
    if uri is not None and URI.match(uri):
        spec["storageUri"] = uri
    elif uri is not None:
        spec["storageUri"] = f"pvc://{PVC_PLACEHOLDER}/{model.name}"
        what = "the file" if (plan.base_dir / uri).is_file() else "the contents of folder"
        annotations["servekit.io/todo"] = (
            f"upload {what} {uri} (relative to serve.yaml) to path {model.name}/ of the "
            f"PersistentVolumeClaim {PVC_PLACEHOLDER}, or set storageUri to where the model "
            "already is (s3://, gs://, pvc://)"
        )
    if grpc:
        spec["protocolVersion"] = "grpc-v2"
        spec["ports"] = [{"name": "h2c", "containerPort": GRPC_PORT, "protocol": "TCP"}]
    annotations[DEPLOYMENT_MODE] = plan.server.kubernetes.deployment_mode
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "labels": labels(plan), "annotations": annotations},
        "spec": {"predictor": {**predictor_scaling(plan), "model": spec}},
    }


def predictor_scaling(plan: ServePlan) -> Manifest:
    """The predictor's replicas and scale target from ``server.kubernetes``, and in KServe's
    Standard mode the pod's grace period: the withdrawal, the drain and a margin
    (app/servekit/export/scaling.py), so the kubelet never kills a draining pod."""
    settings = plan.server.kubernetes
    found: Manifest = {
        "minReplicas": settings.min_replicas,
        "maxReplicas": settings.max_replicas,
    }
    if settings.scale_metric is not None:
        found["scaleMetric"] = settings.scale_metric
    if settings.scale_target is not None:
        found["scaleTarget"] = settings.scale_target
    if settings.deployment_mode == "Standard":
        found["terminationGracePeriodSeconds"] = stop_timing(plan).grace_seconds
    return found


def _pipeline_notes(plan: ServePlan, index: int) -> dict[str, str]:
    """A pipeline's pod serves its steps' models too (``--only`` takes them along), each from
    its own storageUri: name them, and what to do about steps whose files are local."""
    by_name = {m.name: m for m in plan.models}
    steps: list[str] = []
    todo = [step.model for step in plan.models[index].pipeline]
    while todo:
        name = todo.pop(0)
        if name in steps or name not in by_name:
            continue
        steps.append(name)
        todo.extend(step.model for step in by_name[name].pipeline)
    notes = {"servekit.io/steps": ", ".join(steps)}
    local = [
        name
        for name in steps
        if (config := by_name[name].config) is not None
        and config.storage_uri is not None
        and not URI.match(config.storage_uri)
    ]
    if local:
        notes["servekit.io/todo"] = (
            f"the steps {', '.join(local)} read files relative to serve.yaml: set their "
            "storageUri to where the pod can read them (s3://, gs://, https://)"
        )
    return notes


CLUSTER_RUNTIME = "kserve-servekit"
DEFAULT_PRIORITY = 1
"""Below kserve-mlserver's 2: KServe picks servekit for an InferenceService that names
``runtime: kserve-servekit``, or for every one once kserve-mlserver is removed."""
KSERVE_SECURITY = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}
"""The container securityContext of KServe's own runtimes (config/runtimes/kserve-*.yaml)."""


CLUSTER_HEADER = """Generated by `servekit export kserve --cluster-runtime`.
Apply: kubectl apply -f FILE (cluster-wide, beside KServe's own runtimes).
Serves an InferenceService with modelFormat sklearn, xgboost, lightgbm, mlflow or onnx that names
runtime: kserve-servekit (or any, once kserve-mlserver is removed), from /mnt/models."""


def cluster_runtime(image: str, *, priority: int = DEFAULT_PRIORITY) -> Manifest:
    """The ClusterServingRuntime ``kserve-servekit``: one InferenceService a pod, its model
    from /mnt/models as ``{{.Name}}``, HTTP (V1 and V2) on 8080 and gRPC (V2) on 8081."""
    args = [
        "serve", "--model-dir", MODEL_DIR, "--model-name", "{{.Name}}",
        "--host", "0.0.0.0", "--http-port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT),
        "--workers", "1",  # the CPU request below is one core; an InferenceService's
        # args (appended by KServe) may say --workers=N with N cores
    ]  # fmt: skip
    container: Manifest = {
        # no serve.yaml: the startupProbe allows server.kubernetes.startupSeconds' default
        **_servekit_container(image, args, KubernetesConfig()),
        "resources": {
            "requests": {"cpu": "1", "memory": "2Gi"},
            "limits": {"cpu": "1", "memory": "2Gi"},
        },
        "securityContext": dict(KSERVE_SECURITY),
    }
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ClusterServingRuntime",
        "metadata": {
            "name": CLUSTER_RUNTIME,
            "labels": {"app.kubernetes.io/name": "servekit"},
            "annotations": {"serving.kserve.io/server-type": "servekit"},
        },
        "spec": {
            "annotations": {
                "prometheus.kserve.io/port": str(HTTP_PORT),
                "prometheus.kserve.io/path": "/metrics",
            },
            "supportedModelFormats": cluster_formats(priority),
            "protocolVersions": ["v1", "v2", "grpc-v2"],
            "multiModel": False,
            "containers": [container],
        },
    }


def cluster_formats(priority: int) -> list[Manifest]:
    """Every format and version servekit serves from a model folder, all auto-selectable."""
    return [
        {"name": fmt.name, "version": fmt.version, "autoSelect": True, "priority": priority}
        for runtime in BUILTIN_RUNTIMES
        for fmt in runtime.supported_model_formats
        if fmt.name in FORMATS and fmt.version is not None
    ]
