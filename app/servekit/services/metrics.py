"""The server's Prometheus metrics, read from the same Statistics and repository the APIs report.

A collector builds the metric families at scrape time, so nothing is counted twice and the hot
path pays nothing for metrics; the registry, its text and the models' own metrics are
app/servekit/observability/metrics.py's.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from servekit.errors import ServeError
from servekit.observability.metrics import CustomCollector, registry
from servekit.services.catalog import Catalog
from servekit.services.stats import QUEUE_BUCKETS_S, VersionStats
from servekit.services.views import READY, STATES

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds of the batch-size histogram (rows per model execution)."""


class CatalogCollector(Collector):
    """Exposes per model-version request counts, durations and states."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def collect(self) -> Iterator[Metric]:
        yield from _payload_log_metrics(self._catalog)
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
        batch_sizes = HistogramMetricFamily(
            "servekit_batch_size", "Rows per model execution", labels=labels
        )
        queue_seconds = HistogramMetricFamily(
            "servekit_queue_seconds", "Time successful requests waited in the queue", labels=labels
        )
        dispatches = CounterMetricFamily(
            "servekit_batch_dispatch",
            "Dynamic batches by why they stopped at their size (queue_drained: nothing more "
            "was waiting when an instance freed; max_size, preferred_size; incompatible: the "
            "waiting requests had other dimensions)",
            labels=[*labels, "reason"],
        )
        warmup = GaugeMetricFamily(
            "servekit_model_warmup_seconds",
            "How long the version's warm-up took when it loaded (serve.yaml warmup)",
            labels=labels,
        )
        sequences = CounterMetricFamily(
            "servekit_sequences",
            "Sequences of a sequence-batched model by what happened to them (started, ended, "
            "expired: idle past maxSequenceIdleMicroseconds)",
            labels=[*labels, "event"],
        )
        slots = GaugeMetricFamily(
            "servekit_sequences_now",
            "Sequences of a sequence-batched model holding a slot (active) or waiting for one "
            "(backlog)",
            labels=[*labels, "where"],
        )
        pending = GaugeMetricFamily(
            "servekit_pending_requests",
            "Inference requests queued for the model version and not started yet, over every "
            "worker: the signal to scale on",
            labels=labels,
        )
        inflight = GaugeMetricFamily(
            "servekit_inflight_requests",
            "Inference requests the model version's instances have started and not answered "
            "yet, over every worker",
            labels=labels,
        )
        cached = GaugeMetricFamily(
            "servekit_model_cached_copy",
            "1 while a remote model serves the copy its cache took earlier because its store "
            "cannot be reached (server.storage.whenUnreachable), else 0",
            labels=["model"],
        )
        shadows = CounterMetricFamily(
            "servekit_shadow_copies",
            "Copies of requests a shadow version (serve.yaml shadow) got, by outcome: agreed or "
            "disagreed with the answer served, failed, dropped (its queue was full)",
            labels=[*labels, "outcome"],
        )
        for (name, number), (waiting, started) in sorted(self._catalog.load().items()):
            pending.add_metric([name, str(number)], waiting)
            inflight.add_metric([name, str(number)], started)
        for model in self._catalog.models():
            name = model.name
            if model.plan.remote is not None:
                cached.add_metric([name], float(model.plan.cached_copy is not None))
            for version in model.versions:
                number = version.number
                key = [name, str(number)]
                if model.plan.sequence is not None and version.state == READY:
                    _sequence_metrics(self._catalog, key, sequences, slots)
                for candidate in STATES:
                    state.add_metric([*key, candidate], float(version.state == candidate))
                if version.warmup_s is not None:
                    warmup.add_metric(key, version.warmup_s)
                stats = self._catalog.statistics.find(name, number)
                if stats is None:
                    continue
                success.add_metric(key, stats.success.count)
                failure.add_metric(key, stats.fail.count)
                rows.add_metric(key, stats.inference_count)
                executions.add_metric(key, stats.execution_count)
                for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
                    seconds.add_metric([*key, phase], getattr(stats, phase).ns / 1e9)
                _histograms(stats, key, batch_sizes, queue_seconds)
                for reason, count in sorted(stats.batch_reasons.items()):
                    dispatches.add_metric([*key, reason], count)
                for outcome, count in sorted(stats.shadow.items()):
                    shadows.add_metric([*key, outcome], count)
        yield from (success, failure, rows, executions, seconds, state)
        yield from (batch_sizes, queue_seconds, dispatches, warmup, sequences, slots)
        yield from (pending, inflight, cached, shadows)
        yield from _memory_metrics(self._catalog)


def _memory_metrics(catalog: Catalog) -> Iterator[Metric]:
    """Each model's measured resident size, on-demand loads (with their time) and unloads,
    and ``server.modelMemory`` against what the loaded models hold: this process's own
    (each worker keeps its own budget)."""
    status = catalog.memory()
    used = GaugeMetricFamily(
        "servekit_model_memory_used_bytes",
        "Measured resident memory of the loaded models (the sum server.modelMemory bounds)",
    )
    used.add_metric([], status.used_bytes)
    yield used
    if status.budget_bytes is not None:
        budget = GaugeMetricFamily(
            "servekit_model_memory_budget_bytes", "server.modelMemory in bytes"
        )
        budget.add_metric([], status.budget_bytes)
        yield budget
    resident = GaugeMetricFamily(
        "servekit_model_resident_bytes",
        "Resident memory the model's last load took (process RSS before and after it, plus "
        "its child processes'); kept while an on-demand model is unloaded",
        labels=["model"],
    )
    loads = SummaryMetricFamily(
        "servekit_model_load_seconds",
        "Loads of an on-demand model by its requests, and how long they took (what its first "
        "request waited)",
        labels=["model"],
    )
    unloads = CounterMetricFamily(
        "servekit_model_unloads",
        "On-demand models unloaded, least recently used first, to stay within server.modelMemory",
        labels=["model"],
    )
    for model in status.models:
        if model.resident_bytes is not None:
            resident.add_metric([model.name], model.resident_bytes)
        if model.on_demand:
            loads.add_metric([model.name], model.loads, model.load_seconds_total)
            unloads.add_metric([model.name], model.unloads)
    yield from (resident, loads, unloads)


def _sequence_metrics(
    catalog: Catalog,
    key: list[str],
    sequences: CounterMetricFamily,
    slots: GaugeMetricFamily,
) -> None:
    try:
        counts = catalog.sequence_counts(key[0], key[1])
    except ServeError:  # unloaded meanwhile
        return
    for event in ("started", "ended", "expired"):
        sequences.add_metric([*key, event], getattr(counts, event))
    slots.add_metric([*key, "active"], counts.active)
    slots.add_metric([*key, "backlog"], counts.backlog)


def _histograms(
    stats: VersionStats,
    key: list[str],
    batch_sizes: HistogramMetricFamily,
    queue_seconds: HistogramMetricFamily,
) -> None:
    """Cumulative buckets, as Prometheus wants them, from the counts the statistics keep."""
    executed = sorted((size, d.count) for size, d in stats.batch_sizes.items())
    buckets = [
        (str(bound), float(sum(c for size, c in executed if size <= bound)))
        for bound in BATCH_BUCKETS
    ]
    total = sum(c for _, c in executed)
    buckets.append(("+Inf", float(total)))
    batch_sizes.add_metric(key, buckets, sum_value=float(sum(s * c for s, c in executed)))
    running = 0
    queue_buckets = []
    for bound, count in zip((*QUEUE_BUCKETS_S, "+Inf"), stats.queue_histogram, strict=True):
        running += count
        queue_buckets.append((str(bound), float(running)))
    queue_seconds.add_metric(key, queue_buckets, sum_value=stats.queue.ns / 1e9)


def _payload_log_metrics(catalog: Catalog) -> Iterator[Metric]:
    """The payload log's counts (``server.payloadLog``; nothing without one), this process's."""
    counts = catalog.payload_log()
    if counts is None:
        return
    logged = CounterMetricFamily(
        "servekit_payload_log_logged", "Payload log events the sink took (server.payloadLog)"
    )
    logged.add_metric([], counts.logged)
    dropped = CounterMetricFamily(
        "servekit_payload_log_dropped",
        "Payload log events dropped, by reason (queue_full: the sink was slower than the "
        "requests; sink_failed: it refused, timed out or answered an error)",
        labels=["reason"],
    )
    dropped.add_metric(["queue_full"], counts.queue_full)
    dropped.add_metric(["sink_failed"], counts.sink_failed)
    yield from (logged, dropped)


def make_registry(catalog: Catalog) -> CollectorRegistry:
    """A registry of this server's metrics only (and its models' own)."""
    return registry(CatalogCollector(catalog), CustomCollector(catalog.statistics.custom_samples))
