"""The ``config`` parameter of a repository load request, turned into a servekit ModelConfig.

Two shapes are accepted. A servekit model entry (recognised by ``modelFormat``), exactly as in
serve.yaml. Or Triton's ModelConfig JSON, as tritonclient sends it and as ``GET
/v2/models/{m}/config`` answers it (proto field names or their lowerCamelCase JSON forms):
``platform``/``backend`` give the format, ``input``/``output`` with ``data_type`` and ``dims``
become input/output declarations (the batch dimension prepended when ``max_batch_size > 0``), and
``version_policy``, ``instance_group``, ``dynamic_batching`` (its ``default_queue_policy`` giving
``maxQueueSize`` and ``queueTimeoutMicroseconds``), ``parameters`` map onto their serve.yaml
counterparts. The V2-style ``inputs``/``outputs`` (datatype, shape) of the protocol's own example
are accepted too. Fields a Triton config cannot express (where the model lives, its runtime) are
taken from the model's current entry.

A pushed config is a client's data, so it is checked before anything is written or loaded:

* Nothing in it may choose code. A Python model's code-reaching fields (entrypoint,
  ``parameters`` that its ``load()`` receives, runtime, runtimeOptions, storageUri, format) come
  from serve.yaml (or the notebook API in the server's own process) and a load request may only
  repeat them; no load request makes a model a Python model. The same holds for its isolation
  settings (``isolation``, ``timeoutSeconds``, ``memoryLimitBytes``). An ONNX model may use only the
  execution providers serve.yaml gives it (a provider such as Azure's makes network calls).
* Nothing in it may point outside the server's model folders: a new storageUri lies inside
  serve.yaml's folder, not in a hidden folder nor in the storage of pushed models.
* It is bounded by ``server.limits`` (instances, runtime threads, versions) and by int64, the
  range of Triton's protobuf config; like serve.yaml, by the schema's own bounds, such as
  ``maxQueueDelayMicroseconds`` at most 1 s (a pushed config cannot make requests wait on a
  batch indefinitely). A value equal to what the model already has is accepted
  (serve.yaml itself is not bounded by the limits), so a config read with
  ``GET /v2/models/{m}/config`` can be sent back.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from servekit.config.compiler import ModelPlan
from servekit.config.loader import validator_message
from servekit.config.schema import INT64_MAX, Limits, ModelConfig, RuntimeConfig
from servekit.datatypes import from_config_name
from servekit.errors import InvalidArgument, PermissionDenied
from servekit.shown_paths import PUSHED_LABEL

# Triton platform / backend names -> servekit model format.
FORMATS: dict[str, str] = {
    "onnxruntime_onnx": "onnx",
    "onnxruntime": "onnx",
    "onnx": "onnx",
    "python": "python",
}
SUFFIX_FORMATS: dict[str, str] = {".onnx": "onnx", ".py": "python"}
_INHERITED = ("runtime", "runtime_options", "default_version")
PUSHED = PUSHED_LABEL
CODE_FIELDS = (
    "entrypoint",
    "parameters",
    "runtime",
    "runtime_options",
    "storage_uri",
    "model_format",
)
"""Fields of a Python model that reach its code: only serve.yaml may set them."""
CONTAINMENT_FIELDS = ("isolation", "timeout_seconds", "memory_limit_bytes")
"""Fields that hold a Python model's code in its own process and bounds: only serve.yaml may
set them too (a load request must not move an isolated model into the server's process, nor
lift its limits; a Triton config, which cannot express them, keeps serve.yaml's)."""
SERVE_YAML_ONLY = CODE_FIELDS + CONTAINMENT_FIELDS
DEFAULT_PROVIDERS = ("CPUExecutionProvider",)
_PICKLE = (
    "its files are pickles, which run code when they load, so such models are declared in "
    "serve.yaml (or --watch) by whoever may place files there"
)
_LIBRARY = (
    "its files go to a model library's own loader, so such models are declared in serve.yaml "
    "(or --watch), like the pickled formats"
)
DECLARED_ONLY: dict[str, str] = {
    "python": "Python models run code, so they are declared in serve.yaml (entrypoint, parameters)",
    "sklearn": _PICKLE,
    "mlflow": _PICKLE,
    "xgboost": _LIBRARY,
    "lightgbm": _LIBRARY,
}
"""Runtime implementations whose models only serve.yaml declares: a load request may reload
them with serve.yaml's code-reaching fields, never make a model one of them nor point one at
other files (app/servekit/runtimes/tabular.py: scikit-learn and MLflow files are pickles)."""


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
    except RecursionError:
        raise InvalidArgument("the config parameter is nested too deeply") from None
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
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {validator_message(e['msg'])}"
            for e in exc.errors()
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
        policy = _get(batching, "default_queue_policy")
        if isinstance(policy, dict):
            entry.update(_queue_policy(policy))
    parameters = data.get("parameters")
    if isinstance(parameters, dict) and parameters:
        entry["parameters"] = {
            k: _get(v, "string_value") if isinstance(v, dict) else v for k, v in parameters.items()
        }
    return entry


def _queue_policy(policy: dict[str, Any]) -> dict[str, Any]:
    """Triton's ``default_queue_policy`` as serve.yaml's queue bounds (what
    ``GET /v2/models/{m}/config`` reports them as, so a config read there can be sent back).
    Only ``REJECT`` can be honoured: servekit answers an expired request at once, it never
    delays it behind the others. ``allow_timeout_override`` needs no field: a request's
    ``timeout`` parameter may always shorten its own wait, never lengthen it."""
    action = _get(policy, "timeout_action")
    if action not in (None, "REJECT", 0):
        raise InvalidArgument(
            f"config: dynamic_batching.default_queue_policy.timeout_action {action!r:.40} is not "
            "offered; servekit answers a request that waited past its timeout at once "
            "(REJECT: 504 / DEADLINE_EXCEEDED)"
        )
    out: dict[str, Any] = {}
    size = _get(policy, "max_queue_size")
    if size is not None:
        out["max_queue_size"] = _int(size, "default_queue_policy.max_queue_size")
    timeout = _get(policy, "default_timeout_microseconds")
    if timeout is not None:
        out["queue_timeout_microseconds"] = _int(
            timeout, "default_queue_policy.default_timeout_microseconds"
        )
    return out


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
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"config: {what} must be an integer, got {value!r:.40}") from None
    if not -INT64_MAX - 1 <= number <= INT64_MAX:
        raise InvalidArgument(f"config: {what} {value!s:.40} is beyond int64")
    return number


def check_code(
    model: ModelConfig, runtime: RuntimeConfig, current: ModelPlan | None
) -> ModelConfig:
    """Refuse what would let a load request choose code; returns ``model`` with a Python
    model's code-reaching fields as serve.yaml declared them (a config may leave them out)."""
    name = model.name
    if runtime.implementation not in DECLARED_ONLY:
        if model.entrypoint is not None and (
            current is None or current.entrypoint != model.entrypoint
        ):
            raise PermissionDenied(
                f"a load request cannot name a new entrypoint for {name!r} (the server would "
                "import code chosen by the client); declare Python models in serve.yaml"
            )
        _check_providers(model, runtime, current)
        return model
    kind = "Python" if runtime.implementation == "python" else runtime.implementation
    why = DECLARED_ONLY[runtime.implementation]
    declared = (
        current.config
        if current is not None and current.implementation == runtime.implementation
        else None
    )
    if declared is None:
        raise PermissionDenied(f"a load request cannot make {name!r} a {kind} model: {why}")
    changed = [
        field
        for field in SERVE_YAML_ONLY
        if field in model.model_fields_set
        and not _same(field, getattr(model, field), getattr(declared, field))
    ]
    if changed:
        fields = ", ".join(to_camel(f) for f in changed)
        raise PermissionDenied(
            f"{name!r} is a {kind} model: a load request cannot change its {fields} (they reach "
            "or contain its code); only serve.yaml can"
        )
    return model.model_copy(update={field: getattr(declared, field) for field in SERVE_YAML_ONLY})


def _same(field: str, given: Any, declared: Any) -> bool:
    """Whether a pushed value repeats the declared one (a Triton config carries parameters as
    the strings ``GET /v2/models/{m}/config`` rendered them)."""
    if field == "model_format":
        return bool(
            given.name.lower() == declared.name.lower()
            and given.version in (None, declared.version)
        )
    if field == "parameters" and isinstance(given, dict) and given.keys() == declared.keys():
        return all(
            given[k] in (v, v if isinstance(v, str) else json.dumps(v)) for k, v in declared.items()
        )
    return bool(given == declared)


def _check_providers(model: ModelConfig, runtime: RuntimeConfig, current: ModelPlan | None) -> None:
    """Execution providers are chosen in serve.yaml: a pushed config may only narrow them."""
    options = model.runtime_options
    if options is None or options.execution_providers is None:
        return
    allowed = set(runtime.options.execution_providers or DEFAULT_PROVIDERS)
    if current is not None:
        allowed.update(current.options.execution_providers)
    extra = [p for p in options.execution_providers if p not in allowed]
    if extra:
        raise PermissionDenied(
            f"executionProviders {', '.join(map(repr, extra))} can only be chosen in serve.yaml; "
            f"{model.name!r} may use {', '.join(sorted(allowed))}"
        )


def check_limits(
    model: ModelConfig, current: ModelConfig | None, limits: Limits, pushed_versions: int = 0
) -> None:
    """Refuse a pushed config beyond ``server.limits`` (values the model already has pass)."""

    def bound(what: str, value: int | None, was: int | None, setting: str, limit: int) -> None:
        if value is not None and value > limit and value != was:
            shown = what.format(value) if "{}" in what else f"{what} {value}"
            raise InvalidArgument(f"{shown} exceeds server.limits.{setting} ({limit})")

    was = current.instances if current else None
    bound("instances", model.instances, was, "maxInstances", limits.max_instances)
    options, before = model.runtime_options, current.runtime_options if current else None
    for field in ("intra_op_threads", "inter_op_threads"):
        value = getattr(options, field) if options else None
        was = getattr(before, field) if before else None
        name = f"runtimeOptions.{to_camel(field)}"
        bound(name, value, was, "maxRuntimeThreads", limits.max_runtime_threads)
    policy, old = model.version_policy, current.version_policy if current else None
    if policy.latest is not None:
        was = old.latest.num_versions if old and old.latest else None
        name = "versionPolicy.latest.numVersions"
        bound(name, policy.latest.num_versions, was, "maxVersions", limits.max_versions)
    if policy.specific is not None:
        was = len(old.specific.versions) if old and old.specific else None
        name = "versionPolicy.specific ({} versions)"
        bound(name, len(policy.specific.versions), was, "maxVersions", limits.max_versions)
    name = "the pushed files ({} version folders)"
    bound(name, pushed_versions, None, "maxVersions", limits.max_versions)


def check_sources(
    model: ModelConfig, current: ModelConfig | None, base_dir: Path, storage_dir: Path
) -> None:
    """A pushed config without files may only point at model files under serve.yaml's folder:
    not outside it, not in a hidden folder (.git, .servekit) and not at another model's pushed
    files (its unload would pull them from under this one); a single file must be .onnx."""
    if model.storage_uri is None or (
        current is not None and current.storage_uri == model.storage_uri
    ):
        return
    if "://" in model.storage_uri:  # the server fetching what a client names: never
        raise InvalidArgument(
            "storageUri of a load request cannot be a URI (s3://, https://, ...): remote "
            "storage is declared in serve.yaml only"
        )
    location = (base_dir / model.storage_uri).resolve()
    root = base_dir.resolve()
    inside = location.is_relative_to(root) and not location.is_relative_to(storage_dir.resolve())
    if not inside or any(p.startswith(".") for p in location.relative_to(root).parts):
        raise InvalidArgument(
            "storageUri of a load request must lie inside serve.yaml's folder (not in a hidden "
            "folder nor among pushed models); push the files with file:<version>/<name> "
            "parameters instead"
        )
    if location.is_file() and location.suffix != ".onnx":
        raise InvalidArgument("storageUri of a load request must name a folder or a .onnx file")
