"""What one dashboard request may see, from its ``Authorization`` header and ``server.auth``.

How the dashboard works with tokens, without cookies:

* A browser sends no ``Authorization`` header when it navigates to a page, and the dashboard
  never sets a cookie (a cookie would ride along on every cross-site request too). So the page
  routes are open to the HTTP access check and decide here what their HTML may hold. When the
  metadata group has a token and the request does not carry it, a page is a *locked shell*: no
  server name, no model name, no number; only an "Access token" form, answered 401 for every
  path (also unknown models: the shell does not say whether a model exists).
* The user types the token once. The page's script keeps it in the tab's ``sessionStorage``
  (gone when the tab closes or with "Forget token"; never in a URL) and sends it as
  ``Authorization: Bearer`` on every request it makes: when the server left something out of a
  page (``<body data-gated>``: the shell, or admin data) it fetches the same page again with
  the header and shows that HTML in place; it polls the dashboard JSON and calls the repository
  and inference APIs with it. One field serves every group; the server decides per request
  what the token opens.
* Admin data (statistics, model configuration) is left out of pages and JSON unless the
  request opens the admin group; repository controls (load/unload) are shown only when model
  control is ``explicit`` and, if the repository group has a token, once the script has checked
  the token with ``POST /v2/repository/index``; inference sends the token the same way.
* With no token configured (the default) nothing changes: every page is complete HTML that
  needs no JavaScript.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servekit.config.auth import AccessPolicy, ApiGroup


@dataclass(frozen=True)
class Viewer:
    """The groups a request opens (an unprotected group is open to everyone)."""

    policy: AccessPolicy
    opened: frozenset[ApiGroup]

    def may(self, group: ApiGroup) -> bool:
        return group in self.opened

    @property
    def locked(self) -> bool:
        """Whether the request may not see the dashboard at all (metadata needs a token)."""
        return not self.may(ApiGroup.METADATA)


def viewer(policy: AccessPolicy, authorization: str | None) -> Viewer:
    """Which groups a request with this ``Authorization`` value opens."""
    opened = frozenset(g for g in ApiGroup if policy.allows(g, authorization))
    return Viewer(policy, opened)


def hide_admin_data(model: dict[str, Any]) -> dict[str, Any]:
    """A model's view without what the admin group guards (statistics, configuration)."""
    versions = [{**v, "stats": None} for v in model["versions"]]
    steps = [{**step, "stats": None} for step in model.get("pipeline", ())]
    hidden = {
        "config": None,
        "serve_yaml_text": "",
        "storage_uri": None,
        "entrypoint": None,
        "warmup": None,
        "memory": None,
        "traffic": None,
        "pipeline": steps,
    }
    return {**model, **hidden, "versions": versions, "admin_hidden": True}
