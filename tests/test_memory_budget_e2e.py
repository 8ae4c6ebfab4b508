"""50 models under a budget that fits 5, over HTTP against a real ``servekit serve`` (issue 43,
"Load on demand under a budget"): every model is ``load: onDemand`` and holds 8 MiB
(tests/memory_models.py), ``server.modelMemory`` is 5.5 models' worth. Random traffic from
several clients at once (a fixed seed, a bounded number of requests, most of it on a few hot
models as real traffic is) shows that every request is answered, that the server's resident
memory (read from /proc while the traffic runs) stays within the budget plus one model, that
no model is unloaded while a request of its runs (each model writes it to a file if so), and
that /metrics reports each model's load-on-first-request time, resident size and unloads. A
model too big for the budget gets a clear error.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from memory_models import ballast_entry
from prometheus_client.parser import text_string_to_metric_families
from servers import running_server
from waits import wait_until

pytestmark = pytest.mark.slow  # a real server process

MIB = 2**20
MODELS = 50
MODEL_MIB = 8
BUDGET = int(5.5 * MODEL_MIB * MIB)
REQUESTS = 400
CLIENTS = 6
HERE = Path(__file__).parent


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm", "rb") as file:
        return int(file.read().split()[1]) * 4096


class Sampler:
    """The server's largest resident set size seen while it runs (read every 2 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.002)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


def metric(text: str, name: str) -> dict[str, float]:
    """model label -> value of the samples called ``name``."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[sample.labels.get("model", "")] = sample.value
    return found


def test_fifty_models_under_a_budget_of_five(tmp_path: Path) -> None:
    shutil.copy(HERE / "memory_models.py", tmp_path / "memory_models.py")
    record = tmp_path / "unloaded-in-use.log"
    names = [f"m{i:02d}" for i in range(MODELS)]
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"server: {{httpPort: 0, grpcPort: null, modelMemory: {BUDGET}}}\nmodels:\n"
        + "".join(ballast_entry(name, MODEL_MIB, record) for name in names)
        + ballast_entry("big", 64, record)
    )
    rng = random.Random(43)
    # Zipf-like: a few hot models take most requests, every model gets some.
    weights = [1 / (rank + 1) ** 1.2 for rank in range(MODELS)]
    plan = rng.choices(names, weights, k=REQUESTS - MODELS) + names
    rng.shuffle(plan)
    started = time.monotonic()
    with running_server(config, grpc=False) as server:
        pid = server.process.pid
        baseline = rss(pid)
        answers: list[tuple[str, int, float]] = []

        local = threading.local()
        clients: list[httpx.Client] = []

        def send(name: str) -> tuple[str, int, float]:
            if not hasattr(local, "client"):  # one keep-alive connection per client thread
                local.client = httpx.Client(base_url=server.http_url, timeout=30)
                clients.append(local.client)
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}
            response = local.client.post(f"/v2/models/{name}/infer", json=body)
            value = response.json()["outputs"][0]["data"][0] if response.is_success else -1
            return name, response.status_code, value

        traffic = time.monotonic()
        try:
            with Sampler(pid) as sampler, ThreadPoolExecutor(CLIENTS) as pool:
                answers = list(pool.map(send, plan))
        finally:
            for client in clients:
                client.close()
        traffic = time.monotonic() - traffic
        with server.http_client() as client:
            too_big = client.post(
                "/v2/models/big/infer",
                json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]},
            )
            text = client.get("/metrics").text
            index = client.post("/v2/repository/index", json={}).json()
            unloaded = next(
                r["name"] for r in index if r["state"] == "UNAVAILABLE" and r["name"] in names
            )
            metadata = client.get(f"/v2/models/{unloaded}")
            ready = client.get(f"/v2/models/{unloaded}/ready").status_code
            pages = {path: client.get(path).text for path in ("/", "/models", "/models/m00")}
            # A request that cannot wait as long as a load takes (1 us): 503 with Retry-After
            # at once, while the load goes on and the retry finds the model.
            body = {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                "parameters": {"timeout": 1},
            }
            hurried = client.post(f"/v2/models/{unloaded}/infer", json=body)
            wait_until(
                lambda: client.get(f"/v2/models/{unloaded}/ready").status_code == 200,
                what=f"{unloaded} to finish loading after the hurried request",
            )
            del body["parameters"]
            retried = client.post(f"/v2/models/{unloaded}/infer", json=body)
            rows = client.get("/dashboard/api/models").json()
        after = rss(pid)
    elapsed = time.monotonic() - started

    # Every request answered, with the model's answer.
    assert [status for _, status, _ in answers] == [200] * REQUESTS
    assert all(value == 2.0 for _, _, value in answers)
    # Resident memory within the budget plus one model, all along.
    over = sampler.peak - baseline
    assert over <= BUDGET + MODEL_MIB * MIB, (over / MIB, BUDGET / MIB)
    # No model unloaded while in use (each writes it down if it was), yet many unloads.
    assert not record.exists(), record.read_text()
    unloads = metric(text, "servekit_model_unloads_total")
    assert sum(unloads.values()) >= MODELS - 6
    loaded = [row["name"] for row in index if row["state"] == "READY"]
    assert 1 <= len(loaded) <= 5, loaded
    # Load-on-first-request latency, and each model's measured size.
    loads = metric(text, "servekit_model_load_seconds_count")
    seconds = metric(text, "servekit_model_load_seconds_sum")
    assert set(names) <= set(loads) and all(loads[name] >= 1 for name in names)
    resident = metric(text, "servekit_model_resident_bytes")
    assert all(MODEL_MIB * MIB * 0.9 <= resident[name] <= MODEL_MIB * MIB * 1.5 for name in names)
    assert metric(text, "servekit_model_memory_budget_bytes") == {"": BUDGET}
    # An unloaded model: not ready, its metadata from serve.yaml (as Triton's from config).
    assert ready == 503
    assert metadata.status_code == 200 and metadata.json()["inputs"][0]["name"] == "x"
    # The dashboard: memory used against the budget, each model's size, loads and unloads.
    assert "Model memory:" in pages["/"] and 'data-bind="memory-budget">44.0 MiB' in pages["/"]
    assert 'data-bind="memory"' in pages["/models"] and "on demand, 8." in pages["/models"]
    assert "Loads on demand" in pages["/models/m00"] and "Unloaded for room" in pages["/models/m00"]
    assert all(r["memory"].startswith("on demand, 8.") for r in rows if r["name"] != "big")
    assert hurried.status_code == 503 and int(hurried.headers["Retry-After"]) >= 1
    assert "loading on demand" in hurried.json()["error"]
    assert retried.status_code == 200
    # A model too big for the budget: a clear error, and no Retry-After (retrying cannot help).
    assert too_big.status_code == 503 and "Retry-After" not in too_big.headers
    assert "more than server.modelMemory" in too_big.json()["error"]
    mean_load_ms = 1e3 * sum(seconds.values()) / sum(loads.values())
    print(
        f"\n{REQUESTS} requests over {MODELS} models in {traffic:.1f} s ({elapsed:.1f} s with the "
        "server's start and stop); "
        f"loads {int(sum(loads.values()))}, unloads {int(sum(unloads.values()))}, "
        f"mean load {mean_load_ms:.1f} ms; peak over baseline {over / MIB:.1f} MiB "
        f"(budget {BUDGET / MIB:.1f} MiB, one model {MODEL_MIB} MiB); after {after / MIB:.0f} MiB"
    )


NOTEBOOK_CELL = """
import json, sys
import numpy as np
import servekit

with servekit.serve(sys.argv[1], http_port=0, grpc_port=None) as server:
    before = server.models.states()
    x = np.ones(1, np.float32)
    answers = [float(server.infer(m, {"x": x})["output"][0]) for m in ("a", "b")]
    memory = server.memory()
    after = server.models.states()
print(json.dumps({"before": before, "answers": answers, "memory": memory, "after": after}))
"""
"""A notebook's cells in a kernel of its own: sizes are the process's RSS before and after a
load, so the test's process, with the threads and garbage of every test before it, is not
where they are measured (a kernel is a fresh interpreter)."""


def test_a_notebook_reads_the_same_figures(tmp_path: Path) -> None:
    """``server.memory()`` in a notebook: the budget, what is held, and each model's size,
    loads and unloads, as /metrics reports them."""
    shutil.copy(HERE / "memory_models.py", tmp_path / "memory_models.py")
    config = tmp_path / "serve.yaml"
    record = tmp_path / "record"
    config.write_text(
        f"server: {{modelMemory: {int(1.5 * MODEL_MIB * MIB)}}}\nmodels:\n"
        + ballast_entry("a", MODEL_MIB, record)
        + ballast_entry("b", MODEL_MIB, record)
    )
    ran = subprocess.run(
        [sys.executable, "-c", NOTEBOOK_CELL, str(config)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen["before"] == {"a": "UNAVAILABLE", "b": "UNAVAILABLE"}
    assert seen["answers"] == [2.0, 2.0]  # a makes room for b
    assert seen["after"] == {"a": "UNAVAILABLE", "b": "READY"}
    memory = seen["memory"]
    assert memory["budget_bytes"] == int(1.5 * MODEL_MIB * MIB)
    a, b = memory["models"]["a"], memory["models"]["b"]
    assert (a["loads"], a["unloads"], a["loaded"]) == (1, 1, False)
    assert (b["loads"], b["unloads"], b["loaded"]) == (1, 0, True)
    assert b["resident_bytes"] >= MODEL_MIB * MIB * 0.9
    assert memory["used_bytes"] == b["resident_bytes"]
    assert a["last_load_seconds"] > 0 and not record.exists()
