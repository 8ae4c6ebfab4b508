"""No test skips silently (issue 27): what a test needs from the machine goes through
tests/needs.py, which fails under CI and skips elsewhere, naming the install command."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from needs import TORCH_INSTALL, missing, need_torch

TESTS = Path(__file__).parent
BARE_SKIP = re.compile(r"pytest\.skip\(|importorskip\(|mark\.skip(if)?\b")
MACHINE_PROPERTIES = {
    # Not an install: whether the machine has a network address besides loopback.
    "test_shared_memory_security.py": 'pytest.skip("this machine has no non-loopback IPv4',
}


def test_missing_fails_under_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"podman is missing: apt-get install podman"):
        missing("podman", "apt-get install podman")
    for off in ("", "0", "false"):
        monkeypatch.setenv("CI", off)
        with pytest.raises(pytest.skip.Exception, match=r"podman is missing: apt-get install"):
            missing("podman", "apt-get install podman")


def test_no_test_module_skips_but_through_needs() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name in ("needs.py", "test_needs.py"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if BARE_SKIP.search(line.split("#")[0]):
                allowed = MACHINE_PROPERTIES.get(path.name)
                if allowed is None or allowed not in line:
                    found.append(f"{path.relative_to(TESTS)}:{number}: {line.strip()}")
    assert found == [], "skip through tests/needs.py's missing(what, install command)"


def test_the_torch_tier_names_its_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch and onnxscript (a None entry in sys.modules is how Python says "not
    importable"), the torch tier fails under CI and skips elsewhere, naming the test-torch
    extra's install."""
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    monkeypatch.setenv("CI", "true")
    missing = r"extra \(torch and onnxscript\) is missing: .*\[test-torch\]"
    with pytest.raises(pytest.fail.Exception, match=missing):
        need_torch()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match=re.escape(TORCH_INSTALL)):
        need_torch()
