"""Python models in a child process of their own (``isolation: process`` in serve.yaml).

Like Triton's Python backend stub: each instance of the model is a child process
(app/servekit/runtimes/isolated_child.py) that imports and runs the model, fed over a socket pair
with raw tensor buffers (app/servekit/runtimes/isolation_wire.py). To the rest of the server this is
one more runtime with ``predict`` and ``close``; what it adds is that the model's failures stay in
its process:

- the process dies (segfault, abort, the kernel's out-of-memory killer, ``os._exit``), or runs
  out of memory under ``memoryLimitBytes`` (RLIMIT_DATA), or a call runs past the model's
  ``timeoutSeconds`` (the process is then killed): the calls it had get 503 / UNAVAILABLE with
  the reason, the model reports itself down with that reason (the repository shows the version
  UNAVAILABLE: :class:`~servekit.runtimes.base.Supervised`; server readiness does not count it,
  app/servekit/services/readiness.py) and a new process is started after a backoff (0.2 s,
  doubling to 30 s while it keeps failing soon after starting); once it has loaded, the model
  is READY again. Other models never notice.
- a client's deadline (``CALL_DEADLINE``) or cancellation never kills the process: the
  executor answers that client at once and the call goes on in the child, its answer read
  and dropped when it comes (the wire stays one message each way), the process free again
  for the model's other clients. Killing it there let any client with a short deadline
  restart the model over and over, failing everybody else's calls.
- a model that crashes ``BREAKER_CRASHES`` times within ``BREAKER_WINDOW_S`` (a poison request
  sent again and again, a process that dies soon after every start) trips its circuit
  breaker: it stays UNAVAILABLE with the reason ("crashed 5 times in 60 s: <the last one>"),
  its processes are stopped and no longer restarted until a repository load (or serve.yaml
  edit) loads it anew.
- the process never outlives the server: it asks the kernel for SIGKILL when the server dies
  (``PR_SET_PDEATHSIG``, which fires when the *thread* that started it ends, so every child is
  started by one long-lived spawner thread), exits at end of file on its socket, and ``close``
  (unload, reload, server stop) asks it to unload and kills it if it does not within 5 s.

The child imports what serve.yaml's fields name (entrypoint, parameters, tensor overrides), the
same as the in-process runtime; nothing a request sends changes it, and nothing the child sends
is unpickled (headers are JSON, tensors raw bytes checked against their datatype and shape).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from servekit.config.compiler import ModelPlan
from servekit.config.versions import VersionSource
from servekit.datatypes import DATATYPES
from servekit.errors import (
    AlreadyExists,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ServeError,
    Unavailable,
    Unimplemented,
)
from servekit.runtimes.base import CALL_DEADLINE, Arrays, LoadError, Predict
from servekit.runtimes.isolation_wire import (
    ChannelClosed,
    ProtocolError,
    recv_message,
    send_message,
)
from servekit.runtimes.python import OBJECT_PREFIX, PLATFORM
from servekit.types import ModelSignature, TensorSpec

log = logging.getLogger("servekit.isolated")

DEFAULT_TIMEOUT_S = 60.0
"""A call's limit when serve.yaml gives no ``timeoutSeconds`` and the request no deadline."""
LOAD_TIMEOUT_S = 600.0
"""How long a child may take to import and load its model before it counts as hung."""
CLOSE_GRACE_S = 5.0
"""How long a child may take to run the model's ``unload()`` and exit before it is killed."""
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 30.0
STABLE_S = 60.0
"""A process that served this long before failing restarts after the first backoff again."""
BREAKER_CRASHES = 5
BREAKER_WINDOW_S = 60.0
"""That many lost processes (crash, out of memory, killed at ``timeoutSeconds``) within this
many seconds trip the model's circuit breaker: no more restarts until it is loaded again."""
_ERRORS: dict[str, type[ServeError]] = {
    cls.code.value: cls
    for cls in (
        InvalidArgument,
        NotFound,
        Unavailable,
        ResourceExhausted,
        PermissionDenied,
        Unimplemented,
        AlreadyExists,
        Internal,
    )
}
"""Error codes a model may raise on purpose (a ServeError) and the child passes back."""
_SIGNALS = {
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGABRT: "an abort",
    signal.SIGBUS: "a bus error",
    signal.SIGFPE: "a floating-point exception",
    signal.SIGILL: "an illegal instruction",
    signal.SIGKILL: "SIGKILL, e.g. the kernel's out-of-memory killer",
}


@dataclass(frozen=True, slots=True)
class ChildSettings:
    """What a child loads: serve.yaml's fields of the model, nothing from a request."""

    model: str
    entrypoint: str
    parameters: dict[str, Any]
    inputs: list[dict[str, Any]] | None
    outputs: list[dict[str, Any]] | None
    memory_limit_bytes: int | None
    timeout_s: float
    sys_path: list[str] = field(default_factory=lambda: list(sys.path))

    def load_message(self) -> dict[str, Any]:
        return {
            "op": "load",
            "model": self.model,
            "entrypoint": self.entrypoint,
            "parameters": self.parameters,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "memory_limit_bytes": self.memory_limit_bytes,
            "sys_path": self.sys_path,
        }


class _Spawner:
    """Starts every child from one thread that lives as long as the server (see the module
    docstring: PR_SET_PDEATHSIG follows the starting thread, not the process)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[list[str], dict[str, Any], concurrent.futures.Future[subprocess.Popen[bytes]]]
        ] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def popen(self, args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        future: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="servekit-isolated-spawner", daemon=True
                )
                self._thread.start()
        self._jobs.put((args, kwargs, future))
        return future.result()

    def _run(self) -> None:
        while True:
            args, kwargs, future = self._jobs.get()
            try:
                future.set_result(subprocess.Popen(args, **kwargs))
            except BaseException as exc:  # handed to the caller, who reports it
                future.set_exception(exc)


_SPAWNER = _Spawner()


@dataclass(eq=False, slots=True)
class _Child:
    """One running child process and the server's end of its socket."""

    slot: int
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    started: float = field(default_factory=time.monotonic)
    dead: bool = False
    loose: frozenset[str] = frozenset()
    """The model's outputs whose shape was never declared, as its process reports them."""


class IsolatedModel:
    """An isolated Python model: ``instances`` child processes, one call at a time each."""

    platform = PLATFORM
    may_run_inline = False  # a call waits on another process (runtimes/base.py)
    decoupled = False
    outputs_trusted = False
    note = ""

    def __init__(
        self, settings: ChildSettings, children: list[_Child], signature: ModelSignature
    ) -> None:
        self.signature = signature
        self.loose_outputs = children[0].loose if children else frozenset()
        """Outputs whose shape was never declared (PythonModel.loose_outputs, from the child):
        the executor checks only their datatype."""
        self._settings = settings
        self._instances = len(children)
        self._cond = threading.Condition()
        self._idle: list[_Child] = list(children)
        self._busy: set[_Child] = set()
        self._down: dict[int, str] = {}
        self._backoff: dict[int, float] = {}
        self._crashes: deque[float] = deque()
        """When recent processes were lost (``time.monotonic()``), for the breaker."""
        self._tripped: str | None = None
        """The breaker's reason once it tripped: the model is down until it is loaded anew."""
        self._closing = threading.Event()
        self._report: Callable[[str | None], None] | None = None
        for child in children:
            self._wait_for_exit(child)

    # -- the runtime interface ------------------------------------------------------------------
    def predictor(self, index: int) -> Predict:
        """Any free child serves any call (the children are the instances)."""
        return self.predict

    def predict(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        """One call in a free process. The request's deadline (``CALL_DEADLINE``) bounds only
        the wait for a free process and whether the call starts at all; once sent, the call
        runs to its answer or to ``timeoutSeconds`` (see the module docstring): the executor
        has answered a client whose deadline passed meanwhile and drops this result."""
        timeout = self._settings.timeout_s
        given = CALL_DEADLINE.get()
        wait_until = time.monotonic() + timeout
        if given is not None and given < wait_until:
            wait_until = given
        child = self._take(wait_until, given)
        if given is not None and time.monotonic() >= given:
            self._give_back(child)
            raise DeadlineExceeded(
                f"model {self._name!r}: the request's deadline passed before its call started"
            )
        limit = time.monotonic() + timeout
        try:
            send_message(child.sock, {"op": "infer", "outputs": outputs}, inputs, limit)
            header, arrays = recv_message(child.sock, limit)
        except TimeoutError:
            why = f"a call ran past timeoutSeconds ({timeout:g} s); its process was killed"
            raise self._failed(child, why) from None
        except (ChannelClosed, ProtocolError, OSError) as exc:
            if isinstance(exc, ProtocolError):
                log.error("model %s: bad message from its process: %s", self._name, exc)
            raise self._failed(child, _exit_reason(child)) from None
        if header.get("fatal"):
            raise self._failed(child, str(header.get("message", "the process failed")))
        self._give_back(child)
        if not header.get("ok"):
            kind = _ERRORS.get(str(header.get("code")), Internal)
            raise kind(str(header.get("message", "the model failed")))
        if list(arrays) != outputs:
            raise Internal(f"the model's process answered {list(arrays)} for outputs {outputs}")
        return arrays

    def close(self) -> None:
        """Ask every child to unload and exit; kill those that do not (unload, server stop)."""
        self._closing.set()
        with self._cond:
            children = [*self._idle, *self._busy]
            self._idle.clear()
            self._busy.clear()
            self._cond.notify_all()
        for child in children:
            child.dead = True
            with contextlib.suppress(OSError, ChannelClosed):
                send_message(child.sock, {"op": "close"}, {}, time.monotonic() + 1.0)
        end = time.monotonic() + CLOSE_GRACE_S  # one grace for all: they exit in parallel
        for child in children:
            _stop(child, max(0.0, end - time.monotonic()))

    def watch(self, report: Callable[[str | None], None]) -> None:
        """Report this model's health to the repository (see base.Supervised)."""
        self._report = report
        with self._cond:
            problem = self._problem()
        if problem is not None:
            report(problem)

    def pids(self) -> list[int]:
        """The process ids of the running children (tests and the log)."""
        with self._cond:
            return [c.proc.pid for c in (*self._idle, *self._busy)]

    # -- the pool -------------------------------------------------------------------------------
    @property
    def _name(self) -> str:
        return self._settings.model

    def _take(self, deadline: float, given: float | None) -> _Child:
        """A free process, waiting until ``deadline`` at most (``given``: the request's)."""
        with self._cond:
            while True:
                if self._closing.is_set():
                    raise Unavailable(f"model {self._name!r} is unloading")
                if self._tripped is not None:
                    raise Unavailable(f"model {self._name!r} is unavailable: {self._tripped}")
                if self._idle:
                    child = self._idle.pop()
                    self._busy.add(child)
                    return child
                if len(self._down) == self._instances:
                    raise Unavailable(f"model {self._name!r} is unavailable: {self._problem()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    busy = (
                        f"all {self._instances} of its processes stayed busy until the "
                        "request's deadline"
                    )
                    if deadline == given:
                        raise DeadlineExceeded(f"model {self._name!r}: {busy}")
                    raise Unavailable(f"model {self._name!r}: {busy}")
                self._cond.wait(left)

    def _give_back(self, child: _Child) -> None:
        with self._cond:
            self._busy.discard(child)
            stop = self._tripped is not None and not child.dead
            if stop:  # the breaker tripped during this call: the process is not used again
                child.dead = True
            elif not child.dead and not self._closing.is_set():
                self._idle.append(child)
            self._cond.notify()
        if stop:
            _stop(child, 0.0)

    def _problem(self) -> str | None:
        if self._tripped is not None:
            return self._tripped
        if not self._down:
            return None
        reasons = sorted(set(self._down.values()))
        return "; ".join(reasons) + "; restarting it"

    def _failed(self, child: _Child, reason: str) -> Unavailable:
        """Take ``child`` out (killed), report the model down, restart it unless the breaker
        trips; the caller's error."""
        self._lose(child, reason)
        with self._cond:
            tripped = self._tripped
        if tripped is not None:
            return Unavailable(f"model {self._name!r} is unavailable: {tripped}")
        return Unavailable(f"model {self._name!r} is unavailable: {reason}; restarting it")

    def _lose(self, child: _Child, reason: str) -> None:
        with self._cond:
            if child.dead or self._closing.is_set():
                return
            child.dead = True
            self._busy.discard(child)
            if child in self._idle:
                self._idle.remove(child)
            self._down[child.slot] = reason
            now = time.monotonic()
            lived = now - child.started
            first = lived >= STABLE_S or child.slot not in self._backoff
            delay = BACKOFF_FIRST_S if first else min(2 * self._backoff[child.slot], BACKOFF_MAX_S)
            self._backoff[child.slot] = delay
            stopped = self._trip_if_looping(now, reason)
            problem = self._problem()
            self._cond.notify_all()
        _stop(child, 0.0)
        for other in stopped:
            _stop(other, 0.0)
        if self._tripped is not None:
            log.error(
                "model %s: process %d (instance %d) failed: %s; circuit breaker tripped (%s), "
                "no more restarts until the model is loaded again",
                self._name,
                child.proc.pid,
                child.slot,
                reason,
                self._tripped,
            )
            self._tell(problem)
            return
        log.warning(
            "model %s: process %d (instance %d) failed: %s; restarting it in %.1f s",
            self._name,
            child.proc.pid,
            child.slot,
            reason,
            delay,
        )
        self._tell(problem)
        threading.Thread(
            target=self._restart,
            args=(child.slot, delay),
            name=f"servekit-restart-{self._name}",
            daemon=True,
        ).start()

    def _trip_if_looping(self, now: float, reason: str) -> list[_Child]:
        """Count a lost process (under ``_cond``); at ``BREAKER_CRASHES`` within the window,
        trip the breaker and return the idle processes to stop (busy ones stop when their
        call returns: ``_give_back``)."""
        crashes = self._crashes
        crashes.append(now)
        while crashes and now - crashes[0] > BREAKER_WINDOW_S:
            crashes.popleft()
        if self._tripped is not None or len(crashes) < BREAKER_CRASHES:
            return []
        self._tripped = (
            f"crashed {len(crashes)} times in {BREAKER_WINDOW_S:g} s: {reason}; not restarted "
            "until the model is loaded again (repository load or serve.yaml edit)"
        )
        stopped = list(self._idle)
        self._idle.clear()
        for other in stopped:
            other.dead = True
        return stopped

    def _restart(self, slot: int, delay: float) -> None:
        while not self._closing.wait(delay):
            if self._tripped is not None:
                return
            try:
                child, signature = start_child(self._settings, slot)
            except LoadError as exc:
                with self._cond:
                    delay = min(2 * delay, BACKOFF_MAX_S)
                    self._backoff[slot] = delay
                    self._down[slot] = f"its process could not be restarted: {exc}"
                    problem = self._problem()
                log.warning(
                    "model %s: restart failed: %s; next try in %.1f s", self._name, exc, delay
                )
                self._tell(problem)
                continue
            if signature != self.signature:
                log.warning(
                    "model %s: the restarted process reports different metadata; serving with "
                    "the metadata it loaded with (reload the model to take the new one)",
                    self._name,
                )
            with self._cond:
                if self._closing.is_set() or self._tripped is not None:
                    child.dead = True
                else:
                    self._down.pop(slot, None)
                    self._idle.append(child)
                    self._cond.notify_all()
                problem = self._problem()
            if child.dead:
                _stop(child, 0.0)
                return
            self._wait_for_exit(child)
            log.info(
                "model %s: process %d (instance %d) restarted", self._name, child.proc.pid, slot
            )
            self._tell(problem)
            return

    def _wait_for_exit(self, child: _Child) -> None:
        """Notice a child that dies while idle (no call to see it): report it at once."""

        def wait() -> None:
            child.proc.wait()
            if not child.dead:
                self._lose(child, _exit_reason(child))

        threading.Thread(target=wait, name=f"servekit-wait-{self._name}", daemon=True).start()

    def _tell(self, problem: str | None) -> None:
        report = self._report
        if report is not None and not self._closing.is_set():
            report(problem)


def start_child(settings: ChildSettings, slot: int) -> tuple[_Child, ModelSignature]:
    """Start one child and load the model in it; LoadError says why it could not."""
    ours, theirs = socket.socketpair()
    try:
        proc = _SPAWNER.popen(
            [
                sys.executable,
                "-m",
                "servekit.runtimes.isolated_child",
                str(theirs.fileno()),
                str(os.getpid()),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=_child_env(),
        )
    except OSError as exc:
        ours.close()
        raise LoadError(f"cannot start the model's process: {exc}") from None
    finally:
        theirs.close()
    child = _Child(slot, proc, ours)
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    try:
        send_message(ours, settings.load_message(), {}, deadline)
        header, _ = recv_message(ours, deadline)
    except TimeoutError:
        _stop(child, 0.0)
        raise LoadError(f"the model's process did not load within {LOAD_TIMEOUT_S:g} s") from None
    except (ChannelClosed, ProtocolError, OSError):
        _stop(child, CLOSE_GRACE_S)
        raise LoadError(f"while loading, {_exit_reason(child)}") from None
    if not header.get("ok"):
        _stop(child, CLOSE_GRACE_S)
        raise LoadError(str(header.get("message", "the model's process failed to load")))
    try:
        signature = _signature(header.get("signature"))
    except (TypeError, ValueError, KeyError) as exc:
        _stop(child, 0.0)
        raise LoadError(f"the model's process sent unusable metadata: {exc}") from None
    loose = header["signature"].get("loose", [])
    if isinstance(loose, list) and all(isinstance(name, str) for name in loose):
        child.loose = frozenset(loose)
    log.info("model %s: process %d (instance %d) loaded", settings.model, proc.pid, slot)
    return child, signature


def _child_env() -> dict[str, str]:
    """The server's environment, with the source root holding ``servekit`` first on PYTHONPATH so
    the child runs this server's code (the model's own folders come in the load message)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _signature(raw: object) -> ModelSignature:
    if not isinstance(raw, dict):
        raise TypeError("no signature")

    def specs(items: object) -> tuple[TensorSpec, ...]:
        if not isinstance(items, list):
            raise TypeError("a list of tensors")
        out = []
        for item in items:
            name, datatype, shape = item["name"], item["datatype"], item["shape"]
            if not isinstance(name, str) or datatype not in DATATYPES:
                raise ValueError(f"tensor {name!r} of datatype {datatype!r}")
            if not isinstance(shape, list) or not all(type(d) is int and d >= -1 for d in shape):
                raise ValueError(f"tensor {name!r} of shape {shape!r}")
            parameters = item.get("parameters")  # an MLServer runtime's metadata()
            shown = dict(parameters) if isinstance(parameters, dict) else None
            optional = item.get("optional") is True
            out.append(TensorSpec(name, datatype, tuple(shape), optional, parameters=shown))
        return tuple(out)

    parameters = raw.get("parameters")
    return ModelSignature(
        specs(raw["inputs"]),
        specs(raw["outputs"]),
        parameters=dict(parameters) if isinstance(parameters, dict) else None,
    )


def _exit_reason(child: _Child) -> str:
    """Why a child's socket closed, from its exit status (waited for briefly)."""
    try:
        code = child.proc.wait(timeout=CLOSE_GRACE_S)
    except subprocess.TimeoutExpired:
        return "its process stopped answering (its socket closed)"
    if code < 0:
        try:
            number = signal.Signals(-code)
        except ValueError:
            return f"its process was killed by signal {-code}"
        what = _SIGNALS.get(number)
        return f"its process was killed by {number.name}" + (f" ({what})" if what else "")
    return f"its process exited with status {code}"


def _stop(child: _Child, grace: float) -> None:
    """Wait up to ``grace`` seconds for ``child`` to exit, then kill it; close its socket."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.proc.wait(timeout=grace) if grace > 0 else None
    if child.proc.poll() is None:
        child.proc.kill()
        child.proc.wait()
    child.sock.close()


def settings_of(plan: ModelPlan) -> ChildSettings:
    """The child's load message from the model's plan (serve.yaml fields only)."""
    entrypoint = plan.entrypoint
    if entrypoint is None:
        raise LoadError("a Python model needs an entrypoint: module:attribute")
    if entrypoint.startswith(OBJECT_PREFIX):
        raise LoadError(
            "an in-memory Python object cannot run in a child process (isolation: process); "
            "give the model as module:attribute"
        )
    try:
        parameters = orjson.loads(orjson.dumps(plan.parameters))
    except TypeError as exc:
        raise LoadError(f"isolation: process needs JSON-like parameters: {exc}") from None
    config = plan.config
    timeout = config.timeout_seconds if config is not None else None
    return ChildSettings(
        model=plan.name,
        entrypoint=entrypoint,
        parameters=parameters,
        inputs=None if plan.inputs is None else [o.model_dump(mode="json") for o in plan.inputs],
        outputs=None if plan.outputs is None else [o.model_dump(mode="json") for o in plan.outputs],
        memory_limit_bytes=config.memory_limit_bytes if config is not None else None,
        timeout_s=timeout if timeout is not None else DEFAULT_TIMEOUT_S,
    )


def load(plan: ModelPlan, version: VersionSource) -> IsolatedModel:
    """Start the model's processes (one per instance) and read its metadata from the first."""
    settings = settings_of(plan)
    children: list[_Child] = []
    signature: ModelSignature | None = None
    try:
        for slot in range(plan.instances):
            child, signature = start_child(settings, slot)
            children.append(child)
    except BaseException:
        for child in children:
            _stop(child, 0.0)
        raise
    assert signature is not None
    return IsolatedModel(settings, children, signature)
