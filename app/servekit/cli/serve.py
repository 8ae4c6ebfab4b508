"""``servekit serve``: compile serve.yaml with the flags, then serve it in this process (a
ServeKit on its own event loop) or, with several workers, hand it to the supervisor."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servekit import gc_tuning
from servekit.cli.shared import STORED_CONFIG_HELP, local_config, with_config_errors
from servekit.config.compiler import ServePlan
from servekit.config.overrides import Overrides
from servekit.config.overrides import load_plan as load_overridden

if TYPE_CHECKING:  # imported when serving: `servekit --help` stays quick
    from servekit.server import ServeKit, StopSignals

COMMANDS = ("serve",)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subcommands of :data:`COMMANDS` to ``servekit``'s parser."""
    serve = sub.add_parser("serve", help="serve the models of CONFIG over HTTP and gRPC")
    serve.add_argument(
        "config",
        nargs="?",
        help=f"{STORED_CONFIG_HELP} (default: serve.yaml), or where MLSERVER_MODEL_IMPLEMENTATION "
        "or MLSERVER_MODELS_DIR is set (KServe's kserve-mlserver runtime) the MLServer folder "
        "$MLSERVER_MODELS_DIR (/mnt/models unless set)",
    )
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


def run(args: argparse.Namespace) -> int:
    return with_config_errors(lambda: _serve_args(args))


def _serve_args(args: argparse.Namespace) -> int:
    if args.config is None:  # no CONFIG: serve.yaml here, or MLServer's folder in its place
        from servekit.config.mlserver_project import default_config

        args.config = default_config()
    config_uri = local_config(args)  # a remote serve.yaml: args.config is now its local copy
    return _serve(args, config_uri)


def _workers_flag(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number or auto") from None


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
    from servekit.observability import logs
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
            return supervisor.serve(
                plan, config, overrides, workers, level, model_dir=args.model_dir
            )
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
            return runner.run(_run(plan, overrides, args.model_dir))
    except OSError as exc:
        logging.getLogger("servekit").error("servekit: %s", exc)
        return 1


def _print_closed(plan: ServePlan) -> None:
    """Say at start which API groups a bind beyond loopback closed, and what opens them."""
    from servekit.config.auth import closed_line
    from servekit.observability import logs

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


async def _run(plan: ServePlan, overrides: Overrides, model_dir: str | None = None) -> int:
    """Serve until SIGTERM/SIGINT (0); with ``--model-dir``, stop at once (1) if the model did
    not load."""
    from servekit.observability import logs
    from servekit.server import ServeKit, StopSignals

    signals = StopSignals(asyncio.get_running_loop())
    server = ServeKit(plan)
    addresses = await server.start()
    fmt = plan.server.logging.format
    logs.announce(
        addresses.listening_line(), fmt, http=addresses.http_url, grpc=addresses.grpc_target
    )
    _print_closed(plan)
    if model_dir is not None:
        failure = await _model_dir_failure(server, signals, model_dir)
        if failure is not None:
            logging.getLogger("servekit").error("servekit: %s", failure)
            await server.stop(grace=0)  # never ready: nothing was accepted to finish
            return 1
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
    return 0


async def _model_dir_failure(server: ServeKit, signals: StopSignals, model_dir: str) -> str | None:
    """Wait for the start-up load (or a stop signal); why ``--model-dir``'s model did not load,
    or None. A pod serving one model has nothing to offer without it: exiting lets the kubelet
    restart it and show why, where a server left up would stay unready with no sign outside.
    (A serve.yaml of several models keeps serving the others.)"""
    from servekit.config.model_dir import load_failure

    loading = asyncio.ensure_future(server.wait_until_loaded())
    stopping = asyncio.ensure_future(signals.received.wait())
    await asyncio.wait((loading, stopping), return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not loading.done():
        loading.cancel()
        return None
    rows = [row for row in server.control.index() if row.state != "READY"]
    if not rows:
        return None
    return load_failure(rows[0].name, [row.reason for row in rows], model_dir)
