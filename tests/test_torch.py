"""PyTorch modules served through ``add_model`` (issue 16): exported to ONNX in memory by
``torch.onnx.export`` (the torch.export-based exporter, app/servekit/formats/torch_onnx.py), then
served
by onnxruntime like any ONNX model. Real torch (the CPU build, from the test-torch extra), a real
server in this process, tritonclient over HTTP, and the saved project served by a fresh
``servekit serve`` process. Outputs are compared with what torch itself computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from needs import TORCH_INSTALL, missing, torch_absent

if absent := torch_absent():  # the torch tier: the test-torch extra
    missing(absent, TORCH_INSTALL, module=True)

import torch
import tritonclient.http as httpclient
import yaml
from servers import running_server

import servekit
from servekit.errors import InvalidArgument

pytestmark = [pytest.mark.slow, pytest.mark.torch]

TIGHT = {"rtol": 1e-5, "atol": 1e-6}
"""onnxruntime and torch run the same float32 matmuls in different orders: a few ulps apart."""


class Blend(torch.nn.Module):
    """Two inputs of different widths, two outputs, and a dropout that eval mode must turn off
    (in training mode its output would be random)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(2, 3)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mixed = torch.relu(self.drop(self.a(x)) + self.b(y))
        return mixed, torch.sigmoid(self.a(x))


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def expected(module: torch.nn.Module, *arrays: np.ndarray) -> list[np.ndarray]:
    module.eval()
    with torch.no_grad():
        out = module(*(torch.from_numpy(a) for a in arrays))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def http_infer(url: str, model: str, feeds: dict[str, np.ndarray]) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(url.split("://", 1)[1])
    try:
        inputs = []
        for name, array in feeds.items():
            tensor = httpclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        return client.infer(model, inputs)
    finally:
        client.close()


def test_linear_relu_serves_torch_outputs_at_any_batch() -> None:
    net = mlp()
    net.train()  # as a notebook leaves it after a training loop
    rng = np.random.default_rng(1)
    with servekit.serve(grpc_port=None) as server:
        server.add_model("net", net, example=torch.randn(1, 4))
        assert net.training, "exported in eval mode, then put back in the mode it was in"
        meta = server.metadata("net")
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
        assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]
        for batch in (1, 5, 64):
            x = rng.standard_normal((batch, 4)).astype(np.float32)
            out = server.infer("net", {"input": x})["output"]
            assert out.shape == (batch, 3)
            np.testing.assert_allclose(out, expected(net, x)[0], **TIGHT)
        x = rng.standard_normal((7, 4)).astype(np.float32)
        over_http = http_infer(server.url, "net", {"input": x}).as_numpy("output")
        np.testing.assert_allclose(over_http, expected(net, x)[0], **TIGHT)


def test_two_inputs_named_numpy_example_and_eval_mode() -> None:
    torch.manual_seed(2)
    blend = Blend()
    rng = np.random.default_rng(2)
    # numpy's float64 example: exported with the module's float32, as torch would run it.
    example = (rng.standard_normal((2, 4)), rng.standard_normal((2, 2)))
    with servekit.serve(grpc_port=None) as server:
        server.add_model(
            "blend", blend, example=example, input_names=["x", "y"], output_names=["mix", "gate"]
        )
        meta = server.metadata("blend")
        assert [(t["name"], t["shape"]) for t in meta["inputs"]] == [("x", [-1, 4]), ("y", [-1, 2])]
        assert [(t["name"], t["shape"]) for t in meta["outputs"]] == [
            ("mix", [-1, 3]), ("gate", [-1, 3]),
        ]  # fmt: skip
        x = rng.standard_normal((9, 4)).astype(np.float32)
        y = rng.standard_normal((9, 2)).astype(np.float32)
        mix, gate = expected(blend, x, y)
        out = server.infer("blend", {"x": x, "y": y})
        np.testing.assert_allclose(out["mix"], mix, **TIGHT)  # no dropout: eval mode
        np.testing.assert_allclose(out["gate"], gate, **TIGHT)
        result = http_infer(server.url, "blend", {"x": x[:3], "y": y[:3]})
        np.testing.assert_allclose(result.as_numpy("mix"), mix[:3], **TIGHT)
        np.testing.assert_allclose(result.as_numpy("gate"), gate[:3], **TIGHT)


def test_fixed_shapes_when_asked() -> None:
    net = mlp()
    with servekit.serve(grpc_port=None) as server:
        server.add_model("fixed", net, example=torch.zeros(2, 4), dynamic_batch=False)
        assert server.metadata("fixed")["inputs"][0]["shape"] == [2, 4]
        x = np.ones((2, 4), np.float32)
        np.testing.assert_allclose(
            server.infer("fixed", {"input": x})["output"], expected(net, x)[0], **TIGHT
        )
        with pytest.raises(InvalidArgument, match="shape"):
            server.infer("fixed", {"input": np.ones((3, 4), np.float32)})


@pytest.mark.timeout(300)
def test_saved_project_serves_identical_outputs(tmp_path: Path) -> None:
    net, blend = mlp(), Blend()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.standard_normal((6, 2)).astype(np.float32)
    with servekit.serve(grpc_port=None) as server:
        server.add_model("net", net, example=torch.randn(1, 4))
        server.add_model("blend", blend, example=(torch.randn(1, 4), torch.randn(1, 2)))
        here = {"net": server.infer("net", {"input": x}),
                "blend": server.infer("blend", {"input0": x, "input1": y})}  # fmt: skip
        project = server.save(tmp_path / "project")
    assert (project / "models/net/1/model.onnx").is_file()
    assert (project / "models/blend/1/model.onnx").is_file()
    entries = {m["name"]: m for m in yaml.safe_load((project / "serve.yaml").read_text())["models"]}
    assert entries["net"]["storageUri"] == "models/net"
    assert "torch" not in (project / "requirements.txt").read_text()  # the image runs ONNX only
    feeds = {"net": {"input": x}, "blend": {"input0": x, "input1": y}}
    with running_server(project / "serve.yaml", grpc=False) as saved:
        for model, outputs in here.items():
            result = http_infer(saved.http_url, model, feeds[model])
            for name, want in outputs.items():
                got = result.as_numpy(name)
                assert got.dtype == want.dtype and got.shape == want.shape, (model, name)
                assert got.tobytes() == want.tobytes(), (model, name)  # the same file, same bits


def test_output_names_must_match_the_outputs() -> None:
    with servekit.serve(grpc_port=None) as server:
        with pytest.raises(ValueError, match=r"output_names has 1 name\(s\) for 2 tensor\(s\)"):
            server.add_model(
                "blend", Blend(), example=(torch.randn(1, 4), torch.randn(1, 2)), output_names=["z"]
            )
        assert "blend" not in server.models.states()
