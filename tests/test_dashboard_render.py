"""Dashboard templates rendered in process (the browser tests are in tests/test_dashboard.py)."""

from __future__ import annotations

import re

import pytest

from servekit.dashboard.render import environment


@pytest.mark.parametrize(
    ("name", "title"),
    [("servekit", "Overview · servekit"), ("fraud-models", "Overview · fraud-models · servekit")],
)
def test_a_page_title_names_the_server_once(name: str, title: str) -> None:
    page = environment().from_string(
        '{% extends "dashboard_base.html" %}{% block title %}Overview{% endblock %}'
    )
    server = {"name": name, "modelControl": "explicit", "protected": {}, "ready": True,
              "version": "0.1.0"}  # fmt: skip
    html = page.render(server=server, page="home", gated=[], servekit_version="0.1.0")
    found = re.search(r"<title>(.*?)</title>", html)
    assert found is not None and found[1] == title
