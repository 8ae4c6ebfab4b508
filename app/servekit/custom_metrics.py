"""The metrics a Python model defines, under the name model code imports.

``from servekit.custom_metrics import counter, gauge, histogram`` is the documented import for a
model's own code (docs/observability.md), so it stays put while the implementation lives with
the rest of observability (app/servekit/observability/custom_metrics.py).
"""

from servekit.observability.custom_metrics import (
    Counter,
    Gauge,
    Histogram,
    counter,
    gauge,
    histogram,
)

__all__ = ["Counter", "Gauge", "Histogram", "counter", "gauge", "histogram"]
