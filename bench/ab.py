"""Two (or more) checkouts of servekit side by side: which one costs more per request.

    git worktree add ../base 664e9ed
    python bench/ab.py base=../base main=. [--body "REST JSON"] [--rounds 3] [--duration 4]

Each checkout's ``servekit serve`` (started with ``PYTHONPATH`` pointing at it) serves the tiny
MLP, all pinned to CPU 0; wrk (pinned to CPU 1) drives them in turn, round after round, at 16
connections, so every checkout sees the same neighbours. Prints requests/s and the server's CPU
microseconds per request for each round, then the medians. A regression check, not a table for
docs/performance.md (bench/run.py makes those).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # onnx_builders

from procs import Server  # noqa: E402
from run import SERVER_CPU, measure, wait_ready  # noqa: E402
from workload import make_workload  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="NAME=PATH of a servekit checkout")
    parser.add_argument("--body", default="REST JSON", help="REST JSON, REST binary, ...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.trees)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="servekit-ab-") as tmp:
        workload = make_workload(Path(tmp))
        body, header_length = workload.bodies[args.body]
        servers: dict[str, Server] = {}
        try:
            for name, tree in trees.items():
                # the source root: app/ since the package moved to app/servekit/ (without
                # it, every tree would run whichever servekit is installed)
                root = (
                    Path(tree) / "app" if (Path(tree) / "app" / "servekit").is_dir() else Path(tree)
                )
                os.environ["PYTHONPATH"] = str(root.resolve())
                argv = [sys.executable, "-m", "servekit", "serve", str(workload.config),
                        "--http-port", "0", "--no-grpc", "--host", "127.0.0.1",
                        "--log-level", "warning"]  # fmt: skip
                servers[name] = Server(
                    argv, SERVER_CPU, r"listening http://127\.0\.0\.1:(\d+)", cwd=Path(tree)
                )
            for server in servers.values():
                wait_ready(f"http://127.0.0.1:{server.port}/v2/health/ready")
            for round_ in range(args.rounds):
                order = list(servers.items())
                for name, server in order if round_ % 2 == 0 else order[::-1]:
                    url = f"http://127.0.0.1:{server.port}/v2/models/mlp/infer"
                    run = measure(server, url, body, header_length, 16, args.duration)
                    results[name].append((run["rps"], run["cpu_us_per_request"]))
                    print(f"round {round_ + 1} {name:>8} {run['rps']:9,.0f} req/s "
                          f"{run['cpu_us_per_request']:7.1f} us CPU/req", flush=True)  # fmt: skip
        finally:
            for server in servers.values():
                server.stop()
    for name, runs in results.items():
        rps = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"median {name:>8} {rps:9,.0f} req/s {cpu:7.1f} us CPU/req")
    return 0


if __name__ == "__main__":
    sys.exit(main())
