"""The isolated runtime driven directly (real child processes, no server): what a request's
deadline does, what the model's own errors become, and that close leaves no process behind.

Slow tier: it starts processes. The server-level behaviour is in tests/test_isolation.py.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from waits import wait_until

from servekit.config.compiler import BUILTIN_RUNTIMES, plan_model, resolve_options
from servekit.config.schema import ModelConfig
from servekit.errors import DeadlineExceeded, Internal, InvalidArgument, Unavailable
from servekit.runtimes import load_runtime
from servekit.runtimes.base import CALL_DEADLINE, LoadError, Supervised
from servekit.runtimes.isolated import BREAKER_CRASHES, IsolatedModel

pytestmark = pytest.mark.slow

MODULE = """
import time
import numpy as np
from numpy.typing import NDArray
from servekit.errors import InvalidArgument


def slow(x: NDArray[np.float32]) -> NDArray[np.float32]:
    time.sleep(float(x[0]))
    return x


def picky(x: NDArray[np.float32]) -> NDArray[np.float32]:
    if x[0] < 0:
        raise InvalidArgument("x must not be negative")
    if x[0] > 100:
        raise ValueError("too big")
    return x


def exits(x: NDArray[np.float32]) -> NDArray[np.float32]:
    import os
    os._exit(7)

"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("isolated_runtime")
    (root / "iso_runtime_models.py").write_text(MODULE)
    sys.path.append(str(root))
    yield root
    sys.path.remove(str(root))


def load(folder: Path, entrypoint: str, **settings: Any) -> IsolatedModel:
    runtime = next(r for r in BUILTIN_RUNTIMES if r.implementation == "python")
    config = ModelConfig.model_validate(
        {
            "name": entrypoint.split(":")[1],
            "modelFormat": {"name": "python"},
            "entrypoint": entrypoint,
            "isolation": "process",
            **settings,
        }
    )
    plan = plan_model(config, runtime, resolve_options(runtime.options, None, 1, 1), folder)
    model = load_runtime(plan, plan.versions[0])
    assert isinstance(model, IsolatedModel) and isinstance(model, Supervised)
    assert not model.may_run_inline  # never called on the event loop
    return model


def test_a_request_deadline_abandons_the_call_and_keeps_the_process(folder: Path) -> None:
    """The request's deadline (CALL_DEADLINE) never kills the process: the call runs to its
    answer (which the executor drops, having answered the client at its deadline), the same
    process serves the next call; a deadline already past when the call would start sends
    nothing. Only timeoutSeconds kills (next test)."""
    model = load(folder, "iso_runtime_models:slow", timeoutSeconds=60)
    try:
        (pid,) = model.pids()
        context = contextvars.copy_context()
        context.run(CALL_DEADLINE.set, time.monotonic() + 0.1)
        answer = context.run(model.predict, {"x": np.array([0.5], np.float32)}, ["output"])
        assert answer["output"].tolist() == [0.5]  # read off the wire, in step
        assert model.pids() == [pid]
        context.run(CALL_DEADLINE.set, time.monotonic() - 1)
        with pytest.raises(DeadlineExceeded, match="before its call started"):
            context.run(model.predict, {"x": np.array([30.0], np.float32)}, ["output"])
        x = np.array([0.0], np.float32)
        assert model.predict({"x": x}, ["output"])["output"].tolist() == [0.0]
        assert model.pids() == [pid]
    finally:
        model.close()


def test_timeout_seconds_kills_the_call_and_the_process_comes_back(folder: Path) -> None:
    model = load(folder, "iso_runtime_models:slow", timeoutSeconds=0.5)
    try:
        (pid,) = model.pids()
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"timeoutSeconds \(0.5 s\); its process was killed"):
            model.predict({"x": np.array([30.0], np.float32)}, ["output"])
        assert time.monotonic() - started < 10
        reports: list[str | None] = []
        model.watch(reports.append)  # down at once, then back
        wait_until(lambda: reports and reports[-1] is None, 60, "the process to come back")
        x = np.array([0.0], np.float32)
        assert model.predict({"x": x}, ["output"])["output"].tolist() == [0.0]
        assert model.pids() != [pid]
    finally:
        pids = model.pids()
        model.close()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_the_circuit_breaker_stops_a_crash_loop(folder: Path) -> None:
    model = load(folder, "iso_runtime_models:exits")
    reports: list[str | None] = []
    model.watch(reports.append)
    x = {"x": np.array([1.0], np.float32)}
    try:
        for crash in range(1, BREAKER_CRASHES):
            (pid,) = model.pids()
            with pytest.raises(Unavailable, match="exited with status 7; restarting it"):
                model.predict(x, ["output"])
            wait_until(lambda pid=pid: model.pids() not in ([], [pid]), 60, f"restart {crash}")
        with pytest.raises(Unavailable) as tripped:
            model.predict(x, ["output"])
        expected = f"crashed {BREAKER_CRASHES} times in 60 s: its process exited with status 7"
        assert expected in str(tripped.value) and "not restarted" in str(tripped.value)
        assert reports[-1] is not None and expected in reports[-1]
        with pytest.raises(Unavailable, match=expected):  # refused at once, nothing started
            model.predict(x, ["output"])
        wait_until(
            lambda: not any(t.name.startswith("servekit-restart-") for t in threading.enumerate()),
            20,
            "no restart under way",
        )
        assert model.pids() == []
    finally:
        model.close()


def test_model_errors_pass_through_and_keep_the_process(folder: Path) -> None:
    model = load(folder, "iso_runtime_models:picky")
    try:
        (pid,) = model.pids()
        with pytest.raises(InvalidArgument, match="x must not be negative"):
            model.predict({"x": np.array([-1.0], np.float32)}, ["output"])
        with pytest.raises(Internal, match="the model raised ValueError: too big"):
            model.predict({"x": np.array([101.0], np.float32)}, ["output"])
        assert model.predict({"x": np.array([1.0], np.float32)}, ["output"])["output"][0] == 1.0
        assert model.pids() == [pid]
    finally:
        model.close()


def test_an_exit_is_reported_with_its_status(folder: Path) -> None:
    model = load(folder, "iso_runtime_models:exits")
    try:
        with pytest.raises(Unavailable, match="exited with status 7"):
            model.predict({"x": np.array([1.0], np.float32)}, ["output"])
    finally:
        model.close()


def test_load_failures_are_reasons(folder: Path) -> None:
    with pytest.raises(LoadError, match="cannot import 'no_such_module'"):
        load(folder, "no_such_module:f")
    with pytest.raises(LoadError, match="has no attribute"):
        load(folder, "iso_runtime_models:nothing_here")
