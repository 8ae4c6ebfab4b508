"""Issue 22's shared memory findings, each against a real ``servekit serve``: off by default;
another user's object (or one open to others) refused with the same answer as a missing one,
never read or written; a client shrinking its object during copies gets errors while the server
stays up (before: SIGBUS, exit -7); registration refused from another host; a region budget from
the open-file limit that keeps new clients served; the config refusals at start.

Every test here failed on the code before the change (shared memory always on, any peer, any
object the server could open, copies through a mapping, 1,024 regions whatever the limit).
Objects are made directly in /dev/shm under keys unique to this run and removed afterwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import shutil
import socket
import struct
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from servers import server_command, start_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

TOKEN = "shm-security-t0ken"
BIG = 32 * 1024 * 1024
"""Bytes of the large input whose object a client shrinks during copies."""
SERVE_YAML = """
server: {%s}
models:
  - name: simple
    modelFormat: {name: python}
    entrypoint: shm_models:Simple
    inputs: [{name: INPUT0, datatype: INT32, shape: [-1, 16]},
             {name: INPUT1, datatype: INT32, shape: [-1, 16]}]
    outputs: [{name: OUTPUT0, datatype: INT32, shape: [-1, 16]},
              {name: OUTPUT1, datatype: INT32, shape: [-1, 16]}]
  - name: head
    modelFormat: {name: python}
    entrypoint: shm_models:Head
    inputs: [{name: data, datatype: UINT8, shape: [-1]}]
    outputs: [{name: head, datatype: UINT8, shape: [-1]}]
"""


def _store(root: Path, server: str = "sharedMemory: system") -> Path:
    shutil.copy(Path(__file__).with_name("shm_models.py"), root / "shm_models.py")
    (root / "serve.yaml").write_text(SERVE_YAML % server)
    return root / "serve.yaml"


class Objects:
    """Shared memory objects made in /dev/shm for one test (removed afterwards)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def make(self, size: int, mode: int = 0o600, owner: int | None = None) -> tuple[str, str]:
        key = f"/servekit-sec-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path = f"/dev/shm{key}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, b"secret!!" * min(size // 8, 1024), 0)
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, owner, owner)
        finally:
            os.close(fd)
        self.paths.append(path)
        return key, path


@pytest.fixture
def objects() -> Iterator[Objects]:
    made = Objects()
    yield made
    for path in made.paths:
        Path(path).unlink(missing_ok=True)


@contextlib.contextmanager
def serving(root: Path, server: str = "sharedMemory: system", **kwargs: Any) -> Iterator[Any]:
    process = start_server(_store(root, server), **kwargs)
    try:
        yield process
    finally:
        code = process.stop()
        assert code == 0, f"server exited with {code}\n{process.log()}"


def _register(http: httpx.Client, name: str, key: str, size: int, **headers: str) -> httpx.Response:
    body = {"key": key, "offset": 0, "byte_size": size}
    return http.post(f"/v2/systemsharedmemory/region/{name}/register", json=body, headers=headers)


def _grpc_error(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _head_request(region: str, size: int) -> dict[str, Any]:
    params = {"shared_memory_region": region, "shared_memory_byte_size": size}
    return {
        "inputs": [{"name": "data", "datatype": "UINT8", "shape": [size], "parameters": params}]
    }


def test_shared_memory_is_off_by_default(tmp_path: Path, objects: Objects) -> None:
    key, _ = objects.make(64)
    with serving(tmp_path, "") as server, server.http_client(timeout=10) as http:
        for answer in (
            _register(http, "r", key, 64),
            http.get("/v2/systemsharedmemory/status"),
            http.get("/v2/systemsharedmemory/region/r/status"),
            http.post("/v2/systemsharedmemory/unregister"),
            http.post("/v2/systemsharedmemory/region/r/unregister"),
            http.post("/v2/models/head/infer", json=_head_request("r", 64)),
        ):
            assert answer.status_code == 403, answer.text
            assert "'server.sharedMemory: system'" in answer.json()["error"]
        # Triton's CUDA answers are as they were: nothing to list or unregister, no GPUs
        assert http.get("/v2/cudasharedmemory/status").json() == []
        assert http.post("/v2/cudasharedmemory/unregister").status_code == 200
        cuda = http.post("/v2/cudasharedmemory/region/g/register", json={})
        assert cuda.status_code == 400 and "GPUs not supported" in cuda.json()["error"]
        assert "system_shared_memory" not in http.get("/v2").json()["extensions"]
        assert server.grpc_target is not None
        grpc = grpcclient.InferenceServerClient(server.grpc_target)
        for call in (
            lambda: grpc.register_system_shared_memory("r", key, 64),
            lambda: grpc.get_system_shared_memory_status(),
            lambda: grpc.unregister_system_shared_memory(),
        ):
            error = _grpc_error(call)
            assert error.status() == "StatusCode.PERMISSION_DENIED"
            assert "server.sharedMemory: system" in error.message()
        grpc.unregister_cuda_shared_memory()
        grpc.close()
        server.assert_healthy()


def test_objects_of_another_user_or_open_to_others_are_refused_like_missing_ones(
    tmp_path: Path, objects: Objects
) -> None:
    """The server runs as root here, so it could open anything: the owner and mode checks on
    the opened descriptor are what refuse. Every refusal reads the same (no existence oracle),
    and the object's bytes are neither read back nor overwritten."""
    cases = {
        "missing": (None, 0o600, None),
        "another user's 0600": (64, 0o600, 65534),
        "ours, group-readable": (64, 0o640, None),
        "ours, other-writable": (64, 0o602, None),
        "ours, too small": (32, 0o600, None),
    }
    with serving(tmp_path) as server, server.http_client(timeout=10) as http:
        assert server.grpc_target is not None
        grpc = grpcclient.InferenceServerClient(server.grpc_target)
        answers: dict[str, set[str]] = {}
        for what, (size, mode, owner) in cases.items():
            if size is None:
                key, path = f"/servekit-absent-{uuid.uuid4().hex}", ""
            else:
                key, path = objects.make(size, mode, owner)
            answer = _register(http, "r", key, 64)
            assert answer.status_code == 400, (what, answer.text)
            error = _grpc_error(lambda key=key: grpc.register_system_shared_memory("r", key, 64))
            assert error.status() == "StatusCode.INVALID_ARGUMENT", what
            texts = {answer.json()["error"], error.message()}
            answers[what] = {text.replace(repr(key), "KEY") for text in texts}
            if path:
                assert Path(path).read_bytes()[:8] == b"secret!!", what
        assert len({frozenset(texts) for texts in answers.values()}) == 1, answers
        assert http.get("/v2/systemsharedmemory/status").json() == []
        grpc.close()
        server.assert_healthy()


def test_a_client_shrinking_its_object_during_copies_never_kills_the_server(
    tmp_path: Path, objects: Objects
) -> None:
    """A thread cuts the object to nothing and grows it back while requests copy 32 MiB out of
    it: each request is answered (200, or 400 saying the region shrank), the server stays up.
    Through a mapping this was SIGBUS for the whole server."""
    key, path = objects.make(BIG)
    with serving(tmp_path) as server, server.http_client(timeout=60) as http:
        assert _register(http, "big", key, BIG).status_code == 200
        stop = threading.Event()

        def shrink_and_grow() -> None:
            fd = os.open(path, os.O_RDWR)
            try:
                while not stop.is_set():
                    os.ftruncate(fd, 0)
                    os.ftruncate(fd, BIG)
            finally:
                os.close(fd)

        cutter = threading.Thread(target=shrink_and_grow, daemon=True)
        cutter.start()
        statuses = []
        try:
            for _ in range(30):
                answer = http.post("/v2/models/head/infer", json=_head_request("big", BIG))
                statuses.append(answer.status_code)
                if answer.status_code != 200:
                    assert answer.status_code == 400, answer.text
                    assert "shrank below the" in answer.json()["error"], answer.text
                assert server.alive(), server.log()
        finally:
            stop.set()
            cutter.join(10)
        assert set(statuses) <= {200, 400}
        # cut once, for good: an input and an output both get the error, nothing is grown back
        os.truncate(path, 16)
        answer = http.post("/v2/models/head/infer", json=_head_request("big", BIG))
        assert answer.status_code == 400 and "shrank below the" in answer.json()["error"]
        out_key, out_path = objects.make(4096)
        assert _register(http, "out", out_key, 4096).status_code == 200
        os.truncate(out_path, 0)
        body = _head_request("big", 8)
        os.truncate(path, BIG)
        into = {"shared_memory_region": "out", "shared_memory_byte_size": 8}
        body["outputs"] = [{"name": "head", "parameters": into}]
        answer = http.post("/v2/models/head/infer", json=body)
        assert answer.status_code == 400 and "'out' (output 'head') shrank" in answer.text
        assert os.stat(out_path).st_size == 0
        server.assert_healthy()


def _non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine's own interfaces that is not loopback (read with
    SIOCGIFADDR: nothing is sent anywhere)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _index, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
            except OSError:
                continue
            address = socket.inet_ntoa(answer[20:24])
            if not address.startswith("127."):
                return address
    return None


def test_registration_from_another_host_is_refused(tmp_path: Path, objects: Objects) -> None:
    """Bound to this machine's own non-loopback address (with the repository token the config
    then requires) and reached through it, the client's address is not loopback: registering
    is refused over HTTP and gRPC even with the token, status still answers. (The peer rule
    itself is covered in process too: tests/test_shared_memory_unit.py.)"""
    address = _non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect through")
    key, _ = objects.make(64)
    server_yaml = f"sharedMemory: system, auth: {{repository: {TOKEN}}}"
    bearer = f"Bearer {TOKEN}"
    with serving(tmp_path, server_yaml, extra=["--host", address]) as server:
        assert address in server.http_url
        with server.http_client(timeout=10) as http:
            answer = _register(http, "r", key, 64, Authorization=bearer)
            assert answer.status_code == 403, answer.text
            assert "only a client on the server's host" in answer.json()["error"]
            status = http.get("/v2/systemsharedmemory/status", headers={"Authorization": bearer})
            assert status.json() == []
        assert server.grpc_target is not None and address in server.grpc_target
        grpc = grpcclient.InferenceServerClient(server.grpc_target)
        error = _grpc_error(
            lambda: grpc.register_system_shared_memory(
                "r", key, 64, headers={"authorization": bearer}
            )
        )
        assert error.status() == "StatusCode.PERMISSION_DENIED"
        assert "only a client on the server's host" in error.message()
        grpc.close()


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))


def test_the_region_budget_keeps_new_clients_served(tmp_path: Path, objects: Objects) -> None:
    """With 512 open files the server holds 64 regions (one descriptor each) and refuses the
    65th clearly; new connections are still served while all 64 are registered."""
    key, path = objects.make(2 * 64)
    a = np.arange(16, dtype=np.int32)
    Path(path).write_bytes(a.tobytes() * 2)
    with (
        serving(tmp_path, preexec_fn=_low_file_limit) as server,
        server.http_client(timeout=30) as http,
    ):
        accepted = 0
        for index in range(1100):
            answer = _register(http, f"r{index}", key, 128)
            if answer.status_code != 200:
                break
            accepted += 1
        assert accepted == 64, accepted
        assert answer.status_code == 413, answer.text
        assert "64 regions are registered already" in answer.json()["error"]

        params = [{"shared_memory_region": "r7", "shared_memory_byte_size": 64,
                   "shared_memory_offset": offset} for offset in (0, 64)]  # fmt: skip
        body = {"inputs": [{"name": f"INPUT{i}", "datatype": "INT32", "shape": [1, 16],
                            "parameters": params[i]} for i in (0, 1)]}  # fmt: skip

        def new_client(_: int) -> list[int]:
            with server.http_client(timeout=30) as fresh:
                answer = fresh.post("/v2/models/simple/infer", json=body)
                assert answer.status_code == 200, answer.text
                return list(answer.json()["outputs"][0]["data"])

        with ThreadPoolExecutor(30) as pool:
            sums = list(pool.map(new_client, range(60)))
        assert all(total == list(2 * a) for total in sums)
        server.assert_healthy()


@pytest.mark.parametrize(
    ("server", "flags", "says"),
    [
        ("sharedMemory: system", ["--host", "0.0.0.0"], "protect the repository API with a"),
        ("sharedMemory: system", ["--workers", "2"], "needs one server process"),
    ],
)
def test_start_refuses_shared_memory_it_cannot_guard(
    tmp_path: Path, server: str, flags: list[str], says: str
) -> None:
    config = _store(tmp_path, server)
    argv = [*server_command(config), *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0, done.stdout
    assert "server.sharedMemory" in done.stderr and says in done.stderr, done.stderr
    assert "listening" not in done.stdout
