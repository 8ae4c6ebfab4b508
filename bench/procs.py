"""Process plumbing for the benchmark: pinned servers, their CPU time, bounded shutdown.

CPU time matters because the machine is shared: wall-clock requests/s drops whenever someone
else's tests run, but the server's own CPU seconds per request barely move, so
``1e6 / cpu_us_per_request`` is a steadier estimate of what one core can serve.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


class Server:
    """A server subprocess pinned to one CPU that prints its port on start-up."""

    def __init__(self, argv: list[str], cpu: str, port_pattern: str, cwd: Path | None = None):
        self.argv = ["taskset", "-c", cpu, *argv]
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the bench, not the server
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.port = self._wait_for_port(re.compile(port_pattern))

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def _wait_for_port(self, pattern: re.Pattern[str], timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if match := pattern.search(line):
                return int(match.group(1))
        self.stop()
        raise RuntimeError(f"{' '.join(self.argv)} did not start:\n{''.join(self.output)}")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server and every process under it, so far."""
        return sum(_cpu_seconds(pid) for pid in [self.proc.pid, *_descendants(self.proc.pid)])

    def stop(self, grace: float = 20.0) -> None:
        """SIGINT (graceful), then SIGKILL after ``grace`` seconds, for the whole tree."""
        if self.proc.poll() is not None:
            return
        children = _descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for pid in children:  # e.g. granian's worker, if it outlived its parent
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU time of one process (not its children), so far."""
    return _cpu_seconds(pid)


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15)


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except (FileNotFoundError, ProcessLookupError):
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def load_average() -> str:
    """The 1/5/15-minute load averages: how busy the shared machine was."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
