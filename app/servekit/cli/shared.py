"""What every command group of the command line shares: the help's format, the config
argument's help, how a config that cannot be used is said, and a serve.yaml read from a store.

Each group (app/servekit/cli/serve.py, validate.py, export.py, start.py, project.py) imports
this module and nothing of the others, so the package has no import circle.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from servekit.config.loader import ConfigError, ConfigMissing


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


def local_config(args: argparse.Namespace) -> str | None:
    """A remote ``args.config`` (s3://, ...) copied to a local file, which ``args.config`` then
    names; the remote URI is returned (None for a local path) so messages name it instead."""
    if "://" not in args.config:
        return None
    from servekit.services import is_remote_config, remote_config_copy

    if not is_remote_config(args.config):
        return None
    config_uri: str = args.config
    args.config = str(remote_config_copy(config_uri))
    return config_uri


def with_config_errors(command: Callable[[], int]) -> int:
    """Run a command that reads serve.yaml; a config it cannot use (invalid, missing, or a
    remote one that cannot be read) is said on stderr and exits 1, never a traceback."""
    try:
        return command()
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
