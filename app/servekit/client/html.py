"""Rich notebook views: the server card (``_repr_html_``) and the models table.

Templates live beside this module (``card.html.j2``, ``models.html.j2``) and are rendered with
autoescaping, since model names and load-failure reasons come from users and files.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
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
        loader=jinja2.PackageLoader("servekit.client", ""),
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


@dataclass(frozen=True)
class TokenView:
    """What the card says about a token: that one is set and how to use it, never the token.

    A card is a cell output, and outputs are saved in the .ipynb and shared or committed
    with it; so it shows the first characters only (enough to tell two tokens apart) and
    points at the handle's ``.token`` for copying."""

    hint: str | None
    """The token's first four characters and an ellipsis, or None when there is no one token."""
    scope: str
    """For what the token counts (e.g. "every API group", or the groups that need one)."""

    @classmethod
    def of(cls, token: str | None, scope: str) -> TokenView | None:
        return None if token is None else cls(f"{token[:4]}\u2026", scope)


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
    token: TokenView | None = None,
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
            token=token,
        )
    )
