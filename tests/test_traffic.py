"""Traffic between versions, in process (issue 43): serve.yaml's ``traffic`` shares requests
naming no version between versions, by a hash of the ``servekit-traffic-key`` header when sent;
``shadow`` copies a share of them to another version and counts how its answers compare.

The end-to-end tests through real clients (HTTP and gRPC, the shadow's cost to latency, the
dashboard) are in tests/test_traffic_e2e.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from inprocess import Serve, Services, plan_of
from traffic_models import model_yaml, write_model
from waits import async_wait_until

from servekit.cli import main
from servekit.config.loader import ConfigError, load_config
from servekit.config.overrides import load_plan
from servekit.config.traffic import TRAFFIC_KEY_HEADER, Routing, routing_of
from servekit.dashboard.traffic import traffic
from servekit.models.repository import State
from servekit.observability.metrics import render
from servekit.observability.request_ids import CURRENT, RequestInfo
from servekit.services import make_registry
from servekit.services import traffic as traffic_module
from servekit.services.stats import VersionStats
from servekit.services.traffic import agree, choose, draw
from servekit.types import InferRequest, Tensor
from servekit.workers.stats import add_json, stats_to_json

SPLIT = '    traffic: {"2": 90, "3": 10}\n'
REQUESTS = 5000


def ninety_ten() -> Routing:
    routing = routing_of({"2": 90, "3": 10}, None, {})
    assert routing is not None
    return routing


def request(version: str | None = None) -> InferRequest:
    x = np.arange(3, dtype=np.float32)
    return InferRequest("m", [Tensor("x", "FP32", (3,), x)], model_version=version)


async def start(serve: Serve, tmp_path: Path, versions: dict[int, str], extra: str) -> Services:
    module = write_model(tmp_path, "m", versions)
    services: Services = await serve("models:\n" + model_yaml("m", module, "m", extra))
    return services


def keyed(key: str | None, grpc: bool = False) -> RequestInfo:
    """A request as the adapters record it, with the traffic key header (HTTP: bytes pairs;
    gRPC: the metadata's str pairs)."""
    info = RequestInfo("test", False)
    if key is not None:
        info.sent_headers = (
            ((TRAFFIC_KEY_HEADER, key),)
            if grpc
            else [
                (b"content-type", b"application/json"),
                (TRAFFIC_KEY_HEADER.encode(), key.encode()),
            ]
        )
    return info


def within_two_points(versions: Counter[str], total: int) -> float:
    share = versions["3"] / total
    assert abs(share - 0.10) <= 0.02, versions
    return share


# -- the chooser ------------------------------------------------------------------------------
def test_a_90_10_split_draws_10_percent_of_5000() -> None:
    routing = ninety_ten()
    chosen = Counter(str(choose(routing, draw(None))) for _ in range(REQUESTS))
    assert set(chosen) == {"2", "3"}
    within_two_points(chosen, REQUESTS)


def test_keys_are_shared_by_the_split_and_each_stays_on_one_version() -> None:
    routing = ninety_ten()
    chosen = Counter(str(choose(routing, draw(f"user-{n}".encode()))) for n in range(REQUESTS))
    within_two_points(chosen, REQUESTS)
    for n in range(50):
        key = f"user-{n}".encode()
        assert len({choose(routing, draw(key)) for _ in range(20)}) == 1


def test_the_split_bounds_follow_the_percentages() -> None:
    routing = routing_of({"1": 25, "2": 0, "3": 75}, None, {})
    assert routing is not None
    assert [choose(routing, p) for p in (0.0, 0.2499, 0.25, 0.9999)] == [1, 1, 3, 3]
    labelled = routing_of({"stable": 100}, None, {"stable": 7})
    assert labelled is not None and labelled.versions == (7,)


def test_agreement_is_within_the_float_tolerance_and_exact_otherwise() -> None:
    y = np.array([1.0, 2.0, np.nan], np.float32)
    served = [Tensor("y", "FP32", (3,), y)]
    assert agree(served, [Tensor("y", "FP32", (3,), y + np.float32(1e-6))])
    assert not agree(served, [Tensor("y", "FP32", (3,), y * 1.01)])
    assert not agree(served, [Tensor("y", "FP32", (2,), y[:2])])
    assert not agree(served, [Tensor("z", "FP32", (3,), y)])
    labels = [Tensor("label", "INT64", (2,), np.array([1, 2]))]
    assert agree(labels, [Tensor("label", "INT64", (2,), np.array([1, 2]))])
    assert not agree(labels, [Tensor("label", "INT64", (2,), np.array([1, 3]))])


# -- through the DataPlane ----------------------------------------------------------------
@pytest.mark.anyio
async def test_unversioned_requests_follow_the_split_and_versioned_ones_do_not(
    serve: Serve, tmp_path: Path
) -> None:
    services = await start(serve, tmp_path, {2: "double", 3: "double"}, SPLIT)
    infer = services.dataplane.infer
    answered = Counter([(await infer(request())).model_version for _ in range(REQUESTS)])
    within_two_points(answered, REQUESTS)
    assert {(await infer(request("3"))).model_version for _ in range(50)} == {"3"}
    assert {(await infer(request("2"))).model_version for _ in range(50)} == {"2"}


@pytest.mark.anyio
@pytest.mark.parametrize("grpc", [False, True], ids=["http-headers", "grpc-metadata"])
async def test_a_traffic_key_keeps_its_version(serve: Serve, tmp_path: Path, grpc: bool) -> None:
    services = await start(serve, tmp_path, {2: "double", 3: "double"}, SPLIT)
    seen: dict[str, set[str]] = {}
    for n in range(40):
        token = CURRENT.set(keyed(f"user-{n}", grpc))
        try:
            versions = {
                (await services.dataplane.infer(request())).model_version for _ in range(10)
            }
        finally:
            CURRENT.reset(token)
        seen[f"user-{n}"] = versions
    assert all(len(v) == 1 for v in seen.values()), seen
    routing = ninety_ten()
    for key, versions in seen.items():  # the hash decides: the same on every worker
        assert versions == {str(choose(routing, draw(key.encode())))}


@pytest.mark.anyio
async def test_a_split_version_that_is_not_ready_gives_its_share_to_the_serving_one(
    serve: Serve, tmp_path: Path
) -> None:
    split = '    traffic: {"1": 50, "2": 50}\n'
    services = await start(serve, tmp_path, {1: "double", 2: "double"}, split)
    infer = services.dataplane.infer
    assert {(await infer(request())).model_version for _ in range(200)} == {"1", "2"}
    # version 1 stops serving (an isolated model's process restarting is set so the same way)
    services.kit.repository.get("m").versions[1].state = State.UNAVAILABLE
    assert {(await infer(request())).model_version for _ in range(200)} == {"2"}


# -- the shadow ----------------------------------------------------------------------------
SHADOW_ALL = "    shadow: {version: 3, share: 1}\n"


async def shadowed(services: Services, count: int) -> dict[str, int]:
    """Send ``count`` unversioned requests; every answer is version 2's; wait for the copies."""
    for _ in range(count):
        answer = await services.dataplane.infer(request())
        assert answer.model_version == "2"
        np.testing.assert_array_equal(answer.outputs[0].data, np.arange(3, dtype=np.float32) * 2)
    stats = services.catalog.version_stats("m", 3)
    await async_wait_until(lambda: sum(stats.shadow.values()) == count, timeout=10)
    return dict(stats.shadow)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "outcome"),
    [("nudge", "agreed"), ("triple", "disagreed"), ("fail", "failed")],
)
async def test_a_shadow_copy_is_compared_and_never_answers(
    serve: Serve, tmp_path: Path, kind: str, outcome: str
) -> None:
    split = "    defaultVersion: 2\n" + SHADOW_ALL
    services = await start(serve, tmp_path, {2: "double", 3: kind}, split)
    assert await shadowed(services, 30) == {outcome: 30}
    entry = services.statistics("m", "3")
    assert entry["shadow"] == {outcome: 30}
    assert "shadow" not in services.statistics("m", "2")
    metrics = render(make_registry(services.catalog)).decode()
    sample = f'servekit_shadow_copies_total{{model="m",outcome="{outcome}",version="3"}} 30.0'
    assert sample in metrics
    view = traffic(services.catalog, services.catalog.model("m"))
    assert view is not None and view["shadow"]["counts"][outcome] == 30
    expected = {"agreed": 100.0, "disagreed": 0.0, "failed": None}[outcome]
    assert view["shadow"]["agreement"] == expected


@pytest.mark.anyio
async def test_requests_naming_a_version_are_not_copied(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path, {2: "double", 3: "double"}, SPLIT + SHADOW_ALL)
    for _ in range(20):
        await services.dataplane.infer(request("2"))
    for _ in range(20):
        await services.dataplane.infer(request())  # 2 or 3; those answered by 3 are not copied
    answered_by_2 = services.catalog.version_stats("m", 2).success.count - 20
    stats = services.catalog.version_stats("m", 3)
    await async_wait_until(lambda: sum(stats.shadow.values()) == answered_by_2, timeout=10)
    assert stats.shadow == ({"agreed": answered_by_2} if answered_by_2 else {})


@pytest.mark.anyio
async def test_a_full_shadow_queue_drops_copies_and_counts_them(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(traffic_module, "SHADOW_QUEUE", 2)
    extra = "    defaultVersion: 2\n" + SHADOW_ALL
    services = await start(serve, tmp_path, {2: "double", 3: "sleep"}, extra)
    answers = await asyncio.gather(*(services.dataplane.infer(request()) for _ in range(10)))
    assert {a.model_version for a in answers} == {"2"}
    stats = services.catalog.version_stats("m", 3)
    await async_wait_until(lambda: sum(stats.shadow.values()) == 10, timeout=10)
    assert stats.shadow["dropped"] >= 8 - 2 and stats.shadow.get("agreed", 0) >= 2, stats.shadow


# -- serve.yaml ----------------------------------------------------------------------------
def problems(tmp_path: Path, extra: str, versions: tuple[int, ...] = (2, 3)) -> str:
    module = write_model(tmp_path, "m", dict.fromkeys(versions, "double"))
    path = tmp_path / "serve.yaml"
    path.write_text("models:\n" + model_yaml("m", module, "m", extra))
    with pytest.raises(ConfigError) as caught:
        load_plan(path)
    return str(caught.value)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ('    traffic: {"2": 90, "3": 20}\n', "add up to 110, not 100"),
        ('    traffic: {"2": 90, "3": -10}\n', "greater than or equal to 0"),
        ("    traffic: {}\n", "at least one version"),
        ('    traffic: {"2": 50, "stable": 50}\n', "'stable' is neither a number nor a label"),
        ('    traffic: {"2": 50, "4": 50}\n', "version 4, which the model does not serve"),
        ("    shadow: {version: 5, share: 0.2}\n", "version 5, which the model does not serve"),
        ("    shadow: {version: 3, share: 0}\n", "greater than 0"),
        ("    shadow: {version: 3, share: 1.5}\n", "less than or equal to 1"),
        ("    shadow: {share: 0.5}\n", "version"),
        ('    defaultVersion: 2\n    traffic: {"2": 100}\n', "defaultVersion or traffic"),
        ("    shadow: {version: 3, share: 0.5}\n", "it would get no copies"),
    ],
)
def test_a_split_or_shadow_that_cannot_be_served_is_a_config_error(
    tmp_path: Path, extra: str, words: str
) -> None:
    message = problems(tmp_path, extra)
    assert words in message, message
    assert "serve.yaml:" in message  # located at its line


def test_traffic_by_label_and_unquoted_numbers_compile(tmp_path: Path) -> None:
    module = write_model(tmp_path, "m", {2: "double", 3: "double"})
    extra = "    versionLabels: {stable: 2}\n    traffic: {stable: 75, 3: 25}\n"
    extra += "    shadow: {version: 3, share: 0.25}\n"
    path = tmp_path / "serve.yaml"
    path.write_text("models:\n" + model_yaml("m", module, "m", extra))
    plan = load_plan(path).models[0]
    assert plan.routing == Routing((2, 3), (0.75, 1.0), 3, 0.25)


def test_a_pipeline_or_a_sequence_model_has_no_traffic(tmp_path: Path) -> None:
    pipeline = """models:
  - name: p
    pipeline: [{model: m, inputs: {x: x}, outputs: {y: y}}]
    inputs: [{name: x, datatype: FP32, shape: [-1]}]
    outputs: [{name: y, datatype: FP32, shape: [-1]}]
    traffic: {"1": 100}
"""
    path = tmp_path / "serve.yaml"
    path.write_text(pipeline)
    with pytest.raises(ConfigError, match="a pipeline runs other models and has no traffic"):
        load_config(path)
    sequence = "    sequenceBatching: {}\n    shadow: {version: 3, share: 0.5}\n"
    assert "not offered for a sequence model" in problems(tmp_path, sequence)


def test_shadow_counts_add_up_over_workers() -> None:
    """A worker's snapshot carries its shadow counts; the statistics of several add them."""
    mine, theirs = VersionStats(), VersionStats()
    mine.shadow.update(agreed=3, dropped=1)
    theirs.shadow.update(agreed=2, disagreed=4)
    total = VersionStats()
    for stats in (mine, theirs):
        add_json(total, stats_to_json(stats))
    assert total.shadow == {"agreed": 5, "dropped": 1, "disagreed": 4}


def test_validate_prints_the_split_and_the_shadow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = write_model(tmp_path, "m", {2: "double", 3: "double", 4: "double"})
    extra = SPLIT + '    shadow: {version: "4", share: 0.2}\n'
    (tmp_path / "serve.yaml").write_text("models:\n" + model_yaml("m", module, "m", extra))
    assert main(["validate", str(tmp_path / "serve.yaml")]) == 0
    assert "versions 2,3,4, traffic 2: 90%, 3: 10%; shadow 4 gets 20%" in capsys.readouterr().out


@pytest.mark.anyio
async def test_a_decoupled_models_streams_follow_the_split(serve: Serve, tmp_path: Path) -> None:
    module = write_model(tmp_path, "m", {2: "double", 3: "triple"})
    entry = model_yaml("m", module, "m", SPLIT, attribute="Streaming")
    services = await serve("models:\n" + entry)
    routing = ninety_ten()
    for n in range(20):
        key = f"user-{n}"
        token = CURRENT.set(keyed(key))
        try:
            answers = [a async for a in services.dataplane.infer_stream(request())]
        finally:
            CURRENT.reset(token)
        number = choose(routing, draw(key.encode()))
        assert [a.model_version for a in answers] == [str(number)] * 2
        x = np.arange(3, dtype=np.float32)
        np.testing.assert_array_equal(answers[0].outputs[0].data, x * number)


@pytest.mark.anyio
async def test_an_edited_split_applies_without_reloading_the_versions(
    serve: Serve, tmp_path: Path
) -> None:
    module = write_model(tmp_path, "m", {2: "double", 3: "triple"})
    services = await serve("models:\n" + model_yaml("m", module, "m", SPLIT))
    loaded = dict(services.kit.repository.get("m").versions)
    edited = "models:\n" + model_yaml("m", module, "m", '    traffic: {"2": 0, "3": 100}\n')
    done = await services.control.apply_plan(plan_of(edited, tmp_path))
    assert done["reloaded"] == ["m"] and not done["failed"]
    now = services.kit.repository.get("m").versions
    assert all(now[number] is loaded[number] for number in (2, 3))  # not loaded again
    answers = [await services.dataplane.infer(request()) for _ in range(50)]
    assert {a.model_version for a in answers} == {"3"}
    np.testing.assert_array_equal(answers[0].outputs[0].data, np.arange(3, dtype=np.float32) * 3)
    shadow = edited + "    shadow: {version: 2, share: 1}\n"
    await services.control.apply_plan(plan_of(shadow, tmp_path))
    now = services.kit.repository.get("m").versions
    assert all(now[number] is loaded[number] for number in (2, 3))
    await services.dataplane.infer(request())
    stats = services.catalog.version_stats("m", 2)
    await async_wait_until(lambda: stats.shadow == {"disagreed": 1}, timeout=10)


@pytest.mark.anyio
async def test_a_graceful_stop_does_not_wait_for_shadow_copies(
    serve: Serve, tmp_path: Path
) -> None:
    extra = "    defaultVersion: 2\n" + SHADOW_ALL
    services = await start(serve, tmp_path, {2: "double", 3: "sleep"}, extra)
    for _ in range(40):  # 40 copies of 50 ms each wait for version 3's one instance: 2 s
        await services.dataplane.infer(request())
    started = time.monotonic()
    await services.stop()
    assert time.monotonic() - started < 1.0
    assert services.dataplane.in_flight() == 0
