"""KServe's CRD schemas (vendored in tests/data/kserve-crds/) and the Kubernetes schemas, applied
the way ``kubectl apply --validate=strict`` does: a field the schema does not know is an error
(the API server would otherwise drop it without a word), a wrong type or value too."""

from __future__ import annotations

import copy
import gzip
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import referencing
import yaml
from kubernetes_validate import utils as kv

CRDS = Path(__file__).with_name("data") / "kserve-crds"
K8S_VERSION = "1.30.0"
PLURALS = {
    "ClusterServingRuntime": "clusterservingruntimes",
    "ServingRuntime": "servingruntimes",
    "InferenceService": "inferenceservices",
}


@cache
def crd_schema(kind: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of ``kind`` at ``version``, unknown fields refused."""
    path = CRDS / f"serving.kserve.io_{PLURALS[kind]}.yaml.gz"
    crd = yaml.load(gzip.decompress(path.read_bytes()), Loader=yaml.CSafeLoader)
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return _strict(copy.deepcopy(entry["schema"]["openAPIV3Schema"]))
    raise KeyError(f"{kind} has no version {version}")


def _strict(schema: Any) -> Any:
    """Objects with listed properties take no others, unless the schema keeps unknown fields
    (``x-kubernetes-preserve-unknown-fields``), as strict field validation reads it."""
    if isinstance(schema, dict):
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            _strict(value)
    elif isinstance(schema, list):
        for value in schema:
            _strict(value)
    return schema


def validate_kserve(manifest: dict[str, Any]) -> None:
    """Validate a KServe object against its CRD; raise jsonschema's ValidationError."""
    group, _, version = manifest["apiVersion"].partition("/")
    assert group == "serving.kserve.io", manifest["apiVersion"]
    jsonschema.Draft7Validator(crd_schema(manifest["kind"], version)).validate(manifest)


def validate_k8s(instance: object, definition: str) -> None:
    """Validate against one definition of the Kubernetes schema (strict), e.g. container-v1."""
    directory = f"kubernetes-json-schema/v{K8S_VERSION}-local-strict"
    schema = kv.schema_contents(f"{directory}/{definition}.json", K8S_VERSION)
    definitions = kv.schema_contents(f"{directory}/_definitions.json", K8S_VERSION)
    registry: referencing.Registry[Any] = referencing.Registry().with_resources(
        [("_definitions.json", referencing.Resource.from_contents(definitions))]
    )
    jsonschema.Draft202012Validator(schema, registry=registry).validate(instance)
