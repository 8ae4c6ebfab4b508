"""An MLServer project folder read as a servekit config.

MLServer (SeldonIO/MLServer, no longer maintained) serves a folder: ``settings.json`` for the
server and one ``model-settings.json`` per model anywhere under it (its multi-model
discovery), with ``MLSERVER_*`` and ``MLSERVER_MODEL_*`` environment variables filling what the
files leave out (KServe's ``kserve-mlserver`` runtime sets them: ``MLSERVER_HTTP_PORT``,
``MLSERVER_GRPC_PORT``, ``MLSERVER_MODEL_IMPLEMENTATION``, ``MLSERVER_MODEL_NAME``,
``MLSERVER_MODEL_URI``, ``MLSERVER_LOAD_MODELS_AT_STARTUP``). :func:`convert` turns such a folder
into the serve.yaml it stands for (data, with ``storageUri``s relative to the folder) and the
list of what had no servekit meaning; :func:`load` validates it as any serve.yaml, and
:func:`render` writes it as YAML with those notes as comments (``servekit convert mlserver``).

MLServer's four built-in runtimes become servekit's own (``mlserver_sklearn.SKLearnModel`` ->
``sklearn``, ...); any other ``implementation`` is the user's ``mlserver.MLModel`` subclass, a
Python model (app/servekit/runtimes/mlserver_model.py runs it). As with MLServer, the files decide
and the environment fills the gaps: a file's value beats the variable's.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from servekit.config.loader import ConfigError, ConfigIssue, ConfigMissing, validator_message
from servekit.config.schema import MAX_QUEUE_DELAY_MICROSECONDS, ServeConfig

SETTINGS = "settings.json"
MODEL_SETTINGS = "model-settings.json"
SERVE_YAML = "serve.yaml"
log = logging.getLogger("servekit.config")


@dataclass(frozen=True)
class Builtin:
    """One of MLServer's runtimes and the servekit format that serves the same files."""

    format: str
    files: tuple[str, ...]
    """The file names MLServer looks for when ``parameters.uri`` is a folder (empty: the
    folder itself is the model, as an MLflow model)."""


BUILTINS: dict[str, Builtin] = {
    "mlserver_sklearn.SKLearnModel": Builtin(
        "sklearn", ("model.joblib", "model.pickle", "model.pkl")
    ),
    "mlserver_xgboost.XGBoostModel": Builtin("xgboost", ("model.bst", "model.json", "model.ubj")),
    "mlserver_lightgbm.LightGBMModel": Builtin("lightgbm", ("model.bst",)),
    "mlserver_mlflow.MLflowRuntime": Builtin("mlflow", ()),
}

# settings.json keys that mean something to servekit: key -> its serve.yaml `server:` key
_SERVER_KEYS: dict[str, str] = {
    "http_port": "httpPort",
    "grpc_port": "grpcPort",
    "host": "host",
    "server_name": "name",
    "grpc_max_message_length": "grpcMaxMessageBytes",
}
_SILENT_KEYS = frozenset({"debug", "server_version", "model_repository_root"})
"""Read or meaningless here, never warned about: ``debug`` (servekit never sends tracebacks),
the version MLServer reports, the folder models are found in (read by :func:`convert`)."""
_MODEL_KEYS = frozenset(
    {"name", "implementation", "parameters", "inputs", "outputs", "max_batch_size"}
    | {"max_batch_time", "platform", "versions"}
)
_PARAMETER_KEYS = frozenset({"uri", "version", "extra"})


@dataclass
class Converted:
    """A project folder as serve.yaml data, and what of it servekit does not carry over."""

    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    """One line per setting with no servekit meaning, naming its file and key."""


MODELS_DIR_ENV = "MLSERVER_MODELS_DIR"
MODELS_DIR = "/mnt/models"
"""MLServer's image serves ``$MLSERVER_MODELS_DIR`` (its Dockerfile sets /mnt/models, where
KServe's storage initializer puts an InferenceService's files)."""
IMPLEMENTATION_ENV = "MLSERVER_MODEL_IMPLEMENTATION"


def is_project(path: Path, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``path`` is a folder MLServer would serve and servekit has no serve.yaml for:
    a ``settings.json`` or a ``model-settings.json`` in it or under it, or any folder when
    the environment names the model (``MLSERVER_MODEL_IMPLEMENTATION``, as KServe sets it)."""
    if not path.is_dir() or (path / SERVE_YAML).exists():
        return False
    env = os.environ if environ is None else environ
    if env.get(IMPLEMENTATION_ENV):
        return True
    return (path / SETTINGS).is_file() or any(_model_settings_files(path))


def default_config(environ: Mapping[str, str] | None = None) -> str:
    """What ``servekit serve`` with no CONFIG serves: ./serve.yaml, or in MLServer's place, as
    MLServer's image runs ``mlserver start $MLSERVER_MODELS_DIR``, the folder
    ``$MLSERVER_MODELS_DIR`` (default /mnt/models) when the environment is MLServer's:
    ``MLSERVER_MODEL_IMPLEMENTATION`` set (KServe's kserve-mlserver runtime always sets it) or
    ``MLSERVER_MODELS_DIR`` set."""
    env = os.environ if environ is None else environ
    if not (env.get(IMPLEMENTATION_ENV) or env.get(MODELS_DIR_ENV)):
        return SERVE_YAML
    return env.get(MODELS_DIR_ENV) or MODELS_DIR


def load(folder: Path, environ: Mapping[str, str] | None = None) -> ServeConfig:
    """The folder's serve.yaml, validated; what does not carry over is logged in one warning."""
    converted = convert(folder, environ)
    if converted.notes:
        log.warning(
            "%s: MLServer settings servekit does not use: %s",
            folder,
            "; ".join(converted.notes),
        )
    try:
        return ServeConfig(**converted.config)
    except ValidationError as exc:
        issues = [
            ConfigIssue(_render(error["loc"]), None, validator_message(error["msg"]))
            for error in exc.errors()
        ]
        raise ConfigError(str(folder), issues) from None


def render(converted: Converted, folder: str) -> str:
    """serve.yaml text for ``converted``, what did not carry over as comments on top."""
    head = [f"# serve.yaml for the MLServer project {folder} (servekit convert mlserver)"]
    if converted.notes:
        head.append("# Not carried over (no servekit meaning):")
        head += [f"#   {note}" for note in converted.notes]
    body = str(yaml.safe_dump(converted.config, sort_keys=False, allow_unicode=True))
    return "\n".join(head) + "\n" + body


def convert(folder: Path, environ: Mapping[str, str] | None = None) -> Converted:
    """``folder``'s settings.json and model-settings.json files (and the ``MLSERVER_*``
    environment) as serve.yaml data; ConfigError for a file that cannot be read."""
    if not folder.is_dir():
        issue = ConfigIssue("", None, "not a folder (an MLServer project is one)")
        raise ConfigMissing(str(folder), [issue])
    env = os.environ if environ is None else environ
    out = Converted({})
    settings = _read_json(folder / SETTINGS) if (folder / SETTINGS).is_file() else {}
    server = _server(settings, env, out)
    root = folder / str(settings.get("model_repository_root", ".")) if settings else folder
    models: list[dict[str, Any]] = []
    if _flag(settings.get("load_models_at_startup", env.get("MLSERVER_LOAD_MODELS_AT_STARTUP"))):
        files = sorted(_model_settings_files(root))
        for file in files:
            models.append(_model(_read_json(file), file, folder, env, out))
        if not files and env.get("MLSERVER_MODEL_IMPLEMENTATION"):
            models.append(_model({}, None, folder, env, out))  # KServe: the model from env
    else:  # MLServer's LOAD_MODELS_AT_STARTUP=false: models loaded through the repository API
        server["startupModels"] = "none"
        for file in sorted(_model_settings_files(root)):
            models.append(_model(_read_json(file), file, folder, env, out))
    server["grpcAnswers"] = "asSent"  # as MLServer: typed contents to typed gRPC requests
    out.config["server"] = server
    out.config["models"] = models
    return out


def _server(settings: dict[str, Any], env: Mapping[str, str], out: Converted) -> dict[str, Any]:
    server: dict[str, Any] = {}
    for key, target in _SERVER_KEYS.items():
        value = settings.get(key, env.get(f"MLSERVER_{key.upper()}"))
        if value is not None:
            server[target] = _number(value) if key != "host" and key != "server_name" else value
    workers = settings.get("parallel_workers", env.get("MLSERVER_PARALLEL_WORKERS"))
    if workers is not None and _number(workers) > 1:  # 0 and 1: one process serves
        server["workers"] = _number(workers)
    for key in settings:
        known = key in _SERVER_KEYS or key in _SILENT_KEYS
        if not known and key not in ("parallel_workers", "load_models_at_startup"):
            out.notes.append(f"{SETTINGS}: {key}")
    return server


def _model(
    data: dict[str, Any],
    file: Path | None,
    folder: Path,
    env: Mapping[str, str],
    out: Converted,
) -> dict[str, Any]:
    """One model-settings.json (``file``; None: the model the environment describes)."""
    where = str(file.relative_to(folder)) if file is not None else "MLSERVER_MODEL_*"
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ConfigError(where, [ConfigIssue("parameters", None, "must be an object")])
    name = data.get("name") or env.get("MLSERVER_MODEL_NAME")
    if not name and file is not None:
        name = file.parent.name  # MLServer's default: the folder's name
    implementation = data.get("implementation") or env.get("MLSERVER_MODEL_IMPLEMENTATION")
    if not name or not implementation:
        missing = "name" if not name else "implementation"
        raise ConfigError(where, [ConfigIssue(missing, None, "missing")])
    uri = parameters.get("uri") or env.get("MLSERVER_MODEL_URI")
    base = file.parent if file is not None else Path.cwd()
    model: dict[str, Any] = {"name": name}
    builtin = BUILTINS.get(implementation)
    if builtin is not None:
        model["modelFormat"] = {"name": builtin.format}
        model["storageUri"] = _storage(uri, base, folder, builtin)
    else:
        module, _, attr = str(implementation).rpartition(".")
        if not module:
            message = f"{implementation!r}: write it as module.Class"
            raise ConfigError(where, [ConfigIssue("implementation", None, message)])
        model["modelFormat"] = {"name": "python"}
        model["entrypoint"] = f"{module}:{attr}"
        settings = {k: v for k, v in data.items() if k in _MODEL_KEYS}
        settings["name"] = name
        if uri is None and file is not None:
            uri = "."  # MLServer's default: the folder of its model-settings.json
        if uri is not None:
            settings.setdefault("parameters", {})["uri"] = _relative(uri, base, folder)
        model["parameters"] = {"mlserver": settings}  # runtimes/mlserver_model.py reads it
        for kind in ("inputs", "outputs"):
            declared = [_tensor(t) for t in data.get(kind) or () if isinstance(t, dict)]
            if declared and all("datatype" in t and "shape" in t for t in declared):
                model[kind] = declared
    version = parameters.get("version") or env.get("MLSERVER_MODEL_VERSION")
    if version is not None and not str(version).isdigit():
        model["versionLabels"] = {str(version): 1}
    batch = _number(data.get("max_batch_size", env.get("MLSERVER_MODEL_MAX_BATCH_SIZE", 0)))
    if batch > 1:
        seconds = float(data.get("max_batch_time", env.get("MLSERVER_MODEL_MAX_BATCH_TIME", 0)))
        delay = min(round(seconds * 1_000_000), MAX_QUEUE_DELAY_MICROSECONDS)
        model["maxBatchSize"] = batch
        model["dynamicBatching"] = {"maxQueueDelayMicroseconds": delay}
    for key in data:
        if key not in _MODEL_KEYS:
            out.notes.append(f"{where}: {key}")
    for key in parameters:
        if key not in _PARAMETER_KEYS and not (key == "content_type" and builtin is None):
            out.notes.append(f"{where}: parameters.{key}")
    if builtin is not None:
        for key in ("inputs", "outputs"):
            if data.get(key):  # servekit reads a built-in format's tensors from the model
                out.notes.append(f"{where}: {key} (read from the model file instead)")
        if (parameters.get("extra") or {}) != {}:
            out.notes.append(f"{where}: parameters.extra")
    return model


def _storage(uri: Any, base: Path, folder: Path, builtin: Builtin) -> str:
    """The model's file or folder, as MLServer's ``get_model_uri`` finds it: ``uri`` relative
    to its model-settings.json (default that folder), a folder searched for the runtime's
    file names."""
    if uri is not None and "://" in str(uri):
        return str(uri)  # a store servekit reads itself (s3://, gs://, ...)
    path = base / str(uri) if uri is not None else base
    if path.is_dir():
        for name in builtin.files:
            if (path / name).is_file():
                path = path / name
                break
    return _relative(str(path), Path.cwd(), folder)


def _relative(uri: Any, base: Path, folder: Path) -> str:
    """``uri`` (relative to ``base``) as serve.yaml writes it: relative to ``folder`` when it
    is inside it, else absolute."""
    text = str(uri)
    if "://" in text:
        return text
    path = Path(os.path.normpath((base / text).absolute()))
    try:
        return path.relative_to(folder.absolute()).as_posix() or "."
    except ValueError:
        return str(path)


def _tensor(data: dict[str, Any]) -> dict[str, Any]:
    """A model-settings.json tensor as serve.yaml declares one (its own copy of the shape:
    YAML would write a list shared with ``parameters.mlserver`` as an anchor and alias)."""
    tensor: dict[str, Any] = {k: data[k] for k in ("name", "datatype") if k in data}
    if "shape" in data:
        tensor["shape"] = list(data["shape"])
    return tensor


def _model_settings_files(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return [p for p in root.rglob(MODEL_SETTINGS) if p.is_file()]


def _read_json(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        why = f"cannot read: {exc.strerror}"
        raise ConfigError(file.name, [ConfigIssue("", None, why)]) from None
    except ValueError as exc:
        raise ConfigError(file.name, [ConfigIssue("", None, f"invalid JSON: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError(file.name, [ConfigIssue("", None, "must be a JSON object")])
    return data


def _flag(value: Any) -> bool:
    """MLServer's booleans (JSON or an environment string); unset is true."""
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "0", "no", "off")
    return bool(value)


def _number(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(SETTINGS, [ConfigIssue("", None, f"{value!r} is not a number")]) from None


def _render(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
