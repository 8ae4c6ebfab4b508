"""Every uvicorn and Litestar internal the HTTP transport uses still exists in the installed
releases (app/servekit/http/private_apis.py lists them; pyproject.toml pins both to the
ranges tested). An upgrade that renames one fails here, not on a request."""

from __future__ import annotations

import inspect
import re

import pytest

from servekit.http import private_apis
from servekit.http.private_apis import (
    CYCLE_METHODS,
    CYCLE_PARAMETERS,
    CYCLE_STATE,
    FLOW_MEMBERS,
    PROTOCOL_METHODS,
    PROTOCOL_STATE,
    SERVER_STATE,
    FlowControl,
    HttpToolsProtocol,
    RequestResponseCycle,
    ServerState,
)


def _assigned(cls: type) -> set[str]:
    """``self.x`` names the class's own source assigns (its instance attributes)."""
    source = inspect.getsource(cls)
    return {f"self.{name}" for name in re.findall(r"\bself\.(\w+)\s*(?::[^=\n]*)?=[^=]", source)}


@pytest.mark.parametrize("name", PROTOCOL_METHODS)
def test_the_protocol_still_has_each_method_the_edge_uses(name: str) -> None:
    assert callable(getattr(HttpToolsProtocol, name, None)), name


def test_the_protocol_still_sets_each_attribute_the_edge_reads() -> None:
    missing = set(PROTOCOL_STATE) - _assigned(HttpToolsProtocol)
    assert not missing, f"HttpToolsProtocol no longer sets {sorted(missing)}"


def test_the_cycle_still_has_what_the_lane_uses() -> None:
    missing = set(CYCLE_STATE) - _assigned(RequestResponseCycle)
    assert not missing, f"RequestResponseCycle no longer sets {sorted(missing)}"
    for name in CYCLE_METHODS:
        assert callable(getattr(RequestResponseCycle, name, None)), name
    parameters = inspect.signature(RequestResponseCycle).parameters
    assert set(CYCLE_PARAMETERS) <= set(parameters), set(CYCLE_PARAMETERS) - set(parameters)


def test_flow_control_and_server_state_still_have_what_is_read() -> None:
    flow = set(_assigned(FlowControl)) | {f"self.{n}" for n in vars(FlowControl)}
    assert {f"self.{name}" for name in FLOW_MEMBERS} <= flow
    assert set(SERVER_STATE) <= set(vars(ServerState()))


def test_the_status_line_table_and_the_host_rule_still_work() -> None:
    assert private_apis.STATUS_LINE[200] == b"HTTP/1.1 200 OK\r\n"
    assert private_apis.is_valid_host(b"localhost:8080")
    assert not private_apis.is_valid_host(b"bad host")


def test_nothing_else_imports_uvicorn_or_litestar_internals() -> None:
    """Only private_apis names uvicorn's protocol modules or ``litestar._*``."""
    from pathlib import Path

    root = Path(private_apis.__file__).resolve().parents[1]
    internal = re.compile(r"^\s*(from|import)\s+(uvicorn\.protocols|litestar\._)", re.MULTILINE)
    users = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if internal.search(path.read_text()) and path.name != "private_apis.py"
    )
    assert users == []
