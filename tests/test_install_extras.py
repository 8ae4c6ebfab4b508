"""Installs that work from the package index alone (issue 27): no extra pins a build only a
local wheel folder or another index has (a ``+local`` version such as ``torch==2.13.0+cpu``),
the test extra brings no torch (the torch tier has an extra of its own, which CI installs with
PyTorch's CPU build through a constraints file of its own), and the extras a user needs for a
client and for the notebooks exist.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def test_no_extra_pins_a_local_build() -> None:
    for extra, entries in EXTRAS.items():
        for entry in entries:
            for spec in Requirement(entry).specifier:
                assert "+" not in spec.version, f"[{extra}] {entry}: not on the package index"


def test_the_test_extra_leaves_torch_to_its_own_tier() -> None:
    """`pip install -e ".[test]"` brings no torch (from the package index, its CUDA build);
    the torch tier's extra is the test extra plus servekit[torch]."""
    assert not {"torch", "onnxscript"} & {Requirement(e).name for e in EXTRAS["test"]}
    (tier,) = (Requirement(e) for e in EXTRAS["test-torch"])
    assert (tier.name, tier.extras) == ("servekit", {"test", "torch"})


def test_ci_pins_the_cpu_torch_through_its_constraints() -> None:
    constraints = (ROOT / ".ci" / "constraints.txt").read_text()
    pins = [Requirement(line) for line in constraints.splitlines() if line and line[0] != "#"]
    assert [str(r) for r in pins if r.name == "torch"] == ["torch==2.13.0+cpu"]
    torch = next(Requirement(e) for e in EXTRAS["torch"] if Requirement(e).name == "torch")
    assert torch.specifier.contains("2.13.0+cpu")  # the constraint can be met by the extra
    run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'pip install .*-c \.ci/constraints\.txt -e "\.\[test-torch\]"', run)


def test_client_and_notebook_extras() -> None:
    client = {Requirement(e).name: Requirement(e) for e in EXTRAS["client"]}
    assert client["tritonclient"].extras == {"http", "grpc"}
    notebook = {Requirement(e).name: Requirement(e) for e in EXTRAS["notebook"]}
    assert notebook["servekit"].extras == {"client"}
    assert {"jupyterlab", "ipykernel", "nbval"} <= notebook.keys()
