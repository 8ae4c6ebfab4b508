"""Scale-out objects for ``servekit export k8s``: replicas that come and go without losing a
request, and an autoscaler reading the scaling signal.

Always: a PodDisruptionBudget (a node drain takes one replica at a time) and the stop timing
of the pods (``stop_timing``: the readiness probe, ``terminationGracePeriodSeconds``) matched
with ``server.drainDelaySeconds`` and ``server.drainSeconds``. With ``--autoscale hpa``: a
ServiceMonitor (Prometheus Operator scrapes /metrics) and a HorizontalPodAutoscaler on
``servekit_pending_requests`` through prometheus-adapter's external metrics API; with
``--autoscale keda``: the ServiceMonitor and a KEDA ScaledObject whose Prometheus trigger
queries the same gauge. No preStop hook: SIGTERM itself starts servekit's unready-but-serving
window, which a ``sleep`` in preStop would only delay (with readiness still true meanwhile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from servekit.config.compiler import ServePlan

Manifest = dict[str, object]
Autoscale = Literal["none", "hpa", "keda"]
AUTOSCALERS: tuple[Autoscale, ...] = ("none", "hpa", "keda")

METRIC = "servekit_pending_requests"
"""The gauge to scale on (app/servekit/services/metrics.py): requests queued, not started."""
PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
"""Where KEDA asks Prometheus by default (the Service the Prometheus Operator creates for a
Prometheus in namespace ``monitoring``); ``--prometheus-url`` changes it."""
READINESS_PERIOD, READINESS_FAILURES = 2, 2
"""The readiness probe: unready within 4 s of the server saying so (the default
``drainDelaySeconds``, 5 s, covers it)."""
STOP_MARGIN = 10
"""Seconds of ``terminationGracePeriodSeconds`` beyond the withdrawal and the drain: closing
listeners, the last responses, releasing models."""


@dataclass(frozen=True)
class Scaling:
    """What ``--autoscale`` and its companions chose."""

    autoscale: Autoscale = "none"
    min_replicas: int = 1
    max_replicas: int = 10
    target_pending: float = 2.0
    """Pending requests per replica the autoscaler aims at (its AverageValue)."""
    prometheus_url: str = PROMETHEUS_URL


@dataclass(frozen=True)
class StopTiming:
    """The pod's readiness probe and grace, matched with the server's stop settings."""

    readiness_period: int
    readiness_failures: int
    grace_seconds: int


def stop_timing(plan: ServePlan) -> StopTiming:
    """``terminationGracePeriodSeconds`` covers the unready window, the drain and a margin (at
    least Kubernetes' default 30 s), so the kubelet never kills a replica that is draining."""
    server = plan.server
    needed = math.ceil(server.drain_delay_seconds + server.drain_seconds) + STOP_MARGIN
    return StopTiming(READINESS_PERIOD, READINESS_FAILURES, max(30, needed))


def timing_warnings(plan: ServePlan) -> list[str]:
    """A withdrawal shorter than the readiness probe takes to see it fails requests."""
    noticed = READINESS_PERIOD * READINESS_FAILURES
    delay = plan.server.drain_delay_seconds
    if delay >= noticed + 1:
        return []
    return [
        f"server.drainDelaySeconds is {delay:g} s: the readiness probe (every "
        f"{READINESS_PERIOD} s, {READINESS_FAILURES} failures) takes up to {noticed} s to see a "
        f"stopping replica, so give it at least {noticed + 1} s or requests sent meanwhile fail"
    ]


def scrape_warnings(plan: ServePlan, scaling: Scaling) -> list[str]:
    """/metrics needs the admin token when ``server.auth`` sets one: the ServiceMonitor as
    exported sends none."""
    auth = plan.server.auth
    if scaling.autoscale == "none" or (auth.admin is None and auth.default is None):
        return []
    return [
        "server.auth protects /metrics (the admin group): add an `authorization` (type Bearer, "
        "the admin token from its Secret) to the ServiceMonitor's endpoint, or Prometheus "
        "gets 401 and the autoscaler sees no metric"
    ]


def disruption_budget(name: str, labels: dict[str, str]) -> Manifest:
    """At most one replica down at a time for voluntary disruptions (node drains, upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": labels},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    }


def service_monitor(name: str, labels: dict[str, str]) -> Manifest:
    """Prometheus Operator's scrape of every replica's /metrics (through the Service)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def horizontal_autoscaler(name: str, labels: dict[str, str], scaling: Scaling) -> Manifest:
    """An HPA on the pending gauge of this Service's pods, summed over them by
    prometheus-adapter (its external rule: docs/ops.md) and divided by the replicas
    (``AverageValue``)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": METRIC, "selector": {"matchLabels": {"service": name}}},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": _quantity(scaling.target_pending),
                        },
                    },
                }
            ],
        },
    }


def scaled_object(name: str, labels: dict[str, str], scaling: Scaling) -> Manifest:
    """KEDA's ScaledObject: its Prometheus trigger sums the pending gauge of this Service's
    pods; KEDA divides by the replicas (the trigger's default ``AverageValue``)."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicaCount": scaling.min_replicas,
            "maxReplicaCount": scaling.max_replicas,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": scaling.prometheus_url,
                        "query": f'sum({METRIC}{{service="{name}"}})',
                        "threshold": f"{scaling.target_pending:g}",
                    },
                }
            ],
        },
    }


def scale_out(name: str, labels: dict[str, str], scaling: Scaling) -> list[Manifest]:
    """The objects beside the Deployment and Service for ``scaling``."""
    found = [disruption_budget(name, labels)]
    if scaling.autoscale == "hpa":
        found += [service_monitor(name, labels), horizontal_autoscaler(name, labels, scaling)]
    elif scaling.autoscale == "keda":
        found += [service_monitor(name, labels), scaled_object(name, labels, scaling)]
    return found


def _quantity(value: float) -> str:
    """A Kubernetes quantity: ``2`` rather than ``2.0``; ``1500m`` for 1.5."""
    if value == int(value):
        return str(int(value))
    return f"{round(value * 1000)}m"
