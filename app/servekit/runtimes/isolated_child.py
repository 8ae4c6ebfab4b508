"""An isolated Python model's child process: ``python -m servekit.runtimes.isolated_child FD PID``.

``FD`` is its end of a socket pair with the server (app/servekit/runtimes/isolation_wire.py),
``PID`` the server's process id. The first message says what to load, exactly the serve.yaml fields
of the model (entrypoint, parameters, tensor overrides, memory limit) plus the server's import path;
nothing a request sends can change them. The model is built with the in-process Python runtime
(app/servekit/runtimes/python.py), so it behaves as it would in the server; then every message is
one call, answered with its outputs or its error.

The child never outlives the server: the kernel kills it when the server's process dies
(``PR_SET_PDEATHSIG``), and it exits when its socket reaches end of file. It ignores SIGINT
(Ctrl-C in a terminal reaches the whole process group; the server decides when it stops).
Running out of memory (``MemoryError`` under ``memoryLimitBytes``) is answered and ends the
process: the server restarts it rather than trust a process that failed half-way.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from servekit.errors import ServeError
from servekit.observability import logs
from servekit.runtimes.base import LoadError
from servekit.runtimes.isolation_wire import ChannelClosed, recv_message, send_message
from servekit.runtimes.python import MESSAGE_CODECS, PythonModel, build

if TYPE_CHECKING:
    from servekit.config.schema import TensorOverride

log = logging.getLogger("servekit.isolated")

PR_SET_PDEATHSIG = 1
EXIT_OUT_OF_MEMORY = 3


def main(argv: list[str]) -> int:
    """Load the model the server names, then answer calls until told to stop."""
    fd, parent = int(argv[1]), int(argv[2])
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    try:
        header, _ = recv_message(sock)
    except ChannelClosed:
        return 0
    logs.setup_child(str(header.get("model")))  # the server's format (text or JSON lines)
    # This process's composition root: whole-message models take grps messages. The one import
    # of a codec under app/servekit/runtimes/ (pyproject.toml's runtimes contract names it).
    from servekit.codecs.grps_message import CODEC

    MESSAGE_CODECS.setdefault("grps", CODEC)
    model = _load(sock, header)
    if model is None:
        return 1
    return _serve(sock, model, header.get("memory_limit_bytes"))


def _die_with(parent: int) -> None:
    """Ask the kernel for SIGKILL when the server dies (Linux); gone already: exit now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _load(sock: socket.socket, header: dict[str, Any]) -> PythonModel | None:
    limit = header.get("memory_limit_bytes")
    if limit:
        resource.setrlimit(resource.RLIMIT_DATA, (int(limit), int(limit)))
    for entry in header.get("sys_path", []):
        if entry not in sys.path:
            sys.path.append(entry)
    try:
        model = build(
            header.get("entrypoint"),
            header.get("parameters") or {},
            1,
            _overrides(header.get("inputs")),
            _overrides(header.get("outputs")),
            name=str(header.get("model", "")),
        )
    except LoadError as exc:
        send_message(sock, {"ok": False, "message": str(exc)}, {})
        return None
    except MemoryError:
        send_message(sock, {"ok": False, "message": _out_of_memory(limit, "while loading")}, {})
        return None
    except Exception as exc:  # the model's own import or load() failing in its own way
        log.exception("loading the model failed")
        send_message(sock, {"ok": False, "message": f"{type(exc).__name__}: {exc}"}, {})
        return None
    if model.decoupled:
        message = (
            "a model whose predict yields (decoupled: a stream of responses per request) cannot "
            "run with isolation: process yet; serve it in the server's process"
        )
        send_message(sock, {"ok": False, "message": message}, {})
        return None
    model.fatal = (MemoryError,)
    signature = {
        "inputs": [s.as_dict() for s in model.signature.inputs],
        "outputs": [s.as_dict() for s in model.signature.outputs],
        "loose": sorted(model.loose_outputs),
        "parameters": model.signature.parameters,
    }
    send_message(sock, {"ok": True, "signature": signature}, {})
    return model


def _overrides(items: list[dict[str, Any]] | None) -> tuple[TensorOverride, ...] | None:
    """serve.yaml's tensor declarations, back as schema objects (pydantic imported only for a
    model that has some: the child starts faster without it)."""
    if items is None:
        return None
    from servekit.config.schema import TensorOverride

    return tuple(TensorOverride.model_validate(i) for i in items)


def _serve(sock: socket.socket, model: PythonModel, limit: int | None) -> int:
    while True:
        try:
            header, arrays = recv_message(sock)
        except ChannelClosed:
            model.close()
            return 0
        if header.get("op") == "close":
            model.close()
            return 0
        try:
            outputs = model.predict(arrays, list(header.get("outputs", [])))
            send_message(sock, {"ok": True}, outputs)
        except ServeError as exc:
            send_message(sock, {"ok": False, "code": exc.code.value, "message": exc.message}, {})
        except MemoryError:
            message = _out_of_memory(limit, "")
            log.error("%s; the process exits and the server restarts it", message)
            send_message(sock, {"ok": False, "fatal": True, "message": message}, {})
            return EXIT_OUT_OF_MEMORY
        except Exception as exc:  # e.g. an output the wire cannot carry: answer, keep serving
            log.exception("answering a call failed")
            message = f"the model's process could not answer: {type(exc).__name__}"
            send_message(sock, {"ok": False, "code": "INTERNAL", "message": message}, {})


def _out_of_memory(limit: int | None, when: str) -> str:
    where = f" {when}" if when else ""
    if limit:
        return f"the model ran out of memory{where} (memoryLimitBytes: {limit})"
    return f"the model ran out of memory{where}"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
