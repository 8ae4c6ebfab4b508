"""Traffic between versions through a real server and Triton's clients (issue 43): a 90/10 split
over HTTP and gRPC, a traffic key that keeps its version on both, a shadow version that sleeps
50 ms without moving the served version's p99, and the shadow's agreement in the statistics
JSON, /metrics and the model page. The in-process tests are tests/test_traffic.py."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from servers import ServerProcess, start_server
from traffic_models import model_yaml, write_model
from waits import wait_until

import servekit
from servekit.config.traffic import TRAFFIC_KEY_HEADER, routing_of
from servekit.services.traffic import choose, draw

pytestmark = pytest.mark.slow

REQUESTS = 5000
PAIRS = 40
BLOCK = 100
"""The latency comparison: PAIRS pairs of blocks of BLOCK requests to each model."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("traffic")
    entries = []
    for name, versions, extra in (
        ("canary", {2: "double", 3: "triple"}, '    traffic: {"2": 90, "3": 10}\n'),
        ("shadowed", {2: "double", 3: "sleep"},
         "    defaultVersion: 2\n    shadow: {version: 3, share: 0.2}\n"),
        ("plain", {2: "double", 3: "sleep"}, "    defaultVersion: 2\n"),
    ):  # fmt: skip
        module = write_model(root, name, versions)
        entries.append(model_yaml(name, module, name, extra))
    (root / "serve.yaml").write_text("models:\n" + "".join(entries))
    process = start_server(root / "serve.yaml")
    yield process
    assert process.stop() == 0, process.log()


def clients(server: ServerProcess) -> tuple[Any, Any]:
    assert server.grpc_target is not None
    return (
        httpclient.InferenceServerClient(server.http_host_port),
        grpcclient.InferenceServerClient(server.grpc_target),
    )


def infer(client: Any, module: Any, model: str, **kwargs: Any) -> Any:
    x = module.InferInput("x", [3], "FP32")
    x.set_data_from_numpy(np.arange(3, dtype=np.float32))
    return client.infer(model, [x], **kwargs)


def version_of(result: Any) -> str:
    response = result.get_response()
    return str(response["model_version"] if isinstance(response, dict) else response.model_version)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_90_10_split_measures_10_percent_over_5000_requests(
    server: ServerProcess, protocol: str
) -> None:
    rest, grpc = clients(server)
    client, module = (rest, httpclient) if protocol == "http" else (grpc, grpcclient)
    answered = Counter(version_of(infer(client, module, "canary")) for _ in range(REQUESTS))
    share = answered["3"] / REQUESTS
    print(f"{protocol}: version 3 answered {answered['3']} of {REQUESTS} ({share:.2%})")
    assert abs(share - 0.10) <= 0.02, answered
    assert {version_of(infer(client, module, "canary", model_version="3")) for _ in range(20)} == {
        "3"
    }


def test_a_traffic_key_keeps_one_version_over_http_and_grpc(server: ServerProcess) -> None:
    rest, grpc = clients(server)
    routing = routing_of({"2": 90, "3": 10}, None, {})
    assert routing is not None
    seen: dict[str, set[str]] = {}
    for n in range(40):
        key = f"customer-{n}"
        versions: set[str] = set()
        for client, module in ((rest, httpclient), (grpc, grpcclient)) * 5:
            # (a dict each call: tritonclient.http adds its own headers to the one it is given)
            headers = {TRAFFIC_KEY_HEADER: key}
            versions.add(version_of(infer(client, module, "canary", headers=headers)))
        seen[key] = versions
    assert all(v == {str(choose(routing, draw(k.encode())))} for k, v in seen.items()), seen
    assert {next(iter(v)) for v in seen.values()} == {"2", "3"}  # 40 keys reach both


def timed(client: Any, model: str, count: int) -> list[float]:
    """The latency (ms) of ``count`` requests to ``model``, one at a time."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        infer(client, httpclient, model)
        times.append((time.perf_counter() - started) * 1e3)
    return times


def test_a_sleeping_shadow_does_not_move_the_served_p99(server: ServerProcess) -> None:
    """The served version's p99 with a shadow (``shadowed``: 20% copied to a version that
    sleeps 50 ms) and without (``plain``, the same model otherwise), in the same run: PAIRS
    pairs of blocks of BLOCK requests, one block of each model back to back (in turns first),
    so the machine's other load, which moves a block's p99 by milliseconds on a shared machine,
    falls on both blocks of a pair alike. Compared: the median over the pairs of the difference
    of the two blocks' p99 (robust to the pairs a burst of other load hit); every figure is
    printed."""
    rest, _ = clients(server)
    started = time.perf_counter()
    infer(rest, httpclient, "shadowed", model_version="3")
    assert time.perf_counter() - started >= 0.05  # version 3 does sleep 50 ms
    for model in ("plain", "shadowed"):  # warm both (their placement is measured first)
        timed(rest, model, 200)
    samples: dict[str, list[float]] = {"plain": [], "shadowed": []}
    differences = []
    for index in range(PAIRS):
        order = ("plain", "shadowed") if index % 2 == 0 else ("shadowed", "plain")
        blocks = {model: timed(rest, model, BLOCK) for model in order}
        differences.append(
            float(np.percentile(blocks["shadowed"], 99) - np.percentile(blocks["plain"], 99))
        )
        for model, times in blocks.items():
            samples[model] += times
    difference = statistics.median(differences)
    p99 = {model: float(np.percentile(times, 99)) for model, times in samples.items()}
    p50 = {model: statistics.median(times) for model, times in samples.items()}
    stats = rest.get_inference_statistics("shadowed", "3")["model_stats"][0]["shadow"]
    figures = (
        f"median over {PAIRS} pairs of blocks of {BLOCK} of p99(shadow on) - p99(off): "
        f"{difference:.3f} ms (quartiles {np.percentile(differences, [25, 75]).round(3)}); "
        f"over all {PAIRS * BLOCK} requests each: p99 off {p99['plain']:.3f}, on "
        f"{p99['shadowed']:.3f}; p50 off {p50['plain']:.3f}, on {p50['shadowed']:.3f}; "
        f"shadow copies {stats}"
    )
    print(figures)
    assert difference < 1.0, figures
    assert stats.get("agreed", 0) > 0 and stats.get("dropped", 0) > 0, figures


def test_the_shadow_agreement_is_in_statistics_metrics_and_the_model_page(
    server: ServerProcess,
) -> None:
    rest, grpc = clients(server)
    for _ in range(50):
        assert version_of(infer(grpc, grpcclient, "shadowed")) == "2"

    def counts() -> dict[str, int]:
        entry = rest.get_inference_statistics("shadowed", "3")["model_stats"][0]
        return dict(entry.get("shadow", {}))

    wait_until(lambda: counts().get("agreed", 0) > 0, timeout=30)
    assert set(counts()) <= {"agreed", "dropped"}  # the sleeping version agrees
    with server.http_client(timeout=10) as http:
        metrics = http.get("/metrics").text
        assert 'servekit_shadow_copies_total{model="shadowed",outcome="agreed",version="3"}' in (
            metrics
        )
        page = http.get("/models/shadowed").text
    assert 'id="shadow-agreement"' in page and "<td data-agreement>100%</td>" in page, page
    agreed = page.split('data-shadow="agreed">', 1)[1].split("<", 1)[0]
    assert int(agreed) > 0


def test_the_notebook_and_the_client_send_a_traffic_key(server: ServerProcess) -> None:
    """``traffic_key=`` of ``servekit.connect(...).infer`` (the header over HTTP) and of a
    notebook server's ``infer`` (in process) reach the version the key's hash chooses: version 2
    doubles, version 3 triples."""
    routing = routing_of({"2": 90, "3": 10}, None, {})
    assert routing is not None
    config = Path(server.log_path).parent / "serve.yaml"
    x = np.arange(1, 4, dtype=np.float32)
    remote = servekit.connect(server.http_url)
    factors = set()
    try:
        with servekit.serve(config, http_port=0, grpc_port=None, name="traffic-notebook") as nb:
            for n in range(30):
                key = f"analyst-{n}"
                factor = choose(routing, draw(key.encode()))  # the version is the factor
                factors.add(factor)
                for handle in (remote, nb):
                    for _ in range(3):
                        y = handle.infer("canary", {"x": x}, traffic_key=key)["y"]
                        np.testing.assert_array_equal(y, x * factor)
    finally:
        remote.close()
    assert factors == {2, 3}  # (5 of these 30 keys reach version 3)


def test_two_workers_agree_on_each_key_and_add_up_the_shadow(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Under ``--workers 2`` (each new connection may reach either worker, SO_REUSEPORT): a
    key reaches one version whichever worker draws it (the hash is the same in both), and the
    shadow's counts, kept by each worker, add up in the statistics and /metrics."""
    root = tmp_path_factory.mktemp("traffic-workers")
    module = write_model(root, "m", {2: "double", 3: "triple"})
    extra = '    traffic: {"2": 90, "3": 10}\n    shadow: {version: 3, share: 1}\n'
    (root / "serve.yaml").write_text("models:\n" + model_yaml("m", module, "m", extra))
    routing = routing_of({"2": 90, "3": 10}, None, {})
    assert routing is not None
    server = start_server(root / "serve.yaml", grpc=False, extra=["--workers", "2"])
    try:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}
        copied = 0
        for n in range(30):
            key = f"tenant-{n}"
            expected = str(choose(routing, draw(key.encode())))
            for _ in range(4):  # a new connection each: either worker
                with server.http_client(timeout=10) as http:
                    answer = http.post("/v2/models/m/infer", json=body,
                                       headers={TRAFFIC_KEY_HEADER: key})  # fmt: skip
                assert answer.status_code == 200, answer.text
                assert answer.json()["model_version"] == expected
                copied += expected == "2"  # version 2's answers are copied to 3
        assert copied > 0

        def disagreed() -> int:
            with server.http_client(timeout=10) as http:
                entry = http.get("/v2/models/m/versions/3/stats").json()["model_stats"][0]
            return int(entry.get("shadow", {}).get("disagreed", 0))

        wait_until(lambda: disagreed() == copied, timeout=30)  # 2x served, 3x shadowed
        with server.http_client(timeout=10) as http:
            metrics = http.get("/metrics").text
        sample = (
            f'servekit_shadow_copies_total{{model="m",outcome="disagreed",version="3"}} {copied}'
        )
        assert sample + ".0" in metrics
    finally:
        assert server.stop() == 0, server.log()
