"""Raw onnxruntime baseline: ``session.run`` on the served model, batch 1, in one process.

``bench/run.py`` starts this pinned to the server's core. The session is built from the same
serve.yaml with servekit's own session options (threads, optimization level, providers), so the
only thing missing compared with the server is what the server adds: HTTP, codecs, dataplane.
Prints one JSON line: calls per second and per-call latency percentiles in microseconds.

    taskset -c 0 python bench/raw_ort.py SERVE_YAML INPUT_NPY [--duration 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime as ort

from servekit.cli import load_plan
from servekit.runtimes.onnx import session_options


def measure(session: ort.InferenceSession, feed: dict[str, np.ndarray], duration: float) -> dict:  # type: ignore[type-arg]
    """Call ``session.run`` back to back for ``duration`` seconds, timing every call."""
    outputs = [o.name for o in session.get_outputs()]
    for _ in range(2000):  # warm-up: allocator arenas, branch predictors, CPU frequency
        session.run(outputs, feed)
    clock = time.perf_counter_ns
    samples: list[int] = []
    append_sample = samples.append
    deadline = clock() + int(duration * 1e9)
    started = clock()
    while True:
        t0 = clock()
        session.run(outputs, feed)
        t1 = clock()
        append_sample(t1 - t0)
        if t1 > deadline:
            break
    elapsed = clock() - started
    us = np.array(samples, dtype=np.float64) / 1000.0
    return {
        "calls": len(samples),
        "calls_per_s": len(samples) / (elapsed / 1e9),
        "latency_us": {
            "mean": float(us.mean()),
            "p50": float(np.percentile(us, 50)),
            "p99": float(np.percentile(us, 99)),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("input", help=".npy file holding the request's input")
    parser.add_argument("--duration", type=float, default=3.0)
    args = parser.parse_args()
    model = load_plan(args.config).models[0]
    path = str(model.versions[-1].path)
    session = ort.InferenceSession(
        path, session_options(model.options), providers=list(model.options.execution_providers)
    )
    x = np.load(args.input)
    feed = {session.get_inputs()[0].name: x}
    result = measure(session, feed, args.duration)
    result["output"] = session.run(None, feed)[0].reshape(-1).tolist()
    result["intra_op_threads"] = model.options.intra_op_threads
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
