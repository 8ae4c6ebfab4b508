"""The supervisor of ``server.workers``: N worker processes behind the same ports, one state.

It serves nothing itself. It reserves the ports (bound with SO_REUSEPORT, never listening, so a port
0 becomes one concrete port every worker binds too and no other program takes it while a worker
restarts), starts the workers (app/servekit/workers/worker.py), and talks to each over a Unix socket
in a private folder (app/servekit/workers/protocol.py). It is the one place model control is
serialised: an operation a worker forwards is applied by every worker before it is answered, and
recorded in a journal a restarted worker replays before it opens its listeners. It restarts a worker
that dies (a log line, and ``servekit_worker_restarts_total``), answers a worker's statistics read
with every worker position's state and snapshots (app/servekit/workers/stats.py), and on
SIGTERM/SIGINT drains every worker.

It also pings every worker over its channel (heartbeats): a worker that stops answering (stopped
with SIGSTOP, its event loop hung) is shown ``unresponsive``, no repository operation waits for it
longer than ``UNRESPONSIVE_SECONDS``, and past ``KILL_SECONDS`` it is killed and restarted like a
worker that died (docs/server.md, "Workers: heartbeats and restarts").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servekit.config.compiler import ServePlan
from servekit.config.overrides import Overrides
from servekit.errors import ServeError, Unavailable
from servekit.listen import Addresses, bind_http, bound_address
from servekit.models import storage
from servekit.observability import custom_metrics, logs
from servekit.services.stats import WorkerState
from servekit.workers.protocol import Channel, Message
from servekit.workers.spec import WorkerSpec, worker_environment
from servekit.workers.stats import SlotReport, Snapshot, merge

log = logging.getLogger("servekit.workers")

STOP_SECONDS = 30.0
"""How long workers may take after SIGTERM beyond ``server.drainSeconds`` (their drain) before
they are killed: closing listeners, answering what drained, releasing models."""
RESTART_BACKOFF = (0.0, 0.5, 1.0, 2.0, 5.0)
"""Pause before restarting a worker that died again soon after its last start."""
STABLE_SECONDS = 30.0
"""A worker that ran this long before dying is restarted at once."""
HEARTBEAT_SECONDS = 1.0
"""How often the supervisor pings each worker (one ping in flight at a time). A ping is a tiny
frame answered on the worker's event loop, so it costs nothing next to the requests it serves
and proves the loop that serves them turns, not only that the process exists."""
UNRESPONSIVE_SECONDS = 3.0 * HEARTBEAT_SECONDS
"""No answer for this long (three pings missed): the worker is shown ``unresponsive`` and a
repository operation stops waiting for it (it is killed then: it missed a change the others
applied, and replays it when it starts again). Three beats, so one slow answer (a GC pause, a
busy machine) is never taken for a hang."""
KILL_SECONDS = 10.0
"""No answer for this long: the worker is killed (SIGKILL: a stopped process ignores SIGTERM
until it is continued) and restarted. Longer than ``UNRESPONSIVE_SECONDS`` so a worker whose
loop is blocked for a few seconds (a model running on the loop, a swap storm) recovers with the
requests it holds, rather than having them reset; short enough that the connections the kernel
keeps handing a stopped worker wait at most this long plus a restart, well inside a Kubernetes
liveness probe's default failure window (3 failures x 10 s)."""
CONNECT_SECONDS = 60.0
"""A started worker that has not connected to its supervisor this long after it started (an
interpreter and its imports take seconds, more on a busy machine: a generous bound) is killed,
so a worker stopped or hung before it could be pinged does not stay ``starting`` forever."""
STATS_SECONDS = 2.0
"""How long a statistics read waits for one worker's snapshot (then: its last one). Below the
worker's own wait for the whole read (``REFRESH_SECONDS``), so a silent peer never makes the
read fail and the list of workers come back short."""


class WorkerSilent(Exception):
    """A worker did not answer a request before it turned unresponsive."""

    def __init__(self, index: int) -> None:
        super().__init__(f"worker {index} is unresponsive")
        self.index = index


@dataclass
class _Slot:
    """One worker position: its current process and channel."""

    index: int
    process: asyncio.subprocess.Process | None = None
    channel: Channel | None = None
    joined: bool = False
    listening: bool = False
    failures: int = 0
    started: float = 0.0
    state: WorkerState = "starting"
    since: float | None = None
    """When its current process started (Unix seconds), for the per-worker figures."""
    restarts: int = 0
    last_snapshot: Snapshot | None = None
    """Its current process's statistics as last read."""
    retired: Snapshot = field(default_factory=list)
    last_load: list[list[Any]] | None = None
    """Its current process's pending and in-flight requests as last read:
    ``[[model, version, pending, inflight], ...]`` (gone with the process)."""
    last_metrics: custom_metrics.Snapshot | None = None
    """Its current process's custom metrics (app/servekit/observability/custom_metrics.py) as last
    read."""
    retired_metrics: custom_metrics.Snapshot = field(default_factory=list)
    """The counters and histograms of its processes that died, added up."""
    """The last read statistics of its processes that died, merged: they stay in the totals
    and in this position's share of them."""
    beat: float | None = None
    """Loop time of its last sign of life (its first frame, then each ping answered); None while
    it is not watched (not connected yet, restarting)."""
    pinging: bool = False
    silent: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while it is unresponsive: what requests to it stop waiting on."""
    killed: bool = False

    def report(self, now: float) -> SlotReport:
        """This position as a statistics read carries it (app/servekit/workers/stats.py)."""
        process = self.process if self.state != "restarting" else None
        return {
            "index": self.index,
            "pid": None if process is None else process.pid,
            "state": self.state,
            "since": None if process is None else self.since,
            "restarts": self.restarts,
            "retired": self.retired,
            "current": self.last_snapshot,
            "load": self.last_load if process is not None else None,
            "metrics": self.last_metrics,
            "retired_metrics": self.retired_metrics,
            "heartbeat_age": None if self.beat is None else round(max(0.0, now - self.beat), 3),
        }


@dataclass
class Journal:
    """The operations applied since start, per model, compacted to what a new worker must
    replay: a load with a config, an unload or a failure replaces what came before for that
    model; a load without config (a reload as known) follows it once."""

    ops: dict[str, list[Message]] = field(default_factory=dict)

    def record(self, op: Message) -> None:
        name = str(op.get("name", ""))
        action = op.get("action")
        if action == "apply_config" or not name:
            return  # a new worker reads serve.yaml as it is now
        params = op.get("params") or {}
        history = self.ops.pop(name, [])
        if action == "load" and "config" not in params:
            if not history or history[-1] != op:
                history.append(op)
        else:
            history = [op]
        self.ops[name] = history

    def replay(self) -> list[Message]:
        return [op for history in self.ops.values() for op in history]


class Supervisor:
    def __init__(
        self,
        plan: ServePlan,
        config: str,
        overrides: Overrides,
        workers: int,
        log_level: str,
        model_dir: str | None = None,
    ) -> None:
        self.plan = plan
        self.model_dir = model_dir
        """``servekit serve --model-dir``'s folder: its one model failing to load on the first
        worker to join fails the start (app/servekit/cli/serve.py says why)."""
        self.config = config
        self.overrides = overrides
        self.count = workers
        self.log_level = log_level
        self.slots = [_Slot(i) for i in range(workers)]
        self.journal = Journal()
        self.stopping = False
        self.stop_signal: int = signal.SIGINT
        """The signal that stopped the supervisor, passed on to the workers (SIGTERM
        withdraws first, SIGINT drains at once); SIGINT when it stops for another reason (a
        worker failed to start: no load balancer sends it anything yet)."""
        self._lock = asyncio.Lock()
        self._folder = Path(tempfile.mkdtemp(prefix="servekit-workers-"))
        os.chmod(self._folder, 0o700)
        self.socket_path = str(self._folder / "control.sock")
        self._reserved: list[socket.socket] = []
        self.addresses: Addresses | None = None
        self.all_listening = asyncio.Event()
        self.failed_start = asyncio.Event()
        self._pings: set[asyncio.Task[None]] = set()

    # -- ports ----------------------------------------------------------------------------------
    def reserve_ports(self) -> Addresses:
        """Bind (not listen) the HTTP and gRPC ports every worker will listen on."""
        server = self.plan.server
        http = _reserve(server.host, server.http_port)
        hosts = tuple(bound_address(s) for s in http)
        grpc_port = None
        if server.grpc_port is not None:
            grpc = _reserve(server.host, server.grpc_port)
            http.extend(grpc)
            grpc_port = grpc[0].getsockname()[1]
        self._reserved = http
        port = http[0].getsockname()[1]
        self.addresses = Addresses(hosts, port, grpc_port, tls=self.plan.tls is not None)
        return self.addresses

    # -- workers --------------------------------------------------------------------------------
    async def spawn(self, slot: _Slot) -> None:
        assert self.addresses is not None
        spec = WorkerSpec(
            index=slot.index,
            config=self.config,
            socket=self.socket_path,
            http_port=self.addresses.http_port,
            grpc_port=self.addresses.grpc_port,
            server={k: v for k, v in self.overrides.server.items() if k != "workers"},
            only=self.overrides.only,
            storage_uri=self.overrides.storage_uri,
            token_env=self.overrides.token_env,
            config_uri=self.overrides.config_uri,
            log_level=self.log_level,
        )
        slot.joined = slot.listening = False
        slot.channel = None
        slot.state = "starting"
        slot.beat, slot.pinging, slot.killed = None, False, False
        slot.silent.clear()
        slot.started = asyncio.get_running_loop().time()
        slot.since = time.time()
        slot.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "servekit.workers.worker",
            spec.to_json(),
            env=worker_environment(self.count),
        )
        log.info("worker %d started (pid %d)", slot.index, slot.process.pid)

    async def watch(self, slot: _Slot) -> None:
        """Restart the worker of ``slot`` whenever it exits, until the supervisor stops."""
        while True:
            assert slot.process is not None
            code = await slot.process.wait()
            slot.channel = None
            slot.joined = False
            slot.beat = None
            slot.last_load = None  # what it held died with it
            if slot.last_snapshot is not None:  # its counts up to the last read stay
                slot.retired = merge([slot.retired, slot.last_snapshot])
                slot.last_snapshot = None
            if slot.last_metrics is not None:
                slot.retired_metrics = custom_metrics.retire(
                    [slot.retired_metrics, slot.last_metrics]
                )
                slot.last_metrics = None
            if self.stopping:
                return
            slot.state = "restarting"
            if not self.all_listening.is_set() and not slot.listening:
                log.error("worker %d exited during start-up (code %s)", slot.index, code)
                self.failed_start.set()
                return
            ran = asyncio.get_running_loop().time() - slot.started
            slot.failures = 0 if ran > STABLE_SECONDS else slot.failures + 1
            slot.restarts += 1
            log.warning(
                "worker %d (pid %d) exited (%s); restarting it",
                slot.index,
                slot.process.pid,
                f"signal {-code}" if code < 0 else f"code {code}",
            )
            await asyncio.sleep(RESTART_BACKOFF[min(slot.failures, len(RESTART_BACKOFF) - 1)])
            if self.stopping:
                return
            await self.spawn(slot)

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A worker's connection: its requests are handled by :meth:`handle`."""
        holder: dict[str, Any] = {}

        async def handler(message: Message) -> Any:
            return await self.handle(holder["channel"], message)

        holder["channel"] = Channel(reader, writer, handler)

    async def handle(self, channel: Channel, message: Message) -> Any:
        op = message.get("op")
        if op == "attach":  # first frame of a worker: watched from now on, while it loads
            slot = self.slots[int(message["worker"])]
            if slot.channel is None and not slot.killed:
                slot.channel, slot.beat = channel, asyncio.get_running_loop().time()
            return None
        if op == "hello":
            return await self.join(channel, int(message["worker"]), message.get("summary") or {})
        if op == "listening":
            slot = self.slots[int(message["worker"])]
            slot.listening = True
            if not self.stopping and slot.state != "unresponsive":  # a ping answer clears that
                slot.state = "serving"
            if all(s.listening for s in self.slots):
                self.all_listening.set()
            return None
        if op == "control":
            return await self.fan_out(message)
        if op == "stats":
            return await self.statistics()
        raise ValueError(f"unknown request {str(op)[:40]!r}")

    async def join(self, channel: Channel, index: int, summary: dict[str, str]) -> None:
        """Replay the journal to a (re)started worker, then count it in (under the lock, so
        no operation lands between its replay and its joining). A model that loaded at start
        on this worker but not on another (or the other way round) is failed everywhere."""
        slot = self.slots[index]
        failures = {name: reason for name, reason in summary.items() if reason}
        if self.model_dir is not None and failures:
            from servekit.config.model_dir import load_failure

            if not self.failed_start.is_set():  # said once, by the first worker to join
                name, reason = next(iter(failures.items()))
                log.error("servekit: %s", load_failure(name, [reason], self.model_dir))
                self.failed_start.set()
            return
        # Watched from now on: a worker that hangs while it replays is killed, not waited for
        # under the lock (which would hold up every repository operation).
        slot.channel, slot.beat = channel, asyncio.get_running_loop().time()
        async with self._lock:
            peers = self._joined()
            if peers:
                peer, peer_channel = peers[0]
                with contextlib.suppress(ConnectionError, ServeError, WorkerSilent):
                    theirs = await self._ask(peer, peer_channel, {"op": "summary"})
                    for name in sorted(set(summary) & set(theirs)):
                        if bool(summary[name]) != bool(theirs[name]):
                            failed_on = index if summary[name] else peer.index
                            reason = summary[name] or theirs[name]
                            slot.channel, slot.joined = channel, True
                            await self._fail_everywhere(name, f"worker {failed_on}: {reason}")
            failed: list[tuple[Message, ServeError]] = []
            for op in self.journal.replay():
                try:
                    await self._ask(slot, channel, {**op, "op": "apply"})
                except ServeError as error:
                    failed.append((op, error))
                except WorkerSilent:
                    self._kill(slot, "stopped answering while it replayed the repository changes")
                    raise
            slot.channel = channel
            slot.joined = True
            for op, problem in failed:
                name = str(op.get("name"))
                reason = f"worker {index} failed to load {name!r} again: {problem.message}"
                await self._fail_everywhere(name, reason)

    def _joined(self) -> list[tuple[_Slot, Channel]]:
        return [
            (s, s.channel)
            for s in self.slots
            if s.joined and s.channel is not None and not s.channel.closed.is_set()
        ]

    async def _ask(self, slot: _Slot, channel: Channel, message: Message) -> Any:
        """``channel.request``, waited on only while ``slot`` answers its heartbeats: a slow
        operation on a live worker (a large model loading) is waited for as long as it takes,
        a silent worker at most until it turns unresponsive (``WorkerSilent``)."""
        request = asyncio.ensure_future(channel.request(message))
        silent = asyncio.ensure_future(slot.silent.wait())
        try:
            await asyncio.wait({request, silent}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            silent.cancel()
            answered = request.done()
            if not answered:
                request.cancel()
        if not answered:
            raise WorkerSilent(slot.index)
        return request.result()

    async def fan_out(self, message: Message) -> Any:
        """Apply a control operation on every worker; answer once all have (or the error).

        A worker that turns unresponsive meanwhile is not waited for: it is killed (it missed
        the change) and replays the journal when it starts again, what the others did stands,
        and the answer is UNAVAILABLE naming it."""
        op = {k: v for k, v in message.items() if k not in ("id", "op")}
        async with self._lock:
            workers = self._joined()
            results = await asyncio.gather(
                *(self._ask(slot, channel, {**op, "op": "apply"}) for slot, channel in workers),
                return_exceptions=True,
            )
            errors: list[tuple[int, BaseException]] = []
            silent: list[int] = []
            applied: list[int] = []
            answer: Any = None
            for (slot, _), result in zip(workers, results, strict=True):
                if isinstance(result, WorkerSilent):
                    silent.append(slot.index)
                    self._kill(slot, "did not answer a repository operation")
                elif isinstance(result, ConnectionError):
                    continue  # it died: it replays the journal when it comes back
                elif isinstance(result, BaseException):
                    errors.append((slot.index, result))
                else:
                    applied.append(slot.index)
                    if answer is None:
                        answer = result
            what = _describe(op)
            if not errors:
                if silent and not applied:
                    raise Unavailable(f"{what}: {_silence(silent)}; nothing was changed")
                self.journal.record(op)
                if silent:
                    done = f"{what} was applied on {_names(applied)}"
                    replay = "a restarted worker applies it before it serves again"
                    raise Unavailable(f"{done}; {_silence(silent)} ({replay})")
                return answer
            first = errors[0][1]
            note = f"; {_silence(silent)}" if silent else ""
            if len(errors) + len(silent) == len(workers) or not isinstance(first, ServeError):
                # failed alike everywhere: every worker kept its previous state
                if silent and isinstance(first, ServeError):
                    raise type(first)(first.message + note)
                raise first
            # Failed on some workers only: unavailable everywhere, with the reason.
            name = str(op.get("name", ""))
            index = errors[0][0]
            reason = f"worker {index}: {first.message}"
            await self._fail_everywhere(name, reason)
            raise type(first)(reason + note)

    async def _fail_everywhere(self, name: str, reason: str) -> None:
        fail = {"op": "apply", "action": "fail", "name": name, "reason": reason}
        workers = self._joined()
        results = await asyncio.gather(
            *(self._ask(slot, channel, fail) for slot, channel in workers),
            return_exceptions=True,
        )
        for (slot, _), result in zip(workers, results, strict=True):
            if isinstance(result, WorkerSilent):
                self._kill(slot, "did not answer a repository operation")
        self.journal.record(fail)

    async def statistics(self) -> Message:
        """Every worker position: its process, state, restarts, heartbeat age and counts, read
        now (a slow or unresponsive worker: its last read counts; the one asking uses its own,
        fresher). Every position is in the answer, whatever its state."""
        everyone = [
            (s, s.channel)
            for s in self.slots
            if s.joined and s.channel is not None and s.state != "unresponsive"
        ]
        results = await asyncio.gather(
            *(c.request({"op": "snapshot"}, timeout=STATS_SECONDS) for _, c in everyone),
            return_exceptions=True,
        )
        for (slot, channel), result in zip(everyone, results, strict=True):
            # A process that died meanwhile was retired with its last read counts already.
            if not isinstance(result, BaseException) and slot.channel is channel:
                slot.last_snapshot = result["stats"]
                slot.last_load = result.get("load")
                slot.last_metrics = result["metrics"]
        now = asyncio.get_running_loop().time()
        slots = [slot.report(now) for slot in self.slots]
        restarts = sum(slot.restarts for slot in self.slots)
        return {"workers": self.count, "restarts": restarts, "slots": slots}

    # -- heartbeats -----------------------------------------------------------------------------
    async def heartbeats(self) -> None:
        """Ping every watched worker each ``HEARTBEAT_SECONDS``; mark the silent ones
        unresponsive, kill those silent past ``KILL_SECONDS`` (``watch`` restarts them)."""
        loop = asyncio.get_running_loop()
        while not self.stopping:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            if self.stopping:
                return
            for slot in self.slots:
                self._check(slot, loop.time())

    def _check(self, slot: _Slot, now: float) -> None:
        channel = slot.channel
        if channel is None and slot.state == "starting" and now - slot.started > CONNECT_SECONDS:
            self._kill(slot, f"did not connect within {CONNECT_SECONDS:.0f} s of its start")
        if channel is None or slot.beat is None or channel.closed.is_set() or slot.killed:
            return
        if not slot.pinging:
            slot.pinging = True
            task = asyncio.create_task(self._ping(slot, channel))
            self._pings.add(task)
            task.add_done_callback(self._pings.discard)
        silence = now - slot.beat
        if silence > KILL_SECONDS:
            self._kill(slot, f"answered no heartbeat for {silence:.1f} s")
        elif silence > UNRESPONSIVE_SECONDS and slot.state != "unresponsive":
            slot.state = "unresponsive"
            slot.silent.set()
            log.warning(
                "worker %d (pid %s) answered no heartbeat for %.1f s: unresponsive "
                "(killed and restarted after %.0f s)",
                slot.index,
                None if slot.process is None else slot.process.pid,
                silence,
                KILL_SECONDS,
            )

    async def _ping(self, slot: _Slot, channel: Channel) -> None:
        try:
            await channel.request({"op": "ping"})
        except ConnectionError:
            return  # it died: ``watch`` takes over
        except ServeError:
            pass  # an answer all the same
        finally:
            if slot.channel is channel:
                slot.pinging = False
        if slot.channel is not channel or slot.killed:
            return
        slot.beat = asyncio.get_running_loop().time()
        if slot.state == "unresponsive":
            slot.state = "serving" if slot.listening else "starting"
            slot.silent.clear()
            log.warning("worker %d answers its heartbeats again", slot.index)

    def _kill(self, slot: _Slot, why: str) -> None:
        """SIGKILL the worker of ``slot`` (once); ``watch`` restarts it as a worker that died.
        The connections it had accepted are reset by the kernel."""
        process = slot.process
        if process is None or process.returncode is not None or slot.killed:
            return
        slot.killed = True
        slot.silent.set()
        log.error("worker %d (pid %d) %s; killing it to restart it", slot.index, process.pid, why)
        with contextlib.suppress(ProcessLookupError):
            process.kill()

    # -- life cycle -----------------------------------------------------------------------------
    async def run(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stopping(sig: signal.Signals) -> None:
            self.stopping = True  # at once: a worker the signal reached too is not restarted
            if stop.is_set():  # a second signal: the workers' withdrawal is cut short
                self._signal_workers(sig)
            self.stop_signal = sig
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping, sig)
        storage.clean(storage.default_storage_dir(self.plan.base_dir, self.plan.server.storage_dir))
        server = await asyncio.start_unix_server(self.connected, path=self.socket_path)
        watchers: list[asyncio.Task[None]] = []
        try:
            for slot in self.slots:
                await self.spawn(slot)
            watchers = [asyncio.create_task(self.watch(slot)) for slot in self.slots]
            watchers.append(asyncio.create_task(self.heartbeats()))
            waits = [
                asyncio.create_task(e.wait()) for e in (self.all_listening, self.failed_start, stop)
            ]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
            code = 0
            fmt = self.plan.server.logging.format
            if self.failed_start.is_set():
                log.error("servekit: a worker failed to start (see the log above)")
                code = 1
            elif self.all_listening.is_set():
                assert self.addresses is not None
                logs.announce(
                    f"{self.addresses.listening_line()} ({self.count} workers)",
                    fmt,
                    http=self.addresses.http_url,
                    grpc=self.addresses.grpc_target,
                    workers=self.count,
                )
                await stop.wait()
                logs.announce("servekit: stopping (in-flight requests finish first)", fmt)
            await self.stop_workers()
            return code
        finally:
            self.stopping = True
            for task in [*watchers, *self._pings]:
                task.cancel()
            server.close()
            for sock in self._reserved:
                sock.close()
            shutil.rmtree(self._folder, ignore_errors=True)

    def _signal_workers(self, sig: int) -> None:
        """Send ``sig`` to every live worker (SIGKILL to one unresponsive or being killed)."""
        silent = {s.index for s in self.slots if s.state == "unresponsive" or s.killed}
        for slot in self.slots:
            process = slot.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGKILL if slot.index in silent else sig)

    async def stop_workers(self) -> None:
        """Send every worker the signal the supervisor got (SIGTERM: each withdraws for
        ``server.drainDelaySeconds``, unready but serving; both: each drains for
        ``server.drainSeconds``), then wait; kill what outlives both and STOP_SECONDS more.
        An unresponsive worker is killed at once: it would not handle the signal (stopped) or
        not drain (hung)."""
        self.stopping = True
        processes = [s.process for s in self.slots if s.process is not None]
        self._signal_workers(self.stop_signal)
        for slot in self.slots:
            slot.state = "stopping"
        try:
            server = self.plan.server
            limit = server.drain_delay_seconds + server.drain_seconds + STOP_SECONDS
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in processes)), limit)
        except TimeoutError:
            for process in processes:
                if process.returncode is None:
                    log.error("worker pid %d did not stop in time; killing it", process.pid)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            await asyncio.gather(*(p.wait() for p in processes))


def _describe(op: Message) -> str:
    """An operation as the answer names it (names were checked by the worker that forwarded)."""
    if op.get("action") == "apply_config":
        return "the serve.yaml reload"
    return f"{op.get('action')} of {str(op.get('name', ''))[:200]!r}"


def _names(indexes: list[int]) -> str:
    if len(indexes) == 1:
        return f"worker {indexes[0]}"
    return "workers " + ", ".join(str(i) for i in indexes)


def _silence(indexes: list[int]) -> str:
    verb = "has" if len(indexes) == 1 else "have"
    restart = "it is" if len(indexes) == 1 else "they are"
    return (
        f"{_names(indexes)} {verb} not answered for over {UNRESPONSIVE_SECONDS:.0f} s "
        f"(unresponsive): {restart} being killed and restarted"
    )


def _reserve(host: str, port: int) -> list[socket.socket]:
    """Sockets holding ``port`` (0: a free one) on every address of ``host`` for the workers.

    A fixed port is first bound without SO_REUSEPORT, so a port another program (or another
    servekit) already uses is an error here instead of being silently shared."""
    if port != 0:
        for sock in bind_http(host, port, listen=False):
            sock.close()
    return bind_http(host, port, reuse_port=True, listen=False)


def serve(
    plan: ServePlan,
    config: str,
    overrides: Overrides,
    workers: int,
    log_level: str,
    *,
    model_dir: str | None = None,
) -> int:
    """``servekit serve`` with ``workers`` > 1: run the supervisor until SIGTERM/SIGINT (or
    until ``--model-dir``'s model failed to load)."""
    supervisor = Supervisor(plan, config, overrides, workers, log_level, model_dir)
    supervisor.reserve_ports()
    return asyncio.run(supervisor.run())
