"""``servekit export kserve`` (the generic ClusterServingRuntime and the per-model manifests)
against KServe's own CRD schemas and the Kubernetes schemas, offline and strict: what
``kubectl apply --validate=strict`` would accept on a cluster with KServe."""

from __future__ import annotations

import copy
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
