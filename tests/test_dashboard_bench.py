"""Issue 22: the dashboard's Benchmark route against a real server with a token per group.

One server on loopback with distinct tokens for inference, metadata, repository and admin, a
fast ONNX model and a Python model that takes 0.4 s a call. The route needs the admin token
alone; each step's length is a hard deadline whatever the model's speed; a second run while one
is going is answered 409; and a run whose client leaves stops (the slow model's request count
stops growing and the next run may start at once).
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator

import httpx
import onnx_builders
import orjson
import pytest
from repo_helpers import SLOW_MODEL, onnx_bytes
from servers import ServerProcess, running_server

pytestmark = pytest.mark.slow

TOKENS = {"inference": "inf-t0ken", "metadata": "meta-t0ken", "repository": "repo-t0ken",
          "admin": "admin-t0ken"}  # fmt: skip
ADMIN = {"Authorization": f"Bearer {TOKENS['admin']}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bench")
    (root / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (root / "slow_model.py").write_text(SLOW_MODEL)
    auth = ", ".join(f"{group}: {token}" for group, token in TOKENS.items())
    config = root / "serve.yaml"
    config.write_text(
        f"server: {{auth: {{{auth}}}}}\n"
        "models:\n"
        "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
        "  - {name: slow, modelFormat: {name: python}, entrypoint: 'slow_model:predict'}\n"
    )
    with running_server(config) as started:
        yield started


def bench_url(server: ServerProcess, model: str) -> str:
    return f"{server.http_url}/dashboard/api/models/{model}/benchmark"


def served(server: ServerProcess, model: str) -> int:
    """Successful requests ``model`` has answered (its statistics, admin token)."""
    reply = httpx.get(f"{server.http_url}/v2/models/{model}/stats", headers=ADMIN, timeout=10)
    reply.raise_for_status()
    return int(reply.json()["model_stats"][0]["inference_stats"]["success"]["count"])


def until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def test_the_button_needs_the_admin_token_and_only_it(server: ServerProcess) -> None:
    body = {"seconds": 0.3, "concurrency": [1, 2]}
    url = bench_url(server, "add_sub")
    for group in ("metadata", "inference", "repository"):
        other = {"Authorization": f"Bearer {TOKENS[group]}"}
        refused = httpx.post(url, json=body, headers=other, timeout=30)
        assert refused.status_code == 401 and "server.auth.admin" in refused.json()["error"]
    reply = httpx.post(url, json=body, headers=ADMIN, timeout=60)
    assert reply.status_code == 200, reply.text
    rows = reply.json()["rows"]
    assert len(rows) == 4 and all(r["requests"] > 0 and r["errors"] == 0 for r in rows), rows


def test_a_slow_model_cannot_stretch_a_step(server: ServerProcess) -> None:
    # 32 requests in flight on a model answering ~2.5 a second: draining them would take 13 s
    # a step; each step is 1 s, HTTP then gRPC.
    began = time.monotonic()
    reply = httpx.post(
        bench_url(server, "slow"), json={"seconds": 1, "concurrency": [32]}, headers=ADMIN,
        timeout=120,
    )  # fmt: skip
    took = time.monotonic() - began
    assert reply.status_code == 200, reply.text
    assert took < 2 * 1 + 3.0, f"two 1 s steps took {took:.1f} s"
    rows = reply.json()["rows"]
    assert [r["protocol"] for r in rows] == ["http", "grpc"]
    assert all(r["errors"] == 0 for r in rows), rows  # abandoned at the deadline: no error


def test_a_second_run_meanwhile_is_409_and_a_leaving_client_stops_its_run(
    server: ServerProcess,
) -> None:
    before = served(server, "slow")
    conn = http.client.HTTPConnection(server.http_host_port, timeout=60)
    body = orjson.dumps({"seconds": 10, "concurrency": [4]})
    conn.request("POST", "/dashboard/api/models/slow/benchmark", body=body,
                 headers={**ADMIN, "Content-Type": "application/json"})  # fmt: skip
    until(lambda: served(server, "slow") > before, 15, "the benchmark drives the slow model")

    busy = httpx.post(bench_url(server, "add_sub"), json={"seconds": 0.2}, headers=ADMIN)
    assert busy.status_code == 409, busy.text
    assert "already running" in busy.json()["error"]

    conn.close()  # the client leaves (20 s of benchmark were asked for)
    left = time.monotonic()

    def next_run_starts() -> bool:
        reply = httpx.post(
            bench_url(server, "add_sub"), json={"seconds": 0.2, "concurrency": [1]},
            headers=ADMIN, timeout=30,
        )  # fmt: skip
        assert reply.status_code in (200, 409), reply.text
        return reply.status_code == 200

    until(next_run_starts, 6, "the left run to stop and free its place")
    assert time.monotonic() - left < 6
    stopped_at = served(server, "slow")
    time.sleep(1.5)  # an observation window, not a wait for a condition
    assert served(server, "slow") == stopped_at, "the slow model is still being driven"
    server.assert_healthy()
