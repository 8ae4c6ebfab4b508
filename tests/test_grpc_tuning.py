"""grpcio's threads as servekit sets them up (app/servekit/grpc/tuning.py).

Each unit check runs in a fresh interpreter: what it tests happens once per process, before and
while gRPC core starts. The last test looks at the real ``servekit serve`` process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from servers import ServerProcess

from servekit.grpc import tuning

pytestmark = pytest.mark.slow


def run_fresh(code: str, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a new interpreter (bounded) and return what it printed."""
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    environment.update(env or {})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_poller_io_is_asked_for_before_grpc_starts() -> None:
    out = run_fresh(
        """
        import os
        from servekit.grpc import tuning
        print(tuning.prefer_poller_io(), os.environ["GRPC_EXPERIMENTS"])
        """
    )
    assert out == f"True {tuning.LEGACY_IO_EXPERIMENTS}"


def test_a_users_own_grpc_experiments_are_kept() -> None:
    out = run_fresh(
        """
        import os
        from servekit.grpc import tuning
        print(tuning.prefer_poller_io(), repr(os.environ["GRPC_EXPERIMENTS"]))
        """,
        env={"GRPC_EXPERIMENTS": ""},  # empty: the user wants grpcio's own defaults
    )
    assert out == "False ''"


def test_too_late_once_grpc_is_imported() -> None:
    out = run_fresh(
        """
        import os
        import grpc
        from servekit.grpc import tuning
        print(tuning.prefer_poller_io(), "GRPC_EXPERIMENTS" in os.environ)
        """
    )
    assert out == "False False"


@pytest.mark.parametrize("nice", [0, 7, 19])
def test_only_the_poller_thread_gets_lower_priority(nice: int) -> None:
    out = run_fresh(
        f"""
        import asyncio, os, threading
        import grpc
        from servekit.grpc import tuning

        async def main():
            server = grpc.aio.server()
            server.add_insecure_port("127.0.0.1:0")
            await server.start()
            changed = tuning.lower_poller_priority({nice})
            poller = [t for t in threading.enumerate() if tuning.POLLER_THREAD_TARGET in t.name]
            print(changed, len(poller), os.getpriority(os.PRIO_PROCESS, poller[0].native_id),
                  os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id))
            await server.stop(None)

        asyncio.run(main())
        """
    )
    base = os.getpriority(os.PRIO_PROCESS, 0)  # pytest itself may run under nice
    expected = f"1 1 {min(19, base + nice)} {base}" if nice else f"0 1 {base} {base}"
    assert out == expected


def thread_nice_values(pid: int) -> dict[int, int]:
    """tid -> nice of every thread of a process, from /proc (field 19 of stat)."""
    values = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        values[int(task.name)] = int(fields[16])
    return values


def test_the_running_server_lowers_only_its_grpc_poller(server: ServerProcess) -> None:
    assert server.grpc_target is not None
    pid = server.process.pid
    values = thread_nice_values(pid)
    base = values[pid]  # the event loop thread keeps the priority the process started with
    lowered = [nice for nice in values.values() if nice != base]
    assert lowered == [min(19, base + 19)], f"exactly the poller is lowered: {values}"
