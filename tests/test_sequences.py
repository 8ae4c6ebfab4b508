"""Sequence batching (serve.yaml ``sequenceBatching``, Triton's meaning) driven in process.

The DataPlane every protocol calls, with the models of tests/sequence_models.py: requests of
a sequence run in order on one instance with the state their sequence left (the accumulate
model keeps its running sum in the server's implicit state); a sequence holds its slot until
its END or until it is idle ``maxSequenceIdleMicroseconds``, and a sequence waiting for a
slot gets it then; requests without a correlation ID, without START for an unknown
sequence, with a batch of two or a correlation ID of the wrong type are refused with
Triton's words; the model configuration shows ``sequence_batching`` as Triton does and the
control and state tensors stay out of what clients see.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from inprocess import Serve, Services
from sequence_models import CONFIG, write_project
from waits import async_wait_until

from servekit.config.loader import ConfigError, parse_config
from servekit.errors import InvalidArgument, Overloaded
from servekit.grpc.triton_proto import model_config_message
from servekit.observability.metrics import render as render_metrics
from servekit.observability.request_ids import CURRENT, RequestInfo, client_address
from servekit.rest.triton_json import model_config_json
from servekit.services import make_registry
from servekit.types import InferRequest, Tensor

pytestmark = pytest.mark.anyio


async def start(serve: Serve, tmp_path: Path) -> Services:
    write_project(tmp_path)
    services: Services = await serve(CONFIG)
    return services


def request(
    model: str, value: int, sequence: Any, *, start: bool = False, end: bool = False, rows: int = 1
) -> InferRequest:
    batched = model != "one_slot"
    shape = (rows, 1) if batched else (1,)
    data = np.full(shape, value, np.int32)
    params: dict[str, Any] = {"sequence_start": start, "sequence_end": end}
    if sequence is not None:
        params["sequence_id"] = sequence
    return InferRequest(model, [Tensor("INPUT", "INT32", shape, data)], parameters=params)


async def send(
    services: Services, model: str, value: int, sequence: Any, **flags: Any
) -> dict[str, int]:
    response = await services.dataplane.infer(request(model, value, sequence, **flags))
    return {t.name: int(t.data.reshape(-1)[0]) for t in response.outputs}


async def test_the_state_of_a_sequence_is_its_own_running_sum(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    assert (await send(services, "accumulate", 5, 1, start=True))["OUTPUT"] == 5
    assert (await send(services, "accumulate", 100, 2, start=True))["OUTPUT"] == 100
    assert (await send(services, "accumulate", 3, 1))["OUTPUT"] == 8
    assert (await send(services, "accumulate", 1, 2))["OUTPUT"] == 101
    last = await send(services, "accumulate", 2, 1, end=True)
    assert last == {"OUTPUT": 10, "INSTANCE": last["INSTANCE"], "SEEN_ID": 1, "SEEN_END": 1}
    # START again on the same ID: a new sequence, its sum starts over
    assert (await send(services, "accumulate", 7, 1, start=True))["OUTPUT"] == 7
    counts = services.catalog.sequence_counts("accumulate")
    assert (counts.started, counts.ended, counts.active) == (3, 1, 2)
    text = render_metrics(make_registry(services.catalog)).decode()
    assert 'servekit_sequences_total{event="started",model="accumulate",version="1"} 3.0' in text
    assert 'servekit_sequences_now{model="accumulate",version="1",where="active"} 2.0' in text


async def test_requests_of_a_sequence_run_in_order_on_one_instance(
    serve: Serve, tmp_path: Path
) -> None:
    # Two instances, a pause in each call, four sequences of 12 requests all sent at once.
    services = await start(serve, tmp_path)
    ids = [11, 12, 13, 14]
    tasks = []
    for step in range(12):
        for corrid in ids:
            flags = {"start": step == 0, "end": step == 11}
            tasks.append(
                asyncio.ensure_future(send(services, "slow_accumulate", step + 1, corrid, **flags))
            )
    answers = await asyncio.gather(*tasks)
    for index, corrid in enumerate(ids):
        mine = answers[index :: len(ids)]
        assert [a["OUTPUT"] for a in mine] == [n * (n + 1) // 2 for n in range(1, 13)]
        assert len({a["INSTANCE"] for a in mine}) == 1, f"sequence {corrid} changed instance"
        assert all(a["SEEN_ID"] == corrid for a in mine)
    assert len({answers[i]["INSTANCE"] for i in range(len(ids))}) == 2  # both instances used
    stats = services.statistics("slow_accumulate")
    assert stats["inference_count"] == 48
    assert stats["execution_count"] < 48  # the oldest strategy batched sequences together
    counts = services.catalog.sequence_counts("slow_accumulate")
    assert (counts.started, counts.ended, counts.active, counts.backlog) == (4, 4, 0, 0)


async def test_a_sequence_waits_for_a_slot_until_another_ends(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)  # one_slot: one instance, one slot
    await send(services, "one_slot", 1, 100, start=True)
    waiting = asyncio.ensure_future(send(services, "one_slot", 50, 200, start=True))
    await async_wait_until(lambda: services.catalog.sequence_counts("one_slot").backlog == 1)
    assert (await send(services, "one_slot", 2, 100))["OUTPUT"] == 3  # the slot's holder goes on
    assert not waiting.done()
    await send(services, "one_slot", 3, 100, end=True)
    assert (await asyncio.wait_for(waiting, 10))["OUTPUT"] == 50
    counts = services.catalog.sequence_counts("one_slot")
    assert (counts.active, counts.backlog, counts.ended) == (1, 0, 1)


async def test_an_idle_sequence_expires_and_frees_its_slot(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)  # one_slot: maxSequenceIdleMicroseconds 200000
    await send(services, "one_slot", 4, 300, start=True)
    waiting = asyncio.ensure_future(send(services, "one_slot", 9, 400, start=True))
    # 300 never ends: after 0.2 s idle its slot goes to 400
    assert (await asyncio.wait_for(waiting, 10))["OUTPUT"] == 9
    counts = services.catalog.sequence_counts("one_slot")
    assert (counts.expired, counts.active) == (1, 1)
    with pytest.raises(InvalidArgument, match="must specify the START flag on the first request"):
        await send(services, "one_slot", 1, 300)
    await async_wait_until(lambda: services.catalog.sequence_counts("one_slot").expired == 2)
    assert services.catalog.sequence_counts("one_slot").active == 0


@pytest.mark.parametrize(
    ("sequence", "flags", "rows", "words"),
    [
        (
            None,
            {},
            1,
            "inference request to model 'accumulate' must specify a non-zero or "
            "non-empty correlation ID",
        ),
        (0, {"start": True}, 1, "must specify a non-zero or non-empty correlation ID"),
        (
            77,
            {},
            1,
            "inference request for sequence 77 to model 'accumulate' must specify the "
            "START flag on the first request of the sequence",
        ),
        (
            78,
            {"start": True},
            2,
            "must specify batch-size 1 due to requirements of sequence batcher",
        ),
        (
            "abc",
            {"start": True},
            1,
            "sequence batching control 'CORRID' data-type is 'BYTES', "
            "but model 'accumulate' expects 'UINT64'",
        ),
        (
            True,
            {"start": True},
            1,
            "parameter 'sequence_id' must be an unsigned integer or a string",
        ),
    ],
)
async def test_bad_sequence_requests_are_refused_with_tritons_words(
    serve: Serve, tmp_path: Path, sequence: Any, flags: dict[str, bool], rows: int, words: str
) -> None:
    services = await start(serve, tmp_path)
    with pytest.raises(InvalidArgument) as raised:
        await services.dataplane.infer(request("accumulate", 1, sequence, rows=rows, **flags))
    assert words in str(raised.value)
    assert services.catalog.sequence_counts("accumulate").active == 0


async def test_string_correlation_ids_without_a_corrid_control(
    serve: Serve, tmp_path: Path
) -> None:
    services = await start(serve, tmp_path)
    assert (await send(services, "simple_sequence", 20, "a-uuid", start=True))["OUTPUT"] == 21
    assert (await send(services, "simple_sequence", -7, "a-uuid", end=True))["OUTPUT"] == -7


async def test_a_long_string_correlation_id_is_refused_with_the_bound(
    serve: Serve, tmp_path: Path
) -> None:
    services = await start(serve, tmp_path)
    for sequence in ("x" * 10_240, "é" * 129):  # 10 KB; 258 bytes in 129 characters
        with pytest.raises(InvalidArgument, match="at most 256 bytes") as raised:
            await send(services, "simple_sequence", 1, sequence, start=True)
        assert f"a string of {len(sequence.encode())} bytes" in str(raised.value)
    assert (await send(services, "simple_sequence", 1, "y" * 256, start=True))["OUTPUT"] == 2
    assert services.catalog.sequence_counts("simple_sequence").started == 1


async def from_client(
    services: Services, address: str, model: str, value: int, sequence: Any, **flags: Any
) -> dict[str, int]:
    """``send`` as a request of a client at ``address`` (what an adapter puts in CURRENT)."""
    info = RequestInfo(f"from-{address}", False)
    info.client = (address, 40000)
    token = CURRENT.set(info)
    try:
        return await send(services, model, value, sequence, **flags)
    finally:
        CURRENT.reset(token)


async def test_one_client_address_holds_at_most_its_share_of_the_slots(
    serve: Serve, tmp_path: Path
) -> None:
    """accumulate has 8 slots (maxBatchSize 8, one instance): a client address may have 4
    sequences in progress (clientSlotShare 0.5); the fifth is busy (429), another address
    still starts one, and the first may start again once one of its sequences ends."""
    services = await start(serve, tmp_path)
    for sequence in range(1, 5):
        await from_client(services, "10.0.0.1", "accumulate", 1, sequence, start=True)
    with pytest.raises(Overloaded, match=r"client 10\.0\.0\.1 has 4 sequences in progress"):
        await from_client(services, "10.0.0.1", "accumulate", 1, 5, start=True)
    assert (await from_client(services, "10.0.0.2", "accumulate", 7, 6, start=True))["OUTPUT"] == 7
    await from_client(services, "10.0.0.1", "accumulate", 1, 1, end=True)
    await async_wait_until(lambda: services.catalog.sequence_counts("accumulate").ended == 1)
    await from_client(services, "10.0.0.1", "accumulate", 1, 5, start=True)
    assert services.catalog.sequence_counts("accumulate").active == 5
    await send(services, "accumulate", 1, 9, start=True)  # this process: no share
    await send(services, "accumulate", 1, 10, start=True)


def test_the_client_share_is_checked(tmp_path: Path) -> None:
    model = "name: m, modelFormat: {name: python}, entrypoint: 'a:b'"
    text = f"models: [{{{model}, sequenceBatching: {{clientSlotShare: 0.25}}}}]"
    (parsed,) = parse_config(text).models
    assert parsed.sequence_batching is not None
    assert parsed.sequence_batching.per_client(8) == 2
    for share in (0, 1.5):
        text = f"models: [{{{model}, sequenceBatching: {{clientSlotShare: {share}}}}}]"
        with pytest.raises(ConfigError, match="clientSlotShare"):
            parse_config(text)


async def test_config_shows_sequence_batching_and_hides_its_tensors(
    serve: Serve, tmp_path: Path
) -> None:
    services = await start(serve, tmp_path)
    config = services.dataplane.model_config("slow_accumulate")
    as_json = model_config_json(config)
    batching = as_json["sequence_batching"]
    assert batching["oldest"]["max_candidate_sequences"] == 2
    assert [c["name"] for c in batching["control_input"]] == ["START", "END", "READY", "CORRID"]
    assert batching["control_input"][3]["control"][0]["data_type"] == "TYPE_UINT64"
    assert batching["state"][0]["input_name"] == "ACC_IN"
    assert batching["max_sequence_idle_microseconds"] == 1_000_000
    assert [i["name"] for i in as_json["input"]] == ["INPUT"]
    assert "ACC_OUT" not in [o["name"] for o in as_json["output"]]
    message = model_config_message(config)
    assert message.sequence_batching.oldest.max_candidate_sequences == 2
    assert message.sequence_batching.state[0].output_name == "ACC_OUT"
    assert message.sequence_batching.control_input[0].control[0].int32_false_true == [0, 1]
    metadata = services.dataplane.model_metadata("accumulate")
    assert [s.name for s in metadata.inputs] == ["INPUT"]
    # a client may not send a control input the server fills
    sneaky = request("accumulate", 1, 5, start=True)
    sneaky.inputs.append(Tensor("START", "INT32", (1, 1), np.ones((1, 1), np.int32)))
    with pytest.raises(InvalidArgument, match="has no input 'START'"):
        await services.dataplane.infer(sneaky)


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ("{direct: {}, oldest: {maxCandidateSequences: 1}}", "give one strategy"),
        (
            "{controlInputs: [{name: S, control: [{kind: CONTROL_SEQUENCE_START}]}]}",
            "exactly one of",
        ),
        ("{controlInputs: [{name: C, control: [{kind: CONTROL_SEQUENCE_CORRID}]}]}", "dataType"),
    ],
)
def test_bad_sequence_batching_is_a_config_error(block: str, words: str) -> None:
    model = "name: m, modelFormat: {name: python}, entrypoint: 'a:b'"
    text = f"models: [{{{model}, sequenceBatching: {block}}}]"
    with pytest.raises(ConfigError, match=words):
        parse_config(text)


def test_sequence_batching_needs_one_worker(tmp_path: Path) -> None:
    from servekit.config.compiler import compile_plan

    text = (
        "server: {workers: 2}\n"
        "models: [{name: m, modelFormat: {name: python}, entrypoint: 'a:b', sequenceBatching: {}}]"
    )
    with pytest.raises(ConfigError, match="sequenceBatching needs one server process"):
        compile_plan(parse_config(text), tmp_path)


@pytest.mark.parametrize(
    ("client", "address"),
    [
        (("127.0.0.2", 51234), "127.0.0.2"),  # ASGI's scope["client"]
        ("ipv4:127.0.0.1:51234", "127.0.0.1"),  # grpcio's peer
        ("ipv6:%5B::1%5D:51234", "::1"),
        ("unix:/run/servekit.sock", "unix"),
        (None, None),  # a request from this process
    ],
)
def test_the_client_address_of_a_request(client: object, address: str | None) -> None:
    assert client_address(client) == address
