"""serve.yaml plus the command line: the one rule that turns a config file into the plan served.

``servekit serve`` flags beat the file and the environment. Listener flags (``--http-port``,
``--grpc-port``, ``--no-grpc``, ``--host``, ``--watch``) replace server settings; ``--only NAME``
keeps one model and loads it whatever ``startupModels`` says; ``--storage-uri PATH`` reads that
model's files from PATH (how a KServe pod serves the one model mounted at /mnt/models). The start
of ``servekit serve`` and every reload of ``--watch`` go through :func:`load_plan` with the same
:class:`Overrides`, so an edit of serve.yaml can never drop a flag (a pod started for one model
serving all of them after a ConfigMap update).

``servekit serve --token T`` and ``SERVEKIT_TOKEN`` in the server's environment become
``server.auth.default`` (read from that variable at start: the token itself is never written into
the overrides, a worker's command line or a log); groups serve.yaml gives their own token keep it.

``servekit serve s3://bucket/prod/serve.yaml`` reads a local copy of that object
(:attr:`Overrides.config_uri` says where it came from): its relative ``storageUri``s resolve
against the object's folder (``models/iris`` is ``s3://bucket/prod/models/iris``), its other
relative paths against the working directory, and its errors name the URI, never the copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from servekit.config.compiler import ServePlan, compile_plan
from servekit.config.loader import ConfigError, ConfigIssue, load_config, parse_config
from servekit.config.names import find_model
from servekit.config.remote_uris import beside, is_relative
from servekit.config.schema import ModelConfig, ServeConfig, TokenSource
from servekit.shown_paths import shown_uri


@dataclass(frozen=True)
class Overrides:
    """What the command line changes in serve.yaml; the default changes nothing."""

    server: dict[str, Any] = field(default_factory=dict)
    """ServerConfig fields (by attribute name) set by flags, e.g. ``{"http_port": 0}``."""
    only: str | None = None
    """Serve only this model (its serve.yaml name or its Kubernetes name)."""
    storage_uri: str | None = None
    """Read the one served model's files from here (kept as given; made absolute on use)."""
    token_env: str | None = None
    """An environment variable holding the token of every API group but health: it replaces
    ``server.auth.default`` (``servekit serve --token`` / ``SERVEKIT_TOKEN``); groups with their
    own token in serve.yaml keep it."""
    config_uri: str | None = None
    """The remote serve.yaml (``s3://``, ``gs://``, ``az://``, ``https://``) the file read is a
    local copy of: relative storageUris resolve against its folder."""
    flags: bool = True
    """Whether ``server`` came from command-line flags (a bad value is a ConfigError naming the
    flag) or from Python keyword arguments (``servekit.serve``: pydantic's ValidationError)."""


def load_plan(path: str | Path, overrides: Overrides | None = None) -> ServePlan:
    """Load ``path``, apply ``overrides`` and compile: at start and on every reload.

    A file that cannot be served under the overrides (``--only`` naming a model the file no
    longer has) is a ConfigError like any other mistake in it.
    """
    if overrides is None or overrides.config_uri is None:
        return plan_config(load_config(path), Path(path), overrides)
    shown = shown_uri(overrides.config_uri)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(shown, [ConfigIssue("", None, f"cannot read: {exc.strerror}")]) from None
    return plan_config(parse_config(text, shown), Path(path), overrides, base_dir=Path.cwd())


def plan_config(
    config: ServeConfig,
    path: Path | None,
    overrides: Overrides | None = None,
    *,
    base_dir: Path | None = None,
) -> ServePlan:
    """The plan of a loaded serve.yaml (``path``; None for a config given as data) under
    ``overrides``: the one way to a plan. Relative paths resolve from ``base_dir``, by default
    serve.yaml's folder (the working directory for a config given as data)."""
    overrides = overrides or Overrides()
    shown = str(path) if path is not None else "serve.yaml"
    if overrides.config_uri is not None:
        shown = shown_uri(overrides.config_uri)
    config = apply_overrides(config, shown, overrides)
    if path is None:
        return compile_plan(config, base_dir or Path.cwd(), None)
    file = path.resolve()
    folder = file if file.is_dir() else file.parent  # an MLServer project is a folder
    return compile_plan(config, base_dir or folder, file)


def apply_overrides(config: ServeConfig, path: str, overrides: Overrides) -> ServeConfig:
    """``config`` as the command line asks for it (``path`` names the file in errors)."""
    if overrides.server:
        # Validated like the file, so `--http-port 70000` is a message, not a traceback at bind.
        settings = {**config.server.model_dump(), **overrides.server}
        try:
            server = type(config.server).model_validate(settings)
        except ValidationError as exc:
            if not overrides.flags:
                raise
            raise ConfigError(path, [_flag_issue(error) for error in exc.errors()]) from None
        config = config.model_copy(update={"server": server})
    if overrides.token_env is not None:
        auth = config.server.auth.model_copy(
            update={"default": TokenSource(env=overrides.token_env)}
        )
        server = config.server.model_copy(update={"auth": auth})
        config = config.model_copy(update={"server": server})
    if overrides.config_uri is not None:
        config = _beside_remote_config(config, overrides.config_uri)
    if overrides.only is None and overrides.storage_uri is None:
        return config

    models = list(config.models)
    if overrides.only is not None:
        found = find_model([m.name for m in models], overrides.only)
        if found is None:
            names = ", ".join(m.name for m in models) or "none"
            message = f"--only {overrides.only!r}: no such model (models: {names})"
            raise ConfigError(path, [ConfigIssue("models", None, message)])
        wanted = _with_steps(models, found)
        models = [m for m in models if m.name in wanted]
        config = config.model_copy(
            update={"server": config.server.model_copy(update={"startup_models": "all"})}
        )
    # A pipeline has no files: its steps read theirs from their own storageUri.
    pipeline = any(m.pipeline is not None for m in models)
    if overrides.storage_uri is not None and not pipeline:
        if len(models) != 1:
            message = "--storage-uri needs --only NAME (or one model)"
            raise ConfigError(path, [ConfigIssue("models", None, message)])
        absolute = str(Path(overrides.storage_uri).absolute())
        models = [
            m.model_copy(update={"storage_uri": absolute}) if m.storage_uri else m for m in models
        ]
    return config.model_copy(update={"models": models})


def _beside_remote_config(config: ServeConfig, config_uri: str) -> ServeConfig:
    """``config`` with its models' relative storageUris resolved against the folder of the
    remote serve.yaml it was read from (one store holds the config and its models)."""
    models = [
        m.model_copy(update={"storage_uri": beside(config_uri, m.storage_uri)})
        if m.storage_uri is not None and is_relative(m.storage_uri)
        else m
        for m in config.models
    ]
    return config.model_copy(update={"models": models})


def _with_steps(models: list[ModelConfig], name: str) -> set[str]:
    """``name`` and, for a pipeline, the models its steps run (theirs too): ``--only`` a
    pipeline serves what it needs."""
    by_name = {m.name: m for m in models}
    wanted: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in wanted or current not in by_name:
            continue  # an unknown step is the compiler's to report, with its line
        wanted.add(current)
        todo.extend(step.model for step in by_name[current].pipeline or ())
    return wanted


def _flag_issue(error: ErrorDetails) -> ConfigIssue:
    """A refused flag value, named as the user typed it (``--http-port 70000``)."""
    field_name = str(error["loc"][0]) if error["loc"] else ""
    flag = "--" + field_name.replace("_", "-")
    return ConfigIssue(
        f"server.{to_camel(field_name)}", None, f"{flag} {error['input']!r}: {error['msg']}"
    )
