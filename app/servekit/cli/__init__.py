"""The ``servekit`` command line (the console script ``servekit.cli:main``, ``python -m
servekit``). argv is parsed only inside :func:`main`.

One module per command group, each with its ``COMMANDS``, ``register(sub)`` (its flags) and
``run(args)``: serve.py (``serve``), validate.py (``validate``, ``schema``), export.py
(``export``), start.py (``init``, ``infer``), project.py (``save``, ``build``,
``requirements``, ``bench``); shared.py holds what they share. This module only assembles the
parser and hands the parsed arguments to the group that owns the command.
"""

from __future__ import annotations

import argparse
from typing import Any

from servekit.cli import export, project, serve, start, validate
from servekit.cli.shared import HelpFormatter
from servekit.config.compiler import ServePlan
from servekit.config.overrides import Overrides
from servekit.config.overrides import load_plan as load_overridden
from servekit.version import __version__

# In the order `servekit --help` lists their commands.
GROUPS = (serve, validate, export, start, project)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servekit",
        description="Serve models from serve.yaml over HTTP and gRPC (KServe V2). "
        "Start with `servekit init`, then `servekit serve`.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"servekit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    for command in sub.choices.values():
        command.formatter_class = HelpFormatter
    return parser


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
    (group,) = [g for g in GROUPS if args.command in g.COMMANDS]
    result: int = group.run(args)
    return result
