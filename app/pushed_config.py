"""The ``config`` parameter of a repository load request, turned into a servekit ModelConfig.

Two shapes are accepted. A servekit model entry (recognised by ``modelFormat``), exactly as in
serve.yaml. Or Triton's ModelConfig JSON, as tritonclient sends it and as
``GET /v2/models/{m}/config`` answers it (proto field names or their lowerCamelCase JSON forms):
``platform``/``backend`` give the format, ``input``/``output`` with ``data_type`` and ``dims``
become input/output declarations (the batch dimension prepended when ``max_batch_size > 0``),
and ``version_policy``, ``instance_group``, ``dynamic_batching``, ``parameters`` map onto their
serve.yaml counterparts. The V2-style ``inputs``/``outputs`` (datatype, shape) of the protocol's
own example are accepted too. Fields a Triton config cannot express (where the model lives, its
runtime) are taken from the model's current entry.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from app.config import ModelConfig
from app.datatypes import from_config_name
from app.errors import InvalidArgument

# Triton platform / backend names -> servekit model format.
FORMATS: dict[str, str] = {
    "onnxruntime_onnx": "onnx",
    "onnxruntime": "onnx",
    "onnx": "onnx",
    "python": "python",
}
SUFFIX_FORMATS: dict[str, str] = {".onnx": "onnx", ".py": "python"}
_INHERITED = ("runtime", "runtime_options", "default_version")
PUSHED = "(pushed files)"


def parse_load_config(
    name: str, text: object, current: ModelConfig | None, files: list[PurePosixPath]
) -> ModelConfig:
    """Validate ``text`` (JSON) into the ModelConfig of model ``name``."""
    if not isinstance(text, str):
        raise InvalidArgument("the config parameter must be a string holding JSON")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"the config parameter is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument("the config parameter must be a JSON object")
    given = data.get("name")
    if given not in (None, "", name):
        raise InvalidArgument(f"config names model {given!r} but the request loads {name!r}")
    if "modelFormat" in data or "model_format" in data:
        entry = {**data, "name": name}
    else:
        entry = from_triton(data, name, current, files)
    same_format = current is not None and _format_name(entry) == current.model_format.name.lower()
    has_source = _get(entry, "storage_uri") is not None or _get(entry, "entrypoint") is not None
    if files:
        if has_source:
            raise InvalidArgument("give either file: parameters or storageUri/entrypoint, not both")
        entry["storage_uri"] = PUSHED  # replaced by the push folder once the files are written
    elif current is not None and same_format and not has_source:
        entry["storage_uri"], entry["entrypoint"] = current.storage_uri, current.entrypoint
    if current is not None and same_format:
        for key in _INHERITED:
            if _get(entry, key) is None and getattr(current, key) is not None:
                entry[key] = getattr(current, key)
    try:
        return ModelConfig.model_validate(entry)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidArgument(f"invalid model config: {problems}") from None


def _get(data: dict[str, Any], key: str) -> Any:
    return data.get(key, data.get(to_camel(key)))


def _format_name(entry: dict[str, Any]) -> str:
    fmt = _get(entry, "model_format")
    return str(fmt.get("name", "")).lower() if isinstance(fmt, dict) else ""


def from_triton(
    data: dict[str, Any], name: str, current: ModelConfig | None, files: list[PurePosixPath]
) -> dict[str, Any]:
    """A servekit entry (snake_case keys) from Triton's ModelConfig JSON."""
    batch = _int(_get(data, "max_batch_size") or 0, "max_batch_size")
    entry: dict[str, Any] = {"name": name, "model_format": {"name": _format(data, current, files)}}
    if batch:
        entry["max_batch_size"] = batch
    for kind in ("input", "output"):
        tensors = _get(data, kind)
        if tensors is not None:
            entry[f"{kind}s"] = [_tensor(t, batch, kind) for t in _list(tensors, kind)]
        elif data.get(f"{kind}s") is not None:
            entry[f"{kind}s"] = data[f"{kind}s"]
    policy = _get(data, "version_policy")
    if isinstance(policy, dict) and policy:
        entry["version_policy"] = _version_policy(policy)
    groups = _get(data, "instance_group")
    if groups:
        entry["instances"] = sum(
            _int(_get(g, "count") or 1, "instance_group.count") for g in _list(groups, "group")
        )
    batching = _get(data, "dynamic_batching")
    if isinstance(batching, dict):
        entry["dynamic_batching"] = {
            "max_queue_delay_microseconds": _int(
                _get(batching, "max_queue_delay_microseconds") or 0, "max_queue_delay_microseconds"
            ),
            "preferred_batch_size": [
                _int(b, "preferred_batch_size")
                for b in _get(batching, "preferred_batch_size") or []
            ],
        }
    parameters = data.get("parameters")
    if isinstance(parameters, dict) and parameters:
        entry["parameters"] = {
            k: _get(v, "string_value") if isinstance(v, dict) else v for k, v in parameters.items()
        }
    return entry


def _format(data: dict[str, Any], current: ModelConfig | None, files: list[PurePosixPath]) -> str:
    for key in ("platform", "backend"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return FORMATS.get(value.lower(), value)
    for path in files:
        if path.suffix in SUFFIX_FORMATS:
            return SUFFIX_FORMATS[path.suffix]
    if current is not None:
        return current.model_format.name
    raise InvalidArgument("the config names no platform or backend (e.g. onnxruntime_onnx)")


def _tensor(item: object, batch: int, kind: str) -> dict[str, Any]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise InvalidArgument(f"each config {kind} must be an object with a name")
    out: dict[str, Any] = {"name": item["name"]}
    datatype = _get(item, "data_type")
    if isinstance(datatype, str):
        out["datatype"] = from_config_name(datatype).name
    dims = item.get("dims")
    if dims is not None:
        shape = [_int(d, f"{kind} {item['name']} dims") for d in _list(dims, "dims")]
        out["shape"] = [-1, *shape] if batch else shape
    return out


def _version_policy(policy: dict[str, Any]) -> dict[str, Any]:
    if "latest" in policy:
        latest = policy["latest"] or {}
        return {"latest": {"num_versions": _int(_get(latest, "num_versions") or 1, "num_versions")}}
    if "specific" in policy:
        versions = (policy["specific"] or {}).get("versions") or []
        return {"specific": {"versions": [_int(v, "versions") for v in _list(versions, "v")]}}
    return {"all": {}} if "all" in policy else policy


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidArgument(f"config: {what} must be a list")
    return value


def _int(value: object, what: str) -> int:
    """Proto JSON writes int64 as strings; accept both, refuse anything else."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidArgument(f"config: {what} must be an integer")
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"config: {what} must be an integer, got {value!r}") from None


def check_sources(
    model: ModelConfig, current: ModelConfig | None, base_dir: Path, storage_dir: Path
) -> None:
    """A pushed config may not import new code nor read files outside our folders."""
    if model.entrypoint is not None and (current is None or current.entrypoint != model.entrypoint):
        raise InvalidArgument(
            "a load request cannot name a new entrypoint (the server would import code "
            "chosen by the client); declare Python models in serve.yaml"
        )
    if model.storage_uri is not None and (
        current is None or current.storage_uri != model.storage_uri
    ):
        location = (base_dir / model.storage_uri).resolve()
        roots = (base_dir.resolve(), storage_dir.resolve())
        if not any(location.is_relative_to(root) for root in roots):
            raise InvalidArgument(
                "storageUri of a load request must lie inside serve.yaml's folder; push the "
                "files with file:<version>/<name> parameters instead"
            )
