"""The payload log in process: what ``DataPlane.infer`` records (the marked models, the sampled
share, inputs and outputs joined by the request ID), the file sink and its rotation, the counts,
and serve.yaml's checks. The HTTP sink (KServe's CloudEvents), the Authorization header and a
dead sink's cost over real listeners: tests/test_payload_log_e2e.py."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import Echo, Failing, Sum, python_model, request, rows, tensor
from inprocess import Serve, Services, plan_of
from waits import async_wait_until

from servekit.config.loader import ConfigError
from servekit.dashboard import views
from servekit.dashboard.render import environment
from servekit.errors import Internal
from servekit.observability.payloads import (
    BATCH,
    REQUEST,
    RESPONSE,
    PayloadCounts,
    PayloadEvent,
    PayloadLog,
    ce_time,
)
from servekit.observability.request_ids import CURRENT, RequestInfo
from servekit.services.metrics import make_registry

pytestmark = pytest.mark.anyio


def file_log(path: str = "payloads/log.jsonl", **fields: Any) -> str:
    extra = "".join(f"\n    {key}: {json.dumps(value)}" for key, value in fields.items())
    return f"server:\n  payloadLog:\n    sink: file\n    path: {path}{extra}\nmodels: []\n"


def events(path: Path) -> list[dict[str, Any]]:
    """Every event of the log file and its rotated files, oldest file first."""
    files = sorted(path.parent.glob(path.name + "*"), key=lambda p: -len(p.suffixes))
    found = []
    for file in sorted(files, key=lambda p: p.name, reverse=True):
        found += [json.loads(line) for line in file.read_text().splitlines()]
    return found


async def with_models(serve: Serve, yaml_text: str) -> Services:
    services = await serve(yaml_text)
    await services.control.add(python_model("sum", payloadLog=True), Sum())
    await services.control.add(python_model("echo", payloadLog=True), Echo())
    await services.control.add(python_model("quiet"), Sum())
    await services.control.add(python_model("failing", payloadLog=True), Failing())
    return services


def logged(services: Services) -> int:
    counts = services.catalog.payload_log()
    assert counts is not None
    return counts.logged


async def test_request_and_answer_are_written_joined_by_the_request_id(
    serve: Serve, tmp_path: Path
) -> None:
    services = await with_models(serve, file_log())
    info = RequestInfo("client-id-7", True)
    token = CURRENT.set(info)  # what an adapter sets for the request's task
    try:
        await services.dataplane.infer(request("sum", a=rows(1.0), b=rows(2.0)))
    finally:
        CURRENT.reset(token)
    await services.dataplane.infer(request("quiet", a=rows(1.0), b=rows(2.0)))  # not marked
    await async_wait_until(lambda: logged(services) == 2, what="two events logged")
    first, second = events(tmp_path / "payloads" / "log.jsonl")
    assert (first["type"], second["type"]) == (REQUEST, RESPONSE)
    for event in (first, second):
        assert event["specversion"] == "1.0"
        assert event["id"] == "client-id-7"
        assert event["inferenceservicename"] == "sum"
        assert event["modelversion"] == "1"
        assert event["datacontenttype"] == "application/json"
        assert event["component"] == "predictor"
        assert event["endpoint"] == "default"
        assert event["metadata"] == "{}"
    assert first["data"]["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4},
        {"name": "b", "datatype": "FP32", "shape": [1, 4], "data": [2.0] * 4},
    ]
    assert second["data"] == {
        "model_name": "sum",
        "model_version": "1",
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, 4], "data": [3.0] * 4}],
    }


async def test_a_failed_request_is_logged_without_an_answer(serve: Serve, tmp_path: Path) -> None:
    services = await with_models(serve, file_log())
    failing = request("failing", x=[1.0, 2.0])
    failing.id = "v2-body-id"
    with pytest.raises(Internal):
        await services.dataplane.infer(failing)
    text = np.array([b"caf\xc3\xa9", b"\xff"], dtype=np.object_)
    echo = request("echo", tensor("text", text, "BYTES"))
    await services.dataplane.infer(echo)
    await async_wait_until(lambda: logged(services) == 3, what="three events logged")
    failed, echo_in, echo_out = events(tmp_path / "payloads" / "log.jsonl")
    assert (failed["type"], failed["id"]) == (REQUEST, "v2-body-id")  # no answer event
    assert failed["data"]["id"] == "v2-body-id"
    assert echo_in["id"] == echo_out["id"]  # one made ID joins them
    assert echo_out["data"]["outputs"][0]["data"] == ["café", "\\xff"]


async def test_inputs_or_outputs_only(serve: Serve, tmp_path: Path) -> None:
    services = await with_models(serve, file_log(outputs=False))
    for _ in range(3):
        await services.dataplane.infer(request("sum", a=rows(1.0), b=rows(2.0)))
    await async_wait_until(lambda: logged(services) == 3, what="three events logged")
    assert {e["type"] for e in events(tmp_path / "payloads" / "log.jsonl")} == {REQUEST}


async def test_the_sampling_ratio_is_respected(serve: Serve, tmp_path: Path) -> None:
    ratio, total = 0.3, 2000
    services = await with_models(serve, file_log(sampleRatio=ratio, outputs=False))
    for _ in range(total):
        await services.dataplane.infer(request("sum", a=rows(1.0), b=rows(2.0)))
    payloads = services.kit.state.payloads
    assert payloads is not None
    await asyncio.to_thread(payloads.close)  # what is queued is written (as at a stop)
    counts = payloads.counts()
    drawn = counts.logged + counts.dropped  # a slow disk may drop some: they were drawn too
    # Binomial: 5 standard deviations either side (about 1 in 1.7 million to fail by chance).
    spread = 5 * math.sqrt(total * ratio * (1 - ratio))
    assert abs(drawn - total * ratio) <= spread, drawn
    assert len(events(tmp_path / "payloads" / "log.jsonl")) == counts.logged


async def test_the_file_rotates_by_size(serve: Serve, tmp_path: Path) -> None:
    services = await with_models(serve, file_log(maxBytes=2048, backupCount=2))
    for _ in range(40):
        await services.dataplane.infer(request("sum", a=rows(1.0), b=rows(2.0)))
    await async_wait_until(lambda: logged(services) == 80, what="80 events logged")
    folder = tmp_path / "payloads"
    assert sorted(p.name for p in folder.iterdir()) == ["log.jsonl", "log.jsonl.1", "log.jsonl.2"]
    for file in folder.iterdir():
        lines = file.read_text().splitlines()
        longest = max(len(line) for line in lines) + 1
        assert file.stat().st_size <= 2048 + BATCH * longest  # past maxBytes by one write at most
        assert all(json.loads(line)["inferenceservicename"] == "sum" for line in lines)
    # The newest events are kept, in order: the last file written ends with the last answer.
    assert json.loads((folder / "log.jsonl").read_text().splitlines()[-1])["type"] == RESPONSE


async def test_counts_are_metrics(serve: Serve) -> None:
    services = await with_models(serve, file_log())
    await services.dataplane.infer(request("sum", a=rows(1.0), b=rows(2.0)))
    await async_wait_until(lambda: logged(services) == 2, what="two events logged")
    registry = make_registry(services.catalog)
    assert registry.get_sample_value("servekit_payload_log_logged_total") == 2
    full = {"reason": "queue_full"}
    assert registry.get_sample_value("servekit_payload_log_dropped_total", full) == 0
    assert services.catalog.payload_sink() == "file log.jsonl"  # no absolute path shown


async def test_no_payload_log_no_counts(serve: Serve) -> None:
    services = await serve()
    assert services.catalog.payload_log() is None
    registry = make_registry(services.catalog)
    assert registry.get_sample_value("servekit_payload_log_logged_total") is None


def test_ce_time_is_rfc3339_utc_as_kserve_writes_it() -> None:
    assert ce_time(0.0) == "1970-01-01T00:00:00Z"
    assert ce_time(1.25) == "1970-01-01T00:00:01.25Z"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (
            "models:\n- {name: m, modelFormat: {name: python}, entrypoint: 'x:y',\n"
            "   payloadLog: true}\n",
            "payloadLog: true needs server.payloadLog",
        ),
        (
            "server:\n  workers: 2\n  payloadLog: {sink: file, path: p.jsonl}\n",
            "payloadLog sink: file needs one server process",
        ),
        ("server:\n  payloadLog: {sink: http}\n", "sink: http sends to url"),
        ("server:\n  payloadLog: {sink: file, url: 'http://x'}\n", "sink: file writes to path"),
        (
            "server:\n  payloadLog: {sink: http, url: 'ftp://u:secret@x/'}\n",
            "expected http://host:port/path",
        ),
        ("server:\n  payloadLog: {sink: http, url: 'http://x', sampleRatio: 2}\n", "less than"),
    ],
)
def test_serve_yaml_checks(tmp_path: Path, yaml_text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_of(yaml_text, tmp_path)
    assert message in str(caught.value)
    assert "secret" not in str(caught.value)


async def test_the_dashboard_shows_the_counts_to_admins(serve: Serve) -> None:
    services = await with_models(serve, file_log())
    await services.dataplane.infer(request("sum", a=rows(1.0), b=rows(2.0)))
    await async_wait_until(lambda: logged(services) == 2, what="two events logged")
    sources = views.Sources(services.dataplane, services.control, services.catalog)
    assert views.overview(sources, admin=False)["payload_log"] is None  # admin data
    server = views.overview(sources, admin=True)
    assert server["payload_log"] == {
        "sink": "file log.jsonl",
        "logged": 2,
        "dropped": 0,
        "queue_full": 0,
        "sink_failed": 0,
    }
    html = (
        environment()
        .get_template("home.html")
        .render(server=server, asks=[], gated=[], page="home", servekit_version="0")
    )
    card = html.split('id="payload-log"', 1)[1].split("</section>", 1)[0]
    assert '<dd data-bind="payload-logged">2</dd>' in card
    assert "file log.jsonl" in card
    assert str(services.kit.plan.base_dir) not in html  # no absolute path


class Stuck:
    """A sink whose first write blocks until released, as a sink that never answers."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.written: list[str] = []

    def write(self, events: list[tuple[PayloadEvent, bytes]], source: str) -> None:
        self.entered.set()
        self.release.wait(10)
        self.written += [event.id for event, _ in events]

    def close(self) -> None:
        pass

    def shown(self) -> str:
        return "stuck"


def test_a_stuck_sink_fills_the_bounded_queue_and_the_rest_is_dropped_at_once() -> None:
    sink = Stuck()
    log = PayloadLog(sink, lambda: "http://localhost/", capacity=8)

    def event(n: int) -> PayloadEvent:
        return PayloadEvent(REQUEST, str(n), "m", "1", time.time(), lambda: b"{}")

    log.offer(event(0))
    assert sink.entered.wait(10)  # the thread holds event 0 in the sink
    began = time.monotonic()
    offered = 0
    for n in range(1, 1001):
        if log.admits(1):
            log.offer(event(n))
            offered += 1
    spent = time.monotonic() - began
    assert offered == 8  # the queue's bound
    assert log.counts() == PayloadCounts(0, 992, 0)
    assert spent < 0.5  # 1,000 offers never waited on the stuck sink
    sink.release.set()
    log.close()
    assert sink.written == [str(n) for n in range(9)]
    assert log.counts().logged == 9
