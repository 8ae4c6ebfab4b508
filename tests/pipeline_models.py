"""A data scientist's model as three served models and as pipelines of them (issue 29).

``featurise`` (Python: the raw row and its squares) -> ``mlp`` (ONNX, 16 -> 4) -> ``postprocess``
(Python: softmax and the winning class), served as a pipeline ``classify``, next to ``combined``
(one Python model doing all three itself) for comparison. ``write_project`` writes the models
and serve.yaml into a folder; the fast tests, the end-to-end tests and bench/pipeline.py share
it. ``MODULE`` also holds the models the other pipelines use: two that only finish when they
run at the same time (``left``/``right``: a barrier of two), one that fails, Triton's image
ensemble (``image_preprocess``, which decodes the PNG files ``png`` writes, -> ``inception``, a
tiny ONNX classifier) and the vLLM README's ``vllm_model`` shape with optional inputs.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnx_builders

MODULE_NAME = "pipeline_user_models"

MODULE = '''
import threading
import zlib
from pathlib import Path

import numpy as np
import onnxruntime as ort

MEET = threading.Barrier(2, timeout=10)


def featurise(raw):
    return {"features": np.concatenate([raw, raw * raw], axis=1)}


def postprocess(scores):
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    return {"label": probabilities.argmax(axis=1).astype(np.int64), "probabilities": probabilities}


class Combined:
    """The three steps in one Python model (what users write without pipelines)."""

    def load(self):
        path = str(Path(__file__).with_name("mlp.onnx"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def predict(self, raw):
        features = featurise(raw)["features"]
        (scores,) = self.session.run(["output"], {"input": features})
        return postprocess(scores)


def calling(raw):
    """The three models called from one Python model (servekit.models.infer), in process."""
    from servekit import models

    features = models.infer("featurise", {"raw": raw})["features"]
    scores = models.infer("mlp", {"input": features}, version=1)["output"]
    return models.infer("postprocess", {"scores": scores})


def selfish(x):
    from servekit import models

    return models.infer("selfish", {"x": x})


def ping(x):
    from servekit import models

    return {"y": models.infer("pong", {"x": x})["y"]}


def pong(x):
    from servekit import models

    if float(x[0]) < 0:  # only a negative x calls back
        return {"y": models.infer("ping", {"x": x})["y"]}
    return {"y": x}


def impatient(x):
    from servekit import models

    return models.infer("stall", {"x": x})


def _png_pixels(data):
    """The RGB pixels of an 8-bit, non-interlaced PNG whose rows use filter 0 (what the tests
    write with zlib; Triton's example decodes JPEGs with a real image library)."""
    if data[:8] != b"\\x89PNG\\r\\n\\x1a\\n":
        raise ValueError("not a PNG file")
    at, idat = 8, b""
    while at < len(data):
        length = int.from_bytes(data[at:at + 4], "big")
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            if body[8:10] != b"\\x08\\x02" or body[12] != 0:
                raise ValueError("only 8-bit RGB PNGs without interlacing")
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * 3)
    if rows[:, 0].any():
        raise ValueError("only PNG rows with filter 0")
    return rows[:, 1:].reshape(height, width, 3)


def image_preprocess(image):
    """Each image file: decoded, resized to 4 x 4 (nearest), scaled to [0, 1], flattened."""
    out = np.zeros((len(image), 48), dtype=np.float32)
    for row, (data,) in enumerate(image):
        pixels = _png_pixels(data)
        ys = np.arange(4) * pixels.shape[0] // 4
        xs = np.arange(4) * pixels.shape[1] // 4
        out[row] = pixels[ys][:, xs].reshape(-1) / 255.0
    return {"features": out}


def whereabouts(x):
    """Whether it ran on the thread of the server's loop (in the fast tests, the main one)."""
    return {"on_loop": np.full(x.shape, threading.current_thread() is threading.main_thread())}


def maybe_add(a, b=None):
    return {"total": a if b is None else a + b}


def left(x):
    MEET.wait()  # returns only once `right` is running too
    return {"y": x + 1}


def right(x):
    MEET.wait()
    return {"y": x * 2}


def add(a, b):
    return {"total": a + b}


RELEASE = threading.Event()
STALLED = threading.Event()


def stall(x):
    STALLED.set()
    RELEASE.wait(10)  # until the test lets it go
    return {"y": x}


def explode(x):
    raise ValueError("the post-processing table is missing")


def vllm_model(text_input, stream=None, sampling_parameters=None, exclude_input_in_output=None):
    """Echoes which inputs it was given (the vLLM backend's inputs, all but one optional)."""
    given = {"stream": stream, "sampling_parameters": sampling_parameters,
             "exclude_input_in_output": exclude_input_in_output}
    sent = ",".join(["text_input", *(k for k, v in given.items() if v is not None)])
    yield {"text_output": np.array([f"{text_input[0].decode()} [{sent}]".encode()], dtype=object)}
'''

_FP = "{datatype: FP32, shape: [-1, %d]}"


def _tensor(name: str, datatype: str, shape: str, extra: str = "") -> str:
    return f"{{name: {name}, datatype: {datatype}, shape: {shape}{extra}}}"


CONFIG = f"""
models:
  - name: featurise
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:featurise"
    maxBatchSize: 64
    inputs: [{_tensor("raw", "FP32", "[-1, 8]")}]
    outputs: [{_tensor("features", "FP32", "[-1, 16]")}]
  - name: mlp
    modelFormat: {{name: onnx}}
    storageUri: mlp.onnx
    maxBatchSize: 64
  - name: postprocess
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:postprocess"
    maxBatchSize: 64
    inputs: [{_tensor("scores", "FP32", "[-1, 4]")}]
    outputs:
      - {_tensor("label", "INT64", "[-1]")}
      - {_tensor("probabilities", "FP32", "[-1, 4]")}
  - name: classify
    maxBatchSize: 64
    inputs: [{_tensor("RAW", "FP32", "[-1, 8]")}]
    outputs:
      - {_tensor("LABEL", "INT64", "[-1]")}
      - {_tensor("PROBABILITIES", "FP32", "[-1, 4]")}
    pipeline:
      - {{model: featurise, inputs: {{raw: RAW}}, outputs: {{features: FEATURES}}}}
      - {{model: mlp, version: 1, inputs: {{input: FEATURES}}, outputs: {{output: SCORES}}}}
      - model: postprocess
        inputs: {{scores: SCORES}}
        outputs: {{label: LABEL, probabilities: PROBABILITIES}}
  - name: combined
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:Combined"
    maxBatchSize: 64
    inputs: [{_tensor("raw", "FP32", "[-1, 8]")}]
    outputs:
      - {_tensor("label", "INT64", "[-1]")}
      - {_tensor("probabilities", "FP32", "[-1, 4]")}
  - name: left
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:left"
    inputs: [{_tensor("x", "FP32", "[-1]")}]
    outputs: [{_tensor("y", "FP32", "[-1]")}]
  - name: right
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:right"
    inputs: [{_tensor("x", "FP32", "[-1]")}]
    outputs: [{_tensor("y", "FP32", "[-1]")}]
  - name: add
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:add"
    inputs: [{_tensor("a", "FP32", "[-1]")}, {_tensor("b", "FP32", "[-1]")}]
    outputs: [{_tensor("total", "FP32", "[-1]")}]
  - name: fan
    inputs: [{_tensor("X", "FP32", "[-1]")}]
    outputs: [{_tensor("TOTAL", "FP32", "[-1]")}]
    pipeline:
      - {{model: add, inputs: {{a: L, b: R}}, outputs: {{total: TOTAL}}}}
      - {{model: left, inputs: {{x: X}}, outputs: {{y: L}}}}
      - {{model: right, inputs: {{x: X}}, outputs: {{y: R}}}}
  - name: explode
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:explode"
    inputs: [{_tensor("x", "FP32", "[-1]")}]
    outputs: [{_tensor("y", "FP32", "[-1]")}]
  - name: broken
    inputs: [{_tensor("X", "FP32", "[-1]")}]
    outputs: [{_tensor("Y", "FP32", "[-1]")}]
    pipeline:
      - {{model: explode, inputs: {{x: X}}, outputs: {{y: Y}}}}
  - name: stall
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:stall"
    inputs: [{_tensor("x", "FP32", "[-1]")}]
    outputs: [{_tensor("y", "FP32", "[-1]")}]
  - name: stalled
    inputs: [{_tensor("X", "FP32", "[-1]")}]
    outputs: [{_tensor("Y", "FP32", "[-1]")}]
    pipeline:
      - {{model: add, inputs: {{a: X, b: X}}, outputs: {{total: T}}}}
      - {{model: stall, inputs: {{x: T}}, outputs: {{y: Y}}}}
  - name: draining
    inputs: [{_tensor("X", "FP32", "[-1]")}]
    outputs: [{_tensor("Y", "FP32", "[-1]")}]
    pipeline:
      - {{model: stall, inputs: {{x: X}}, outputs: {{y: T}}}}
      - {{model: add, inputs: {{a: T, b: T}}, outputs: {{total: Y}}}}
  - name: calling
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:calling"
    inputs: [{_tensor("raw", "FP32", "[-1, 8]")}]
    outputs:
      - {_tensor("label", "INT64", "[-1]")}
      - {_tensor("probabilities", "FP32", "[-1, 4]")}
  - name: selfish
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:selfish"
    inputs: [{_tensor("x", "FP32", "[-1]")}]
    outputs: [{_tensor("y", "FP32", "[-1]")}]
  - name: ping
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:ping"
    inputs: [{_tensor("x", "FP32", "[-1]")}]
    outputs: [{_tensor("y", "FP32", "[-1]")}]
  - name: pong
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:pong"
    inputs: [{_tensor("x", "FP32", "[-1]")}]
    outputs: [{_tensor("y", "FP32", "[-1]")}]
  - name: impatient
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:impatient"
    inputs: [{_tensor("x", "FP32", "[-1]")}]
    outputs: [{_tensor("y", "FP32", "[-1]")}]
  - name: image_preprocess
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:image_preprocess"
    maxBatchSize: 8
    inputs: [{_tensor("image", "BYTES", "[-1, 1]")}]
    outputs: [{_tensor("features", "FP32", "[-1, 48]")}]
  - name: inception
    modelFormat: {{name: onnx}}
    storageUri: inception.onnx
    maxBatchSize: 8
  - name: preprocess_inception_ensemble
    maxBatchSize: 8
    inputs: [{_tensor("INPUT", "BYTES", "[-1, 1]")}]
    outputs:
      - {_tensor("OUTPUT", "FP32", "[-1, 4]", ", labels: [cat, dog, fish, bird]")}
    pipeline:
      - {{model: image_preprocess, inputs: {{image: INPUT}}, outputs: {{features: F}}}}
      - {{model: inception, inputs: {{input: F}}, outputs: {{output: OUTPUT}}}}
  - name: whereabouts
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:whereabouts"
    inputs: [{_tensor("x", "FP32", "[-1]")}]
    outputs: [{_tensor("on_loop", "BOOL", "[-1]")}]
  - name: located
    inputs: [{_tensor("X", "FP32", "[-1]")}]
    outputs: [{_tensor("ON_LOOP", "BOOL", "[-1]")}]
    pipeline:
      - {{model: whereabouts, inputs: {{x: X}}, outputs: {{on_loop: ON_LOOP}}}}
  - name: calls_as_a_step
    inputs: [{_tensor("RAW", "FP32", "[-1, 8]")}]
    outputs: [{_tensor("LABEL", "INT64", "[-1]")}]
    pipeline:
      - {{model: calling, inputs: {{raw: RAW}}, outputs: {{label: LABEL}}}}
  - name: maybe_add
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:maybe_add"
    inputs: [{_tensor("a", "FP32", "[-1]")}, {_tensor("b", "FP32", "[-1]", ", optional: true")}]
    outputs: [{_tensor("total", "FP32", "[-1]")}]
  - name: maybe
    inputs: [{_tensor("A", "FP32", "[-1]")}, {_tensor("B", "FP32", "[-1]", ", optional: true")}]
    outputs: [{_tensor("TOTAL", "FP32", "[-1]")}]
    pipeline:
      - {{model: maybe_add, inputs: {{a: A, b: B}}, outputs: {{total: TOTAL}}}}
  - name: vllm_model
    modelFormat: {{name: python}}
    entrypoint: "{MODULE_NAME}:vllm_model"
    inputs:
      - {_tensor("text_input", "BYTES", "[1]")}
      - {_tensor("stream", "BOOL", "[1]", ", optional: true")}
      - {_tensor("sampling_parameters", "BYTES", "[1]", ", optional: true")}
      - {_tensor("exclude_input_in_output", "BOOL", "[1]", ", optional: true")}
    outputs: [{_tensor("text_output", "BYTES", "[-1]")}]
"""


def write_project(folder: Path) -> Path:
    """The models and serve.yaml in ``folder``; returns serve.yaml's path."""
    onnx.save(onnx_builders.mlp(inputs=16, hidden=32, outputs=4, seed=7), str(folder / "mlp.onnx"))
    # The image classifier of Triton's ensemble example, tiny: 4 x 4 RGB pixels -> 4 classes.
    classifier = onnx_builders.mlp(inputs=48, hidden=16, outputs=4, seed=5)
    onnx.save(classifier, str(folder / "inception.onnx"))
    (folder / f"{MODULE_NAME}.py").write_text(MODULE)
    config = folder / "serve.yaml"
    config.write_text(CONFIG)
    return config


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A tiny RGB PNG of random pixels (8-bit, filter 0), written with the standard library."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width * 3), dtype=np.uint8)
    scanlines = b"".join(b"\x00" + row.tobytes() for row in pixels)

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body).to_bytes(4, "big")
        return len(body).to_bytes(4, "big") + kind + body + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(scanlines))
        + chunk(b"IEND", b"")
    )


def rows(count: int, seed: int = 0) -> np.ndarray:
    """``count`` raw rows for ``classify`` (FP32, 8 columns)."""
    return np.random.default_rng(seed).standard_normal((count, 8)).astype(np.float32)
