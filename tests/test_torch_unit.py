"""The PyTorch path's refusals, in process and without exporting anything: a missing torch or
onnxscript names the extra to install, export options given with another kind of model are
refused instead of ignored, and a wrong example or wrong count of names says what to pass."""

from __future__ import annotations

import sys

import onnx_builders
import pytest
from needs import TORCH_INSTALL, missing, torch_absent

if absent := torch_absent():  # the torch tier: the test-torch extra
    missing(absent, TORCH_INSTALL, module=True)

import torch

from servekit.formats import convert, torch_onnx

# In process, but importing torch alone takes seconds (5 s on a busy 2-core machine): the
# developer loop leaves these to the full run (tests/tiers.py).
pytestmark = [pytest.mark.slow, pytest.mark.torch]

EXTRA = 'pip install "servekit[torch]"'


def test_a_module_is_told_by_its_ancestry() -> None:
    assert torch_onnx.is_torch_module(torch.nn.Linear(2, 2))
    assert not torch_onnx.is_torch_module(torch.nn.Linear)  # the class itself is not a model
    assert not torch_onnx.is_torch_module(torch.zeros(2))
    assert not torch_onnx.is_torch_module(b"onnx bytes")


def test_without_torch_a_module_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a pickled or hand-made subclass of torch's Module looks like where torch is absent:
    # its ancestry names torch.nn.Module; importing torch then fails.
    base = type("Module", (), {"__module__": "torch.nn.modules.module"})
    net = type("Net", (base,), {})()
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"needs torch: " + EXTRA.replace("[", r"\[")):
        convert.to_onnx_source(net, example=[[0.0]])


def test_without_onnxscript_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(ImportError, match=r"needs onnxscript: " + EXTRA.replace("[", r"\[")):
        convert.to_onnx_source(torch.nn.Linear(2, 2), example=torch.zeros(1, 2))


def test_export_options_with_another_model_are_refused() -> None:
    model = onnx_builders.mlp().SerializeToString()
    for option in ({"input_names": ["x"]}, {"output_names": ["y"]}, {"dynamic_batch": False}):
        with pytest.raises(TypeError, match=f"{next(iter(option))} apply to a torch.nn.Module"):
            convert.to_onnx_source(model, **option)  # type: ignore[arg-type]
    assert convert.to_onnx_source(model) == model


def test_example_and_names_are_checked_before_exporting() -> None:
    net = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"example=torch.randn\(1, \.\.\.\)"):
        convert.to_onnx_source(net)
    with pytest.raises(ValueError, match="example is empty"):
        convert.to_onnx_source(net, example=())
    with pytest.raises(TypeError, match=r"example\[1\] must be a torch.Tensor or a numpy array"):
        convert.to_onnx_source(net, example=(torch.zeros(1, 2), object()))
    with pytest.raises(ValueError, match=r"input_names has 2 name\(s\) for 1 tensor\(s\)"):
        convert.to_onnx_source(net, example=torch.zeros(1, 2), input_names=["a", "b"])
    with pytest.raises(ValueError, match="distinct non-empty strings"):
        convert.to_onnx_source(net, example=(torch.zeros(1, 2),) * 2, input_names=["a", "a"])
