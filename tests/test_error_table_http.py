"""Every core error code has an HTTP status, and each error class carries the code it claims."""

from __future__ import annotations

import pytest

from servekit import errors
from servekit.errors import ErrorCode, ServeError
from servekit.rest.errors import HTTP_STATUS


def test_every_code_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(ErrorCode)
    for code, status in HTTP_STATUS.items():
        assert 400 <= status < 600, code
    server_side = {c for c, s in HTTP_STATUS.items() if s >= 500}
    assert ErrorCode.INVALID_ARGUMENT not in server_side  # a client's mistake is never a 5xx
    assert ErrorCode.NOT_FOUND not in server_side


@pytest.mark.parametrize(
    ("cls", "status"),
    [
        (errors.InvalidArgument, 400),
        (errors.NotFound, 404),
        (errors.Unavailable, 503),
        (errors.ResourceExhausted, 413),
        (errors.Unimplemented, 501),
        (errors.AlreadyExists, 409),
        (errors.Internal, 500),
        (errors.Overloaded, 429),
        (errors.DeadlineExceeded, 504),
    ],
)
def test_error_classes_map_to_their_status(cls: type[ServeError], status: int) -> None:
    error = cls("why")
    assert error.message == "why"
    assert HTTP_STATUS[error.code] == status


def test_every_error_class_is_covered() -> None:
    classes = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, ServeError) and obj is not ServeError
    ]
    assert {cls.code for cls in classes} <= set(HTTP_STATUS)
    assert len(classes) >= 7


def test_unexpected_errors_answer_a_reference_not_their_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug's exception text (paths, secrets) stays in the log; the client gets a reference."""
    from litestar import Litestar, get
    from litestar.testing import TestClient

    from servekit.rest.errors import EXCEPTION_HANDLERS
    from servekit.rest.grps import _failure

    @get("/boom", sync_to_thread=False)
    def boom() -> None:
        raise KeyError("/srv/secret/token.txt")

    app = Litestar([boom], exception_handlers=EXCEPTION_HANDLERS, logging_config=None)
    with TestClient(app) as client:
        answer = client.get("/boom")
    assert answer.status_code == 500
    message = answer.json()["error"]
    assert message.startswith("internal error (reference ") and "secret" not in message
    reference = message.split("reference ", 1)[1].split(";", 1)[0]
    assert any(reference in r.getMessage() and r.exc_info for r in caplog.records)

    grps = _failure(RuntimeError("/srv/secret/token.txt")).content
    assert b"internal error (reference " in grps and b"secret" not in grps
