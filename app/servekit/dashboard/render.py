"""Jinja2 rendering for the dashboard: where the templates live, the environment, the filters.

The templates are in the repository's top-level ``templates/`` folder (fixed by the contract). A
wheel cannot hold a folder outside its packages, so the build copies ``templates/`` into
``app/servekit/dashboard/templates`` (``scripts/build_hooks.py``, wired in pyproject.toml). At run
time the packaged copy wins and a source checkout (editable install, tests) uses the folder itself.
Autoescaping is on for every template: model names and load-failure reasons are user-supplied."""

from __future__ import annotations

import datetime as dt
import functools
from pathlib import Path
from typing import Any

import jinja2

from servekit.version import __version__

_HERE = Path(__file__).resolve().parent
STATIC_DIR = _HERE / "static"


def templates_dir() -> Path:
    """The folder holding the dashboard's Jinja templates (packaged copy first)."""
    for candidate in (_HERE / "templates", _HERE.parents[2] / "templates"):
        if (candidate / "dashboard_base.html").is_file():
            return candidate
    raise RuntimeError(
        "dashboard templates not found: expected app/servekit/dashboard/templates (installed) or "
        "templates/ beside app/servekit/ (source checkout)"
    )


@functools.cache
def environment() -> jinja2.Environment:
    """The one Jinja environment (built on first use, never at import time)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = duration
    env.filters["ms"] = milliseconds
    env.filters["timestamp"] = timestamp
    env.globals["servekit_version"] = __version__
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def duration(seconds: float) -> str:
    """A compact human duration: 42s, 3m 07s, 5h 02m, 2d 04h."""
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def milliseconds(value: float | None) -> str:
    """Average latency in ms with sensible precision; an em dash when nothing was measured."""
    if value is None:
        return "—"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def timestamp(epoch: float | None, unit: str = "s") -> str:
    """UTC time of an epoch value (seconds, or milliseconds with unit='ms'); '—' when unset."""
    if not epoch:
        return "—"
    seconds = epoch / 1000 if unit == "ms" else epoch
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
