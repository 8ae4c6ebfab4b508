"""Prometheus at ``/metrics``: a registry per server and its text, and the metrics Python models
define (app/servekit/observability/custom_metrics.py) as metric families.

Each server has its own registry (never prometheus_client's global one), so several servers in
one process (tests, notebooks) do not collide. Its collectors build the families when scraped,
from what the server keeps anyway, so the hot path pays nothing for metrics: the server's own
figures come from the services (app/servekit/services/metrics.py ``make_registry``, which
reads the DataPlane's statistics and models), the models' own from :class:`CustomCollector`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from servekit.observability.custom_metrics import Sample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text exposition format's media type."""


class CustomCollector(Collector):
    """The metrics Python models define, labelled with their model and version: ``samples``
    reads them (this process's, or every worker's under ``server.workers``)."""

    def __init__(self, samples: Callable[[], Iterable[Sample]]) -> None:
        self._samples = samples

    def collect(self) -> Iterator[Metric]:
        for sample in self._samples():
            labels = list(sample.labels)
            family: Metric
            if sample.kind == "counter":
                family = CounterMetricFamily(sample.name, sample.help, labels=labels)
                for key, value, _, _ in sample.rows:
                    family.add_metric(list(key), value)
            elif sample.kind == "gauge":
                family = GaugeMetricFamily(sample.name, sample.help, labels=labels)
                for key, value, _, _ in sample.rows:
                    family.add_metric(list(key), value)
            else:
                family = HistogramMetricFamily(sample.name, sample.help, labels=labels)
                for key, total, _, buckets in sample.rows:
                    shown = [("+Inf" if math.isinf(b) else str(b), float(c)) for b, c in buckets]
                    family.add_metric(list(key), shown, sum_value=total)
            yield family


def registry(*collectors: Collector) -> CollectorRegistry:
    """A registry of these collectors only."""
    made = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        made.register(collector)
    return made


def render(registry: CollectorRegistry) -> bytes:
    """The registry's families in the text exposition format (:data:`CONTENT_TYPE`)."""
    return generate_latest(registry)
