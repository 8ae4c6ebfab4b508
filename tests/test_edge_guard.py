"""The edge's token check (app/servekit/rest/access.py ``EdgeGuard``) decides as the application's
guard does, for every route: it refuses, when a request's headers end, exactly the requests the
application would refuse for their token, and lets everything else through to be answered as
before (issue 36)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servekit.config.auth import ApiGroup
from servekit.config.compiler import compile_plan
from servekit.config.schema import ServeConfig
from servekit.rest.access import EdgeGuard, edge_guard, group_of
from servekit.server import ServeKit

TOKENS = {"inference": "t-inf", "metadata": "t-meta", "repository": "t-repo", "admin": "t-adm"}


def _guard(tmp_path: Path, auth: dict[str, str]) -> tuple[EdgeGuard | None, object]:
    config = ServeConfig.model_validate({"server": {"auth": auth}})
    kit = ServeKit(compile_plan(config, tmp_path))
    app = kit.http_app()
    return edge_guard(app, kit.dataplane.access), app


def _concrete(path: str) -> str:
    """A path the route template matches (``{version:int}`` -> 1, any other parameter -> m)."""
    return re.sub(r"\{[^}:]+:int\}", "1", re.sub(r"\{[^}:]+:(?!int)[^}]+\}", "m", path))


def _headers(token: str | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"host", b"127.0.0.1:8080")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return headers


def test_no_guard_without_tokens(tmp_path: Path) -> None:
    guard, _ = _guard(tmp_path, {})
    assert guard is None  # the edge skips the check: one ``is None`` per request


def test_every_route_refused_as_its_group_guard_refuses(tmp_path: Path) -> None:
    guard, app = _guard(tmp_path, TOKENS)
    assert guard is not None
    checked = 0
    for route in app.routes:  # type: ignore[attr-defined]
        for handler in getattr(route, "route_handlers", []):
            for method in sorted(handler.http_methods) if hasattr(handler, "http_methods") else []:
                if method == "OPTIONS":
                    continue
                url = _concrete(route.path).encode()
                group = group_of(handler.opt)
                token = TOKENS.get(group.value)
                refused = guard.refuses(method.encode(), url, _headers(None))
                assert refused is (group is not ApiGroup.OPEN), (method, url, group)
                assert not guard.refuses(method.encode(), url, _headers(token)), (method, url)
                if group is not ApiGroup.OPEN:  # another group's token does not open it
                    other = next(t for g, t in TOKENS.items() if g != group.value)
                    assert guard.refuses(method.encode(), url, _headers(other)), (method, url)
                checked += 1
    assert checked > 40


@pytest.mark.parametrize(
    ("method", "url", "headers"),
    [
        (b"OPTIONS", b"/v2/models/m/infer", []),  # open, as token_guard lets it through
        (b"GET", b"/no/such/route", []),  # 404 before any guard
        (b"DELETE", b"/v2/models/m/infer", []),  # 405 before any guard
        (b"POST", b"/v2/models/m/infer", [(b"host", b"bad host\x01")]),  # Litestar's 400 first
        (b"POST", b"/v2/health/live", []),  # an open route
        # one of several Authorization values opens it: the application decides
        (b"POST", b"/v2/models/m/infer", [(b"authorization", b"x"),
                                          (b"authorization", b"Bearer t-inf")]),
    ],
)  # fmt: skip
def test_what_the_edge_leaves_to_the_application(
    tmp_path: Path, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    guard, _ = _guard(tmp_path, TOKENS)
    assert guard is not None
    assert not guard.refuses(method, url, headers)


def test_percent_encoded_and_query_paths_route_as_litestar_routes_them(tmp_path: Path) -> None:
    guard, _ = _guard(tmp_path, TOKENS)
    assert guard is not None
    assert guard.refuses(b"POST", b"/v2/models/%6D/infer?x=1", _headers(None))
    assert guard.refuses(b"GET", b"/v2/models/m", _headers("t-inf"))  # metadata's token
    assert not guard.refuses(b"GET", b"/v2/models/m", _headers("t-meta"))
