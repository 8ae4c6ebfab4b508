"""The ``servekit`` command line. argv is parsed only inside ``main``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from servekit import gc_tuning
from servekit.config.compiler import ServePlan
from servekit.config.loader import ConfigError, ConfigIssue, ConfigMissing, line_in_file
from servekit.config.overrides import Overrides
from servekit.config.overrides import load_plan as load_overridden
from servekit.version import __version__


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each argument's default after its help, as uvicorn and mlserver do; defaults that
    are None (the setting comes from serve.yaml) say so in their help text instead."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text or action.default in (None, argparse.SUPPRESS):
            return text
        if action.default is False:
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


CONFIG_HELP = "the serve.yaml to read"
STORED_CONFIG_HELP = (
    "the serve.yaml to read, a path or an object in a store: s3://, gs://, az://, https:// "
    "(the environment's credentials; its relative storageUris from its folder)"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servekit",
        description="Serve models from serve.yaml over HTTP and gRPC (KServe V2). "
        "Start with `servekit init`, then `servekit serve`.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"servekit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve the models of CONFIG over HTTP and gRPC")
    serve.add_argument("config", nargs="?", default="serve.yaml", help=STORED_CONFIG_HELP)
    serve.add_argument(
        "--http-port",
        type=int,
        help="HTTP port, 0 picks a free one (default: server.httpPort, 8000)",
    )
    serve.add_argument(
        "--grpc-port",
        type=int,
        help="gRPC port, 0 picks a free one (default: server.grpcPort, 8001)",
    )
    serve.add_argument("--no-grpc", action="store_true", help="disable gRPC")
    serve.add_argument(
        "--host", help="address to listen on (default: server.host, 127.0.0.1: this machine only)"
    )
    serve.add_argument(
        "--token",
        help="bearer token every API group but health then needs (default: $SERVEKIT_TOKEN; "
        "groups serve.yaml's server.auth names keep their own)",
    )
    serve.add_argument(
        "--watch",
        action="store_true",
        help="apply edits of CONFIG live (a remote CONFIG is read every "
        "server.storage.pollSeconds)",
    )
    serve.add_argument(
        "--workers",
        metavar="N",
        type=_workers_flag,
        help="server processes behind the same ports, a number or auto: one per core "
        "(default: server.workers, 1)",
    )
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="lowest level logged (default: server.logging.level, info)",
    )
    serve.add_argument(
        "--only",
        metavar="NAME",
        help="serve only this model, its name or Kubernetes name (default: every model)",
    )
    serve.add_argument(
        "--storage-uri",
        metavar="PATH",
        help="read the model's files from PATH, KServe: /mnt/models "
        "(default: the model's storageUri)",
    )
    serve.add_argument(
        "--model-dir",
        "--model_dir",
        metavar="DIR",
        help="serve one model from DIR (default: CONFIG's models)",
    )
    serve.add_argument(
        "--model-name",
        "--model_name",
        metavar="NAME",
        help="--model-dir: the model's name (default: model)",
    )
    serve.add_argument(
        "--model-format", help="--model-dir: its format (default: told by the files)"
    )
    validate = sub.add_parser(
        "validate", help="check CONFIG (and import its Python models) and print a summary"
    )
    validate.add_argument("config", nargs="?", default="serve.yaml", help=STORED_CONFIG_HELP)
    sub.add_parser("schema", help="print the JSON Schema of serve.yaml")
    export = sub.add_parser("export", help="print Kubernetes manifests that serve CONFIG")
    export.add_argument("target", choices=["k8s", "kserve"], help="plain Deployment, or KServe")
    export.add_argument("config", nargs="?", default="serve.yaml", help=CONFIG_HELP)
    export.add_argument("--image", default=f"servekit:{__version__}", help="container image")
    export.add_argument(
        "--grpc", action="store_true", help="kserve: expose gRPC (h2c) instead of HTTP"
    )
    export.add_argument(
        "--cluster-runtime",
        action="store_true",
        help="kserve: the ClusterServingRuntime kserve-servekit instead, no CONFIG (default: off)",
    )
    export.add_argument(
        "--priority", type=_positive, default=1, help="--cluster-runtime: its formats' priority"
    )
    export.add_argument(
        "--autoscale",
        choices=["none", "hpa", "keda"],
        default="none",
        help="k8s: also a ServiceMonitor and an autoscaler on servekit_pending_requests: a "
        "HorizontalPodAutoscaler (through prometheus-adapter) or a KEDA ScaledObject",
    )
    export.add_argument(
        "--max-replicas", type=_positive, default=10, help="k8s --autoscale: most replicas"
    )
    export.add_argument(
        "--target-pending",
        type=_above_zero,
        default=2.0,
        help="k8s --autoscale: pending requests per replica to aim at",
    )
    export.add_argument(
        "--prometheus-url",
        help="k8s --autoscale keda: where KEDA queries Prometheus (default: the Prometheus "
        "Operator's prometheus-operated Service in namespace monitoring)",
    )
    from servekit import cli_project, cli_start

    cli_start.register(sub)
    cli_project.register(sub)
    for command in sub.choices.values():
        command.formatter_class = HelpFormatter
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return value


def _above_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number above 0")
    return value


def _workers_flag(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number or auto") from None


def load_plan(
    path: str,
    overrides: dict[str, Any] | None = None,
    only: str | None = None,
    storage_uri: str | None = None,
) -> ServePlan:
    """Load, override (flags beat file and environment) and compile a config file
    (:func:`servekit.config.overrides.load_plan` with keyword arguments, for scripts and
    benchmarks)."""
    return load_overridden(path, Overrides(dict(overrides or {}), only, storage_uri))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `servekit`: the help, as `servekit --help` prints it
        parser.print_help()
        return 0
    if args.command == "schema":
        from servekit.config.schema import json_schema

        print(json.dumps(json_schema(), indent=2))
        return 0
    from servekit import cli_project, cli_start

    if args.command in cli_project.COMMANDS:
        return cli_project.run(args)
    if args.command in cli_start.COMMANDS:
        return cli_start.run(args)
    try:
        config_uri = None
        if args.command in ("serve", "validate") and "://" in args.config:
            from servekit.services import is_remote_config, remote_config_copy

            if is_remote_config(args.config):
                config_uri = args.config
                args.config = str(remote_config_copy(config_uri))
        if args.command == "validate":
            return _validate(args.config, config_uri)
        if args.command == "export":
            return _export(args)
        return _serve(args, config_uri)
    except ConfigError as exc:
        print(config_error_text(exc), file=sys.stderr)
        return 1
    except Exception as exc:
        from servekit.services import RemoteConfigError, RemoteConfigMissing

        if not isinstance(exc, RemoteConfigError):
            raise
        print(f"servekit: {exc}", file=sys.stderr)
        if isinstance(exc, RemoteConfigMissing):
            print("  put serve.yaml there first, or name another object", file=sys.stderr)
        return 1


def config_error_text(exc: ConfigError) -> str:
    """What the command line says of a config it cannot use: a missing file as such (with the
    command that writes one), anything else as an invalid config listing every problem."""
    if isinstance(exc, ConfigMissing):
        return (
            f"servekit: no such file: {exc.filename}\n"
            "  write a starter project here with `servekit init`, or name another config "
            "(servekit serve PATH/serve.yaml)"
        )
    return f"servekit: invalid config\n{exc}"


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
        print(
            f"  {model.name}: format {model.format_name}, runtime {model.runtime}, "
            f"versions {versions}{status}"
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
    from servekit.services import warmup_problems

    issues = []
    for index, model in enumerate(plan.models):
        line = line_in_file(plan.config_path, ["models", index, "warmup"])
        for problem in warmup_problems(model):
            issues.append(ConfigIssue(f"models[{index}].warmup", line, f"{model.name}: {problem}"))
    return issues


def _python_issues(plan: ServePlan) -> list[ConfigIssue]:
    """A ConfigIssue, at its entrypoint's line, for each Python model serve would not load."""
    from servekit.services import python_problems

    problems = python_problems(plan)
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


def _overrides(args: argparse.Namespace, config_uri: str | None = None) -> Overrides:
    """What ``servekit serve``'s flags change in serve.yaml, at start and on every reload."""
    server: dict[str, Any] = {}
    if args.http_port is not None:
        server["http_port"] = args.http_port
    if args.grpc_port is not None:
        server["grpc_port"] = args.grpc_port
    if args.no_grpc:
        server["grpc_port"] = None
    if args.host is not None:
        server["host"] = args.host
    if args.watch:
        server["watch"] = True
    if args.workers is not None:
        server["workers"] = args.workers
    from servekit.config.auth import TOKEN_ENV

    # The flag travels as the variable (set by _serve), never as the token, so worker processes
    # inherit it and their command lines and the overrides never hold it.
    token_env = TOKEN_ENV if args.token or os.environ.get(TOKEN_ENV) else None
    # Absolute now: a reload must read the same folder whatever the working directory is then.
    uri = str(Path(args.storage_uri).absolute()) if args.storage_uri is not None else None
    return Overrides(server, args.only, uri, token_env, config_uri)


def _serve(args: argparse.Namespace, config_uri: str | None = None) -> int:
    if args.model_dir is not None:  # one model, no serve.yaml (app/servekit/config/model_dir.py)
        from servekit.config.model_dir import ModelDirError, model_dir_config_file

        try:
            args.config = str(
                model_dir_config_file(args.model_dir, args.model_name or "model", args.model_format)
            )
        except ModelDirError as exc:
            print(f"servekit: {exc}", file=sys.stderr)
            return 1
    if args.token:
        from servekit.config.auth import TOKEN_ENV

        os.environ[TOKEN_ENV] = args.token  # this process serves until it exits
    overrides = _overrides(args, config_uri)
    plan = load_overridden(args.config, overrides)
    from servekit import logs
    from servekit.workers.spec import worker_count

    workers = worker_count(plan.server.workers)
    settings = plan.server.logging
    level = logs.level_of(args.log_level, settings.level)
    # The one log setup of this process (a supervisor's workers set up their own).
    logs.setup(settings.format, level, onnxruntime=workers == 1)
    _warn_public_without_token(plan)
    # More than one: a supervisor and worker processes (app/servekit/workers/); 1: this process.
    if workers > 1:
        from servekit.workers import supervisor

        config = str(Path(args.config).absolute())
        _print_closed(plan)
        try:
            return supervisor.serve(plan, config, overrides, workers, level)
        except OSError as exc:
            logging.getLogger("servekit").error("servekit: %s", exc)
            return 1
    gc_tuning.tune()  # a process of its own: see app/servekit/gc_tuning.py
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        loop_factory = None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_run(plan, overrides))
    except OSError as exc:
        logging.getLogger("servekit").error("servekit: %s", exc)
        return 1
    return 0


def _export(args: argparse.Namespace) -> int:
    """Print manifests (``servekit export k8s|kserve``); warnings about the image to stderr."""
    from servekit.export import k8s as export
    from servekit.export import kserve as export_kserve
    from servekit.export.scaling import PROMETHEUS_URL, Scaling, scrape_warnings

    if args.cluster_runtime:  # no serve.yaml: one InferenceService a pod
        runtime = export_kserve.cluster_runtime(args.image, priority=args.priority)
        print(export.render([runtime], export_kserve.CLUSTER_HEADER), end="")
        return 0
    plan = export.load_plan(args.config)
    try:
        text = export.config_text(plan)
        if args.target == "k8s":
            scaling = Scaling(
                autoscale=args.autoscale,
                max_replicas=args.max_replicas,
                target_pending=args.target_pending,
                prometheus_url=args.prometheus_url or PROMETHEUS_URL,
            )
            manifests = export.k8s_manifests(plan, text, args.image, scaling)
            for warning in scrape_warnings(plan, scaling):
                print(f"servekit: warning: {warning}", file=sys.stderr)
        else:
            manifests = export_kserve.kserve_manifests(plan, text, args.image, grpc=args.grpc)
    except export.ExportError as exc:
        print(f"servekit: {exc}", file=sys.stderr)
        return 1
    for warning in export.warnings(plan, args.target):
        print(f"servekit: warning: {warning}", file=sys.stderr)
    print(export.render(manifests, export.header(args.target, args.config)), end="")
    return 0


def _print_closed(plan: ServePlan) -> None:
    """Say at start which API groups a bind beyond loopback closed, and what opens them."""
    from servekit import logs
    from servekit.config.auth import closed_line

    line = closed_line(plan.access, plan.server.host)
    if line is not None:
        logs.announce(line, plan.server.logging.format)


def _warn_public_without_token(plan: ServePlan) -> None:
    """One warning at start when the server listens beyond loopback and no token guards any
    API group: inference and metadata are then open to whoever reaches the port."""
    from servekit.config.hosts import is_loopback

    host = plan.server.host
    if is_loopback(host) or plan.access.tokens:
        return
    logging.getLogger("servekit").warning(
        "servekit listens on %s (beyond loopback) without any token: whoever reaches it can "
        "run inference and read metadata; set server.auth.default (for example "
        "{env: SERVEKIT_TOKEN}) in serve.yaml to require a bearer token",
        host,
    )


async def _run(plan: ServePlan, overrides: Overrides) -> None:
    from servekit import logs
    from servekit.server import ServeKit, StopSignals

    signals = StopSignals(asyncio.get_running_loop())
    server = ServeKit(plan)
    addresses = await server.start()
    fmt = plan.server.logging.format
    logs.announce(
        addresses.listening_line(), fmt, http=addresses.http_url, grpc=addresses.grpc_target
    )
    _print_closed(plan)
    watcher = None
    if plan.server.watch:
        from servekit.services import watch_config

        watcher = asyncio.create_task(watch_config(server, overrides))
    await signals.received.wait()
    delay = signals.withdraw_seconds(server.plan)
    withdrawn = (
        f"not ready, still serving for server.drainDelaySeconds ({delay:g} s), then "
        if delay > 0
        else "not ready, "
    )
    logs.announce(
        f"servekit: stopping: {withdrawn}new requests refused, accepted ones finish first "
        f"(up to server.drainSeconds: {server.plan.server.drain_seconds:g} s)",
        fmt,
    )
    if watcher is not None:
        watcher.cancel()
    await signals.stop(server)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
