"""What a test needs from the machine, said the same way everywhere (issue 27).

A test that needs something absent (Chromium, podman, a venv built by a script) never skips
silently: under CI (``CI`` set, as ``.ci/run`` runs) it fails with the command that installs
it; elsewhere it skips with that command, so a developer without the tool still runs the rest.
"""

from __future__ import annotations

import importlib.util
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


TORCH_INSTALL = (
    "pip install -c .ci/constraints.txt --extra-index-url https://download.pytorch.org/whl/cpu "
    '-e ".[test-torch]"'
)
"""The PyTorch tier's install (docs/development.md): torch is not in the test extra, whose
install would otherwise bring torch's CUDA build; this is CI's command, with the CPU build."""


def torch_absent() -> str:
    """The torch tier's libraries (torch, onnxscript) that are not installed, said as what is
    missing ("the test-torch extra (torch and onnxscript)"); empty when both are."""
    absent = [name for name in ("torch", "onnxscript") if importlib.util.find_spec(name) is None]
    return f"the test-torch extra ({' and '.join(absent)})" if absent else ""


def need_torch() -> None:
    """In a test of the ``torch`` tier: without its libraries, ``missing`` names the install
    (fails under CI, skips elsewhere). A module checks ``torch_absent()`` before importing
    torch and calls ``missing(..., module=True)``."""
    if absent := torch_absent():
        missing(absent, TORCH_INSTALL)
