"""Rich notebook views: the server card (``_repr_html_``) and the models table.

Templates live beside this module (``card.html.j2``, ``models.html.j2``) and are rendered with
autoescaping, since model names and load-failure reasons come from users and files.
"""

from __future__ import annotations

import functools
from typing import Any

import jinja2
from markupsafe import Markup

STATE_COLORS = {
    "READY": "#1a7f37",
    "LOADING": "#9a6700",
    "UNLOADING": "#9a6700",
    "UNAVAILABLE": "#cf222e",
}


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("app.notebook", ""),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )


class ModelTable(list[dict[str, Any]]):
    """The repository index (one dict per model version: name, version, state, reason).

    A plain list for code, a table in a notebook.
    """

    def states(self) -> dict[str, str]:
        """``name`` -> state of its highest version: a quick look for code and tests."""
        return {row["name"]: row["state"] for row in self}

    def _repr_html_(self) -> str:
        return models_html(self)


def models_html(rows: list[dict[str, Any]]) -> str:
    return _environment().get_template("models.html.j2").render(rows=rows, colors=STATE_COLORS)


def card_html(
    *,
    kind: str,
    state: str,
    running: bool,
    url: str,
    grpc_target: str | None,
    dashboard_url: str,
    models: list[dict[str, Any]],
    note: str = "",
) -> str:
    """The card shown when a server handle is the value of a cell."""
    return (
        _environment()
        .get_template("card.html.j2")
        .render(
            kind=kind,
            state=state,
            running=running,
            url=url,
            grpc_target=grpc_target,
            dashboard_url=dashboard_url,
            models_table=Markup(models_html(models)),
            note=note,
        )
    )
