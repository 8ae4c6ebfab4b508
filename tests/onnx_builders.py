"""Small ONNX models built with the onnx helper API: examples, tests and benchmarks.

Nothing is downloaded: every model the project serves in examples or tests is made here from
a fixed seed, so the bytes are reproducible.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

V2_TO_ONNX: dict[str, int] = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}

OPSET = 17


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime we support
    onnx.checker.check_model(model)
    return model


def mlp(inputs: int = 16, hidden: int = 64, outputs: int = 4, seed: int = 0) -> onnx.ModelProto:
    """A two-layer perceptron ``input[-1, inputs] -> output[-1, outputs]`` with fixed weights."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((inputs, hidden)) / np.sqrt(inputs)).astype(np.float32)
    b1 = (rng.standard_normal(hidden) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((hidden, outputs)) / np.sqrt(hidden)).astype(np.float32)
    b2 = (rng.standard_normal(outputs) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["input", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["o0"]),
        helper.make_node("Add", ["o0", "b2"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", inputs])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", outputs])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    return _model(graph)


def identity(datatype: str, shape: list[int | str] | None = None) -> onnx.ModelProto:
    """``INPUT0 -> OUTPUT0`` unchanged, for any V2 datatype (default shape [batch, n])."""
    elem = V2_TO_ONNX[datatype]
    dims: list[int | str] = shape if shape is not None else ["batch", "n"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        f"identity_{datatype.lower()}",
        [helper.make_tensor_value_info("INPUT0", elem, dims)],
        [helper.make_tensor_value_info("OUTPUT0", elem, dims)],
    )
    return _model(graph)


def add_sub(datatype: str = "FP32", size: int = 16) -> onnx.ModelProto:
    """Triton's classic example: ``OUTPUT0 = INPUT0 + INPUT1``, ``OUTPUT1 = INPUT0 - INPUT1``."""
    elem = V2_TO_ONNX[datatype]
    dims: list[int | str] = ["batch", size]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [
            helper.make_tensor_value_info("INPUT0", elem, dims),
            helper.make_tensor_value_info("INPUT1", elem, dims),
        ],
        [
            helper.make_tensor_value_info("OUTPUT0", elem, dims),
            helper.make_tensor_value_info("OUTPUT1", elem, dims),
        ],
    )
    return _model(graph)


def classifier(features: int = 4, classes: int = 3, seed: int = 0) -> onnx.ModelProto:
    """A linear classifier as scikit-learn's converter shapes one: ``X[-1, features]`` ->
    ``label`` INT64 [-1] (the arg max) and ``probabilities`` FP32 [-1, classes] (softmax)."""
    w = np.random.default_rng(seed).standard_normal((features, classes)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "w"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", features])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes]),
        ],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    return _model(graph)
