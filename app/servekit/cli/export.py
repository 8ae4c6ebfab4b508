"""``servekit export k8s|kserve``: the Kubernetes manifests that serve a serve.yaml, printed."""

from __future__ import annotations

import argparse
import math
import sys

from servekit.cli.shared import CONFIG_HELP, with_config_errors
from servekit.version import __version__

COMMANDS = ("export",)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subcommands of :data:`COMMANDS` to ``servekit``'s parser."""
    export = sub.add_parser("export", help="print Kubernetes manifests that serve CONFIG")
    export.add_argument("target", choices=["k8s", "kserve"], help="plain Deployment, or KServe")
    export.add_argument("config", nargs="?", default="serve.yaml", help=CONFIG_HELP)
    export.add_argument("--image", default=f"servekit:{__version__}", help="container image")
    export.add_argument(
        "--grpc", action="store_true", help="kserve: expose gRPC (h2c) instead of HTTP"
    )
    export.add_argument(
        "--cluster-runtime",
        action="store_true",
        help="kserve: the ClusterServingRuntime kserve-servekit instead, no CONFIG (default: off)",
    )
    export.add_argument(
        "--priority", type=_positive, default=1, help="--cluster-runtime: its formats' priority"
    )
    export.add_argument(
        "--autoscale",
        choices=["none", "hpa", "keda"],
        default="none",
        help="k8s: also a ServiceMonitor and an autoscaler on servekit_pending_requests: a "
        "HorizontalPodAutoscaler (through prometheus-adapter) or a KEDA ScaledObject",
    )
    export.add_argument(
        "--max-replicas", type=_positive, default=10, help="k8s --autoscale: most replicas"
    )
    export.add_argument(
        "--target-pending",
        type=_above_zero,
        default=2.0,
        help="k8s --autoscale: pending requests per replica to aim at",
    )
    export.add_argument(
        "--prometheus-url",
        help="k8s --autoscale keda: where KEDA queries Prometheus (default: the Prometheus "
        "Operator's prometheus-operated Service in namespace monitoring)",
    )


def run(args: argparse.Namespace) -> int:
    return with_config_errors(lambda: _export(args))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return value


def _above_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number above 0")
    return value


def _export(args: argparse.Namespace) -> int:
    """Print manifests (``servekit export k8s|kserve``); warnings about the image to stderr."""
    from servekit.export import k8s as export
    from servekit.export import kserve as export_kserve
    from servekit.export.scaling import PROMETHEUS_URL, Scaling, scrape_warnings

    if args.cluster_runtime:  # no serve.yaml: one InferenceService a pod
        runtime = export_kserve.cluster_runtime(args.image, priority=args.priority)
        print(export.render([runtime], export_kserve.CLUSTER_HEADER), end="")
        return 0
    plan = export.load_plan(args.config)
    try:
        text = export.config_text(plan)
        if args.target == "k8s":
            scaling = Scaling(
                autoscale=args.autoscale,
                max_replicas=args.max_replicas,
                target_pending=args.target_pending,
                prometheus_url=args.prometheus_url or PROMETHEUS_URL,
            )
            manifests = export.k8s_manifests(plan, text, args.image, scaling)
            for warning in scrape_warnings(plan, scaling):
                print(f"servekit: warning: {warning}", file=sys.stderr)
        else:
            manifests = export_kserve.kserve_manifests(plan, text, args.image, grpc=args.grpc)
    except export.ExportError as exc:
        print(f"servekit: {exc}", file=sys.stderr)
        return 1
    for warning in export.warnings(plan, args.target):
        print(f"servekit: warning: {warning}", file=sys.stderr)
    print(export.render(manifests, export.header(args.target, args.config)), end="")
    return 0
