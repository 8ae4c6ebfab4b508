"""The two test tiers, and the guard that keeps an end-to-end test out of the fast one.

``pytest -m "not slow"`` is the developer loop: tests that run in this process only (codecs,
config, the services driven directly with fake runtimes) and take milliseconds each.
Everything that starts a server process, a browser, a container, a notebook kernel or listens on
a port is end-to-end and carries the ``slow`` marker (``pytestmark = pytest.mark.slow`` on the
module, or ``@pytest.mark.slow`` on the test), and so does an in-process test that needs a
library taking seconds to import (torch, scikit-learn's converter), so that the developer loop
stays under 45 s on a quiet 2-core machine. Plain ``pytest`` runs both tiers.

Forgetting the marker cannot go unnoticed: while a test without it runs, starting a process,
listening on a socket or connecting to a TCP address fails the test with a message saying to
mark it (``install_guard`` patches those three entry points once per session; the flag is set
per test by tests/conftest.py before any of its fixtures are set up, so a shared server fixture
started for an unmarked test is caught too). Test modules that use the shared end-to-end
fixtures without the marker are refused at collection (``check_markers``).
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

MARKER = "slow"
E2E_FIXTURES = frozenset({"server", "http", "channel", "repo"})
"""The shared fixtures of tests/conftest.py that run a server process."""

FAST_ONLY = "not slow"
"""The mark expression of the developer loop."""
_MODULE_MARK = re.compile(r"^pytestmark = .*\bpytest\.mark\.slow\b", re.MULTILINE)

_state = {"fast": False}


class EndToEndInFastTier(RuntimeError):
    """A test without the ``slow`` marker tried to leave the process."""


def _refuse(what: str) -> None:
    if _state["fast"]:
        raise EndToEndInFastTier(
            f"{what} in a test without the {MARKER!r} marker: end-to-end tests (server "
            f"processes, browsers, sockets) carry `pytestmark = pytest.mark.{MARKER}` or "
            f"`@pytest.mark.{MARKER}`; the fast tier runs in process only"
        )


def install_guard() -> None:
    """Wrap process start, listen and TCP connect so that they check the current tier."""
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    listen = socket.socket.listen
    connect = socket.socket.connect

    def guarded_execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any) -> Any:
        _refuse(f"starting a process ({args!r:.80})")
        return execute_child(self, args, *rest)

    def guarded_listen(self: socket.socket, *args: Any) -> None:
        _refuse("listening on a socket")
        listen(self, *args)

    def guarded_connect(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _refuse(f"connecting to {address!r}")
        connect(self, address)

    subprocess.Popen._execute_child = guarded_execute_child  # type: ignore[attr-defined]
    socket.socket.listen = guarded_listen  # type: ignore[method-assign]
    socket.socket.connect = guarded_connect  # type: ignore[method-assign]


def enter(item: pytest.Item) -> None:
    """Called before ``item``'s fixtures are set up: guard it unless it is marked slow."""
    _state["fast"] = item.get_closest_marker(MARKER) is None


def leave() -> None:
    """Between tests (and at session teardown) nothing is guarded."""
    _state["fast"] = False


def _fixtures(item: pytest.Item) -> set[str]:
    """The fixtures ``item`` uses (parametrized arguments of the same names aside)."""
    callspec = getattr(item, "callspec", None)
    params = set(callspec.params) if callspec is not None else set()
    return set(getattr(item, "fixturenames", ())) - params


def skip_module(path: Path, config: pytest.Config) -> bool:
    """Whether collecting ``path`` can be skipped: the fast tier is asked for and the module
    marks all its tests slow. Its tests would all be deselected; not importing it (browsers,
    OpenAPI documents, Kubernetes schemas, ...) saves seconds of the developer loop."""
    if config.option.markexpr.strip() != FAST_ONLY or path.suffix != ".py":
        return False
    if not path.name.startswith("test_"):
        return False
    return bool(_MODULE_MARK.search(path.read_text(encoding="utf-8")))


def check_markers(items: Iterable[pytest.Item]) -> None:
    """Refuse unmarked tests that ask for the shared server fixtures."""
    wrong = [
        item.nodeid
        for item in items
        if item.get_closest_marker(MARKER) is None and E2E_FIXTURES & _fixtures(item)
    ]
    if wrong:
        raise pytest.UsageError(
            f"these tests use a server fixture ({', '.join(sorted(E2E_FIXTURES))}) but are not "
            f"marked {MARKER!r}:\n  " + "\n  ".join(wrong[:20])
        )
