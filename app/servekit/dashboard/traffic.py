"""A model page's traffic section: serve.yaml's ``traffic`` and ``shadow`` and how the shadow's
copies compared with the answers served (app/servekit/services/traffic.py counts them)."""

from __future__ import annotations

from typing import Any

from servekit.config.traffic import TRAFFIC_KEY_HEADER
from servekit.services import SHADOW_OUTCOMES, Catalog, ModelView


def traffic(catalog: Catalog, model: ModelView) -> dict[str, Any] | None:
    """The split (version, percent), the header that pins a client, and the shadow with its
    copies by outcome and ``agreement`` (% of the compared copies that agreed; None before the
    first); None for a model with neither."""
    config, routing = model.plan.config, model.plan.routing
    if config is None or routing is None:
        return None
    split = [{"version": v, "percent": p} for v, p in (config.traffic or {}).items()]
    shadow = None
    if config.shadow is not None and routing.shadow is not None:
        counts = catalog.version_stats(model.name, routing.shadow).shadow
        compared = counts.get("agreed", 0) + counts.get("disagreed", 0)
        shadow = {
            "version": config.shadow.version,
            "share": config.shadow.share,
            "counts": {outcome: counts.get(outcome, 0) for outcome in SHADOW_OUTCOMES},
            "agreement": round(100 * counts.get("agreed", 0) / compared, 2) if compared else None,
        }
    return {"split": split, "header": TRAFFIC_KEY_HEADER, "shadow": shadow}
