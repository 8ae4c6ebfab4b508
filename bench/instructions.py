"""Instructions per request, counted by valgrind: a regression check that noise cannot move.

    python bench/instructions.py --check             # CI: fail if any grew >5% over the baseline
    python bench/instructions.py --write-baseline    # after a change meant to cost more (or less)
    git worktree add --detach /work/wt/base 664e9ed
    python bench/instructions.py base=/work/wt/base new=. [--body "REST JSON"] [--requests 300]
    python bench/instructions.py base=... new=. --batching --concurrency 64   # the batched path
    python bench/instructions.py off=. json=. --server json='logging: {format: json, accessLog: on}'
    python bench/instructions.py ... --threads   # each server thread's share printed too

This machine is shared and its speed varies from minute to minute, so timed A/B runs
(bench/ab.py) need many rounds to see a 5% change. Counting instructions does not. Each
checkout's ``servekit serve`` runs under ``valgrind --tool=callgrind`` with counting off; for
each body in turn, one client sends ``--warmup`` requests on one keep-alive connection (or one
gRPC channel), the counter is switched on (``callgrind_control -i on``), ``--requests`` more
are sent, the counter is switched off and dumped (which zeroes it), and the dump's total is
divided by the request count. REST and gRPC bodies share one server process (fewer valgrind
start-ups: the three bodies take about a minute and a half).

What makes the count repeatable: the executor decides by wall time whether a tiny model runs
on the event loop or in its worker threads (services/execution/placement.py), and under
valgrind a call takes about 50 times longer, close to the default 500 us bound, so the choice
used to flip during the counted window (counts of 500- and 1000-request runs disagreed). Here
the serve.yaml sets ``server.inlineBelowMicroseconds`` far above any call, so the model is
placed on the loop after its two learning calls, as a tiny model is on a real machine, and
stays there: the warm-up is then well past every first-call cost, and the counted window is
the steady path only. Repeated runs agree within about 0.5%. The figure is work done
(instructions), not time (it does not see cache misses or lock waits), so confirm a found
difference in time with bench/ab.py.

``--check`` compares with ``bench/instructions_baseline.json``, which keeps only what does not
depend on the machine: the counts, the Python version, the commit they were measured on and
the versions of the libraries on the path (a different Python or library version changes the
counts: the check then says so, and a refresh on the new versions is in order).

``--concurrency N`` sends from N client threads at once, each on its own connection (or gRPC
channel); ``--batching`` serves the model with ``maxBatchSize: 64`` and ``dynamicBatching``,
so the counted requests take the batched path (queue, one stacked call per batch in the
model's thread, answers split back). Under valgrind the server is far slower than its clients,
so batches fill; the mean rows per model run over the counted window (the model's statistics,
read outside it) is printed beside each count.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))  # onnx_builders

from run import wait_ready  # noqa: E402
from workload import make_workload  # noqa: E402

LISTENING = re.compile(r"listening http://127\.0\.0\.1:(\d+)")
GRPC_ADDRESS = re.compile(r"grpc://127\.0\.0\.1:(\d+)")
GC_STEADY = re.compile(r"^gc steady \d+$", re.MULTILINE)

BODIES = ("REST JSON", "REST binary", "gRPC")
"""What ``--check`` counts: the protocols issue 28 guards."""
BASELINE = HERE / "instructions_baseline.json"
TOLERANCE = 0.05
"""How much a body's count may grow over the baseline before ``--check`` fails."""
OTHER_MACHINE_TOLERANCE = 0.15
"""The same, when Python, a library or the CPU's vector instructions differ from the
baseline's: numpy and onnxruntime pick their kernels by CPU (AVX2 or AVX-512), so a count made
on another machine is not comparable at 5%; a real regression of the kind the guard exists for
(a loop on the hot path: +46% in docs/development.md) still fails."""
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni")
"""The CPU flags (Linux /proc/cpuinfo) that change which kernels numpy and onnxruntime run."""
CHECK_REQUESTS = 300
CHECK_WARMUP = 200
LIBRARIES = (
    "litestar",
    "uvicorn",
    "httptools",
    "uvloop",
    "orjson",
    "msgspec",
    "numpy",
    "onnxruntime",
    "grpcio",
    "protobuf",
)
"""The libraries on the measured path whose versions the baseline records."""
MAX_BATCH = 64
"""maxBatchSize of the model with ``--batching``."""
INLINE_BOUND_US = 10_000_000
"""server.inlineBelowMicroseconds for the measured server: every call runs on the loop once
learnt (see the module docstring)."""


Sender = Callable[[int], None]


def count(
    tree: Path,
    config: Path,
    bodies: dict[str, tuple[bytes, int | None] | None],
    requests: int,
    warmup: int,
    out_dir: Path,
    name: str,
    windows: int = 1,
    concurrency: int = 1,
    server: str | None = None,
) -> dict[str, float]:
    """Instructions per request of each body (None: gRPC) on one server of one checkout,
    sent by ``concurrency`` client threads at once; ``server``: serve.yaml ``server:``
    settings (YAML flow mappings) for this one, which then runs at the level they give
    (default info) instead of ``--log-level warning``."""
    # Since the move to app/servekit/, the source root is app/ (no symlink at the top).
    root = tree / "app" if (tree / "app" / "servekit").is_dir() else tree
    # PYTHONHASHSEED: str hashes (dict and set layouts, so probe lengths) alike in every run.
    env = dict(
        os.environ, PYTHONPATH=str(root.resolve()), PYTHONMALLOC="malloc", PYTHONHASHSEED="0"
    )
    out_file = out_dir / f"callgrind.{name}.out"
    prefix = f"--vgdb-prefix={out_dir / name}-vgdb"
    # A checkout from before the package was called servekit (issue 16) serves as `app`.
    package = "servekit" if (root / "servekit").exists() else "app"
    grpc = any(body is None for body in bodies.values())
    if server is not None:  # the workload's serve.yaml ends in its `server:` block
        own = out_dir / f"{name}.serve.yaml"
        own.write_text(config.read_text() + "".join(f"  {x}\n" for x in server.splitlines()))
        config = own
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        *(["--separate-threads=yes"] if THREADS else []),
        "--vgdb=yes",
        prefix,
        f"--callgrind-out-file={out_file}",
        sys.executable,
        str(HERE / "gc_steady.py"),
        package,
        "serve",
        str(config),
        "--http-port",
        "0",
        "--host",
        "127.0.0.1",
    ]
    if server is None:
        argv += ["--log-level", "warning"]
    argv += ["--grpc-port", "0"] if grpc else ["--no-grpc"]
    log_path = out_dir / f"{name}.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            argv, cwd=tree, env=env, stderr=log_file, stdout=log_file, stdin=subprocess.PIPE
        )
    results: dict[str, float] = {}
    try:
        port = _wait_port(proc, log_path)
        wait_ready(f"http://127.0.0.1:{port}/v2/models/mlp/ready", timeout=300)
        index = 0
        for label, body in bodies.items():
            senders = [
                _grpc_sender(log_path) if body is None else _http_sender(port, *body)
                for _ in range(concurrency)
            ]
            send = _together(senders)
            send(warmup)  # first calls, caches, lazy imports, the executor's placement
            for window in range(windows):
                _gc_steady(proc, log_path)
                before = _runs(port)
                _control(prefix, proc.pid, "-i", "on")
                send(requests)
                _control(prefix, proc.pid, "-i", "off")
                _control(prefix, proc.pid, "--dump")
                index += 1
                value = _dump_total(out_file, index) / requests
                after = _runs(port)
                runs = after[1] - before[1]
                rows = (after[0] - before[0]) / runs if runs else 0.0
                if windows > 1 or concurrency > 1:
                    print(
                        f"{name:>10}  {label:<12} window {window + 1}: {value:>12,.0f}  "
                        f"({rows:.1f} rows per model run)",
                        flush=True,
                    )
                results[label] = value
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    return results


def _together(senders: list[Sender]) -> Sender:
    """One sender, or several sending at once from their own threads (n split among them)."""
    if len(senders) == 1:
        return senders[0]

    def send(n: int) -> None:
        shares = [n // len(senders) + (i < n % len(senders)) for i in range(len(senders))]
        with ThreadPoolExecutor(len(senders)) as pool:
            for done in [pool.submit(s, k) for s, k in zip(senders, shares, strict=True)]:
                done.result()

    return send


def _runs(port: int) -> tuple[int, int]:
    """The model's (inference_count, execution_count): rows and model runs so far."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", "/v2/models/mlp/stats")
        stats = json.loads(conn.getresponse().read())["model_stats"][0]
    finally:
        conn.close()
    return int(stats["inference_count"]), int(stats["execution_count"])


def _gc_steady(proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """Have the server collect and freeze its heap (bench/gc_steady.py) and wait until done."""
    assert proc.stdin is not None
    done = len(GC_STEADY.findall(log_path.read_text(errors="replace")))
    proc.stdin.write(b"steady\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 120
    while len(GC_STEADY.findall(log_path.read_text(errors="replace"))) <= done:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the server did not steady its garbage collector")
        time.sleep(0.1)


THREADS = False
"""``--threads``: each thread of the server counted apart (``--separate-threads=yes``), its
share printed; the figure is their sum, as without it."""


def _dump_total(out_file: Path, index: int) -> int:
    """The total of the ``index``-th dump (callgrind names them ``<out-file>.<n>``, or
    ``<out-file>.<n>-<thread>`` with ``--threads``: their sum)."""
    path = out_file.with_name(f"{out_file.name}.{index}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the dump is written by the server's own thread
        paths = sorted(out_file.parent.glob(f"{out_file.name}.{index}-*")) if THREADS else []
        if not THREADS and path.exists():
            paths = [path]
        counted = [_totals(each) for each in paths]
        if paths and all(total is not None for total in counted):
            if THREADS:
                shares = ", ".join(
                    f"thread {each.name.rsplit('-', 1)[1]}: {total:,}"
                    for each, total in zip(paths, counted, strict=True)
                )
                print(f"    dump {index}: {shares}", flush=True)
            return sum(total or 0 for total in counted)
        time.sleep(0.2)
    raise RuntimeError(f"callgrind wrote no dump {path.name}")


def _totals(path: Path) -> int | None:
    """A dump's cost ("totals:", as "summary:" may read 0), None while it is being written."""
    lines = path.read_text(errors="replace").splitlines()
    totals = [int(line.split()[1]) for line in lines if line.startswith("totals:")]
    return max(totals) if totals else None


def _control(prefix: str, pid: int, *command: str) -> None:
    """Tell the server's callgrind what to do (vgdb reaches it while the server waits)."""
    done = subprocess.run(
        ["callgrind_control", prefix, *command, str(pid)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 or "OK" not in done.stdout:
        raise RuntimeError(
            f"callgrind_control {' '.join(command)} failed: {done.stdout}{done.stderr}"
        )


def _http_sender(port: int, body: bytes, header_length: int | None) -> Sender:
    """Sends ``n`` requests in turn on one keep-alive connection."""
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(header_length),
        }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def send(n: int) -> None:
        for _ in range(n):
            conn.request("POST", "/v2/models/mlp/infer", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"server answered {response.status}")

    return send


def _grpc_sender(log_path: Path) -> Sender:
    """Sends ``n`` ModelInfer calls in turn on one channel (tritonclient.grpc, raw contents)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    match = GRPC_ADDRESS.search(log_path.read_text())
    if match is None:
        raise RuntimeError("the server printed no gRPC address")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{match.group(1)}")
    x = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    infer_input = grpcclient.InferInput("input", list(x.shape), "FP32")
    infer_input.set_data_from_numpy(x)

    def send(n: int) -> None:
        for _ in range(n):
            client.infer("mlp", [infer_input])

    return send


def _wait_port(proc: subprocess.Popen[bytes], log_path: Path) -> int:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        match = LISTENING.search(log_path.read_text(errors="replace"))
        if match:
            return int(match.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"server exited before listening: {log_path.read_text()[-2000:]}")
        time.sleep(0.2)
    raise RuntimeError("server did not listen within 300 s")


def measure(
    trees: dict[str, Path],
    labels: list[str],
    requests: int,
    warmup: int,
    windows: int = 1,
    keep: Path | None = None,
    concurrency: int = 1,
    batching: bool = False,
    servers: dict[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """tree name -> body -> instructions per request (of the last of ``windows``); ``keep``:
    a folder for the callgrind dumps (``callgrind_annotate``), else they are deleted;
    ``servers``: tree name -> its own ``server:`` settings (``--server``)."""
    with tempfile.TemporaryDirectory(prefix="servekit-instr-") as scratch:
        tmp = str(keep) if keep is not None else scratch
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        workload = make_workload(Path(tmp))
        config = workload.config
        model = config.read_text()
        if batching:
            model += f"    maxBatchSize: {MAX_BATCH}\n    dynamicBatching: {{}}\n"
        # batching: every call in the model's thread, as the medium model's batches run at 64
        # in flight (on the loop, each request would be answered alone in its own read)
        bound = 0 if batching else INLINE_BOUND_US
        config.write_text(model + f"server:\n  inlineBelowMicroseconds: {bound}\n")
        bodies: dict[str, tuple[bytes, int | None] | None] = {}
        for label in labels:
            if label == "gRPC":
                bodies[label] = None
            else:
                path, header_length = workload.bodies[label]
                bodies[label] = (path.read_bytes(), header_length)
        results = {}
        for name, tree in trees.items():
            server = (servers or {}).get(name)
            results[name] = count(
                tree,
                config,
                bodies,
                requests,
                warmup,
                Path(tmp),
                name,
                windows,
                concurrency,
                server,
            )
            for label, value in results[name].items():
                print(f"{name:>10}  {label:<12} {value:>12,.0f} instructions/request", flush=True)
        return results


def environment() -> dict[str, str]:
    """What the counts depend on besides our code: Python and the libraries on the path."""
    versions = {"python": platform.python_version(), "cpu": _cpu_features()}
    for library in LIBRARIES:
        try:
            versions[library] = metadata.version(library)
        except metadata.PackageNotFoundError:
            versions[library] = "absent"
    return versions


def _cpu_features() -> str:
    """The CPU_FEATURES this machine has, in a fixed order ("unknown" off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return " ".join(feature for feature in CPU_FEATURES if feature in flags) or "none"


def _commit() -> str:
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return head + ("+changes" if dirty else "")


def write_baseline(requests: int, warmup: int) -> int:
    counts = measure({"this": ROOT}, list(BODIES), requests, warmup)["this"]
    baseline = {
        "about": "bench/instructions.py --check compares with this; refresh with "
        "`python bench/instructions.py --write-baseline` (docs/development.md)",
        "commit": _commit(),
        "requests": requests,
        "warmup": warmup,
        "environment": environment(),
        "instructions_per_request": {label: round(value) for label, value in counts.items()},
    }
    BASELINE.write_text(json.dumps(baseline, indent=2) + "\n")
    print(f"wrote {BASELINE.relative_to(ROOT)} (commit {baseline['commit']})")
    return 0


def check(requests: int | None, warmup: int | None) -> int:
    """0 when no body's count grew by more than TOLERANCE over the baseline, else 1."""
    baseline = json.loads(BASELINE.read_text())
    expected: dict[str, int] = baseline["instructions_per_request"]
    counts = measure(
        {"this": ROOT},
        list(expected),
        requests or baseline["requests"],
        baseline["warmup"] if warmup is None else warmup,
    )["this"]
    here = environment()
    differ = {k: (v, here.get(k)) for k, v in baseline["environment"].items() if here.get(k) != v}
    tolerance = OTHER_MACHINE_TOLERANCE if differ else TOLERANCE
    print(
        f"\nagainst {BASELINE.relative_to(ROOT)} (measured on {baseline['commit']}), "
        f"tolerance +{tolerance:.0%}:"
    )
    failed = []
    for label, before in expected.items():
        ratio = counts[label] / before
        verdict = "OK"
        if ratio > 1 + tolerance:
            verdict = "FAIL"
            failed.append(label)
        elif ratio < 1 - TOLERANCE:
            verdict = "OK (cheaper: refresh the baseline to keep the gain)"
        print(f"  {label:<12} {before:>10,} -> {counts[label]:>10,.0f}  {ratio:.3f}x  {verdict}")
    if differ:
        print(
            "  note: measured on another machine or other versions than the baseline's, so the "
            f"tolerance is +{tolerance:.0%}, not +{TOLERANCE:.0%} (baseline -> here): "
            + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in differ.items())
            + "; refresh the baseline here to guard at +5% again"
        )
    if failed:
        print(
            f"\nFAILED: {', '.join(failed)} cost more than {tolerance:.0%} over the baseline. "
            "Find the cause with `python bench/instructions.py base=<worktree of "
            f"{baseline['commit'].split('+')[0]}> new=.`; if the cost is meant, refresh the "
            "baseline: `python bench/instructions.py --write-baseline` (docs/development.md)."
        )
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", help="NAME=PATH of a servekit checkout")
    parser.add_argument(
        "--body",
        action="append",
        choices=["REST JSON", "REST binary", "REST raw binary", "gRPC"],
        help="what to send (repeatable); default REST JSON, REST binary, gRPC",
    )
    parser.add_argument(
        "--requests",
        type=int,
        help=f"counted requests (default {CHECK_REQUESTS}, --check: the baseline's)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        help=f"requests before counting (default {CHECK_WARMUP}, --check: the baseline's)",
    )
    parser.add_argument(
        "--windows",
        type=int,
        default=1,
        help="counted windows per body, one after the other (spread)",
    )
    parser.add_argument("--keep", type=Path, help="keep the callgrind dumps in this folder")
    parser.add_argument(
        "--threads",
        action="store_true",
        help="count each server thread apart (callgrind --separate-threads) and print each "
        "one's share of a window (the request's own thread, the log's writer, grpc's poller)",
    )
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME=YAML",
        help="serve.yaml `server:` settings for the tree NAME (repeatable), e.g. "
        "json='logging: {format: json, accessLog: on}'; that server then logs at the level "
        "they give (default info), the others at warning",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="client threads sending at once, each on its own connection (default 1)",
    )
    parser.add_argument(
        "--batching",
        action="store_true",
        help=f"serve the model with maxBatchSize {MAX_BATCH} and dynamicBatching",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help=f"this checkout against {BASELINE.name}; exit 1 on growth over "
        f"{TOLERANCE * 100:.0f} percent",
    )
    mode.add_argument(
        "--write-baseline",
        action="store_true",
        help=f"measure this checkout and write {BASELINE.name}",
    )
    args = parser.parse_args()
    if args.threads:
        global THREADS
        THREADS = True
    if args.check:
        return check(args.requests, args.warmup)
    requests = args.requests or CHECK_REQUESTS
    warmup = CHECK_WARMUP if args.warmup is None else args.warmup
    if args.write_baseline:
        return write_baseline(requests, warmup)
    if not args.trees:
        parser.error("name at least one NAME=PATH checkout, or --check / --write-baseline")
    trees = {name: Path(path) for name, path in (item.split("=", 1) for item in args.trees)}
    labels = args.body or list(BODIES)
    servers = dict(item.split("=", 1) for item in args.server)
    unknown = set(servers) - set(trees)
    if unknown:
        parser.error(f"--server names no tree: {', '.join(sorted(unknown))}")
    results = measure(
        trees, labels, requests, warmup, args.windows, args.keep, args.concurrency, args.batching,
        servers,
    )  # fmt: skip
    first_name = next(iter(results))
    print()
    for label in labels:
        first = results[first_name][label]
        print(
            f"{label:<12} "
            + "  ".join(f"{name} {values[label] / first:.3f}x" for name, values in results.items())
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
