"""Build the example's ONNX embedding model with the ``onnx`` helper API (no download).

A bag-of-words embedder: the text is lower-cased (StringNormalizer), split on whitespace
(StringSplit), each word looked up in a vocabulary (ai.onnx.ml LabelEncoder; unknown words
share one row), the rows of a fixed random table averaged and scaled to unit length. Texts
sharing words get close vectors. Input ``text_input`` STRING [N], output ``embedding`` FP32
[N, 64]: N is the batch, so servekit's dynamic batching joins concurrent requests.

    python examples/openai/build_embedder.py   # writes models/embedder/1/model.onnx beside it
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DIMENSIONS = 64
_VOCABULARY = """
    the a an and or but of to in on at for with from by is are was were be been it its this
    that these those what which who how why when where model models server servers text
    texts word words letter letters stream streams batch batches embedding embeddings vector
    vectors cat cats dog dogs fox sun sea river mat sat ran jumps quick brown lazy small
    large fast slow question answer ask query search document documents find similar same
    different good bad new old first last one two three many few data
"""
WORDS = sorted(set(_VOCABULARY.split()))
"""Word ids 2.. (0 is the padding of short texts, 1 every unknown word)."""


def build(dimensions: int = DIMENSIONS) -> onnx.ModelProto:
    rng = np.random.default_rng(42)
    table = rng.standard_normal((len(WORDS) + 2, dimensions)).astype(np.float32)
    table[0] = 0.0  # padding adds nothing
    nodes = [
        helper.make_node(
            "StringNormalizer", ["text_input"], ["lower"], case_change_action="LOWER", locale="C"
        ),
        helper.make_node("StringSplit", ["lower"], ["words", "counts"]),
        helper.make_node(
            "LabelEncoder",
            ["words"],
            ["ids"],
            domain="ai.onnx.ml",
            keys_strings=["", *WORDS],
            values_int64s=[0, *range(2, len(WORDS) + 2)],
            default_int64=1,
        ),
        helper.make_node("Gather", ["table", "ids"], ["vectors"]),  # [N, W, D]
        helper.make_node("ReduceSum", ["vectors", "axis1"], ["summed"], keepdims=0),  # [N, D]
        helper.make_node("Mul", ["summed", "summed"], ["squares"]),
        helper.make_node("ReduceSum", ["squares", "axis_last"], ["norm2"], keepdims=1),
        helper.make_node("Max", ["norm2", "tiny"], ["safe"]),
        helper.make_node("Sqrt", ["safe"], ["norm"]),
        helper.make_node("Div", ["summed", "norm"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "embedder",
        [helper.make_tensor_value_info("text_input", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", dimensions])],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
            numpy_helper.from_array(np.array([-1], np.int64), "axis_last"),
            numpy_helper.from_array(np.array(1e-12, np.float32), "tiny"),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ai.onnx.ml", 3)],
        producer_name="servekit-example",
    )
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def main(folder: Path) -> Path:
    path = folder / "embedder" / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(), str(path))
    return path


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "models"
    print(main(where))
