"""Issue 22, in process: which Host names a listener answers, and which API groups a bind beyond
loopback closes (the rules of app/servekit/config/hosts.py and config/auth.py; the end-to-end
proofs with a real server and Chromium are in tests/test_rebinding.py and test_public_bind.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from servekit.config.auth import (
    AccessPolicy,
    ApiGroup,
    close_public_groups,
    closed_line,
)
from servekit.config.compiler import compile_plan
from servekit.config.hosts import check_entry, host_name, host_policy
from servekit.config.schema import ServeConfig, ServerConfig
from servekit.errors import PermissionDenied, Unauthenticated


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        (b"localhost:8000", "localhost"),
        (b"Example.COM.:80", "example.com"),
        (b"[::1]:8000", "::1"),
        (b"[::1]", "::1"),
        (b"10.0.0.1", "10.0.0.1"),
        (b"rebind.attacker.example:8000", "rebind.attacker.example"),
    ],
)
def test_host_name_drops_port_brackets_case_and_trailing_dot(raw: bytes, name: str) -> None:
    assert host_name(raw) == name


LOOPBACK = host_policy("127.0.0.1", ["127.0.0.1"], [])


@pytest.mark.parametrize(
    "host",
    [b"127.0.0.1:8000", b"localhost:1", b"LOCALHOST", b"app.localhost", b"[::1]:80",
     b"127.0.0.2", b"[::ffff:127.0.0.1]", b"gpu-box:8000", b"model.ns.svc.cluster.local",
     b"box.internal"],
)  # fmt: skip
def test_a_loopback_listener_answers_its_own_and_private_names(host: bytes) -> None:
    assert LOOPBACK is not None and LOOPBACK.allows(host)


@pytest.mark.parametrize(
    "host",
    [b"rebind.attacker.example:8000", b"localhost.attacker.example", b"10.0.0.1",
     b"[fe80::1]", b"127.0.0.1.nip.io", b"example.local.attacker.example"],
)  # fmt: skip
def test_a_loopback_listener_refuses_public_names_and_foreign_addresses(host: bytes) -> None:
    assert LOOPBACK is not None and not LOOPBACK.allows(host)
    assert "server.allowedHosts" in LOOPBACK.refusal(host)


def test_a_wildcard_bind_answers_every_ip_literal_but_only_listed_names() -> None:
    policy = host_policy("0.0.0.0", ["0.0.0.0"], ["models.example.com", "*.corp.example"])
    assert policy is not None
    for ok in (b"10.1.2.3:8000", b"[2001:db8::1]:8000", b"models.example.com",
               b"a.b.corp.example:443", b"localhost"):  # fmt: skip
        assert policy.allows(ok), ok
    for refused in (b"corp.example", b"other.example.com", b"rebind.attacker.example"):
        assert not policy.allows(refused), refused


def test_a_specific_bind_answers_its_address_and_its_name() -> None:
    policy = host_policy("box.example.org", ["192.0.2.7"], [])
    assert policy is not None
    assert policy.allows(b"192.0.2.7:8000") and policy.allows(b"box.example.org:8000")
    assert not policy.allows(b"192.0.2.8") and not policy.allows(b"other.example.org")


def test_a_star_turns_the_check_off_and_an_allowed_value_is_remembered() -> None:
    assert host_policy("127.0.0.1", ["127.0.0.1"], ["*"]) is None
    policy = host_policy("127.0.0.1", ["127.0.0.1"], [])
    assert policy is not None
    assert policy.allows(b"localhost:9") and b"localhost:9" in policy.remembered
    assert not policy.allows(b"evil.example") and b"evil.example" not in policy.remembered


@pytest.mark.parametrize("entry", ["http://example.com", "example.com:8000", "a/b", "", "*.",
                                   "a..b", "exa mple.com"])  # fmt: skip
def test_allowed_hosts_entries_are_checked(entry: str) -> None:
    with pytest.raises(ValueError, match="not a host name"):
        check_entry(entry)
    with pytest.raises(ValidationError, match="allowedHosts"):
        ServerConfig.model_validate({"allowedHosts": [entry]})


def test_allowed_hosts_entries_are_normalised() -> None:
    server = ServerConfig.model_validate(
        {"allowedHosts": ["Models.Example.COM.", "*.Corp.example", "[::1]", "*"]}
    )
    assert server.allowed_hosts == ["models.example.com", "*.corp.example", "::1", "*"]


# -- groups closed on a public bind ---------------------------------------------------------------


def plan_for(server: dict[str, object], tmp_path: Path) -> AccessPolicy:
    config = ServeConfig.model_validate({"server": server, "models": []})
    return compile_plan(config, tmp_path).access


def test_loopback_without_tokens_closes_nothing(tmp_path: Path) -> None:
    policy = plan_for({}, tmp_path)
    assert not policy.enabled and not policy.closed
    assert closed_line(policy, "127.0.0.1") is None


def test_a_public_bind_without_tokens_closes_admin_and_repository(tmp_path: Path) -> None:
    policy = plan_for({"host": "0.0.0.0"}, tmp_path)
    assert set(policy.closed) == {ApiGroup.ADMIN, ApiGroup.REPOSITORY}
    assert policy.enabled  # the checks are installed
    for group in (ApiGroup.INFERENCE, ApiGroup.METADATA, ApiGroup.OPEN):
        assert policy.allows(group, None) and not policy.guards(group)
    for group in (ApiGroup.ADMIN, ApiGroup.REPOSITORY):
        assert not policy.allows(group, "Bearer anything")
        with pytest.raises(PermissionDenied, match=f"server.auth.{group.value}"):
            policy.check(group, None, "test")
    line = closed_line(policy, "0.0.0.0")
    assert line is not None and "server.auth.admin" in line and "repository" in line


def test_a_token_opens_its_group_to_its_holder_only(tmp_path: Path) -> None:
    policy = plan_for({"host": "0.0.0.0", "auth": {"admin": "admin-t0ken"}}, tmp_path)
    assert set(policy.closed) == {ApiGroup.REPOSITORY}
    assert policy.allows(ApiGroup.ADMIN, "Bearer admin-t0ken")
    with pytest.raises(Unauthenticated):
        policy.check(ApiGroup.ADMIN, "Bearer wrong", "test")
    assert not plan_for({"host": "::", "auth": {"default": "all-t0ken"}}, tmp_path).closed


def test_explicit_model_control_keeps_the_repository_open(tmp_path: Path) -> None:
    policy = plan_for({"host": "0.0.0.0", "modelControl": "explicit"}, tmp_path)
    assert set(policy.closed) == {ApiGroup.ADMIN}


def test_closing_is_about_the_bind_not_the_tokens() -> None:
    assert close_public_groups(AccessPolicy(), "localhost").closed == {}
    assert close_public_groups(AccessPolicy(), "::1").closed == {}
    assert set(close_public_groups(AccessPolicy(), "box.example.org").closed) == {
        ApiGroup.ADMIN,
        ApiGroup.REPOSITORY,
    }
