"""Prometheus metrics, read from the same Statistics and repository the APIs report.

A custom collector builds the metric families at scrape time, so nothing is counted twice and
the hot path pays nothing for metrics. Each server has its own registry (never the global one),
so several servers in one process (tests, notebooks) do not collide.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.models.repository import State
from app.services.dataplane import DataPlane

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DataPlaneCollector(Collector):
    """Exposes per model-version request counts, durations and states."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "version"]
        success = CounterMetricFamily(
            "servekit_inference_success", "Successful inference requests", labels=labels
        )
        failure = CounterMetricFamily(
            "servekit_inference_failure", "Failed inference requests", labels=labels
        )
        rows = CounterMetricFamily(
            "servekit_inference_count", "Inferences performed (batch rows)", labels=labels
        )
        executions = CounterMetricFamily(
            "servekit_execution_count", "Model executions (batches)", labels=labels
        )
        seconds = CounterMetricFamily(
            "servekit_request_duration_seconds",
            "Cumulative time of successful requests by phase",
            labels=[*labels, "phase"],
        )
        state = GaugeMetricFamily(
            "servekit_model_state",
            "1 for the current state of each model version",
            labels=[*labels, "state"],
        )
        for entry in self._dataplane.models():
            name = entry.plan.name
            for number, version in entry.versions.items():
                key = [name, str(number)]
                for candidate in State:
                    state.add_metric([*key, candidate.value], float(version.state is candidate))
                stats = self._dataplane.statistics.find(name, number)
                if stats is None:
                    continue
                success.add_metric(key, stats.success.count)
                failure.add_metric(key, stats.fail.count)
                rows.add_metric(key, stats.inference_count)
                executions.add_metric(key, stats.execution_count)
                for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
                    seconds.add_metric([*key, phase], getattr(stats, phase).ns / 1e9)
        yield from (success, failure, rows, executions, seconds, state)


def make_registry(dataplane: DataPlane) -> CollectorRegistry:
    """A registry of this server's metrics only."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DataPlaneCollector(dataplane))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
