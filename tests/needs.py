"""What a test needs from the machine, said the same way everywhere (issue 27).

A test that needs something absent (Chromium, podman, a venv built by a script) never skips
silently: under CI (``CI`` set, as ``.ci/run`` runs) it fails with the command that installs
it; elsewhere it skips with that command, so a developer without the tool still runs the rest.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """``CI`` set to anything but empty, ``0`` or ``false`` (CI services set ``true``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def missing(what: str, install: str, *, module: bool = False) -> NoReturn:
    """``what`` is absent: fail under CI, else skip; both say ``install``. ``module``: called
    at a test module's top level (the whole module skips or fails)."""
    message = f"{what} is missing: {install}"
    if in_ci():
        pytest.fail(f"{message} (CI must install it)", pytrace=False)
    pytest.skip(message, allow_module_level=module)
