"""System shared memory in process: the region service (app/servekit/services/shared_memory.py) and
the
DataPlane reading inputs from and writing outputs to regions, through the real codecs.

Regions are real POSIX shared memory objects made with tritonclient's ``utils.shared_memory``
(what Triton's example programs use), under keys unique to this test run; the confinement
checks (symbolic links, directories, FIFOs) use a stand-in directory for ``/dev/shm``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from fakes import python_model
from inprocess import Serve, Services, plan_of
from shm_models import Simple, SimpleString
from tritonclient import utils

from servekit.codecs import v2_binary, v2_json, v2_proto
from servekit.config.loader import ConfigError
from servekit.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    Overloaded,
    PermissionDenied,
    ResourceExhausted,
)
from servekit.protos import grpc_service_pb2 as pb
from servekit.server import ServeKit
from servekit.services.shared_memory import (
    SharedMemoryRegions,
    _Window,
    is_local_peer,
    region_budget,
)

pytestmark = pytest.mark.anyio

SIXTEEN = 16 * 4  # bytes of one [1, 16] INT32 tensor
LOCAL = "127.0.0.1"
"""The peer a client on the server's host registers from."""
ON = "server: {sharedMemory: system}\nmodels: []\n"


@pytest.fixture
def regions() -> Iterator[SharedMemoryRegions]:
    made = SharedMemoryRegions(enabled=True)
    yield made
    made.close()


class Objects:
    """Shared memory objects made for one test (destroyed afterwards)."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def make(self, size: int) -> tuple[str, Any]:
        key = f"/servekit-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        handle = shm.create_shared_memory_region(key[1:], key, size)
        self.handles.append(handle)
        return key, handle

    def destroy(self) -> None:
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def objects() -> Iterator[Objects]:
    made = Objects()
    yield made
    made.destroy()


# -- registration ---------------------------------------------------------------------------
def test_register_status_unregister(regions: SharedMemoryRegions, objects: Objects) -> None:
    key, _ = objects.make(256)
    regions.register("in", key, 0, 128, peer=LOCAL)
    regions.register("out", key, 128, 128, peer=LOCAL)
    assert [r.as_dict() for r in regions.status()] == [
        {"name": "in", "key": key, "offset": 0, "byte_size": 128},
        {"name": "out", "key": key, "offset": 128, "byte_size": 128},
    ]
    assert regions.status("out")[0].offset == 128
    with pytest.raises(AlreadyExists, match="'in' already in manager"):
        regions.register("in", key, 0, 8, peer=LOCAL)
    regions.unregister("in")
    regions.unregister("in")  # idempotent, as in Triton
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'in'"):
        regions.status("in")
    regions.unregister()
    assert regions.status() == []


def test_the_window_must_lie_inside_the_object(
    regions: SharedMemoryRegions, objects: Objects
) -> None:
    key, _ = objects.make(64)
    with pytest.raises(
        InvalidArgument, match=r"Unable to open.*at least offset \+ byte_size \(96\)"
    ):
        regions.register("r", key, 32, 64, peer=LOCAL)
    with pytest.raises(InvalidArgument, match="byte_size must be at least 1"):
        regions.register("r", key, 0, 0, peer=LOCAL)
    with pytest.raises(InvalidArgument, match="offset must be a non-negative integer"):
        regions.register("r", key, -1, 8, peer=LOCAL)
    regions.register("r", key, 5, 59, peer=LOCAL)  # an offset need not be page-aligned
    assert len(regions) == 1


@pytest.mark.parametrize(
    "key",
    ["", "/", "//x", "/a/b", "../etc/passwd", "/..", ".", "a\0b", "/dev/shm/x", "x" * 300],
)
def test_keys_name_one_object_in_dev_shm(regions: SharedMemoryRegions, key: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid shm key"):
        regions.register("r", key, 0, 8, peer=LOCAL)


def test_unknown_key(regions: SharedMemoryRegions) -> None:
    with pytest.raises(
        InvalidArgument, match=r"Unable to open shared memory region: '/servekit-absent"
    ):
        regions.register("r", f"/servekit-absent-{uuid.uuid4().hex}", 0, 8, peer=LOCAL)


def test_only_regular_objects_are_mapped(tmp_path: Path) -> None:
    """Links are refused, never followed (O_NOFOLLOW); directories and FIFOs are no objects."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 64)
    directory = tmp_path / "shm"
    directory.mkdir()
    (directory / "link").symlink_to(secret)
    (directory / "folder").mkdir()
    os.mkfifo(directory / "fifo")
    (directory / "plain").write_bytes(bytes(64))
    (directory / "plain").chmod(0o600)
    regions = SharedMemoryRegions(str(directory), enabled=True)
    for key in ("/link", "/folder", "/fifo"):
        with pytest.raises(InvalidArgument, match="Unable to open shared memory region"):
            regions.register("r", key, 0, 8, peer=LOCAL)
    regions.register("r", "/plain", 0, 64, peer=LOCAL)
    regions.close()
    assert len(regions) == 0


# -- inference through the codecs --------------------------------------------------------------
async def simple(serve: Serve) -> Services:
    return await simple_with(serve, ON)


async def simple_with(serve: Serve, yaml_text: str) -> Services:
    """The services of ``yaml_text`` (no models) serving Simple and SimpleString."""
    if not yaml_text.rstrip().endswith("[]"):
        yaml_text += "\nmodels: []\n"
    services = await serve(yaml_text)
    ints = {"datatype": "INT32", "shape": [-1, 16]}
    await services.control.add(
        python_model(
            "simple",
            inputs=[{"name": "INPUT0", **ints}, {"name": "INPUT1", **ints}],
            outputs=[{"name": "OUTPUT0", **ints}, {"name": "OUTPUT1", **ints}],
        ),
        Simple(),
    )
    text = {"datatype": "BYTES", "shape": [-1, 16]}
    await services.control.add(
        python_model(
            "simple_string",
            inputs=[{"name": "INPUT0", **text}, {"name": "INPUT1", **text}],
            outputs=[{"name": "OUTPUT0", **text}, {"name": "OUTPUT1", **text}],
        ),
        SimpleString(),
    )
    return services


def _shm(region: str, size: int, offset: int = 0) -> dict[str, Any]:
    params: dict[str, Any] = {"shared_memory_region": region, "shared_memory_byte_size": size}
    if offset:
        params["shared_memory_offset"] = offset
    return params


def _json_request(params0: dict[str, Any], params1: dict[str, Any]) -> dict[str, Any]:
    shape = [1, 16]
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": shape, "parameters": params0},
            {"name": "INPUT1", "datatype": "INT32", "shape": shape, "parameters": params1},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": False, **_shm("out", SIXTEEN)}},
            {"name": "OUTPUT1", "parameters": _shm("out", SIXTEEN, SIXTEEN)},
        ],
    }


async def test_http_json_inputs_and_outputs_in_regions(serve: Serve, objects: Objects) -> None:
    services = await simple(serve)
    regions = services.dataplane.shared_memory
    in_key, in_handle = objects.make(2 * SIXTEEN)
    out_key, out_handle = objects.make(2 * SIXTEEN)
    a, b = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
    shm.set_shared_memory_region(in_handle, [a])
    shm.set_shared_memory_region(in_handle, [b], offset=SIXTEEN)
    regions.register("in", in_key, 0, 2 * SIXTEEN, peer=LOCAL)
    regions.register("out", out_key, 0, 2 * SIXTEEN, peer=LOCAL)

    body = _json_request(_shm("in", SIXTEEN), _shm("in", SIXTEEN, SIXTEEN))
    request = v2_json.decode_request(body, "simple", None)
    assert request.shared_memory
    response = await services.dataplane.infer(request)
    content, header = v2_binary.encode_response(request, response)
    assert header is None  # no binary data follows: the outputs are in the region
    answer = v2_json.loads(content)
    assert answer["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16]},
    ]
    total = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16])
    difference = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=SIXTEEN)
    assert (total[0] == a + b).all() and (difference[0] == a - b).all()


async def test_grpc_raw_inputs_beside_a_region(serve: Serve, objects: Objects) -> None:
    """raw_input_contents holds the inputs not in shared memory, in order; an output in a region
    keeps its place in raw_output_contents, empty, as Triton answers."""
    services = await simple(serve)
    key, handle = objects.make(SIXTEEN)
    a = np.arange(16, dtype=np.int32)
    shm.set_shared_memory_region(handle, [a])
    services.dataplane.shared_memory.register("in", key, 0, SIXTEEN, peer=LOCAL)
    out_key, out_handle = objects.make(SIXTEEN)
    services.dataplane.shared_memory.register("out", out_key, 0, SIXTEEN, peer=LOCAL)

    def param(value: object) -> pb.InferParameter:
        return v2_proto.parameter_to_proto(value)

    message = pb.ModelInferRequest(model_name="simple")
    first = message.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    first.parameters["shared_memory_region"].CopyFrom(param("in"))
    first.parameters["shared_memory_byte_size"].CopyFrom(param(SIXTEEN))
    message.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    message.raw_input_contents.append(np.full(16, 3, np.int32).tobytes())
    wanted = message.outputs.add(name="OUTPUT0")
    wanted.parameters["shared_memory_region"].CopyFrom(param("out"))
    wanted.parameters["shared_memory_byte_size"].CopyFrom(param(SIXTEEN))
    message.outputs.add(name="OUTPUT1")

    request = v2_proto.decode_request(message)
    answer = v2_proto.encode_response(request, await services.dataplane.infer(request))
    assert [o.name for o in answer.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert answer.raw_output_contents[0] == b""
    assert (np.frombuffer(answer.raw_output_contents[1], np.int32) == a - 3).all()
    assert (shm.get_contents_as_numpy(out_handle, np.int32, [16]) == a + 3).all()


async def test_bytes_tensors_in_regions(serve: Serve, objects: Objects) -> None:
    services = await simple(serve)
    regions = services.dataplane.shared_memory
    numbers = np.array([str(i).encode() for i in range(16)], dtype=np.object_).reshape(1, 16)
    ones = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
    serialized = [utils.serialize_byte_tensor(t) for t in (numbers, ones)]
    sizes = [utils.serialized_byte_size(s) for s in serialized]
    keys = []
    for name, data, size in zip(("in0", "in1"), serialized, sizes, strict=True):
        key, handle = objects.make(size)
        shm.set_shared_memory_region(handle, [data])
        regions.register(name, key, 0, size, peer=LOCAL)
        keys.append(key)
    out_key, out_handle = objects.make(256)
    regions.register("out", out_key, 0, 256, peer=LOCAL)
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 16],
             "parameters": _shm("in0", sizes[0])},
            {"name": "INPUT1", "datatype": "BYTES", "shape": [1, 16],
             "parameters": _shm("in1", sizes[1])},
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": _shm("out", 256)}, {"name": "OUTPUT1"}],
    }  # fmt: skip
    request = v2_json.decode_request(body, "simple_string", None)
    response = await services.dataplane.infer(request)
    answer = v2_json.loads(v2_binary.encode_response(request, response)[0])
    assert "data" not in answer["outputs"][0]
    assert answer["outputs"][1]["data"][:3] == ["-1", "0", "1"]
    total = shm.get_contents_as_numpy(out_handle, np.object_, [1, 16])
    assert list(total[0][:3]) == [b"1", b"2", b"3"]


async def test_windows_and_names_are_checked(serve: Serve, objects: Objects) -> None:
    services = await simple(serve)
    key, _ = objects.make(2 * SIXTEEN)
    services.dataplane.shared_memory.register("in", key, 0, 2 * SIXTEEN, peer=LOCAL)
    out_key, _ = objects.make(SIXTEEN)
    services.dataplane.shared_memory.register("out", out_key, 0, SIXTEEN, peer=LOCAL)
    good = _shm("in", SIXTEEN)
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        (_shm("nowhere", SIXTEEN), NotFound, "Unable to find shared memory region: 'nowhere'"),
        (_shm("in", SIXTEEN, 2 * SIXTEEN), InvalidArgument, "Invalid offset for shared memory"),
        (_shm("in", SIXTEEN, SIXTEEN + 4), InvalidArgument, "Invalid offset \\+ byte size"),
        (_shm("in", 8), InvalidArgument, "needs 64 bytes, got 8"),
        ({**good, "shared_memory_offset": -4}, InvalidArgument, "non-negative integer"),
        ({"shared_memory_region": "in"}, InvalidArgument, "'shared_memory_byte_size' must be"),
        ({**good, "shared_memory_region": 7}, InvalidArgument, "must be a region name"),
    ]
    for params, error, message in cases:
        request = v2_json.decode_request(_json_request(good, params), "simple", None)
        with pytest.raises(error, match=message):
            await services.dataplane.infer(request)
    # An output window too small for the result; classification into a region.
    small = _json_request(good, good)
    small["outputs"] = [{"name": "OUTPUT0", "parameters": _shm("out", 32)}]
    with pytest.raises(InvalidArgument, match="should be at least 64 bytes"):
        await services.dataplane.infer(v2_json.decode_request(small, "simple", None))
    both = _json_request(good, good)
    both["outputs"] = [{"name": "OUTPUT0", "parameters": {**_shm("out", 64), "classification": 1}}]
    with pytest.raises(InvalidArgument, match="can't set both 'shared_memory_region' and 'class"):
        await services.dataplane.infer(v2_json.decode_request(both, "simple", None))
    # An input with data as well as a region.
    doubled = _json_request(good, good)
    doubled["inputs"][0]["data"] = list(range(16))
    with pytest.raises(InvalidArgument, match="Input must set only one of the following"):
        v2_json.decode_request(doubled, "simple", None)


async def test_stop_unregisters_every_region(serve: Serve, objects: Objects) -> None:
    services = await simple(serve)
    key, _ = objects.make(64)
    services.dataplane.shared_memory.register("r", key, 0, 64, peer=LOCAL)
    await services.stop()
    assert services.dataplane.shared_memory.status() == []


def test_metadata_names_the_extensions(tmp_path: Path) -> None:
    services = Services(plan_of(ON, tmp_path))
    extensions = services.dataplane.server_metadata().extensions
    assert {"system_shared_memory", "classification", "binary_tensor_data"} <= set(extensions)
    off = Services(plan_of("models: []\n", tmp_path)).dataplane.server_metadata()
    assert {"classification", "binary_tensor_data"} <= set(off.extensions)
    assert "system_shared_memory" not in off.extensions  # off by default


# -- issue 22: off by default, local peers, owner and mode, descriptors, budgets -----------------
# Each of these failed on the code before issue 22's change (shared memory always on, any peer,
# any object the server could open, reads through a mapping, 1,024 regions whatever the limit).


def _object(mode: int, size: int = 64, owner: int | None = None) -> tuple[str, str]:
    """A shared memory object made directly in /dev/shm with ``mode`` (and ``owner``), as
    another program or user would leave it: (key, path)."""
    key = f"/servekit-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm{key}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, b"secret!!" * (size // 8), 0)
        os.fchmod(fd, mode)  # after creation: the umask does not interfere
        if owner is not None:
            os.fchown(fd, owner, owner)
    finally:
        os.close(fd)
    return key, path


@pytest.fixture
def made() -> Iterator[list[str]]:
    """Paths of objects a test made in /dev/shm (removed afterwards)."""
    paths: list[str] = []
    yield paths
    for path in paths:
        Path(path).unlink(missing_ok=True)


def _refusal(regions: SharedMemoryRegions, key: str, size: int = 64) -> str:
    """The message a refused registration gives, with the key written as KEY."""
    with pytest.raises(InvalidArgument) as info:
        regions.register("r", key, 0, size, peer=LOCAL)
    assert len(regions) == 0
    return info.value.message.replace(repr(key), "KEY")


def test_objects_of_others_or_open_to_others_are_refused_like_missing_ones(
    regions: SharedMemoryRegions, made: list[str]
) -> None:
    """No existence oracle: a missing object, another user's 0600 object, one of ours that
    group or others may read or write, one too small: the same answer, and nothing is read."""
    missing = _refusal(regions, f"/servekit-absent-{uuid.uuid4().hex}")
    assert "Unable to open shared memory region: KEY" in missing
    assert "owned by the server's user" in missing and "mode 0600" in missing
    cases = {
        "another user's": (0o600, 64, 65534),
        "group-readable": (0o640, 64, None),
        "other-readable": (0o604, 64, None),
        "group-writable": (0o620, 64, None),
        "other-writable": (0o602, 64, None),
        "too small": (0o600, 32, None),
    }
    for what, (mode, size, owner) in cases.items():
        key, path = _object(mode, size, owner)
        made.append(path)
        assert _refusal(regions, key) == missing, what
        assert Path(path).read_bytes() == b"secret!!" * (size // 8), what
    key, path = _object(0o600)  # ours and closed to others: accepted
    made.append(path)
    regions.register("mine", key, 0, 64, peer=LOCAL)
    assert [r.name for r in regions.status()] == ["mine"]


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        (None, True),  # an ASGI connection without a client address: uvicorn's UNIX socket
        ("ipv4:127.0.0.1:50123", True),  # gRPC's peer strings
        ("ipv6:[::1]:50123", True),
        ("ipv6:%5B::1%5D:50123", True),
        ("unix:/run/servekit.sock", True),
        ("unix:", True),
        ("192.0.2.7", False),
        ("10.0.0.1", False),
        ("::ffff:192.0.2.7", False),
        ("fd00::2", False),
        ("ipv4:192.0.2.7:50123", False),
        ("ipv6:[fd00::2]:50123", False),
        ("ipv6:%5Bfd00::2%5D:50123", False),
        ("testclient", False),
        ("", False),
    ],
)
def test_which_peers_are_local(peer: str | None, local: bool) -> None:
    assert is_local_peer(peer) is local


def test_remote_peers_cannot_register(regions: SharedMemoryRegions, made: list[str]) -> None:
    key, path = _object(0o600)
    made.append(path)
    for peer in ("192.0.2.7", "ipv4:192.0.2.7:50123", "ipv6:[fd00::2]:1"):
        with pytest.raises(PermissionDenied, match="only a client on the server's host"):
            regions.register("r", key, 0, 64, peer=peer)
    assert len(regions) == 0


async def test_http_registration_from_another_host_is_refused(
    tmp_path: Path, made: list[str]
) -> None:
    """The HTTP route passes the peer uvicorn saw: the real application, a client address that
    is not loopback (httpx's ASGI transport sets it; no socket is opened in this tier)."""
    kit = ServeKit(plan_of(ON, tmp_path))
    key, path = _object(0o600)
    made.append(path)
    body = {"key": key, "byte_size": 64}
    url = "http://servekit/v2/systemsharedmemory/region/r/register"
    try:
        for client, status in ((("192.0.2.7", 4000), 403), (("127.0.0.1", 4000), 200)):
            transport = httpx.ASGITransport(app=kit.http_app(), client=client)
            async with httpx.AsyncClient(transport=transport) as http:
                answer = await http.post(url, json=body)
            assert answer.status_code == status, answer.text
            if status == 403:
                assert "only a client on the server's host" in answer.json()["error"]
        assert [r.name for r in kit.dataplane.shared_memory.status()] == ["r"]
    finally:
        await kit.stop()


async def test_off_by_default(serve: Serve, made: list[str]) -> None:
    """Without server.sharedMemory every system route says it is off and how to turn it on;
    a request naming a region too; the CUDA routes answer as before."""
    services = await simple_with(serve, "models: []\n")
    regions = services.dataplane.shared_memory
    key, path = _object(0o600)
    made.append(path)
    calls = (
        lambda: regions.register("r", key, 0, 64, peer=LOCAL),
        lambda: regions.status(),
        lambda: regions.status("r"),
        lambda: regions.unregister(),
        lambda: regions.unregister("r"),
    )
    for call in calls:
        with pytest.raises(PermissionDenied, match=r"disabled.*'server.sharedMemory: system'"):
            call()
    body = _json_request(_shm("in", SIXTEEN), _shm("in", SIXTEEN, SIXTEEN))
    with pytest.raises(PermissionDenied, match=r"server\.sharedMemory: system"):
        await services.dataplane.infer(v2_json.decode_request(body, "simple", None))
    assert regions.max_regions == 0  # no descriptor is set aside for it either


def test_config_allows_system_only_where_registering_is_guarded(tmp_path: Path) -> None:
    def issues(server: str) -> str:
        try:
            plan_of(f"server: {{{server}}}\nmodels: []\n", tmp_path)
        except ConfigError as exc:
            return str(exc)
        return ""

    assert issues("sharedMemory: system") == ""  # loopback by default
    assert issues("sharedMemory: system, host: localhost") == ""
    assert issues("sharedMemory: off, host: 0.0.0.0") == ""
    assert issues("host: 0.0.0.0") == ""
    open_host = issues("sharedMemory: system, host: 0.0.0.0")
    assert "server.sharedMemory" in open_host and "'0.0.0.0'" in open_host
    assert "host: 127.0.0.1" in open_host and "server.auth.repository" in open_host
    assert issues("sharedMemory: system, host: 0.0.0.0, auth: {repository: t0ken}") == ""
    assert "t0ken" not in issues("sharedMemory: system, host: 0.0.0.0, auth: {inference: t0ken}")
    several = issues("sharedMemory: system, workers: 2")
    assert "needs one server process" in several and "workers: 1" in several
    assert "Input should be 'off' or 'system'" in issues("sharedMemory: cuda")
    assert plan_of(ON, tmp_path).server.shared_memory == "system"
    assert plan_of("models: []\n", tmp_path).server.shared_memory == "off"


def test_a_shrunk_object_gives_an_error_never_a_crash(
    regions: SharedMemoryRegions, made: list[str]
) -> None:
    """Copies go through the descriptor: an object cut after registering (ftruncate) reads
    short, an error for that request; a mapping would have been SIGBUS for the server."""
    key, path = _object(0o600, 8192)
    made.append(path)
    regions.register("r", key, 0, 8192, peer=LOCAL)
    os.truncate(path, 16)
    with pytest.raises(InvalidArgument, match="'r' \\(input 'x'\\) shrank below the 8192 bytes"):
        regions._read(_Window("input 'x'", "r", 4096, 64))
    with pytest.raises(InvalidArgument, match="'r' \\(output 'y'\\) shrank below"):
        regions._write(memoryview(bytes(64)), _Window("output 'y'", "r", 0, 64))
    assert os.stat(path).st_size == 16  # an object its client cut is never grown back


async def test_inputs_beyond_max_request_bytes_are_refused(serve: Serve, made: list[str]) -> None:
    services = await simple_with(serve, "server: {sharedMemory: system, maxRequestBytes: 1024}")
    key, path = _object(0o600, 4096)
    made.append(path)
    services.dataplane.shared_memory.register("big", key, 0, 4096, peer=LOCAL)
    body = _json_request(_shm("big", 2048), _shm("big", SIXTEEN))
    with pytest.raises(ResourceExhausted, match="more than the 1024 one request may bring"):
        await services.dataplane.infer(v2_json.decode_request(body, "simple", None))


def test_a_region_budget_from_the_open_file_limit(made: list[str]) -> None:
    key, path = _object(0o600)
    made.append(path)
    assert region_budget() == min(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 8)
    regions = SharedMemoryRegions(enabled=True, max_regions=3)
    for index in range(3):
        regions.register(f"r{index}", key, 0, 64, peer=LOCAL)
    with pytest.raises(ResourceExhausted, match="3 regions are registered already"):
        regions.register("r3", key, 0, 64, peer=LOCAL)
    regions.unregister("r0")
    regions.register("r3", key, 0, 64, peer=LOCAL)
    regions.close()


def test_unregistering_during_a_copy_closes_the_descriptor_after_it(
    regions: SharedMemoryRegions, made: list[str]
) -> None:
    key, path = _object(0o600)
    made.append(path)
    regions.register("r", key, 0, 64, peer=LOCAL)
    region = regions._use(_Window("input 'x'", "r", 0, 8))  # a copy in progress
    regions.unregister("r")
    os.fstat(region.fd)  # still open for the copy
    regions._done(region)
    with pytest.raises(OSError):
        os.fstat(region.fd)


class _Gate:
    """A model that holds its request until the test opens the gate (bounded wait)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()

    def predict(self, data: Any) -> dict[str, Any]:
        self.entered.set()
        self.gate.wait(10)
        return {"head": np.asarray(data)[:8].copy()}


async def test_inputs_held_by_requests_in_progress_are_bounded(
    serve: Serve, made: list[str]
) -> None:
    """maxRequestBytes bounds the region bytes all requests in progress hold together: past
    it a request is answered 429 at once (retry), not queued with its copy in memory."""
    services = await serve("server: {sharedMemory: system, maxRequestBytes: 1024}\nmodels: []\n")
    gate = _Gate()
    uint8 = {"datatype": "UINT8", "shape": [-1]}
    config = python_model(
        "gate", inputs=[{"name": "data", **uint8}], outputs=[{"name": "head", **uint8}]
    )
    await services.control.add(config, gate)
    key, path = _object(0o600, 2048)
    made.append(path)
    services.dataplane.shared_memory.register("r", key, 0, 2048, peer=LOCAL)

    def request(size: int) -> Any:
        body = {"inputs": [{"name": "data", "datatype": "UINT8", "shape": [size],
                            "parameters": _shm("r", size)}]}  # fmt: skip
        return v2_json.decode_request(body, "gate", None)

    first = asyncio.ensure_future(services.dataplane.infer(request(800)))
    for _ in range(1000):  # bounded: until the first request is inside the model
        if gate.entered.is_set():
            break
        await asyncio.sleep(0.005)
    assert gate.entered.is_set()
    with pytest.raises(Overloaded, match="requests in progress fill the server's budget"):
        await services.dataplane.infer(request(800))
    gate.gate.set()
    answer = await first
    assert list(answer.outputs[0].data) == list(b"secret!!")
    gate.entered.clear()
    await services.dataplane.infer(request(800))  # the budget is free again
