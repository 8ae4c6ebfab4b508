"""Fast checks of the access rules, in process (no server started).

The token policy (bearer parsing, groups, the default token), token resolution from the
environment and files, the model-control default, and the two group tables: every HTTP route
and every gRPC method a servekit server offers belongs to a group chosen on purpose.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pytest

from servekit.config.auth import AccessPolicy, ApiGroup, TokenError, clear_tokens, resolve_policy
from servekit.config.compiler import compile_plan
from servekit.config.hosts import is_loopback
from servekit.config.schema import AuthConfig, ServeConfig
from servekit.errors import Unauthenticated
from servekit.grpc import grps_servicer
from servekit.grpc import servicer as inference_servicer
from servekit.grpc.access import METHOD_GROUPS, protect
from servekit.rest.access import API_GROUP, cross_site_guard
from servekit.server import ServeKit

POLICY = AccessPolicy({ApiGroup.INFERENCE: b"abc123", ApiGroup.ADMIN: b"zz-top"})


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        (None, False),
        ("", False),
        ("Bearer", False),
        ("Bearer ", False),
        ("abc123", False),
        ("Basic abc123", False),
        ("Bearer abc12", False),
        ("Bearer abc1234", False),
        ("Bearer abc123", True),
        ("bearer abc123", True),
        ("BEARER   abc123  ", True),
        (b"Bearer abc123", True),
        ("Bearer zz-top", False),  # another group's token
    ],
)
def test_bearer_token_of_a_protected_group(header: str | bytes | None, allowed: bool) -> None:
    assert POLICY.allows(ApiGroup.INFERENCE, header) is allowed


def test_open_and_unprotected_groups_need_nothing() -> None:
    assert POLICY.allows(ApiGroup.OPEN, None)
    assert POLICY.allows(ApiGroup.METADATA, None)
    assert not AccessPolicy().enabled and POLICY.enabled


def test_a_refusal_names_the_group_and_logs_no_token(caplog: pytest.LogCaptureFixture) -> None:
    policy = AccessPolicy({ApiGroup.REPOSITORY: b"s3cret-value"})
    with caplog.at_level(logging.WARNING, "servekit.auth"):
        with pytest.raises(Unauthenticated, match=r"server\.auth\.repository"):
            policy.check(ApiGroup.REPOSITORY, "Bearer guessed-value", "10.1.2.3:5555")
        for _ in range(5):  # a burst: one line a second, the rest counted
            with pytest.raises(Unauthenticated):
                policy.check(ApiGroup.REPOSITORY, None, "10.1.2.3:5555")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["refused a repository request from 10.1.2.3:5555: wrong token"]
    assert "guessed" not in lines[0] and "s3cret" not in lines[0]


def test_tokens_come_from_env_file_clear_text_and_default(tmp_path: Path) -> None:
    (tmp_path / "token.txt").write_text("  from-file-token\n")
    auth = AuthConfig.model_validate(
        {
            "default": {"env": "MY_TOKEN"},
            "repository": {"file": "token.txt"},
            "admin": "in-clear-token",
        }
    )
    policy = resolve_policy(auth, tmp_path, {"MY_TOKEN": "from-env"})
    assert policy.tokens == {
        ApiGroup.INFERENCE: b"from-env",
        ApiGroup.METADATA: b"from-env",
        ApiGroup.REPOSITORY: b"from-file-token",
        ApiGroup.ADMIN: b"in-clear-token",
    }
    assert clear_tokens(auth) == ["server.auth.admin"]


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"inference": {"env": "UNSET_VAR"}}, "UNSET_VAR is not set"),
        ({"inference": {"file": "missing.txt"}}, "cannot read token file missing.txt"),
        ({"inference": "   "}, "empty"),
        ({"inference": "two words"}, "printable ASCII"),
    ],
)
def test_unusable_tokens_are_config_errors(
    tmp_path: Path, auth: dict[str, object], message: str
) -> None:
    with pytest.raises(TokenError, match=message) as error:
        resolve_policy(AuthConfig.model_validate(auth), tmp_path, {})
    assert error.value.field == "server.auth.inference"


def test_a_token_source_names_exactly_one_place() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        AuthConfig.model_validate({"admin": {"env": "A", "file": "b"}})
    with pytest.raises(ValueError, match="exactly one"):
        AuthConfig.model_validate({"admin": {}})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.5", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.3", False),
     ("myhost.example", False)],
)  # fmt: skip
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("server", "mode"),
    [
        ({}, "explicit"),  # default bind: loopback
        ({"host": "0.0.0.0"}, "none"),
        ({"host": "0.0.0.0", "auth": {"repository": "t0ken-value"}}, "explicit"),
        ({"host": "0.0.0.0", "auth": {"default": "t0ken-value"}}, "explicit"),
        ({"host": "0.0.0.0", "auth": {"inference": "t0ken-value"}}, "none"),
        ({"host": "0.0.0.0", "modelControl": "explicit"}, "explicit"),
        ({"modelControl": "none"}, "none"),
    ],
)
def test_model_control_default(tmp_path: Path, server: dict[str, object], mode: str) -> None:
    plan = compile_plan(ServeConfig.model_validate({"server": server}), tmp_path)
    assert plan.model_control == mode


def test_every_http_route_declares_its_group(tmp_path: Path) -> None:
    kit = ServeKit(compile_plan(ServeConfig(), tmp_path))
    app = kit.http_app()
    undeclared = [
        (route.path, handler.handler_name)
        for route in app.routes
        for handler in getattr(route, "route_handlers", [])
        if API_GROUP not in handler.opt and handler.handler_name != "options_handler"
    ]  # Litestar's automatic OPTIONS answers are open (see app/servekit/rest/access.py)
    assert undeclared == []
    groups = {
        route.path: {h.opt.get(API_GROUP) for h in route.route_handlers}  # type: ignore[attr-defined]
        for route in app.routes
    }
    assert groups["/v2/health/ready"] == {ApiGroup.OPEN, None}
    assert groups["/v2/models/{model:str}/infer"] == {ApiGroup.INFERENCE, None}
    assert groups["/v2/repository/models/{model:str}/load"] == {ApiGroup.REPOSITORY, None}
    assert groups["/metrics"] == {ApiGroup.ADMIN, None}
    guarded = {
        route.path
        for route in app.routes
        for handler in getattr(route, "route_handlers", [])
        if cross_site_guard in (handler.guards or ())
    }
    assert guarded == {
        "/v2/repository/models/{model:str}/load",
        "/v2/repository/models/{model:str}/unload",
        "/grps/v1/health/online",
        "/grps/v1/health/offline",
        "/dashboard/api/models/{name:str}/benchmark",  # makes the server work: a control route
        # shared memory (register/unregister change what the server maps:
        # app/servekit/rest/shared_memory.py)
        "/v2/systemsharedmemory/region/{name:str}/register",
        "/v2/systemsharedmemory/region/{name:str}/unregister",
        "/v2/systemsharedmemory/unregister",
        "/v2/cudasharedmemory/region/{name:str}/register",
        "/v2/cudasharedmemory/region/{name:str}/unregister",
        "/v2/cudasharedmemory/unregister",
    }
    assert groups["/dashboard/api/models/{name:str}/benchmark"] == {ApiGroup.ADMIN, None}
    shared_memory = {path: g for path, g in groups.items() if "sharedmemory" in path}
    assert len(shared_memory) == 10
    assert all(g == {ApiGroup.REPOSITORY, None} for g in shared_memory.values()), shared_memory


def test_every_grpc_method_our_servicers_implement_has_a_group() -> None:
    implemented = {
        *(f"/{inference_servicer.SERVICE_NAME}/{name}" for name in inference_servicer.IMPLEMENTED),
        *(f"/{grps_servicer.SERVICE_NAME}/{name}" for name in vars(grps_servicer.GrpsServicer)
          if name[:1].isupper()),
    }  # fmt: skip
    assert len(implemented) == 26, implemented  # 18 of Triton's service, 8 of grps
    shared_memory = {m for m in implemented if "SharedMemory" in m}
    assert len(shared_memory) == 6
    assert {METHOD_GROUPS[m] for m in shared_memory} == {ApiGroup.REPOSITORY}
    assert implemented <= set(METHOD_GROUPS), implemented - set(METHOD_GROUPS)


def test_protect_wraps_only_the_methods_of_protected_groups(tmp_path: Path) -> None:
    kit = ServeKit(compile_plan(ServeConfig(), tmp_path))
    servicer = inference_servicer.InferenceServicer(kit.dataplane, kit.control, kit.catalog)
    policy = AccessPolicy({ApiGroup.INFERENCE: b"t0ken", ApiGroup.ADMIN: b"other"})
    before = {name: getattr(servicer, name) for name in ("ModelInfer", "ServerLive", "ModelConfig")}
    protect(servicer, inference_servicer.SERVICE_NAME, policy)
    assert servicer.ServerLive == before["ServerLive"]  # open: untouched, no cost
    assert servicer.ModelInfer != before["ModelInfer"]
    assert servicer.ModelConfig != before["ModelConfig"]
    assert inspect.isasyncgenfunction(servicer.ModelStreamInfer)  # still a stream
