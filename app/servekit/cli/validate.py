"""``servekit validate``, ``servekit schema`` and ``servekit convert``: check serve.yaml as
``servekit serve`` would read it (more strictly), print the JSON Schema editors check it
against, and print the serve.yaml of an MLServer project folder."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from servekit.cli.shared import STORED_CONFIG_HELP, local_config, with_config_errors
from servekit.config.compiler import ServePlan
from servekit.config.loader import ConfigError, ConfigIssue, line_in_file
from servekit.config.overrides import Overrides
from servekit.config.overrides import load_plan as load_overridden
from servekit.config.traffic import describe

COMMANDS = ("validate", "schema", "convert")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subcommands of :data:`COMMANDS` to ``servekit``'s parser."""
    validate = sub.add_parser(
        "validate", help="check CONFIG (and import its Python models) and print a summary"
    )
    validate.add_argument("config", nargs="?", default="serve.yaml", help=STORED_CONFIG_HELP)
    sub.add_parser("schema", help="print the JSON Schema of serve.yaml")
    convert = sub.add_parser("convert", help="print the serve.yaml of another server's project")
    convert.add_argument("source", choices=["mlserver"], help="an MLServer project folder")
    convert.add_argument("folder", help="the folder holding settings.json, model-settings.json")


def run(args: argparse.Namespace) -> int:
    if args.command == "schema":
        from servekit.config.schema import json_schema

        print(json.dumps(json_schema(), indent=2))
        return 0
    if args.command == "convert":
        return with_config_errors(lambda: _convert(args.folder))
    return with_config_errors(lambda: _validate_args(args))


def _convert(folder: str) -> int:
    """``servekit convert mlserver FOLDER``: the folder's serve.yaml, with what did not carry
    over as comments (app/servekit/config/mlserver_project.py)."""
    from pathlib import Path

    from servekit.config import mlserver_project

    converted = mlserver_project.convert(Path(folder))
    print(mlserver_project.render(converted, folder), end="")
    return 0


def _validate_args(args: argparse.Namespace) -> int:
    config_uri = local_config(args)  # a remote serve.yaml: args.config is now its local copy
    return _validate(args.config, config_uri)


def _validate(path: str, config_uri: str | None = None) -> int:
    """Check serve.yaml as ``servekit serve`` would, and more strictly: a storageUri that does
    not exist is an error here (serve starts anyway and serves that model as UNAVAILABLE), and
    tokens written in clear are warned about (exit code unaffected). Any problem it finds
    (a model or version serve would leave UNAVAILABLE, a pipeline step naming a version that
    is not loaded, a warm-up sample that does not fit the model) exits 1. ``config_uri``:
    the remote serve.yaml ``path`` is a local copy of (named in every message instead)."""
    plan = load_overridden(path, Overrides(config_uri=config_uri))
    if config_uri is not None:
        from servekit.shown_paths import shown_uri

        path = shown_uri(config_uri)
    for warning in _clear_token_warnings(plan, path) + _tracing_warnings(plan, path):
        print(warning, file=sys.stderr)
    missing = _missing_storage(plan)
    reported = {issue.path for issue in missing}
    problems = (
        missing
        + _model_problems(plan, reported)
        + _python_issues(plan)
        + _step_version_issues(plan)
        + _warmup_issues(plan)
        + _tracing_issues(plan)
    )
    if problems:
        raise ConfigError(path, problems)
    print(f"{path}: OK, {len(plan.models)} model(s)")
    for model in plan.models:
        versions = ",".join(str(v.version) for v in model.versions) or "-"
        if model.remote is not None:
            versions = "fetched at start"
        status = f"  problem: {model.problem}" if model.problem else ""
        routing = f", {describe(model.routing)}" if model.routing is not None else ""
        print(
            f"  {model.name}: format {model.format_name}, runtime {model.runtime}, "
            f"versions {versions}{routing}{status}"
        )
    return 0


def _missing_storage(plan: ServePlan) -> list[ConfigIssue]:
    """A ConfigIssue, with its line, for each model whose storageUri does not exist."""
    issues = []
    for index, model in enumerate(plan.models):  # compiled in serve.yaml's order, none left out
        uri = model.config.storage_uri if model.config is not None else None
        if model.remote is not None:  # fetched by serve; validate reads no network
            if model.problem is None:
                continue
            message = model.problem  # its scheme's extra is not installed
        elif uri is None or (plan.base_dir / uri).exists():
            continue
        else:
            message = f"{uri} does not exist (looked for {(plan.base_dir / uri).resolve()})"
        where = ["models", index, "storageUri"]
        line = line_in_file(plan.config_path, where)
        issues.append(ConfigIssue(f"models[{index}].storageUri", line, message))
    return issues


def _model_problems(plan: ServePlan, reported: set[str]) -> list[ConfigIssue]:
    """A ConfigIssue, at its storageUri's line, for each model or version that serve would
    leave UNAVAILABLE for what its files say (no MLmodel file, a version the policy names that
    is not there, ...), unless its storageUri was reported missing already."""
    issues = []
    for index, model in enumerate(plan.models):
        where = f"models[{index}].storageUri"
        if where in reported or model.remote is not None:  # remote: _missing_storage's
            continue
        found = [model.problem] if model.problem else []
        found += [f"version {v.version}: {v.problem}" for v in model.versions if v.problem]
        line = line_in_file(plan.config_path, ["models", index, "storageUri"])
        for problem in dict.fromkeys(found):
            issues.append(ConfigIssue(where, line, f"{model.name}: {problem}"))
    return issues


def _step_version_issues(plan: ServePlan) -> list[ConfigIssue]:
    """A pipeline step naming a version its model's policy does not load."""
    from servekit.config.pipelines import step_version_issues

    configs = [m.config for m in plan.models if m.config is not None]
    loaded: dict[str, set[int] | None] = {
        m.name: None if m.remote is not None else {v.version for v in m.versions if v.path}
        for m in plan.models
    }
    return step_version_issues(configs, loaded, plan.config_path)


def _warmup_issues(plan: ServePlan) -> list[ConfigIssue]:
    """A warm-up sample that does not fit its model's inputs (where the file tells)."""
    from servekit.services import ModelControl

    issues = []
    for index, model in enumerate(plan.models):
        line = line_in_file(plan.config_path, ["models", index, "warmup"])
        for problem in ModelControl.warmup_problems(model):
            issues.append(ConfigIssue(f"models[{index}].warmup", line, f"{model.name}: {problem}"))
    return issues


def _python_issues(plan: ServePlan) -> list[ConfigIssue]:
    """A ConfigIssue, at its entrypoint's line, for each Python model serve would not load."""
    from servekit.services import ModelControl

    problems = ModelControl.python_problems(plan)
    issues = []
    for index, model in enumerate(plan.models):
        if model.name in problems:
            line = line_in_file(plan.config_path, ["models", index, "entrypoint"])
            where = f"models[{index}].entrypoint"
            issues.append(ConfigIssue(where, line, f"{model.name}: {problems[model.name]}"))
    return issues


def _tracing_issues(plan: ServePlan) -> list[ConfigIssue]:
    """``server.tracing.enabled`` without OpenTelemetry's SDK: serve would start untraced."""
    import importlib.util

    if not plan.server.tracing.enabled:
        return []
    try:
        found = importlib.util.find_spec("opentelemetry.sdk") is not None
    except ModuleNotFoundError:
        found = False
    if found:
        return []
    line = line_in_file(plan.config_path, ["server", "tracing", "enabled"])
    message = "OpenTelemetry's SDK is not installed: pip install 'servekit[otel]'"
    return [ConfigIssue("server.tracing.enabled", line, message)]


def _tracing_warnings(plan: ServePlan, path: str) -> list[str]:
    """A warning naming (never showing) the export headers written in serve.yaml: a
    collector's key belongs in ``OTEL_EXPORTER_OTLP_HEADERS`` (from a secret store)."""
    names = sorted(plan.server.tracing.headers)
    if not names:
        return []
    line = line_in_file(plan.config_path, ["server", "tracing", "headers"])
    where = f"{path}:{line}: " if line else f"{path}: "
    return [
        f"{where}warning: server.tracing.headers ({', '.join(names)}) written in serve.yaml; "
        "for a secret prefer OTEL_EXPORTER_OTLP_HEADERS set from a secret store (it wins)"
    ]


def _clear_token_warnings(plan: ServePlan, path: str) -> list[str]:
    """One warning per token written in serve.yaml itself (a clear token from a SERVEKIT_*
    environment variable is not in the file, and the environment is where it belongs)."""
    from servekit.config.auth import clear_tokens
    from servekit.config.loader import _env_source

    warnings = []
    for field_path in clear_tokens(plan.server.auth):
        loc: list[Any] = field_path.split(".")
        if _env_source(loc) is not None:
            continue
        line = line_in_file(plan.config_path, loc)
        where = f"{path}:{line}" if line else path
        warnings.append(
            f"{where}: warning: {field_path}: token written in clear; "
            "use {env: VAR} or {file: PATH}"
        )
    return warnings
