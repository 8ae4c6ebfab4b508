"""``pytest notebooks/`` (pytest.ini beside this file).

nbval's sanitizers are sanitize.cfg, found beside this file wherever pytest is started from
(nbval opens the path it is given relative to the working directory). A notebook whose
libraries are not installed is skipped with the command that installs them, rather than failing
at its first import: the PyTorch one needs torch, whose CPU build comes from PyTorch's index
(docs/notebook.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

NEEDS = {
    "04-to-production.ipynb": (("sklearn", "skl2onnx"), 'pip install -e ".[sklearn]"'),
    "05-pytorch.ipynb": (
        ("torch", "onnxscript"),
        "pip install torch --index-url https://download.pytorch.org/whl/cpu"
        ' && pip install -e ".[torch]"',
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    if config.option.nbval_sanitize_with is None:
        config.option.nbval_sanitize_with = str(Path(__file__).with_name("sanitize.cfg"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for name, (modules, install) in NEEDS.items():
        absent = [m for m in modules if importlib.util.find_spec(m) is None]
        if absent:
            skip = pytest.mark.skip(reason=f"{name} needs {' and '.join(absent)}: {install}")
            for item in items:
                if item.path.name == name:
                    item.add_marker(skip)
