"""``servekit.serve``: start a server from a notebook cell and get a handle once it serves.

The call returns when every start-up model has loaded, or raises: a bad serve.yaml raises its
ConfigError (every key and line), and models that fail to load raise :class:`StartError` with
each reason, after the half-started server has been stopped again, so a failed cell never holds
a port. Ports default to 0 (free ports) and the host to the loopback interface: a notebook
should not expose models to the network unless asked to; ``token=True`` guards the server with a
random token when it must be reachable from elsewhere.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from servekit.client import valid_token
from servekit.config.compiler import ServePlan
from servekit.config.hosts import is_loopback
from servekit.config.overrides import Overrides, load_plan, plan_config
from servekit.config.schema import ServeConfig
from servekit.notebook import registry
from servekit.notebook.handle import Server
from servekit.notebook.launcher import ServerThread

ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | ServeConfig | None


class StartError(RuntimeError):
    """Models that failed to load at start-up; ``problems`` maps ``name[:version]`` -> reason."""

    def __init__(self, problems: dict[str, str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {where}: {why}" for where, why in problems.items())
        super().__init__(
            f"servekit did not start: {len(problems)} model version(s) failed to load\n{lines}\n"
            "(pass strict=False to serve the other models anyway)"
        )


def serve(
    config: ConfigSource = None,
    *,
    http_port: int = 0,
    grpc_port: int | None = 0,
    host: str = "127.0.0.1",
    token: bool | str | None = None,
    name: str = "default",
    strict: bool = True,
    timeout: float = 120.0,
    **server_options: Any,
) -> Server:
    """Serve ``config`` (a serve.yaml path, a dict of its content, or None for no models yet)
    in a background thread and return a :class:`Server` handle once it is ready.

    ``http_port``/``grpc_port`` override the file (0 picks a free port; ``grpc_port=None``
    disables gRPC); ``server_options`` override other ``server:`` keys (snake_case). Calling
    ``serve`` again with the same ``name`` first stops the previous server of that name.
    With ``strict`` (the default) a model that fails to load is an error, not a warning.

    ``token=True`` makes a random token (``secrets.token_urlsafe``) that every API group but
    health then needs (``server.auth.default``); a string is used as that token; either
    replaces serve.yaml's ``server.auth``. The handle's ``.token`` holds it and sends it
    itself; other clients send ``Authorization: Bearer <token>``. Default: serve.yaml's tokens
    if any, else none (fine on the loopback interface, warned about on any other).
    """
    overrides = {"http_port": http_port, "grpc_port": grpc_port, "host": host, **server_options}
    chosen = _token(token)
    if chosen is not None:
        if "auth" in server_options:
            raise TypeError("give token= or auth=, not both")
        overrides["auth"] = {"default": chosen}
    cleanup: Path | None = None
    if config is None and "storage_dir" not in overrides:
        # Models pushed into a config-less server live only as long as the server.
        cleanup = Path(tempfile.mkdtemp(prefix="servekit-notebook-"))
        overrides["storage_dir"] = str(cleanup)
    try:
        replan = _planner(config, overrides)
        plan = replan()  # a bad config raises here, before any thread or port exists
        if not is_loopback(plan.server.host) and not plan.access.tokens:
            warnings.warn(
                f"servekit listens on {plan.server.host} without a token: anyone who reaches "
                "this machine can run inference and read metadata, and the admin and "
                "repository APIs are closed to every client; pass token=True to require one",
                stacklevel=2,
            )
        server = registry.replace(name, lambda: _start(plan, name, replan, cleanup, timeout))
    except BaseException:
        if cleanup is not None:
            import shutil

            shutil.rmtree(cleanup, ignore_errors=True)
        raise
    if strict:
        problems = {
            f"{row['name']}:{row['version']}" if row["version"] else row["name"]: row["reason"]
            for row in server.models
            if row["state"] != "READY" and plan.loads_at_start(row["name"])
        }
        if problems:
            server.stop(grace=1.0)
            raise StartError(problems)
    return server


def _token(token: bool | str | None) -> str | None:
    """The token ``serve(token=...)`` asks for: None, a fresh random one, or the one given."""
    if token is None or token is False:
        return None
    if token is True:
        return secrets.token_urlsafe(32)  # 256 random bits, header-safe characters
    if not isinstance(token, str):
        raise TypeError(f"token must be True, a string or None, not {type(token).__name__}")
    return valid_token(token, "token")


def _start(
    plan: ServePlan,
    name: str,
    replan: Callable[[], ServePlan],
    cleanup: Path | None,
    timeout: float,
) -> Server:
    thread = ServerThread(plan)
    thread.start(timeout)
    return Server(
        thread,
        name=name,
        replan=replan if plan.config_path else None,
        cleanup=cleanup,
        load_timeout=max(timeout, 300.0),
    )


def _planner(config: ConfigSource, overrides: dict[str, Any]) -> Callable[[], ServePlan]:
    """A function compiling the current ``config`` with ``overrides`` (re-run by reload),
    through the same rule as ``servekit serve`` (app/servekit/config/overrides.py)."""
    # Keyword arguments, not flags: a misspelled option or a bad port raises pydantic's own
    # ValidationError naming the argument.
    arguments = Overrides(server=overrides, flags=False)
    if config is None or isinstance(config, Mapping | ServeConfig):
        loaded = config if isinstance(config, ServeConfig) else ServeConfig(**(config or {}))
        base = Path.cwd()
        return lambda: plan_config(loaded, None, arguments, base_dir=base)
    path = Path(os.fspath(config)).expanduser().resolve()
    return lambda: load_plan(path, arguments)
