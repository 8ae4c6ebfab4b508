"""``servekit export kserve`` (the generic ClusterServingRuntime and the per-model manifests)
against KServe's own CRD schemas and the Kubernetes schemas, offline and strict: what
``kubectl apply --validate=strict`` would accept on a cluster with KServe."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kserve_schemas import K8S_VERSION, validate_k8s, validate_kserve
from kubernetes_validate import utils as kv

from servekit.cli import main

SERVE_YAML = """\
server: {name: shop}
models:
  - name: ranker
    modelFormat: {name: onnx}
    storageUri: s3://models/ranker
  - name: churn
    modelFormat: {name: sklearn}
    storageUri: gs://models/churn
"""


def _export(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    assert main(["export", "kserve", *argv]) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


@pytest.fixture
def runtime(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    (doc,) = _export(capsys, "--cluster-runtime", "--image", "registry.example/servekit:1")
    return doc


def test_the_cluster_runtime_passes_kserve_and_kubernetes_schemas(runtime: dict[str, Any]) -> None:
    validate_kserve(runtime)
    for container in runtime["spec"]["containers"]:
        validate_k8s(container, "container-v1")


def test_the_cluster_runtime_is_kserve_servekit(runtime: dict[str, Any]) -> None:
    assert runtime["kind"] == "ClusterServingRuntime"
    assert runtime["metadata"]["name"] == "kserve-servekit"
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v1", "v2", "grpc-v2"]
    assert spec["annotations"] == {
        "prometheus.kserve.io/port": "8080",
        "prometheus.kserve.io/path": "/metrics",
    }
    formats = {(f["name"], f["version"]) for f in spec["supportedModelFormats"]}
    assert formats == {
        ("onnx", "1"), ("sklearn", "1"), ("xgboost", "1"), ("xgboost", "2"), ("xgboost", "3"),
        ("lightgbm", "3"), ("lightgbm", "4"), ("mlflow", "1"), ("mlflow", "2"), ("mlflow", "3"),
    }  # fmt: skip
    # Below kserve-mlserver's 2: chosen when named, or once kserve-mlserver is gone.
    assert all(
        f["autoSelect"] is True and f["priority"] == 1 for f in spec["supportedModelFormats"]
    )
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    assert container["image"] == "registry.example/servekit:1"
    args = container["args"]
    assert args[0] == "serve" and "config" not in args
    assert args[args.index("--model-dir") + 1] == "/mnt/models"
    assert args[args.index("--model-name") + 1] == "{{.Name}}"
    assert args[args.index("--http-port") + 1] == "8080"
    assert args[args.index("--grpc-port") + 1] == "8081"
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    # What KServe's own runtimes set (config/runtimes/kserve-sklearnserver.yaml and the others).
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_priority_flag(capsys: pytest.CaptureFixture[str]) -> None:
    (doc,) = _export(capsys, "--cluster-runtime", "--priority", "3")
    assert {f["priority"] for f in doc["spec"]["supportedModelFormats"]} == {3}
    validate_kserve(doc)
    with pytest.raises(SystemExit):
        main(["export", "kserve", "--cluster-runtime", "--priority", "0"])


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "protocolVersion"), ["v2"]),  # misspelt: protocolVersions
        (("spec", "supportedModelFormats", 0, "priority"), "high"),
        (("spec", "supportedModelFormats", 0, "autoselect"), True),
        (("spec", "containers", 0, "readinessProbe", "httpGet", "paths"), "/v2/health/ready"),
        (("spec", "multiModel"), "no"),
    ],
)
def test_a_wrong_field_fails_the_schema_check(
    runtime: dict[str, Any], path: tuple[Any, ...], value: object
) -> None:
    broken = copy.deepcopy(runtime)
    target: Any = broken
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate_kserve(broken)
        validate_k8s(broken["spec"]["containers"][0], "container-v1")


def test_a_wrong_container_field_fails_the_kubernetes_check(runtime: dict[str, Any]) -> None:
    container = copy.deepcopy(runtime["spec"]["containers"][0])
    container["securityContext"]["runAsNonroot"] = True
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s(container, "container-v1")


def test_every_per_model_manifest_passes_both_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE_YAML)
    for grpc in ((), ("--grpc",)):
        docs = _export(capsys, str(config), *grpc)
        kinds = sorted(d["kind"] for d in docs)
        assert kinds == ["ConfigMap", "InferenceService", "InferenceService", "ServingRuntime"]
        for doc in docs:
            if doc["apiVersion"].startswith("serving.kserve.io/"):
                validate_kserve(doc)
            else:
                kv.validate(doc, K8S_VERSION, strict=True)
        (runtime,) = (d for d in docs if d["kind"] == "ServingRuntime")
        for container in runtime["spec"]["containers"]:
            validate_k8s(container, "container-v1")


TUNED_YAML = """\
server:
  name: shop
  drainDelaySeconds: 6
  drainSeconds: 40
  kubernetes:
    minReplicas: 2
    maxReplicas: 6
    scaleMetric: cpu
    scaleTarget: 70
    startupSeconds: 120
models:
  - name: churn
    modelFormat: {name: sklearn}
    storageUri: gs://models/churn
"""


def _per_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> dict[str, list[dict[str, Any]]]:
    config = tmp_path / "serve.yaml"
    config.write_text(text)
    found: dict[str, list[dict[str, Any]]] = {}
    for doc in _export(capsys, str(config)):
        found.setdefault(doc["kind"], []).append(doc)
    return found


def test_the_cluster_runtime_allows_for_warm_up(runtime: dict[str, Any]) -> None:
    """Liveness waits for the startupProbe, which allows startupSeconds' default (600 s) for
    the model to load and warm up; readiness is seen within the default drainDelaySeconds."""
    (container,) = runtime["spec"]["containers"]
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert startup["periodSeconds"] * startup["failureThreshold"] == 600
    ready = container["readinessProbe"]
    assert ready["periodSeconds"] * ready["failureThreshold"] < 5
    # Knative refuses lifecycle on the user container, and SIGTERM alone starts the drain.
    assert "lifecycle" not in container


def test_server_kubernetes_becomes_the_predictor_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _per_model(tmp_path, capsys, TUNED_YAML)
    (isvc,) = docs["InferenceService"]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    predictor = isvc["spec"]["predictor"]
    assert {k: v for k, v in predictor.items() if k != "model"} == {
        "minReplicas": 2,
        "maxReplicas": 6,
        "scaleMetric": "cpu",
        "scaleTarget": 70,
        # drainDelaySeconds + drainSeconds + 10 s for closing: the kubelet waits for the drain
        "terminationGracePeriodSeconds": 56,
    }
    (container,) = docs["ServingRuntime"][0]["spec"]["containers"]
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 120
    assert "lifecycle" not in container
    for doc in (isvc, docs["ServingRuntime"][0]):
        validate_kserve(doc)
    validate_k8s(container, "container-v1")


def test_knative_mode_leaves_the_stop_to_knative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Knative's webhook refuses a pod's terminationGracePeriodSeconds (its revision timeout
    is the grace) and a container's lifecycle (its own preStop waits for queue-proxy)."""
    text = (
        TUNED_YAML.replace("minReplicas: 2", "minReplicas: 0")
        .replace("scaleMetric: cpu", "scaleMetric: concurrency")
        .replace("kubernetes:", "kubernetes:\n    deploymentMode: Knative")
    )
    (isvc,) = _per_model(tmp_path, capsys, text)["InferenceService"]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Knative"
    predictor = isvc["spec"]["predictor"]
    assert "terminationGracePeriodSeconds" not in predictor
    assert (predictor["minReplicas"], predictor["scaleMetric"]) == (0, "concurrency")
    validate_kserve(isvc)


def test_the_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No server.kubernetes: 1 to 10 replicas, KServe's own scale metric, Standard mode, grace
    of at least Kubernetes' 30 s."""
    (isvc,) = _per_model(
        tmp_path,
        capsys,
        TUNED_YAML.split("  kubernetes:")[0]
        + ("models: [{name: churn, modelFormat: {name: sklearn}, storageUri: gs://m/churn}]\n"),
    )["InferenceService"]
    predictor = isvc["spec"]["predictor"]
    assert {k: v for k, v in predictor.items() if k != "model"} == {
        "minReplicas": 1,
        "maxReplicas": 10,
        "terminationGracePeriodSeconds": 56,
    }


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ("{scaleMetric: rps}", "scaleMetric rps is Knative's"),
        ("{minReplicas: 0}", "minReplicas 0 (scale to zero) needs deploymentMode: Knative"),
        ("{minReplicas: 4, maxReplicas: 3}", "maxReplicas 3 is below minReplicas 4"),
        ("{scaleTarget: 50}", "scaleTarget needs scaleMetric"),
        ("{scaleMetric: memory}", "scaleMetric memory needs scaleTarget"),
        ("{scaleMetric: latency}", "scaleMetric"),
        ("{deploymentMode: RawDeployment}", "deploymentMode"),
        ("{startupSeconds: 1}", "startupSeconds"),
        ("{maxReplica: 3}", "did you mean 'maxReplicas'"),
    ],
)
def test_a_wrong_setting_is_refused_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], settings: str, words: str
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"server:\n  kubernetes: {settings}\n"
        "models: [{name: churn, modelFormat: {name: sklearn}, storageUri: gs://m/churn}]\n"
    )
    assert main(["export", "kserve", str(config)]) == 1
    err = capsys.readouterr().err
    assert words in err and "serve.yaml:2: server.kubernetes" in err


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "predictor", "scaleMetric"), "latency"),
        (("spec", "predictor", "minReplicas"), "two"),
        (("spec", "predictor", "scaleTargets"), 70),  # misspelt: scaleTarget
        (("spec", "predictor", "terminationGracePeriodSeconds"), "56s"),
        (("spec", "predictor", "model", "modelformat"), {"name": "sklearn"}),
    ],
)
def test_a_wrong_inference_service_field_fails_the_schema_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: tuple[str, ...], value: object
) -> None:
    (isvc,) = _per_model(tmp_path, capsys, TUNED_YAML)["InferenceService"]
    validate_kserve(isvc)
    target: Any = isvc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate_kserve(isvc)


@pytest.mark.parametrize(
    ("field", "value"),
    [("failureThreshold", "many"), ("periodSecond", 5), ("httpGet", {"paths": "/"})],
)
def test_a_wrong_startup_probe_fails_the_kubernetes_check(
    runtime: dict[str, Any], field: str, value: object
) -> None:
    container = copy.deepcopy(runtime["spec"]["containers"][0])
    container["startupProbe"][field] = value
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s(container, "container-v1")


@pytest.mark.slow  # runs kubectl
def test_kubectl_kustomize_builds_the_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The export is a resource kustomize takes as written (offline: ``kubectl kustomize``
    needs no cluster): both exports side by side, the image set over them by kustomize."""
    config = tmp_path / "serve.yaml"
    config.write_text(TUNED_YAML)
    folder = tmp_path / "deploy"
    folder.mkdir()
    expected: list[tuple[str, str]] = []
    for name, argv in (
        ("kserve.yaml", [str(config)]),
        ("kserve-servekit.yaml", ["--cluster-runtime"]),
    ):
        assert main(["export", "kserve", *argv, "--image", "servekit:0.1.0"]) == 0
        text = capsys.readouterr().out
        (folder / name).write_text(text)
        expected += [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(text)]
    (folder / "kustomization.yaml").write_text(
        "resources: [kserve.yaml, kserve-servekit.yaml]\n"
        "images: [{name: servekit, newName: registry.example.com/servekit, newTag: 0.2.0}]\n"
    )
    built = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    docs = list(yaml.safe_load_all(built.stdout))
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(expected)
    assert len(expected) == 4  # ConfigMap, ServingRuntime, InferenceService; the cluster runtime
    for doc in docs:
        for container in doc.get("spec", {}).get("containers", []):
            assert container["image"] == "registry.example.com/servekit:0.2.0"
        if doc["apiVersion"].startswith("serving.kserve.io/"):
            validate_kserve(doc)
        else:
            kv.validate(doc, K8S_VERSION, strict=True)
