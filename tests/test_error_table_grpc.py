"""The gRPC error table covers every core error code, with a distinct, meaningful status."""

from __future__ import annotations

import grpc
import pytest

from servekit.errors import ErrorCode, ServeError
from servekit.grpc.status import GRPC_STATUS, status_of


def test_every_error_code_has_a_grpc_status() -> None:
    assert set(GRPC_STATUS) == set(ErrorCode)


SHARED = {ErrorCode.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED}
"""Codes HTTP tells apart but gRPC has one status for: a full queue (HTTP 429, retry) and a
request too large (HTTP 413) are both RESOURCE_EXHAUSTED, as gRPC defines it."""


def test_statuses_are_distinct_and_never_ok_or_unknown() -> None:
    statuses = [s for c, s in GRPC_STATUS.items() if c not in SHARED]
    assert len(set(statuses)) == len(statuses)
    assert set(SHARED.values()) <= set(statuses)
    assert grpc.StatusCode.OK not in statuses and grpc.StatusCode.UNKNOWN not in statuses


@pytest.mark.parametrize("code", list(ErrorCode))
def test_core_codes_keep_their_names(code: ErrorCode) -> None:
    """The core's codes are named after gRPC's, so the table is the identity on names (but
    for the few gRPC folds into one status, see SHARED)."""
    assert GRPC_STATUS[code] == SHARED.get(code) or GRPC_STATUS[code].name == code.value


@pytest.mark.parametrize("code", list(ErrorCode))
def test_status_of_a_serve_error(code: ErrorCode) -> None:
    error = type("E", (ServeError,), {"code": code})("what went wrong")
    assert status_of(error) == (GRPC_STATUS[code], "what went wrong")


def test_unexpected_errors_become_internal_with_a_reference_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The exception's text (it may hold paths or secrets) stays in the log, under the reference
    the client is given."""
    status, message = status_of(ZeroDivisionError("division by zero in /srv/secret/x.py"))
    assert status is grpc.StatusCode.INTERNAL
    assert message.startswith("internal error (reference ")
    assert "division" not in message and "/srv" not in message
    reference = message.split("reference ", 1)[1].split(";", 1)[0]
    logged = [r for r in caplog.records if reference in r.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "/srv/secret/x.py" in str(logged[0].exc_info[1])
